"""The documented "use the store from your own script" example runs under mpiexec -n 2 and learns,
and, stopped mid-epoch and started again from its checkpoint (the loader's state_dict), ends with
exactly the model of the run that was never stopped."""

import re
from pathlib import Path

import pytest
from support.formats import raw_container
from support.mpirun import REPO, run_mpi

SCRIPT = REPO / "docs" / "examples" / "train_own_script.py"
RESULT = r"test accuracy ([0-9.]+) on (\d+) samples; weight sum (\S+)"


@pytest.fixture(scope="module")
def full_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("example")
    # No container: the example ingests digits into a temporary directory (here under tmp).
    res = run_mpi(2, ["python", str(SCRIPT), "--epochs", "3"], timeout=120, env={"TMPDIR": str(tmp)})
    return tmp, res


@pytest.mark.mpi
def test_own_script_example_runs(full_run):
    tmp, res = full_run
    m = re.search(RESULT, res.stdout)
    assert m, res.stdout + res.stderr
    assert int(m.group(2)) == 1797 - int(1797 * 0.8)
    assert float(m.group(1)) > 0.6, res.stdout  # chance is 0.1
    assert list(Path(tmp).glob("*/digits.h5"))
    assert "Warning" not in res.stderr, res.stderr  # a user's first run shows no torch UserWarning


@pytest.mark.mpi
def test_own_script_resumes_from_the_loaders_state_dict(full_run, tmp_path):
    tmp, res = full_run
    (container,) = Path(tmp).glob("*/digits.h5")
    ck = tmp_path / "ck.pt"
    args = ["python", str(SCRIPT), str(container), "--epochs", "3", "--checkpoint", str(ck)]
    # 30 steps: 7 steps into epoch 1 (23 steps per epoch), with the loader's read-ahead in flight.
    stopped = run_mpi(2, args + ["--stop-after-steps", "30"], timeout=120)
    assert "stopped after 30 steps at 1:7" in stopped.stdout, stopped.stdout
    resumed = run_mpi(2, args, timeout=120)
    want, got = re.search(RESULT, res.stdout), re.search(RESULT, resumed.stdout)
    assert want, res.stdout
    assert got, resumed.stdout + resumed.stderr
    assert got.groups() == want.groups(), (res.stdout, resumed.stdout)


def test_own_script_example_takes_any_container(tmp_path):
    """Not only 8x8 grey digits: colour images larger than 32x32, 3 classes (resized by the loader)."""
    import subprocess
    import sys

    path = raw_container(tmp_path / "rgb.h5", n=80, shape=(40, 40, 3), classes=3)
    res = subprocess.run(
        [sys.executable, str(SCRIPT), str(path), "--epochs", "1"], capture_output=True, text=True, timeout=120, cwd=REPO
    )
    assert res.returncode == 0, res.stderr
    m = re.search(RESULT, res.stdout)
    assert m and int(m.group(2)) == 80 - int(80 * 0.8), res.stdout + res.stderr
