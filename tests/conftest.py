"""Shared fixtures. Multi-rank scenarios run through tests/support/mpirun.py (real mpiexec, with a timeout).

tests/ is on sys.path through `pythonpath = ["tests"]` in pyproject.toml."""

import os

import pytest
from hypothesis import HealthCheck, settings
from support import mpirun

os.environ.setdefault("OMP_NUM_THREADS", "1")
# The tests run 3-4 ranks on 2 cores: a rank blocked in MPI busy-polls with sched_yield, which on an
# oversubscribed machine keeps the ranks with work off the cores (measured: the store scenarios on
# 4 ranks spent 15 s of system time spinning, 3 s with this). MPICH's heavy yield sleeps between
# polls instead. It changes only how a blocked rank waits, never what MPI delivers; every mpiexec a
# test launches inherits it. A test of how a rank waits sets it back to 0 (test_collective).
os.environ.setdefault("MPIR_CVAR_ENABLE_HEAVY_YIELD", "1")

# Property tests check results, never timings: on a loaded machine (CI, parallel jobs) one example
# can take longer than Hypothesis's 200 ms deadline, or its data generation its too-slow limit, and
# a correct test failed. The "ci" profile, loaded unless $HYPOTHESIS_PROFILE names another
# ("default": Hypothesis's own), has neither; a test's own @settings still overrides it.
settings.register_profile("ci", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


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
