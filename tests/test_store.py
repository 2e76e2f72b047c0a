"""DataStore end to end: the same scenarios (tests/store_scenarios/scenarios.py) in-process on
COMM_SELF and under real `mpiexec -n 1..4` on uneven data, plus an error on one rank ending the job."""

import sys
from pathlib import Path

import pytest
from mpirun import run_mpi

SCEN_DIR = Path(__file__).resolve().parent / "store_scenarios"
sys.path.insert(0, str(SCEN_DIR))
import scenarios  # noqa: E402


@pytest.fixture(scope="module")
def container(tmp_path_factory):
    # 157 samples of 0..20,000 bytes, some empty: not a multiple of the batch (12) nor of 1..4 ranks.
    return scenarios.make_container(str(tmp_path_factory.mktemp("store") / "uneven.h5"))


@pytest.mark.parametrize("name", sorted(scenarios.SCENARIOS))
def test_scenario_in_process_on_comm_self(container, name):
    from mpi4py import MPI

    scenarios.SCENARIOS[name](MPI.COMM_SELF, container)


@pytest.mark.mpi
@pytest.mark.parametrize("nprocs", [1, 2, 3, 4])
def test_scenarios_under_mpiexec(container, nprocs):
    res = run_mpi(nprocs, ["python", "-m", "mpi4py", str(SCEN_DIR / "scenarios.py"), container], timeout=150)
    for name in scenarios.SCENARIOS:
        assert f"OK {name} on {nprocs} ranks" in res.stdout, res.stdout + res.stderr


@pytest.mark.mpi
def test_error_inside_an_epoch_on_one_rank_ends_the_job(container, tmp_path):
    # Rank 1 fails mid-epoch inside `with store:`; its exit must not wait in the collective
    # Win.Free while the others wait in the next epoch's collective: the job must end, non-zero.
    script = tmp_path / "fail.py"
    script.write_text(
        "from mpi4py import MPI\n"
        "from datastore.store import DataStore\n"
        f"with DataStore(MPI.COMM_WORLD, {container!r}, batch_size=12) as st:\n"
        "    for b in st.epoch(0):\n"
        "        if st.rank == 1 and b.step == 3:\n"
        "            raise RuntimeError('boom on rank 1')\n"
        "    for b in st.epoch(1):\n"
        "        pass\n"
    )
    res = run_mpi(3, ["python", "-m", "mpi4py", str(script)], timeout=60, check=False)
    assert res.returncode != 0
    assert "boom on rank 1" in res.stderr


def test_zarr_container_in_process(tmp_path):
    from mpi4py import MPI

    path = scenarios.make_container(str(tmp_path / "uneven.zarr"), n=61, fmt="zarr")
    scenarios.scenario_exactly_once(MPI.COMM_SELF, path)
    scenarios.scenario_dynamic(MPI.COMM_SELF, path)
