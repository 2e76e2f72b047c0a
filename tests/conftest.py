"""Shared fixtures. Multi-rank scenarios run through tests/mpirun.py (real mpiexec, with a timeout)."""

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture(scope="session")
def cache(tmp_path_factory):
    """A $DSTORE_CACHE for training runs: the built-in `digits` set is ingested into it once, by the
    first run that needs it, and reused by the others."""
    return tmp_path_factory.mktemp("cache")
