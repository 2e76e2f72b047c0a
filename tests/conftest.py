"""Shared fixtures. Multi-rank scenarios run through tests/mpirun.py (real mpiexec, with a timeout)."""

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("OMP_NUM_THREADS", "1")

import mpirun  # found on the path set above


def pytest_runtest_setup(item):
    """Before the test's fixtures: whether it may launch mpiexec (only marked `mpi`; see mpirun.MARKED)."""
    mpirun.MARKED = item.get_closest_marker("mpi") is not None


def pytest_runtest_teardown(item):
    mpirun.MARKED = None


@pytest.fixture(scope="session")
def cache(tmp_path_factory):
    """A $DSTORE_CACHE for training runs: the built-in `digits` set is ingested into it once, by the
    first run that needs it, and reused by the others."""
    return tmp_path_factory.mktemp("cache")
