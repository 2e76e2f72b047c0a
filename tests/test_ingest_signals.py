"""An ingest ended by a signal before anything was durable leaves nothing of its own behind (issue 19,
partly held): SIGTERM unwinds as Ctrl-C does; what a SIGKILLed writer left is removed by the next
writer of that output (and accepted by --overwrite of a sharded output); an aborted job's MPICH
/dev/shm file goes. (What an interrupted ingest made durable is kept for a resume: test_ingest_resume.)"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
from support.mpirun import REPO, mpiexec

from dstore.formats import open_container
from dstore.ingest import ingest


def _leftovers(folder):
    return sorted(os.path.relpath(os.path.join(r, f), folder) for r, _, fs in os.walk(folder) for f in fs)


def _signal_mid_ingest(tmp_path, sig, *args, mpi=0):
    """Starts `dstore ingest synthetic ARGS`, sends `sig` once its first temporary exists (in the
    journal beside the output), before its first checkpoint; returns (returncode, output)."""
    cmd = [sys.executable, "-m", "dstore.tools", "ingest", "synthetic", *args, "--count", "3000", "--no-progress"]
    if mpi:
        cmd = [mpiexec(), "-n", str(mpi), *cmd]
    proc = subprocess.Popen(
        cmd,
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        env={**os.environ, "PYTHONPATH": str(REPO), "DSTORE_INGEST_CHECKPOINT": "1000"},
    )
    try:
        deadline = time.monotonic() + 120
        while not any(".a0." in f for f in _leftovers(tmp_path)):
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.05)
        proc.send_signal(sig)
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return proc.returncode, out


@pytest.mark.parametrize("args", [("out.h5",), ("outdir", "--shards", "2")], ids=["file", "sharded"])
def test_sigterm_during_ingest_removes_its_temporaries_as_sigint_does(tmp_path, args):
    rc, out = _signal_mid_ingest(tmp_path, signal.SIGTERM, *args)
    assert rc == 143 and "terminated (SIGTERM)" in out and "Traceback" not in out, out
    assert _leftovers(tmp_path) == [], out


@pytest.mark.mpi
def test_sigterm_to_mpiexec_during_a_sharded_ingest_leaves_nothing(tmp_path):
    rc, out = _signal_mid_ingest(tmp_path, signal.SIGTERM, "outdir", "--shards", "2", mpi=2)
    assert rc != 0 and "terminated (SIGTERM)" in out, out
    assert _leftovers(tmp_path) == [], out


def test_a_killed_writers_temporaries_go_with_the_next_writer_and_overwrite(tmp_path):
    from mpi4py import MPI

    stale = ".out.h5.tmp-999999-0123abcd"
    (tmp_path / stale).write_bytes(b"x" * 1000)  # as a SIGKILLed writer leaves it
    (tmp_path / ".out.h5.lock").write_bytes(b"")
    (tmp_path / ".other.h5.tmp-999999-0123abcd").write_bytes(b"y")  # another output's: not ours to take
    ingest("synthetic", str(tmp_path / "out.h5"), comm=MPI.COMM_SELF, count=12, progress=False)
    assert _leftovers(tmp_path) == [".other.h5.tmp-999999-0123abcd", "out.h5"]

    out = tmp_path / "outdir"
    ingest("synthetic", str(out), comm=MPI.COMM_SELF, count=12, shards=2, progress=False)
    for name in (
        ".shard-00000-of-00002.h5.tmp-999999-0123abcd",
        ".shard-00000-of-00002.h5.lock",
        ".shard-00001-of-00003.h5.tmp-999999-89abcdef",
    ):  # also of a run with another shard count
        (out / name).write_bytes(b"z")
    ingest("synthetic", str(out), comm=MPI.COMM_SELF, count=12, shards=2, progress=False, overwrite=True)
    assert [f for f in _leftovers(out) if f.startswith(".")] == []
    with open_container(str(out)) as r:
        assert r.num_samples == 12


@pytest.mark.mpi
def test_an_aborted_job_removes_its_mpich_shm_file(tmp_path):
    """MPICH removes /dev/shm/mpich_shm_* in MPI_Finalize, never on MPI_Abort: each aborted job left one."""
    script = tmp_path / "abort.py"
    script.write_text(
        "from mpi4py import MPI\nfrom dstore.runtime import job\nimport time\n"
        "maps = sorted({l.split(None, 5)[5].strip() for l in open('/proc/self/maps') if 'mpich_shm_' in l})\n"
        "print('MAPPED', *maps, flush=True)\nMPI.COMM_WORLD.Barrier()\n"
        "if MPI.COMM_WORLD.Get_rank() == 1:\n    job.report_and_abort(3, 'boom')\ntime.sleep(60)\n"
    )
    res = subprocess.run(
        [mpiexec(), "-n", "2", sys.executable, str(script)], capture_output=True, text=True, timeout=120, cwd=REPO
    )
    assert res.returncode == 3, res
    mapped = {p for line in res.stdout.splitlines() if line.startswith("MAPPED") for p in line.split()[1:]}
    if not mapped:
        pytest.skip("this MPI library maps no /dev/shm/mpich_shm_* file")
    assert not [p for p in mapped if os.path.exists(p)], mapped


def _png_folder(root, mode):
    from PIL import Image

    (root / "a").mkdir(parents=True)
    for i in range(4):
        Image.new("RGB", (8, 8), (i, i, i)).save(root / "a" / f"{i}.png")
    root.chmod(mode)
    return root


@pytest.mark.parametrize("fmt, out, shards", [("hdf5", "out.h5", 1), ("zarr", "out.zarr", 1), ("hdf5", "outdir", 2)])
def test_a_private_source_gives_a_private_container(tmp_path, fmt, out, shards):
    from mpi4py import MPI

    src = _png_folder(tmp_path / "private", 0o700)
    old = os.umask(0o022)
    try:
        ingest(str(src), str(tmp_path / out), comm=MPI.COMM_SELF, fmt=fmt, shards=shards, progress=False)
        assert os.umask(0o022) == 0o022  # put back after the ingest
    finally:
        os.umask(old)
    modes = {p: os.stat(os.path.join(r, p)).st_mode & 0o777 for r, ds, fs in os.walk(tmp_path / out) for p in ds + fs}
    modes[out] = os.stat(tmp_path / out).st_mode & 0o777
    assert all(m & 0o077 == 0 for m in modes.values()), modes


def test_a_readable_source_keeps_the_umask(tmp_path):
    from mpi4py import MPI

    src = _png_folder(tmp_path / "shared", 0o755)
    old = os.umask(0o022)
    try:
        ingest(str(src), str(tmp_path / "out.h5"), comm=MPI.COMM_SELF, progress=False)
    finally:
        os.umask(old)
    assert os.stat(tmp_path / "out.h5").st_mode & 0o777 == 0o644
