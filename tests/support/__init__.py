"""Helpers shared by the tests and by the scenario scripts they launch under mpiexec.

Imported as `from support.formats import ...`: tests/ is on sys.path once, through
`pythonpath = ["tests"]` in pyproject.toml for pytest, and through $PYTHONPATH, which
`support.mpirun.run_mpi` sets, for the scripts it launches.
"""
