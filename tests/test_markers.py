"""The test suite's own rules: markers are declared (--strict-markers) and every test that launches
mpiexec is marked `mpi`, so `pytest -m "not mpi"` is the fast loop without any mpiexec."""

import pytest
from support import mpirun


def test_an_unmarked_test_cannot_launch_mpiexec():
    assert mpirun.MARKED is False
    with pytest.raises(AssertionError, match="mark it @pytest.mark.mpi"):
        mpirun.mpiexec()


@pytest.mark.mpi
def test_a_marked_test_can():
    assert mpirun.MARKED is True and mpirun.mpiexec()
