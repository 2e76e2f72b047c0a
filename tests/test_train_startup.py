"""`dstore train` before its first step and across its runs in one directory: a preemption signal
during start-up exits 75 saying "no step yet" (the handlers are installed first thing); a new run
in a directory holding a run is refused unless --overwrite; --resume takes the run's own
config.json as its defaults, refuses every disagreeing flag at once, and keeps config.json true."""

import json
import os
import signal
import subprocess
import sys

import pytest
from formats_helpers import raw_container
from mpirun import REPO

from dstore.preemption import PREEMPTED_EXIT

SIGNALLING_FACTORY = '''
import os, signal
from torch import nn

def signals_itself(in_channels, num_classes, image_size):
    """Sends this process SIGTERM while the run starts up (its model is built before any step)."""
    os.kill(os.getpid(), signal.SIGTERM)
    return nn.Sequential(nn.Flatten(), nn.Linear(in_channels * image_size[0] * image_size[1], num_classes))
'''


def dstore(*argv, env=None, timeout=120):
    return subprocess.run([sys.executable, "-m", "dstore.tools", *map(str, argv)], capture_output=True, text=True,
                          timeout=timeout, cwd=REPO, env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})})


@pytest.fixture(scope="module")
def container(tmp_path_factory):
    return raw_container(tmp_path_factory.mktemp("startup") / "c.h5", n=48, shape=(6, 6, 1), classes=3)


def test_a_signal_during_start_up_exits_75_saying_no_step_yet(container, tmp_path):
    (tmp_path / "sig_models.py").write_text(SIGNALLING_FACTORY)
    run_dir = tmp_path / "run"
    res = dstore("train", container, "--model", "sig_models:signals_itself", "--epochs", "1", "--batch-size", "8",
                 "--run-dir", run_dir, env={"PYTHONPATH": str(tmp_path)})
    assert res.returncode == PREEMPTED_EXIT, (res.returncode, res.stdout, res.stderr)
    assert "stopped by SIGTERM during start-up, no step yet: no checkpoint written" in res.stdout, res.stdout
    assert not (run_dir / "checkpoint.pt").exists()
