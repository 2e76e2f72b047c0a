"""Whole jobs under faults (docs/reliability.md): a rank killed with SIGKILL during `dstore train`
ends the job, and `--resume` continues from the last checkpoint to the end; two jobs writing one
output at once leave one whole container, never a mix of both."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from typing import Any

import numpy as np
import pytest
from support.ingest import check_container_against_folder, small_jpegs
from support.mpirun import REPO, mpiexec, run_mpi

from dstore.formats import ContainerExistsError, create_writer, open_container
from dstore.formats.lock import lock_path

pytestmark = pytest.mark.mpi


def _launch(argv: list[str], env: dict | None = None) -> subprocess.Popen:
    """`mpiexec -n 2 python <argv>` in its own session, output captured."""
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", **(env or {})}
    return subprocess.Popen(
        [mpiexec(), "-n", "2", sys.executable, *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=full_env,
        cwd=REPO,
        start_new_session=True,
    )


def _finish(proc: subprocess.Popen, timeout: float) -> tuple[int, str, str]:
    """(returncode, stdout, stderr) of a launched job; a job still running after `timeout` is a hang."""
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        raise AssertionError(
            f"HANG: {proc.args} still running after {timeout}s\n--- stdout ---\n{out}\n--- stderr ---\n{err}"
        ) from None
    return proc.returncode, out, err


def _rank_pid(root: int, rank: int) -> int | None:
    """The pid of MPI rank `rank` among the descendants of process `root` (hydra gives each rank
    its own session, so it is found by ancestry and its PMI_RANK)."""
    parents = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as f:
                    parents[int(name)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                pass
    family = {root}
    while True:
        more = {p for p, pp in parents.items() if pp in family} - family
        if not more:
            break
        family |= more
    for pid in sorted(family - {root}):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if f"PMI_RANK={rank}".encode() in f.read().split(b"\0"):
                    return pid
        except OSError:
            pass
    return None


def _raw_container(path, n=400, seed=0):
    rng = np.random.default_rng(seed)
    with create_writer(
        str(path), "hdf5", encoding="raw", class_names=["a", "b", "c", "d"], raw_dtype="uint8", raw_shape=(8, 8, 1)
    ) as w:
        for i in range(n):
            w.append(rng.integers(0, 256, 64, dtype=np.uint8).tobytes(), i % 4, f"s{i}", i)
    return str(path)


def test_kill_9_of_a_rank_during_training_ends_the_job_and_resume_finishes(tmp_path):
    import torch

    from dstore.training.metrics import read_jsonl

    data = _raw_container(tmp_path / "c.h5")  # 320 training samples, global batch 32: 10 steps an epoch
    run = tmp_path / "run"
    common = [
        "--batch-size",
        "32",
        "--checkpoint-every",
        "2",
        "--seed",
        "1",
        "--log-batches",
        "--no-progress",
        "--run-dir",
        str(run),
    ]
    proc = _launch(["-m", "dstore.tools", "train", data, "--epochs", "40"] + common)
    checkpoint = run / "checkpoint.pt"
    deadline = time.monotonic() + 120
    while not checkpoint.exists() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.02)
    assert checkpoint.exists(), _finish(proc, 60)  # (a job that ended, or hung, before its first checkpoint)
    pid = _rank_pid(proc.pid, 1)
    assert pid is not None, "rank 1 not found"
    os.kill(pid, signal.SIGKILL)
    code, out, err = _finish(proc, 60)  # the job must end, not hang
    assert code != 0 and "signal 9" in out + err, (code, out, err)

    saved = torch.load(checkpoint, weights_only=True)
    step = int(saved["global_step"])
    assert 0 < step < 20, step  # killed within the first two epochs, so the resumed run has work left
    logged = {r: len(read_jsonl(run / f"batches.rank{r}.jsonl")) for r in (0, 1)}

    res = run_mpi(2, ["dstore", "train", data, "--resume", "auto", "--epochs", "2"] + common, timeout=120)
    assert "resumed from" in res.stdout and f"(global step {step})" in res.stdout, res.stdout
    assert int(torch.load(checkpoint, weights_only=True)["global_step"]) == 20
    for r in (0, 1):  # the resumed run trains every step from the checkpoint to the end, each once
        batches = read_jsonl(run / f"batches.rank{r}.jsonl")[logged[r] :]
        assert [(b["epoch"], b["step"]) for b in batches] == [divmod(s, 10) for s in range(step, 20)], r


SLOW_INGEST = """
import sys, time
from mpi4py import MPI
from dstore.ingest import ingest
from dstore.ingest.folder import FolderSource

load, slow_rank = FolderSource.load, int(sys.argv[3])


def slow_load(self, i):  # the rank that writes shard `slow_rank` takes seconds, the other not
    time.sleep(0.08 if MPI.COMM_WORLD.rank == slow_rank else 0.005)
    return load(self, i)


FolderSource.load = slow_load
ingest(sys.argv[1], sys.argv[2], shards=2, overwrite=True, progress=False)
"""


def test_two_jobs_writing_one_output_at_once_leave_one_whole_container(tmp_path):
    """Two sharded `--overwrite` ingests of different sources into one output, the second started
    while the first writes; the first writes its shard 0 fast and shard 1 slowly, the second the
    other way round, so their renames interleave. Before the output lock both jobs succeeded and
    left a manifest over the second's shard 0 and the first's shard 1 (verify passed: each shard is
    whole); with two plain concurrent runs that happened about 1 run in 4."""
    sources = [tmp_path / "a", tmp_path / "b"]
    for seed, src in enumerate(sources):
        small_jpegs(str(src), 60, seed=seed + 1)  # same names, other bytes: a mix shows
    script = tmp_path / "slow.py"
    script.write_text(SLOW_INGEST)
    out = tmp_path / "out"
    first = _launch([str(script), str(sources[0]), str(out), "1"])
    while not (out.exists() and any(n.endswith(".lock") or ".tmp-" in n for n in os.listdir(out))):
        assert first.poll() is None, _finish(first, 10)
        time.sleep(0.01)
    second = _launch([str(script), str(sources[1]), str(out), "0"])
    results = [_finish(first, 120), _finish(second, 120)]
    ok = [src for src, (code, _, _) in zip(sources, results) if code == 0]
    assert ok, results
    for code, _, err in results:
        if code != 0:  # refused at once, by name, leaving the other job's output alone
            assert "is being written by another job" in err and str(out) in err, err
    # One whole container: every sample from one source (the job that ended last and succeeded).
    matches = []
    for src in ok:
        try:
            check_container_against_folder(str(out), str(src), check_index=False)
            matches.append(src)
        except AssertionError:
            pass
    assert len(matches) == 1, (matches, results)
    assert not [n for n in os.listdir(tmp_path) if n.endswith(".lock")]
    assert sorted(os.listdir(out)) == ["manifest.json", "shard-00000-of-00002.h5", "shard-00001-of-00002.h5"]


def test_a_second_writer_of_one_path_is_refused_and_a_stale_lock_blocks_nothing(tmp_path):
    path = str(tmp_path / "c.h5")
    args: dict[str, Any] = dict(encoding="raw", class_names=["a"], raw_dtype="uint8", raw_shape=(1,))
    first = create_writer(path, "hdf5", overwrite=True, **args)
    with pytest.raises(ContainerExistsError, match="being written by another job"):
        create_writer(path, "zarr", overwrite=True, **args)  # (it replaced the first's output silently)
    first.append(b"\x01", 0, "x")
    first.commit()
    assert not os.path.exists(lock_path(path))  # a writer that ends removes its lock
    # A job killed with SIGKILL leaves its lock file, but not its lock: the next writer goes on.
    open(lock_path(path), "w").close()
    with create_writer(path, "hdf5", overwrite=True, **args) as w:
        w.append(b"\x02", 0, "y")
    with open_container(path) as c:
        assert bytes(c.sample(0)[0]) == b"\x02"
    assert not os.path.exists(lock_path(path))
