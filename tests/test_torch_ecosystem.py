"""The loader among PyTorch's tools: DataLoader(loader) must say batch_size=None (else refused:
it silently added a dimension), torchdata's StatefulDataLoader resumes exactly through the
loader's state_dict, and HF Accelerate (given torch_env's MASTER_ADDR/PORT) and Lightning Fabric
(its MPIEnvironment) train under `mpiexec -n 2` with the store feeding them. Each third-party test
runs where the package is installed (none is a dependency) and is skipped with the reason elsewhere."""

import importlib.util

import pytest
from mpi4py import MPI
from support.formats import raw_container
from support.mpirun import REPO, run_mpi
from torch.utils.data import DataLoader

from dstore import DataStore, StoreLoader
from dstore.errors import ConfigError


@pytest.fixture(scope="module")
def container(tmp_path_factory):
    return raw_container(tmp_path_factory.mktemp("eco") / "c.h5")


def _sums(batches):
    return [int(x.sum()) for x, _ in batches]


def test_a_dataloader_that_would_batch_the_batches_is_refused(container):
    with DataStore(MPI.COMM_SELF, container, batch_size=4, seed=1) as store:
        loader = StoreLoader(store)
        with pytest.raises(ConfigError, match="batch_size=None"):
            next(iter(DataLoader(loader)))  # batch_size=1 by default: a (1, 4, 1, 4, 4) batch
        images, labels = next(iter(DataLoader(loader, batch_size=None)))
        assert tuple(images.shape) == (4, 1, 4, 4) and tuple(labels.shape) == (4,)


def test_statefuldataloader_resumes_exactly(container):
    sdl = pytest.importorskip(
        "torchdata.stateful_dataloader", reason="torchdata is not installed (pip install --no-deps torchdata)"
    )
    with DataStore(MPI.COMM_SELF, container, batch_size=4, seed=1) as store:
        full = _sums(StoreLoader(store))
    with DataStore(MPI.COMM_SELF, container, batch_size=4, seed=1) as store:
        dl = sdl.StatefulDataLoader(StoreLoader(store), batch_size=None)
        it = iter(dl)
        first = _sums(next(it) for _ in range(3))
        state = dl.state_dict()
    assert state["dataset_state"]["step"] == 3  # the loader's own state_dict, taken by torchdata
    with DataStore(MPI.COMM_SELF, container, batch_size=4, seed=1) as store:
        dl = sdl.StatefulDataLoader(StoreLoader(store), batch_size=None)
        dl.load_state_dict(state)
        rest = _sums(dl)
    assert first + rest == full and len(full) == 10
    with DataStore(MPI.COMM_SELF, container, batch_size=4, seed=1) as store, pytest.raises(ConfigError):
        next(iter(sdl.StatefulDataLoader(StoreLoader(store))))  # batch_size=1 there too


def _epochs_after_resume(sdl, container, batches: int, finish: bool) -> list[int]:
    """Batches of the first two iterations of a StatefulDataLoader resumed from a state taken after
    `batches` batches of the first epoch (after the `for` saw the epoch's end too, with `finish`)."""
    with DataStore(MPI.COMM_SELF, container, batch_size=4, seed=1) as store:
        dl = sdl.StatefulDataLoader(StoreLoader(store), batch_size=None)
        it = iter(dl)
        for _ in range(batches):
            next(it)
        if finish:
            assert next(it, None) is None
        state = dl.state_dict()
    with DataStore(MPI.COMM_SELF, container, batch_size=4, seed=1) as store:
        dl = sdl.StatefulDataLoader(StoreLoader(store), batch_size=None)
        dl.load_state_dict(state)
        return [len(list(dl)), len(list(dl))]


def test_a_state_taken_after_an_epochs_last_batch_resumes_as_torchdata_resumes_a_dataset(container):
    """torchdata's own map-style resume, the reference: after the last batch of an epoch whose `for`
    has not ended, the resumed loader yields no batch (that epoch's end), then the next epoch; after
    the `for` ended, the next epoch. Before, the store's loader ran a whole extra epoch there."""
    sdl = pytest.importorskip(
        "torchdata.stateful_dataloader", reason="torchdata is not installed (pip install --no-deps torchdata)"
    )
    reference = []
    for finish in (False, True):
        dl = sdl.StatefulDataLoader(list(range(40)), batch_size=4)
        it = iter(dl)
        for _ in range(10):
            next(it)
        if finish:
            assert next(it, None) is None
        again = sdl.StatefulDataLoader(list(range(40)), batch_size=4)
        again.load_state_dict(dl.state_dict())
        reference.append([len(list(again)), len(list(again))])
    assert reference == [[0, 10], [10, 10]]
    assert [_epochs_after_resume(sdl, container, 10, finish) for finish in (False, True)] == reference
    with DataStore(MPI.COMM_SELF, container, batch_size=4, seed=1) as store:  # and the next epoch is epoch 1
        loader = StoreLoader(store)
        epochs = [_sums(loader), _sums(loader)]
    with DataStore(MPI.COMM_SELF, container, batch_size=4, seed=1) as store:
        loader = StoreLoader(store)
        it = iter(loader)
        assert _sums(next(it) for _ in range(10)) == epochs[0]
        state = loader.state_dict()
    assert state["end_pending"] == 1 and (state["epoch"], state["step"]) == (1, 0)
    with DataStore(MPI.COMM_SELF, container, batch_size=4, seed=1) as store:
        loader = StoreLoader(store)
        loader.load_state_dict(state)
        assert [_sums(loader), _sums(loader)] == [[], epochs[1]]


@pytest.mark.mpi
@pytest.mark.parametrize(
    "package, script, says",
    [
        ("accelerate", "accelerate_script.py", "accelerate ok DistributedType.MULTI_CPU"),
        ("lightning", "fabric_script.py", "fabric ok MPIEnvironment"),
    ],
)
def test_accelerate_and_fabric_train_under_mpiexec_on_the_store(container, tmp_path, package, script, says):
    if importlib.util.find_spec(package) is None:
        pytest.skip(f"{package} is not installed (not a dependency of dstore)")
    res = run_mpi(
        2, ["python", str(REPO / "tests" / "ecosystem" / script), container, str(tmp_path / "ck")], timeout=180
    )
    assert says in res.stdout, res.stdout + res.stderr  # and the two ranks' weights are equal (asserted inside)
