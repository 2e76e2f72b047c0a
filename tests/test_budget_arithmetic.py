"""The memory budget's arithmetic (dstore.memory.budget) on plain values: no MPI, no store. Each figure is
checked against the bytes counted by hand, so a changed `+ 1` or rounding fails here."""

import numpy as np
import pytest

from dstore.memory import budget
from dstore.store import budget as store_budget

# sample sizes 1, 2, 4, ..., 128: any k largest have their own sum (the top 3: 224, 4: 240)
OFFSETS = np.concatenate([[0], np.cumsum(2 ** np.arange(8))]).astype(np.int64)
TOP = {k: int(sum(2 ** np.arange(8)[::-1][:k])) for k in range(9)}


@pytest.mark.parametrize(
    "batch, nranks, block, steps, samples",
    [
        (8, 4, None, 1, 3),  # 2 samples per rank per step, plus one
        (9, 4, None, 1, 4),  # ceil(9 / 4) = 3, plus one
        (4, 4, None, 1, 2),  # 1, plus one
        (4, 4, 10, 4, 4),  # the local policy's block of 10 over 4 steps: ceil(10 / 4) = 3, plus one
        (4, 4, 8, 4, 3),  # 8 over 4 steps: 2, plus one
        (64, 1, None, 1, 8),  # never more than the data set
        (7, 1, None, 1, 8),  # 7 plus one: all 8
    ],
)
def test_a_receive_buffer_holds_a_ranks_largest_step_plus_one_sample(batch, nranks, block, steps, samples):
    got = budget.step_bound(OFFSETS, 8, batch, nranks, largest_block=block, steps_per_epoch=steps)
    assert got == TOP[samples]


def test_receive_buffers_are_prefetch_plus_one_steps_unless_alone_or_replicated():
    assert budget.receive_bytes(100, prefetch=2, nranks=2, replicate=False) == 300
    assert budget.receive_bytes(100, prefetch=0, nranks=3, replicate=False) == 100
    assert budget.receive_bytes(100, prefetch=2, nranks=1, replicate=False) == 0
    assert budget.receive_bytes(100, prefetch=2, nranks=4, replicate=True) == 0


def test_the_tier_holds_lookahead_plus_one_storage_buffers_and_its_threads_indexes():
    # 50 receive, 5 storage buffers of 100, 3 threads' indexes of 7
    assert budget.tier_bytes(50, 100, 7, storage_lookahead=4, storage_threads=3) == 50 + 500 + 21
    assert budget.tier_bytes(0, 100, 0, storage_lookahead=0, storage_threads=2) == 100


def test_a_streaming_preload_holds_prefetch_plus_one_buffers_and_its_threads_indexes():
    assert budget.stream_bytes(100, 7, prefetch=2, storage_threads=3) == 300 + 21
    assert budget.stream_bytes(100, 0, prefetch=0, storage_threads=3) == 100


def test_reader_indexes_are_20_bytes_a_sample_per_thread_where_loaded():
    assert budget.index_bytes(300, index_on_demand=False) == 6000
    assert budget.index_bytes(300, index_on_demand=True) == 0
    pop = budget.population_index_bytes
    assert pop(6000, population_threads=3, population="preload", replicate=False) == 18000
    assert pop(6000, population_threads=1, population="preload", replicate=False) == 0
    assert pop(6000, population_threads=3, population="dynamic", replicate=False) == 0
    assert pop(6000, population_threads=3, population="dynamic", replicate=True) == 18000


def test_the_peak_is_the_larger_of_buffers_and_indexes_or_all_of_them_when_streaming():
    assert budget.peak_bytes(300, 400, None) == 400 and budget.peak_bytes(500, 400, None) == 500
    assert budget.peak_bytes(300, 400, 321) == 1021


def test_the_room_for_resident_data_is_each_budget_less_the_buffers():
    room = budget.resident_room([1000, 600, 500], 571)
    assert room.dtype == np.int64 and room.tolist() == [429, 29, -71]


# A store's plan (dstore.store.storeplan) built from the same plain values, as 4 ranks see it: the budget's
# store-level figures (what check_budget gathers) without MPI or a container.
def _plan(rank=0, **options):
    from dstore.store import storeplan
    from dstore.store.config import StoreConfig

    cfg = StoreConfig.from_options({"batch_size": 8, **options}).checked(4)
    n = OFFSETS.size - 1
    return storeplan.build(
        rank,
        4,
        cfg,
        0,
        n,
        OFFSETS,
        np.zeros(n, dtype=np.int64),
        np.zeros(n, dtype=np.uint32),
        0,
        reader_index=budget.index_bytes(n, False),
    )


def test_a_plans_needs_are_its_block_and_its_receive_buffers_by_hand():
    for rank in range(4):
        p = _plan(rank, prefetch=2, population_threads=1, storage_lookahead=2, storage_threads=1)
        block = int(OFFSETS[p.bounds[rank + 1]] - OFFSETS[p.bounds[rank]])
        recv = 3 * TOP[3]  # prefetch + 1 buffers of the largest 2 + 1 samples (8 over 4 ranks)
        # nothing resident: the receive buffers, 2 + 1 storage buffers, 1 storage thread's index of 20 B a sample
        assert store_budget.memory_needs(p) == (block + recv, recv + 3 * TOP[3] + 20 * 8)


def test_a_plans_stream_runs_beside_the_receive_buffers_and_replication_holds_everything():
    p = _plan(population="stream", population_threads=1, storage_threads=2)
    recv = 3 * TOP[3]
    stream = 3 * TOP[3] + 2 * 20 * 8
    assert store_budget.memory_needs(p)[0] == int(OFFSETS[p.bounds[1]]) + recv + stream
    # replicated: the whole data set, no receive buffers; its 3 population threads' indexes beside it
    assert store_budget.memory_needs(_plan(replicate=True, population_threads=1))[0] == int(OFFSETS[-1])
    assert store_budget.memory_needs(_plan(replicate=True, population_threads=3))[0] == int(OFFSETS[-1]) + 3 * 20 * 8


def test_a_plan_is_a_value_replaced_not_written():
    import dataclasses

    p = _plan()
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.seed = 3  # type: ignore[misc]
    q = dataclasses.replace(p, config=dataclasses.replace(p.config, seed=3))
    assert (p.seed, q.seed) == (0, 3)
    assert not np.array_equal(p.schedule(0).ids, q.schedule(0).ids)  # the orders follow the seed
