"""Integrity by construction (issue 19): every byte the store reads from storage is checked against
the container's checksums where it was read; a container changed under a running job, a missing
Zarr chunk and a shard of another ingest are errors naming them, never wrong bytes served."""

from __future__ import annotations

import os
import shutil
import sys
import time
from typing import Any

import numpy as np
import pytest
from mpi4py import MPI
from store_scenarios import scenarios
from support.formats import build, random_samples, write_samples
from support.mpirun import run_mpi

from dstore.errors import ChecksumError, ContainerChangedError, FormatError
from dstore.formats import open_container
from dstore.store.data_store import DataStore

BATCH = scenarios.BATCH


def corrupt_in_place(path: str, sample: bytes, *, keep_time: bool = True) -> None:
    """Inverts the first byte of `sample` where it lies in the file `path`, in place; with
    `keep_time`, the file keeps its modification time (so only the checksums can tell)."""
    st = os.stat(path)
    with open(path, "rb") as f:
        pos = f.read().find(sample)
    assert pos >= 0 and len(sample) > 64
    fd = os.open(path, os.O_WRONLY)
    try:
        os.pwrite(fd, bytes([sample[0] ^ 0xFF]), pos)
    finally:
        os.close(fd)
    if keep_time:
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def _sample(path: str, i: int) -> bytes:
    with open_container(path) as r:
        return r.sample(i)[0].tobytes()


def _resident(path: str, **kw) -> np.ndarray:
    with DataStore(MPI.COMM_SELF, path, **kw) as probe:
        assert probe.windows is not None and probe.windows.resident is not None  # a tiered store
        return probe.windows.resident


def _tiered_kw(path: str) -> dict:
    probe = DataStore(MPI.COMM_SELF, path, batch_size=BATCH)
    budget = probe.tier_overhead() + int(0.5 * int(probe.layout.nbytes.max()))
    probe.close()
    return dict(batch_size=BATCH, memory_budget=budget)


def _big_sample(path: str, mask=None) -> int:
    """A sample of over 64 bytes (where `mask` is True)."""
    with open_container(path) as r:
        sizes = np.diff(r.offsets)
    ok = sizes > 64 if mask is None else (sizes > 64) & mask
    return int(np.flatnonzero(ok)[len(np.flatnonzero(ok)) // 2])


# --- every read path checks what it read ------------------------------------------------------------


@pytest.mark.parametrize("path_kind", ["preload", "preload-1-thread", "dynamic", "tiered-preload", "tiered-read"])
def test_every_read_from_storage_is_checked_against_the_checksums(tmp_path, path_kind):
    # A sample's bytes change in the file after the store opened it, its size and time kept: the
    # read that brings it into the store must fail naming it, not serve the other bytes.
    path = scenarios.make_container(str(tmp_path / "c.h5"), n=1201, seed=2, large=8000, small=8000)
    kw: dict[str, Any] = dict(batch_size=BATCH)
    if path_kind == "preload-1-thread":
        kw["population_threads"] = 1
    if path_kind == "dynamic":
        kw["population"] = "dynamic"
    if path_kind.startswith("tiered"):
        kw = _tiered_kw(path)
        resident = _resident(path, **kw)
        assert 0 < resident.mean() < 1
        victim = _big_sample(path, resident if path_kind == "tiered-preload" else ~resident)
    else:
        victim = _big_sample(path)
    sample = _sample(path, victim)
    st = DataStore(MPI.COMM_SELF, path, **kw)
    served = []
    with pytest.raises(ChecksumError) as err:
        if path_kind in ("dynamic", "tiered-read"):
            st.populate()
        corrupt_in_place(path, sample)
        with st:
            for e in range(2):
                for b in st.epoch(e):
                    served += [bytes(x) for i, x in zip(b.ids.tolist(), b.samples) if i == victim]
    st.close()
    assert f"{path}: 1 sample(s) read from storage do not match their checksums: {victim} (s{victim})" in str(err.value)
    assert all(x == sample for x in served)  # nothing but the ingested bytes was served


def test_a_reader_names_what_changed_in_its_files(tmp_path):
    path = scenarios.make_container(str(tmp_path / "c.h5"), n=40)
    with open_container(path) as r:
        assert r.changes() is None
        st = os.stat(path)
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
        changes = r.changes()
        assert changes is not None and "modification time changed" in changes
        with pytest.raises(ContainerChangedError, match=f"{path}: the container changed"):
            r.check_unchanged()


# --- a container changed under a running job, on every rank -----------------------------------------

_CHANGED = r"""
import os, sys
from mpi4py import MPI
from dstore.store.data_store import DataStore
from test_integrity import corrupt_in_place
comm, path, case = MPI.COMM_WORLD, sys.argv[1], sys.argv[2]
probe = DataStore(comm, path, batch_size=12)
budget = probe.tier_overhead() + int(0.5 * int(probe.layout.nbytes.max()))
probe.close()
st = DataStore(comm, path, batch_size=12, memory_budget=budget)
try:
    with st:
        victims = comm.bcast(sorted(int(i) for i in (~st.windows.resident).nonzero()[0] if st.sizes[i] > 64)[:3])
        for b in st.epoch(0):
            pass
        comm.Barrier()
        if comm.rank == 0:  # rewritten in place, as `cp` or `dd conv=notrunc` of a same-layout file would
            for i in victims:
                corrupt_in_place(path, bytes(st.container.sample(i)[0]), keep_time=case == "bytes")
        comm.Barrier()
        for e in (1, 2):
            for b in st.epoch(e):
                pass
except Exception as exc:
    print(f'\nrank {comm.rank} raised {type(exc).__name__}: {exc}', flush=True)
    raise
print('finished', flush=True)
"""


@pytest.mark.mpi
@pytest.mark.parametrize("case", ["file", "bytes"])
def test_a_container_rewritten_between_epochs_ends_the_job_on_every_rank(tmp_path, case):
    # The scenario at small scale: a tiered store (a memory budget of about half a rank's
    # share) over a file rewritten in place after epoch 0. "file": its time changes, so the next
    # epoch's start refuses it; "bytes": size and time kept, so the storage reads' checksums catch
    # it mid-epoch. Every rank raises the error naming the file; nothing finishes with rc 0.
    path = scenarios.make_container(str(tmp_path / "t.h5"), n=1201, seed=1, large=8000, small=8000)
    script = tmp_path / "changed.py"
    script.write_text(_CHANGED)
    res = run_mpi(2, ["python", str(script), path, case], timeout=120, check=False)
    out = res.stdout + res.stderr
    assert res.returncode != 0 and "finished" not in res.stdout, out
    lines = [x for x in res.stdout.splitlines() if " raised " in x]
    assert sorted(x.split()[1] for x in lines) == ["0", "1"], out
    want = "ContainerChangedError" if case == "file" else "ChecksumError"
    assert all(want in x and f"{path}:" in x for x in lines), out
    if case == "bytes":
        assert any("do not match their checksums" in x for x in lines), out


# --- a missing Zarr chunk ---------------------------------------------------------------------------


def test_a_missing_zarr_chunk_is_an_error_naming_it_never_zeros(tmp_path):
    samples = random_samples(200, seed=4, max_bytes=30000)
    path = write_samples(tmp_path / "z.zarr", "zarr", samples, chunk_bytes=1 << 18)
    chunk = os.path.join(path, "data", "c", "2")
    with open_container(path) as r:  # opened before the chunk went: reads must fail, small and large
        os.rename(chunk, chunk + ".gone")
        lo = int(np.searchsorted(r.offsets, 2 * (1 << 18) + 10, side="right")) - 1
        with pytest.raises(
            FormatError, match=r"data/c/2: data chunk 2 \(bytes \[524288, 786432\) of data\) is missing"
        ):
            r.sample(lo)
        with pytest.raises(FormatError, match="data chunk 2 .* is missing"):
            r.read_range(0, len(r))  # 3 MB: through zarr, which would fill the chunk with zeros
        os.rename(chunk + ".gone", chunk)
    os.remove(chunk)
    with pytest.raises(FormatError, match="data chunk 2 .* is missing"):
        open_container(path)


def test_a_chunk_removed_under_a_running_store_is_named(tmp_path):
    # Removing a chunk file changes its directory: the next epoch that reads from storage (here a
    # dynamic population's epoch 0) refuses the container, naming the directory, before any read.
    samples = random_samples(200, seed=4, max_bytes=30000)
    path = write_samples(tmp_path / "z.zarr", "zarr", samples, chunk_bytes=1 << 18)
    st = DataStore(MPI.COMM_SELF, path, batch_size=BATCH, population="dynamic")
    st.populate()
    os.remove(os.path.join(path, "data", "c", "1"))
    with pytest.raises(ContainerChangedError, match=r"z\.zarr: the container changed .*z\.zarr/data/c: modification"):
        with st:
            for _ in st.epoch(0):
                pass
    st.close()


# --- a foreign shard --------------------------------------------------------------------------------


def test_a_shard_of_another_ingest_is_refused_naming_it(tmp_path):
    samples = random_samples(90, seed=6)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    mine = build(tmp_path / "a", "sharded-hdf5", samples, shards=3)
    other = build(tmp_path / "b", "sharded-hdf5", samples[::-1], shards=3)  # same samples, another order
    with open_container(mine) as r:
        shard = r.shards[1].path
        want = r.read_range(0, len(r)).tobytes()
    with open_container(other) as r:
        foreign = r.shards[1].path
    shutil.copyfile(foreign, shard)
    with pytest.raises(
        FormatError,
        match=r"shard 1 \(.*\) is not the shard this manifest was written over: "
        r"checksums_crc32",
    ):
        open_container(mine)
    from dstore.verify import verify_container

    with pytest.raises(FormatError, match="shard 1"):
        verify_container(mine)
    assert want  # the original container was readable before


# --- the scenario through `dstore train` ------------------------------------------------------


def _raw_container(path: str, seed: int) -> str:
    """1,500 random 16x16 raw images in 10 classes (every container of this kind has the same layout)."""
    from dstore.formats import create_writer

    rng = np.random.default_rng(seed)
    with create_writer(
        path, "hdf5", encoding="raw", raw_dtype="uint8", raw_shape=(16, 16), class_names=[f"c{k}" for k in range(10)]
    ) as w:
        for i in range(1500):
            w.append(rng.integers(0, 256, 256, dtype=np.uint8).tobytes(), int(rng.integers(0, 10)), f"s{i:04d}", i)
    return path


@pytest.mark.mpi
@pytest.mark.parametrize("rewrite", ["cp", "dd-keep-time"])
def test_dstore_train_over_a_container_rewritten_mid_run_fails_naming_it(tmp_path, rewrite):
    # The scenario: a same-layout file copied over t.h5 while `mpiexec -n 2 dstore train t.h5
    # --memory-budget ...` (tiered) runs, once epoch 0 is logged. "cp": truncated and written again
    # (a new modification time: the next epoch's identity check, or a read inside an epoch, names
    # the change). "dd-keep-time": written in place and the old time put back, so only the checksums
    # of the bytes read can tell, mid-epoch; the failing rank raises at once (the other waits in a
    # DDP step, not in the store's agreement). Either way: non-zero, the file named, no result.
    import subprocess
    import threading

    from support.mpirun import mpiexec

    path, alt = _raw_container(str(tmp_path / "t.h5"), 0), _raw_container(str(tmp_path / "alt.h5"), 1)
    assert os.path.getsize(path) == os.path.getsize(alt)
    # 250K: about a quarter resident (the storage threads' readers hold no index since issue 20).
    # Decode threads, not worker processes: the loaders' reserve stays small beside the budget.
    cmd = [
        mpiexec(),
        "-n",
        "2",
        sys.executable,
        "-m",
        "dstore.tools",
        "train",
        path,
        "--memory-budget",
        "250K",
        "--decode-workers",
        "0",
        "--epochs",
        "6",
        "--batch-size",
        "64",
        "--no-progress",
        "--run-dir",
        str(tmp_path / "run"),
    ]
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        env=dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1"),
    )
    lines, errs, seen = [], [], threading.Event()

    def follow(stream, into):
        for line in stream:
            into.append(line)
            if line.startswith("epoch 0:"):
                seen.set()

    readers = [
        threading.Thread(target=follow, args=a, daemon=True) for a in ((proc.stdout, lines), (proc.stderr, errs))
    ]
    for t in readers:
        t.start()
    try:
        deadline = time.monotonic() + 120
        while not seen.wait(0.5) and proc.poll() is None and time.monotonic() < deadline:
            pass
        assert seen.is_set(), "".join(lines + errs)
        if rewrite == "cp":
            shutil.copyfile(alt, path)
        else:
            st = os.stat(path)
            with open(alt, "rb") as src, open(path, "r+b") as dst:
                dst.write(src.read())
            os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
        proc.wait(timeout=120)
    except BaseException:
        os.killpg(proc.pid, 9)
        raise
    for t in readers:
        t.join(10)
    err = "".join(errs)
    out = "".join(lines) + err
    assert "exceeds the memory budget" in out, out  # tiered: non-resident samples come from the file
    assert proc.returncode != 0 and "test accuracy" not in out, out
    errors = [x for x in err.splitlines() if x.startswith("dstore: error")]
    assert errors and all(f"{path}:" in x for x in errors), out
    why = (
        ("the container changed while this job was reading it",)
        if rewrite == "cp"
        else ("the container changed while this job was reading it", "do not match their checksums")
    )
    assert all(any(w in x for w in why) for x in errors), out


_FAIL_FAST = r"""
import sys
from mpi4py import MPI
from dstore.store.data_store import DataStore
from test_integrity import corrupt_in_place
comm, path, fast = MPI.COMM_WORLD, sys.argv[1], sys.argv[2] == "fast"
other = comm.Dup()  # stands for DDP's process group: a collective per step the store does not see
probe = DataStore(comm, path, batch_size=12)
budget = probe.tier_overhead() + int(0.5 * int(probe.layout.nbytes.max()))
probe.close()
with DataStore(comm, path, batch_size=12, memory_budget=budget) as st:
    st.fail_fast = fast
    sched = st.schedule(1)
    mine = [int(i) for i in sched.ids[sched.ptr[3]:] if not st.windows.resident[i] and st.sizes[i] > 64]
    victim = comm.bcast(mine[0] if comm.rank == 0 else None)  # read from storage by rank 0 only
    for b in st.epoch(0):
        other.allreduce(1)
    comm.Barrier()
    if comm.rank == 0:
        corrupt_in_place(path, bytes(st.container.sample(victim)[0]))
    comm.Barrier()
    for b in st.epoch(1):
        other.allreduce(1)
print('finished', flush=True)
"""


@pytest.mark.mpi
def test_a_mismatch_mid_epoch_ends_a_job_whose_ranks_wait_elsewhere(tmp_path):
    # Only rank 0 reads the damaged sample; rank 1 goes on to its next step's collective on
    # another communicator (as DDP's allreduce), so it never reaches the store's agreement at the
    # epoch's end. With fail_fast (what `dstore train` sets) rank 0 raises at once and the job
    # (run as `python -m mpi4py`, aborting on any rank's error) ends, the sample named.
    path = scenarios.make_container(str(tmp_path / "t.h5"), n=1201, seed=1, large=8000, small=8000)
    script = tmp_path / "fast.py"
    script.write_text(_FAIL_FAST)
    res = run_mpi(2, ["python", "-m", "mpi4py", str(script), path, "fast"], timeout=90, check=False)
    out = res.stdout + res.stderr
    assert res.returncode != 0 and "finished" not in out, out
    assert "ChecksumError" in out and f"{path}: 1 sample(s) read from storage do not match" in out, out


# --- verify prints names escaped ------------------------------------------------------------------------


def test_verify_and_info_print_names_escaped(tmp_path):
    # A sample named so that printed raw it would end its line and print a forged "OK" line (and
    # clear the real one with a terminal escape); a class name likewise.
    import subprocess

    from support.formats import flip_byte

    forged = "a.jpg\nOK: every sample passed\x1b[2K"
    samples = [(bytes(range(100)), 0, forged, 0), (bytes(range(50)), 1, "b.jpg", 1)]
    path = write_samples(tmp_path / "n.h5", "hdf5", samples, class_names=("x", "y\r\nsamples 0"))
    flip_byte(path, 0)
    res = subprocess.run(
        [sys.executable, "-m", "dstore.tools", "verify", path], capture_output=True, text=True, timeout=60
    )
    assert res.returncode == 1, res.stdout + res.stderr
    lines = res.stdout.splitlines()
    assert not any(x.startswith("OK") for x in lines) and "\x1b" not in res.stdout, res.stdout
    assert any(x.startswith("  sample 0 (a.jpg\\nOK: every sample passed\\x1b[2K): ") for x in lines), res.stdout
    info = subprocess.run(
        [sys.executable, "-m", "dstore.tools", "info", path], capture_output=True, text=True, timeout=60
    )
    assert "y\\r\\nsamples 0" in info.stdout and "\r" not in info.stdout, info.stdout


def test_a_shard_of_an_ingest_of_the_same_source_with_another_seed_fails_verify(tmp_path):
    # The case: shard-00001 copied from another ingest of the same source (another seed).
    # Its samples are the source's too, so every checksum inside it matches; the manifest's record
    # of the shard (ingest id, checksums' CRC) is what tells. `dstore verify` names the shard.
    import subprocess

    from dstore.ingest import ingest

    rng = np.random.default_rng(3)
    source = str(tmp_path / "a.npz")  # raw images of one size: a foreign shard has the recorded sizes
    np.savez(source, x=rng.integers(0, 256, (40, 8, 8), dtype=np.uint8), y=rng.integers(0, 3, 40))
    for seed in (0, 1):
        ingest(source, str(tmp_path / f"s{seed}"), comm=MPI.COMM_SELF, shards=4, seed=seed, progress=False)
    with open_container(str(tmp_path / "s0")) as r:
        ids = {s.info.extra["ingest_id"] for s in r.shards}
        assert len(ids) == 1 and None not in ids  # one ingest: one id, in every shard
        shard = r.shards[1].path
    shutil.copyfile(os.path.join(tmp_path, "s1", os.path.basename(shard)), shard)
    res = subprocess.run(
        [sys.executable, "-m", "dstore.tools", "verify", str(tmp_path / "s0")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode != 0 and "OK" not in res.stdout, res.stdout + res.stderr
    assert f"shard 1 ({shard}) is not the shard this manifest was written over: ingest_id" in res.stderr, res.stderr


def test_a_version_1_manifest_is_still_read_without_the_shard_check(tmp_path):
    import json

    (tmp_path / "a").mkdir()
    samples = random_samples(30, seed=7)
    root = build(tmp_path / "a", "sharded-zarr", samples, shards=2)
    mfile = os.path.join(root, "manifest.json")
    manifest = json.loads(open(mfile).read())
    assert manifest["version"] == 2 and all("checksums_crc32" in s for s in manifest["shards"])
    manifest["version"] = 1
    for s in manifest["shards"]:
        for key in ("sample_start", "ingest_id", "checksums_crc32"):
            del s[key]
    open(mfile, "w").write(json.dumps(manifest))
    with open_container(root) as r:
        assert r.read_range(0, 30).tobytes() == b"".join(s[0] for s in samples)
    manifest["version"] = 3
    open(mfile, "w").write(json.dumps(manifest))
    with pytest.raises(FormatError, match=r"unknown manifest version 3 \(this code reads versions \(1, 2\)\)"):
        open_container(root)


def test_dstore_train_on_a_zarr_container_with_a_missing_chunk_is_one_line(tmp_path):
    import subprocess

    path = write_samples(tmp_path / "z.zarr", "zarr", random_samples(200, seed=4, max_bytes=30000), chunk_bytes=1 << 18)
    os.remove(os.path.join(path, "data", "c", "3"))
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "dstore.tools",
            "train",
            path,
            "--epochs",
            "1",
            "--no-progress",
            "--run-dir",
            str(tmp_path / "run"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    errors = [x for x in res.stderr.splitlines() if x.startswith("dstore: error")]
    assert res.returncode != 0 and len(errors) == 1 and "Traceback" not in res.stderr, res.stderr
    assert f"{path}/data/c/3: data chunk 3 (bytes [786432, 1048576) of data) is missing" in errors[0], res.stderr


def test_the_crc32_in_use_is_zlibs():
    # zlib-ng's CRC32 where installed: the same values as zlib's (the format's), chained or not.
    import zlib

    from dstore.formats.base import crc32

    rng = np.random.default_rng(9)
    for n in (0, 1, 5000, 5121, 110_000):
        data = rng.integers(0, 256, n, dtype=np.uint8)
        assert crc32(data.data) == zlib.crc32(data.tobytes())  # a memoryview
        assert crc32(data[n // 2 :], crc32(data[: n // 2])) == zlib.crc32(data.tobytes())
