"""The command line: help works, and an error on one rank ends the whole job (no hang)."""

import subprocess
import sys

import pytest
from support.mpirun import run_mpi


def test_help_lists_commands():
    out = subprocess.run([sys.executable, "-m", "dstore.tools", "--help"], capture_output=True, text=True, check=True)
    assert "dstore" in out.stdout


@pytest.mark.mpi
@pytest.mark.parametrize("nprocs", [2, 4])
def test_error_on_one_rank_ends_job(tmp_path, nprocs):
    # Rank 1 fails; the others would wait forever in a barrier if the CLI did not abort the job.
    script = tmp_path / "fail.py"
    script.write_text(
        "from mpi4py import MPI\n"
        "from dstore.tools.cli import abort_on_error\n"
        "from dstore.errors import FormatError\n"
        "def work():\n"
        "    if MPI.COMM_WORLD.rank == 1:\n"
        "        raise FormatError('bad container /x/y.h5: no completion marker')\n"
        "    MPI.COMM_WORLD.Barrier()\n"
        "import sys; sys.exit(abort_on_error(work))\n"
    )
    res = run_mpi(nprocs, ["python", str(script)], timeout=60, check=False)
    assert res.returncode != 0
    assert "error on rank 1" in res.stderr and "no completion marker" in res.stderr, res.stderr
