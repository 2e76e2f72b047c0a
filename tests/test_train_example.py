"""The documented "use the store from your own script" example runs under mpiexec -n 2 and learns."""

import re
from pathlib import Path

import pytest
from mpirun import REPO, run_mpi


@pytest.mark.mpi
def test_own_script_example_runs(tmp_path):
    script = REPO / "docs" / "examples" / "train_own_script.py"
    # No container: the example ingests digits into a temporary directory (here under tmp_path).
    res = run_mpi(2, ["python", str(script), "--epochs", "3"], timeout=120, env={"TMPDIR": str(tmp_path)})
    m = re.search(r"test accuracy ([0-9.]+) on (\d+) samples", res.stdout)
    assert m, res.stdout + res.stderr
    assert int(m.group(2)) == 1797 - int(1797 * 0.8)
    assert float(m.group(1)) > 0.6, res.stdout  # chance is 0.1
    assert list(Path(tmp_path).glob("*/digits.h5"))
