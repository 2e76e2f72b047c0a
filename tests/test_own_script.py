"""A user's own script is as safe as `dstore train`: while a DataStore or a process group is open, an
uncaught exception on one rank prints once and ends the whole `mpiexec` job (it hung until killed);
started by torchrun (N separate 1-rank MPI worlds) it is refused with the launch line to use."""

import os
import subprocess
import sys

import pytest
from mpi4py import MPI
from support.formats import raw_container
from support.mpirun import run_mpi

from dstore import DataStore
from dstore.runtime import job

LAUNCH_VARS = (
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "SLURM_STEP_NUM_TASKS",
    "OMPI_COMM_WORLD_SIZE",
    "PMI_SIZE",
    "RANK",
    "SLURM_PROCID",
    "TORCHELASTIC_RUN_ID",
)


# Rank 1 raises in the middle of an epoch; rank 0 goes on to the next collective (the next epoch's
# agreement, a DDP allreduce, a Barrier), where without the hook it waited forever.
STORE_SCRIPT = """
import sys
from mpi4py import MPI
from dstore import DataStore
comm = MPI.COMM_WORLD
with DataStore(comm, sys.argv[1], batch_size=4) as store:
    for step, batch in enumerate(store.epoch(0)):
        if comm.rank == 1 and step == 2:
            raise ValueError("boom on rank one")
    comm.Barrier()
print("not reached", flush=True)
"""

DIST_SCRIPT = """
import torch, torch.distributed as dist
from mpi4py import MPI
from dstore.training.dist import init_distributed
comm = MPI.COMM_WORLD
with init_distributed(comm, "cpu") as ctx:
    if comm.rank == 1:
        raise ValueError("boom on rank one")
    dist.all_reduce(torch.ones(1), group=ctx.group)
print("not reached", flush=True)
"""


def _env(**extra):
    env = {k: v for k, v in os.environ.items() if k not in LAUNCH_VARS}
    env.update(extra)
    return env


@pytest.mark.mpi
@pytest.mark.parametrize("body", [STORE_SCRIPT, DIST_SCRIPT], ids=["datastore", "init_distributed"])
def test_an_exception_on_one_rank_ends_the_job_once(tmp_path, body):
    script = tmp_path / "own.py"
    script.write_text(body)
    path = raw_container(tmp_path / "c.h5")
    res = run_mpi(2, ["python", str(script), path], timeout=60, check=False, env=_env())
    assert res.returncode != 0, res
    assert "not reached" not in res.stdout
    assert res.stderr.count("ValueError: boom on rank one") == 1, res.stderr
    assert "dstore: error on rank 1/2: Traceback" in res.stderr, res.stderr


def test_the_hook_is_held_while_open_and_given_back_on_a_clean_close(tmp_path):
    # Holds left by earlier tests in this process (a store that raised keeps its hold: the error is
    # on its way up) are counted, not assumed away.
    before, holds = sys.excepthook, job._armed
    path = raw_container(tmp_path / "c.h5")
    with DataStore(MPI.COMM_SELF, path, batch_size=4) as a:
        assert sys.excepthook is job._hook and job.armed()
        sys.excepthook = lambda *args: None  # as torch's init_process_group does
        with DataStore(MPI.COMM_SELF, path, batch_size=4):
            pass
        assert sys.excepthook is job._hook  # taken back on top, and the outer store still holds it
        a.close()
        a.close()  # twice: no second release
    assert job._armed == holds
    if holds == 0:
        assert sys.excepthook is before and not job.armed()


TORCHRUN_SCRIPT = """
import sys
from mpi4py import MPI
from dstore import DataStore
with DataStore(MPI.COMM_WORLD, sys.argv[1], batch_size=4):
    pass
print("trained alone", flush=True)
"""


@pytest.mark.parametrize(
    "env",
    [
        {"WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2", "TORCHELASTIC_RUN_ID": "x"},  # torchrun
        {"SLURM_STEP_NUM_TASKS": "2", "SLURM_PROCID": "0"},  # srun without PMI
    ],
)
@pytest.mark.parametrize("rank", ["0", "1"])
def test_a_script_started_by_torchrun_is_refused_in_one_line(tmp_path, env, rank):
    script = tmp_path / "own.py"
    script.write_text(TORCHRUN_SCRIPT)
    path = raw_container(tmp_path / "c.h5")
    env = _env(**env, RANK=rank) if "WORLD_SIZE" in env else _env(**{**env, "SLURM_PROCID": rank})
    res = subprocess.run([sys.executable, str(script), path], capture_output=True, text=True, timeout=60, env=env)
    assert res.returncode != 0 and "trained alone" not in res.stdout
    if rank == "0":
        lines = res.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("dstore: error: LauncherError: "), res.stderr
        assert "mpiexec -n 2 python your_script.py" in lines[0], lines
    else:
        assert res.stderr == "", res.stderr  # one copy per job: the launcher's rank 0 prints


# ------------------------------------------------------------------ preemption flag for own loops
def test_a_preemption_signal_sets_the_flag_and_is_given_back(tmp_path):
    import signal

    from dstore.errors import ConfigError
    from dstore.runtime.preemption import Preemption, parse_signals

    assert parse_signals("sigterm, USR1") == ("TERM", "USR1") and parse_signals("none") == ()
    with pytest.raises(ConfigError, match="KILL"):
        parse_signals("TERM,KILL")
    before = signal.getsignal(signal.SIGUSR1)
    with Preemption("USR1") as preempt:
        assert not preempt.requested and not preempt.agreed(MPI.COMM_SELF)
        os.kill(os.getpid(), signal.SIGUSR1)
        assert preempt.requested and preempt.received == "USR1" and preempt.agreed(MPI.COMM_SELF)
    assert signal.getsignal(signal.SIGUSR1) is before
