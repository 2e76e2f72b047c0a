"""One memory budget per rank for the trainer's stores and its loaders' batches
(dstore.training.budget): the stores' parts add up to the budget less the loaders' reserve, each
covers at least the buffers a store cannot do without, and stores that do not all fit keep part of
their samples resident, within the budget, while still delivering every sample."""

import pytest
from mpi4py import MPI
from store_scenarios import scenarios

from dstore.codec.kernels import RESERVE_BYTES
from dstore.errors import MemoryBudgetError
from dstore.loader.workers import KEEP_HANDED, WORKER_BYTES
from dstore.store.data_store import DataStore
from dstore.training.budget import _divide, loader_reserve, share_budget


@pytest.fixture(scope="module")
def container(tmp_path_factory):
    return scenarios.make_container(
        str(tmp_path_factory.mktemp("budget") / "c.h5"), n=600, seed=3, large=6000, small=6000
    )


def _stores(path):
    train = DataStore(MPI.COMM_SELF, path, batch_size=16, seed=1, sample_range=(0, 480))
    held = DataStore(MPI.COMM_SELF, path, batch_size=16, seed=2, sample_range=(480, 600))
    return train, held


def _held_bytes(store, needs):
    full, least = needs
    tier = store.tier
    return full if tier["resident_fraction"] >= 1.0 else tier["resident_bytes"] + least


def _ids(store):
    return sorted(int(i) for b in store.epoch(0) for i, pad in zip(b.ids, b.pad) if not pad)


def test_the_parts_fill_the_budget_and_cover_every_floor():
    needs = [(900, 300), (200, 120), (50, 80)]  # the last store needs less in full than its tier buffers
    fit = _divide(2000, needs)
    assert sum(fit) <= 2000 and all(b >= f for b, (f, _) in zip(fit, needs))
    tight = _divide(700, needs)
    assert sum(tight) <= 700 and tight[2] == 50
    assert all(least <= b <= full for b, (full, least) in zip(tight[:2], needs[:2]))


def test_loader_reserve_counts_batches_and_decode_threads():
    got = loader_reserve(
        local_batch=32,
        input_shape=(224, 224, 3),
        image_shape=(375, 500, 3),
        mean_sample_bytes=110_000,
        decode_threads=4,
        loaders=2,
    )
    per = 3 * 32 * (110_000 + 2 * 224 * 224 * 3) + 4 * 2 * 375 * 500 * 3
    assert got == 2 * per + RESERVE_BYTES  # 224 x 224: the compiled kernels load, once per rank
    # decode workers: the training loader's threads replaced by processes and the batches they keep mapped
    with_workers = loader_reserve(
        local_batch=32,
        input_shape=(224, 224, 3),
        image_shape=(375, 500, 3),
        mean_sample_bytes=110_000,
        decode_threads=4,
        loaders=2,
        workers=3,
    )
    assert (
        with_workers
        == 2 * per
        - 4 * 2 * 375 * 500 * 3
        + 3 * (WORKER_BYTES + 2 * 375 * 500 * 3)
        + KEEP_HANDED * 32 * 224 * 224 * 3
        + RESERVE_BYTES
    )
    small = loader_reserve(
        local_batch=32, input_shape=(32, 32, 3), image_shape=(32, 32, 3), mean_sample_bytes=3_000, decode_threads=4
    )  # under NATIVE_MIN_PIXELS: no kernels
    assert small == 3 * 32 * (3_000 + 2 * 32 * 32 * 3) + 4 * 2 * 32 * 32 * 3


def test_stores_over_budget_share_it_and_still_deliver_every_sample(container):
    train, held = _stores(container)
    needs = [train.memory_needs(), held.memory_needs()]
    reserve = 200_000
    full, least = sum(f for f, _ in needs), sum(x for _, x in needs)
    total = reserve + least + (full - least) // 2  # above the buffers, below everything resident
    budgets = share_budget(MPI.COMM_SELF, [train, None, held], budget=total, reserve=reserve)
    assert budgets is not None  # there are stores
    assert sum(budgets) <= total - reserve
    with train, held:
        used = [_held_bytes(s, n) for s, n in zip((train, held), needs)]
        assert sum(used) <= total - reserve, (used, budgets)
        assert all(b >= min(full, least) for b, (full, least) in zip(budgets, needs))
        assert 0 < train.tier["resident_fraction"] < 1  # the training store serves part from storage
        assert _ids(train) == list(range(480)) and _ids(held) == list(range(480, 600))


def test_stores_that_fit_stay_whole(container):
    train, held = _stores(container)
    share_budget(MPI.COMM_SELF, [train, held], budget=10**9, reserve=10**6)
    with train, held:
        assert train.tier["resident_fraction"] == 1.0 and held.tier["resident_fraction"] == 1.0


def test_a_budget_below_the_buffers_is_refused_naming_the_loaders_share(container):
    train, held = _stores(container)
    least = sum(x for _, x in (train.memory_needs(), held.memory_needs()))
    with pytest.raises(MemoryBudgetError, match="for the loaders' batches leaves .* need .* of buffers"):
        share_budget(MPI.COMM_SELF, [train, held], budget=least, reserve=50_000)
    train.close()
    held.close()


@pytest.mark.mpi
@pytest.mark.parametrize("n", [2, 4])
def test_the_budget_is_shared_on_every_rank_and_a_refusal_ends_all(container, tmp_path, n):
    import json
    import os

    from support.mpirun import run_mpi

    run_mpi(
        n, ["python", os.path.join(os.path.dirname(__file__), "budget_run.py"), container, str(tmp_path)], timeout=120
    )
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(n)]
    served = [sorted(sum((r["served"][k] for r in ranks), [])) for k in (0, 1)]
    assert served == [list(range(480)), list(range(480, 600))]  # every sample once, over all ranks
    for r in ranks:
        assert sum(r["budgets"]) <= r["budget"] and sum(r["used"]) <= r["budget"], r
        assert r["refused"] is not None and "leaves" in r["refused"], r  # rank 0's refusal reached every rank
