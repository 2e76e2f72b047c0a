"""`dstore pfs` mounted for real: bytes, the model's caps (lower bounds only), unmounting on every exit, stale mounts.

Skipped, with the reason, where FUSE is not available (no /dev/fuse, no fusermount3, no libfuse3).
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time

import pytest

from dstore.errors import ConfigError
from dstore.tools.pfs import PfsModel, StaleMountError, fuse_available, parse_spec, pfs_mount, stale_mounts
from dstore.tools.pfs.mount import check_mountpoint, force_unmount, is_mounted, pfs_mountpoints

REASON = fuse_available()
pytestmark = pytest.mark.skipif(REASON is not None, reason=f"FUSE tests need FUSE: {REASON}")

SIZES = {
    "empty": 0,
    "one": 1,
    "page-1": 4095,
    "page": 4096,
    "sample.jpg": 110_000,
    "big.bin": 2_500_000,
    "sub/deeper/x.bin": 300_001,
}
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    src = tmp_path_factory.mktemp("pfs-src")
    rng = random.Random(9)
    for name, size in SIZES.items():
        p = src / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(rng.randbytes(size))
    return src


def _pread_all(path, n, size, nthreads, seed=0):
    """`nthreads` threads, each `n` preads of `size` bytes at seeded offsets of one file."""

    def work(k):
        rng = random.Random(seed + k)
        fd = os.open(path, os.O_RDONLY)
        try:
            end = os.fstat(fd).st_size - size
            for _ in range(n):
                os.pread(fd, size, rng.randrange(0, max(end, 1)))
        finally:
            os.close(fd)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(nthreads)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.perf_counter() - t0


def test_bytes_through_the_mount_equal_the_source(source):
    with pfs_mount(source, model=parse_spec("local")) as mnt:
        assert pfs_mountpoints(source) == [mnt.mountpoint]
        assert sorted(os.listdir(mnt.mountpoint)) == sorted(os.listdir(source))
        for name, size in SIZES.items():
            assert os.stat(mnt.path(name)).st_size == size
            with open(mnt.path(name), "rb") as fh:
                assert fh.read() == (source / name).read_bytes(), name
        errors = []

        def reader(k):
            rng = random.Random(k)
            names = [n for n, s in SIZES.items() if s]
            fds = {n: os.open(mnt.path(n), os.O_RDONLY) for n in names}
            try:
                for _ in range(150):
                    n = rng.choice(names)
                    off = rng.randrange(0, SIZES[n] + 10)
                    ln = rng.choice([1, 4096, 110_000, 1_200_000])
                    want = (source / n).read_bytes()[off : off + ln]
                    if os.pread(fds[n], ln, off) != want:
                        errors.append((n, off, ln))
            finally:
                for fd in fds.values():
                    os.close(fd)

        threads = [threading.Thread(target=reader, args=(k,)) for k in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
        with pytest.raises(OSError):  # read-only
            open(mnt.path("one"), "r+b")
    assert mnt.stats is not None and mnt.stats["reads"] > 1000 and mnt.stats["read_bytes"] > 0
    assert mnt.mountpoint is not None and not is_mounted(mnt.mountpoint) and not os.path.exists(mnt.mountpoint)
    assert pfs_mountpoints(source) == []


@pytest.mark.parametrize(
    "spec, n, size, nthreads, lower",
    [
        # N reads at iops=200 (plus a few opens/stats, which also take tokens) take >= 0.9 N / 200 s
        ("pfs:latency=0,iops=200,bandwidth=unlimited", 40, 4096, 4, 0.9 * 160 / 200),
        # one reader, 20 ms per read: >= 0.9 x 25 x 20 ms; four readers overlap their latencies
        ("pfs:latency=20ms,open_latency=0,iops=unlimited,bandwidth=unlimited", 25, 4096, 1, 0.9 * 25 * 0.02),
        ("pfs:latency=20ms,open_latency=0,iops=unlimited,bandwidth=unlimited", 25, 4096, 4, 0.9 * 25 * 0.02),
        # 4 x 20 reads of 110 KB = 8.8 MB at 40 MB/s (minus one 10 ms burst)
        ("pfs:latency=0,iops=unlimited,bandwidth=40MB/s", 20, 110_000, 4, 0.9 * (80 * 110_000 - 400_000) / 40e6),
    ],
)
def test_model_caps_hold_lower_bounds(source, spec, n, size, nthreads, lower):
    with pfs_mount(source, model=parse_spec(spec)) as mnt:
        elapsed = _pread_all(mnt.path("big.bin"), n, size, nthreads)
    assert elapsed >= lower, f"{spec}: {nthreads}x{n} reads took {elapsed:.3f} s < {lower:.3f} s"
    assert mnt.stats is not None and mnt.stats["reads"] == n * nthreads


def _wait_mounted(mp, proc, timeout=30):
    deadline = time.monotonic() + timeout
    while not (is_mounted(mp) and os.path.exists(os.path.join(mp, "one"))):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "mount did not come up"
        time.sleep(0.05)


def test_dstore_pfs_unmounts_on_sigterm_and_reports(source, tmp_path):
    mp = tmp_path / "mnt"
    mp.mkdir()
    stats = tmp_path / "stats.json"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "dstore.tools",
            "pfs",
            str(source),
            str(mp),
            "--latency",
            "1ms",
            "--stats-json",
            str(stats),
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        _wait_mounted(str(mp), proc)
        assert (mp / "sample.jpg").read_bytes() == (source / "sample.jpg").read_bytes()
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
        force_unmount(str(mp))
    assert proc.returncode == 0, out
    assert not is_mounted(str(mp))
    assert "served" in out and "MB" in out, out
    import json

    assert json.loads(stats.read_text())["read_bytes"] >= 110_000


def test_bad_source_leaves_no_mount(tmp_path):
    mp = tmp_path / "mnt"
    mp.mkdir()
    r = subprocess.run(
        [sys.executable, "-m", "dstore.tools", "pfs", str(tmp_path / "nope"), str(mp)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode != 0 and "SOURCE" in r.stderr and "nope" in r.stderr, r.stderr
    assert not is_mounted(str(mp))
    with pytest.raises(ConfigError, match="SOURCE"):
        with pfs_mount(tmp_path / "nope", mp):
            pass
    assert not is_mounted(str(mp))


def test_error_in_the_body_still_unmounts(source):
    mnt = pfs_mount(source, model=PfsModel(latency=1e-3))
    with pytest.raises(RuntimeError, match="boom"):
        with mnt:
            assert os.listdir(mnt.mountpoint)
            raise RuntimeError("boom")
    assert mnt.mountpoint is not None and not is_mounted(mnt.mountpoint) and not os.path.exists(mnt.mountpoint)


def test_stale_mount_is_detected_and_named(source, tmp_path):
    mp = tmp_path / "mnt"
    mp.mkdir()
    proc = subprocess.Popen(
        [sys.executable, "-m", "dstore.tools.pfs.fs", str(source), str(mp), "--latency", "0"],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        _wait_mounted(str(mp), proc)
        proc.kill()  # a killed run: the kernel mount stays, its process is gone
        proc.wait(timeout=30)
        assert str(mp) in stale_mounts()
        with pytest.raises(StaleMountError, match=f"fusermount3? -u {mp}"):
            check_mountpoint(str(mp))
        r = subprocess.run(
            [sys.executable, "-m", "dstore.tools", "pfs", str(source), str(mp)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert r.returncode != 0 and "stale" in r.stderr and f"-u {mp}" in r.stderr, r.stderr
        r = subprocess.run(
            [sys.executable, "-m", "dstore.tools", "pfs", "--find-stale"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert r.returncode == 1 and str(mp) in r.stdout, r.stdout
    finally:
        if proc.poll() is None:
            proc.kill()
        force_unmount(str(mp))
    assert not is_mounted(str(mp)) and str(mp) not in stale_mounts()
    check_mountpoint(str(mp))  # usable again


def test_finding_stale_mounts_never_blocks_on_an_unresponsive_mount(source, tmp_path):
    # Issue 21: stale_mounts() statfs'ed every dstore pfs mount of the host in this process; a mount
    # whose file system process is alive but stopped held it (and `dstore pfs --find-stale`) in
    # uninterruptible sleep. Now each statfs runs in a child with a timeout: the stopped mount is
    # alive (not stale), and the call returns.
    mp = tmp_path / "mnt"
    mp.mkdir()
    proc = subprocess.Popen(
        [sys.executable, "-m", "dstore.tools.pfs.fs", str(source), str(mp), "--latency", "0"],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    found = []
    try:
        _wait_mounted(str(mp), proc)
        proc.send_signal(signal.SIGSTOP)  # alive, answering nothing
        while open(f"/proc/{proc.pid}/stat").read().rsplit(")", 1)[1].split()[0] != "T":
            time.sleep(0.01)  # stopped for sure before the search starts
        finder = threading.Thread(target=lambda: found.append(stale_mounts()), daemon=True)
        finder.start()
        finder.join(60)  # a hang bound, not a timing: the statfs children give up after 2 s
        assert not finder.is_alive(), "stale_mounts() blocked on a stopped mount"
        assert str(mp) not in found[0] and is_mounted(str(mp))
    finally:
        proc.send_signal(signal.SIGCONT)  # releases a statfs still waiting on it
        proc.kill()
        proc.wait(timeout=30)
        force_unmount(str(mp))
    assert not is_mounted(str(mp))


def test_mount_does_not_outlive_a_killed_owner(source):
    """The process that opened pfs_mount is SIGKILLed (as an aborted MPI rank is): the file system
    notices, unmounts and exits instead of serving forever."""
    code = (
        "import sys, time; from dstore.tools.pfs import pfs_mount, PfsModel\n"
        f"m = pfs_mount({str(source)!r}, model=PfsModel()).__enter__()\n"
        "print(m.mountpoint, m._proc.pid, flush=True); time.sleep(600)\n"
    )
    owner = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert owner.stdout is not None  # piped
        mp, fs_pid = owner.stdout.readline().split()
        assert is_mounted(mp)
        owner.kill()
        owner.wait(timeout=30)
        deadline = time.monotonic() + 30
        while is_mounted(mp) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not is_mounted(mp)
        while time.monotonic() < deadline:
            try:
                os.kill(int(fs_pid), 0)
            except ProcessLookupError:
                break
            time.sleep(0.1)
        else:
            raise AssertionError(f"the file system process {fs_pid} is still running")
    finally:
        if owner.poll() is None:
            owner.kill()


def test_stats_json_relative_to_the_callers_directory(source, tmp_path):
    """issue 19: `--stats-json rel.json` lands in the caller's directory, not the file system's."""
    mp = tmp_path / "mnt"
    mp.mkdir()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "dstore.tools",
            "pfs",
            str(source),
            str(mp),
            "--latency",
            "0",
            "--stats-json",
            "rel.json",
        ],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONPATH": ROOT},
    )
    try:
        _wait_mounted(str(mp), proc)
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
        force_unmount(str(mp))
    assert proc.returncode == 0, out
    assert (tmp_path / "rel.json").is_file(), (out, os.listdir(tmp_path))


def _read_quietly(path):
    try:
        path.read_bytes()
    except OSError:
        pass  # the mount ended under the read (ENOTCONN): what the test does


def test_sigterm_ends_a_mount_with_a_read_in_its_longest_wait(source, tmp_path):
    """issue 19: every wait is bounded (MAX_DELAY_S), so SIGTERM ends a mount whose reader is waiting."""
    mp = tmp_path / "mnt"
    mp.mkdir()
    proc = subprocess.Popen(
        [sys.executable, "-m", "dstore.tools", "pfs", str(source), str(mp), "--latency", "2s", "--open-latency", "0"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    reader = None
    try:
        _wait_mounted(str(mp), proc)
        reader = threading.Thread(target=_read_quietly, args=(mp / "one",), daemon=True)
        reader.start()
        time.sleep(0.5)  # the read is in the model's wait now
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)  # a mount that outlives this is the hang of issue 19
    finally:
        if proc.poll() is None:
            proc.kill()
        force_unmount(str(mp))
    assert not is_mounted(str(mp)), out


def test_a_mount_of_the_temporary_directory_itself_goes_elsewhere(tmp_path, monkeypatch):
    """pfs_mount without a mountpoint makes its own; where the temporary directory lies inside the
    source (a bench of files under /tmp), it goes beside the source instead of inside it."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "x.bin").write_bytes(b"abc")
    monkeypatch.setattr(tempfile, "tempdir", str(src))
    with pfs_mount(src, model=PfsModel()) as mnt:
        assert mnt.mountpoint is not None and not mnt.mountpoint.startswith(str(src) + "/")
        assert (open(mnt.path("x.bin"), "rb").read()) == b"abc"
