"""Property tests of the store's arithmetic (dstore.order.plan), without MPI."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from dstore.order import plan, shuffle
from dstore.order.policy import POLICIES, resume_point

sizes = st.lists(st.integers(0, 1000), min_size=1, max_size=200)


@given(sz=sizes, nranks=st.integers(1, 8))
def test_blocks_are_contiguous_balanced_and_searchable(sz, nranks):
    offsets = np.concatenate([[0], np.cumsum(sz)]).astype(np.int64)
    b = plan.block_bounds(offsets, nranks)
    assert b[0] == 0 and b[-1] == len(sz) and np.all(np.diff(b) >= 0)
    cost = offsets + np.arange(len(sz) + 1)
    per_rank = cost[b[1:]] - cost[b[:-1]]
    assert per_rank.max() <= cost[-1] / nranks + max(sz) + 1
    ids = np.arange(len(sz))
    own = plan.owner_of(b, ids)
    assert np.all((b[own] <= ids) & (ids < b[own + 1]))
    lay = plan.block_layout(offsets, b)
    assert np.array_equal(lay.owner, own)
    assert np.all(lay.disp + np.diff(offsets) <= lay.nbytes[own])
    assert lay.nbytes.sum() == offsets[-1]


@settings(max_examples=80)
@given(
    n=st.integers(1, 300), bs=st.integers(1, 40), nranks=st.integers(1, 4), drop=st.booleans(), seed=st.integers(0, 99)
)
def test_global_schedules_partition_each_global_batch(n, bs, nranks, drop, seed):
    bs = max(bs, nranks)
    order = shuffle.global_order(n, seed, 0)
    steps = plan.steps_per_epoch(n, bs, drop)
    scheds = [plan.global_schedule(order, bs, nranks, r, drop) for r in range(nranks)]
    assert all(s.steps == steps for s in scheds)  # same number of steps on every rank
    for s in range(steps):
        got = np.concatenate([sc.ids[sc.step(s)][~sc.pad[sc.step(s)]] for sc in scheds])
        want = order[s * bs : min((s + 1) * bs, n)]
        assert np.array_equal(got, want)  # the ranks' slices, in rank order, are the global batch
        assert all(sc.ptr[s + 1] > sc.ptr[s] for sc in scheds)  # nobody gets an empty step
    real = np.concatenate([sc.ids[~sc.pad] for sc in scheds])
    kept = (n // bs) * bs if drop else n
    assert np.array_equal(np.sort(real), np.sort(order[:kept]))
    # The assignment function agrees with the schedules.
    who = plan.global_assignment(n, bs, nranks, drop)
    for r, sc in enumerate(scheds):
        assert np.array_equal(np.sort(order[who == r]), np.sort(sc.ids[~sc.pad]))


@given(n=st.integers(1, 200), bs=st.integers(4, 30), seed=st.integers(0, 99), drop=st.booleans())
def test_global_order_of_batches_is_independent_of_rank_count(n, bs, seed, drop):
    order = shuffle.global_order(n, seed, 3)
    seqs = []
    for nranks in (1, 2, 3, 4):
        sc = [plan.global_schedule(order, bs, nranks, r, drop) for r in range(nranks)]
        seqs.append(
            np.concatenate(
                [np.concatenate([x.ids[x.step(s)][~x.pad[x.step(s)]] for x in sc]) for s in range(sc[0].steps)]
                or [np.zeros(0, np.int64)]
            )
        )
    for s in seqs[1:]:
        assert np.array_equal(s, seqs[0])


@settings(max_examples=60)
@given(
    sz=st.lists(st.integers(0, 100), min_size=1, max_size=150),
    bs=st.integers(4, 20),
    nranks=st.integers(1, 4),
    policy=st.sampled_from(["local", "partial"]),
    drop=st.booleans(),
)
def test_local_and_partial_deliver_exactly_once_in_equal_steps(sz, bs, nranks, policy, drop):
    offsets = np.concatenate([[0], np.cumsum(sz)])
    n = len(sz)
    bounds = plan.block_bounds(offsets, nranks)
    order = POLICIES[policy].order(n, bounds, 5, 2, 0.5)
    steps = plan.steps_per_epoch(n, bs, drop)
    scheds = [POLICIES[policy].schedule(order, bounds, bs, nranks, r, drop) for r in range(nranks)]
    assert all(s.steps == steps for s in scheds)
    if steps:
        real = np.concatenate([s.ids[~s.pad] for s in scheds])
        assert np.array_equal(np.sort(real), np.arange(n))
        assert all(np.all(np.diff(s.ptr) >= 1) for s in scheds)
    if policy == "local":
        for r, s in enumerate(scheds):
            assert np.all(plan.owner_of(bounds, s.ids[~s.pad]) == r)


@given(n=st.integers(1, 200), bs=st.integers(4, 30), nranks=st.integers(1, 4), drop=st.booleans())
def test_dynamic_layout_owner_is_the_epoch0_consumer(n, bs, nranks, drop):
    rng = np.random.default_rng(n)
    offsets = np.concatenate([[0], np.cumsum(rng.integers(0, 50, n))])
    order = shuffle.global_order(n, 1, 0)
    owner = plan.dynamic_owner(n, bs, nranks, drop, order)
    for r in range(nranks):
        sc = plan.global_schedule(order, bs, nranks, r, drop)
        assert np.all(owner[sc.ids[~sc.pad]] == r)
    lay = plan.scattered_layout(offsets, owner, nranks)
    sizes = np.diff(offsets)
    for r in range(nranks):  # each window is its samples back to back in index order, no overlap
        mine = np.nonzero(owner == r)[0]
        assert np.array_equal(lay.disp[mine], np.concatenate([[0], np.cumsum(sizes[mine])[:-1]])[: mine.size])
        assert lay.nbytes[r] == sizes[mine].sum()


@settings(max_examples=80)
@given(
    n=st.integers(1, 300), bs=st.integers(1, 30), nranks=st.integers(1, 5), drop=st.booleans(), chunk=st.integers(1, 50)
)
def test_dynamic_owners_on_lookup_and_their_layout_in_chunks_are_the_whole_ones(n, bs, nranks, drop, chunk):
    rng = np.random.default_rng(n + bs)
    offsets = np.concatenate([[0], np.cumsum(rng.integers(0, 50, n))]).astype(np.int64)
    want = plan.dynamic_owner(n, bs, nranks, drop, shuffle.global_order(n, 2, 0))
    owner = plan.dynamic_owner_of(n, bs, nranks, drop, shuffle.global_permutation(n, 2, 0))
    assert np.array_equal(np.asarray(owner), want)
    ref = plan.scattered_layout(offsets, want, nranks)
    lay = plan.owner_layout(offsets, owner, nranks, chunk=chunk)
    assert lay.owner.dtype == np.uint8 and np.array_equal(lay.owner, want)
    assert np.array_equal(lay.disp, ref.disp) and np.array_equal(lay.nbytes, ref.nbytes) and lay.base is None


@given(
    entries=st.lists(st.tuples(st.integers(0, 3), st.integers(0, 20), st.integers(0, 4)), max_size=40),
    rank=st.integers(0, 3),
)
def test_fetch_plan_copies_exactly_the_right_bytes(entries, rank):
    # Simulate windows as arrays and the gets as slice copies; every entry must land intact.
    windows = [np.arange(100, dtype=np.int64) + 1000 * o for o in range(4)]
    owner = np.array([e[0] for e in entries], dtype=np.int64)
    disp = np.array([e[1] for e in entries], dtype=np.int64)
    ln = np.array([e[2] for e in entries], dtype=np.int64)
    f = plan.plan_fetch(owner, disp, ln, rank)
    buf = np.full(f.remote_bytes, -1, dtype=np.int64)
    for o, d, n_, b in zip(f.run_owner, f.run_disp, f.run_len, f.run_buf):
        assert n_ > 0
        buf[b : b + n_] = windows[o][d : d + n_]
    for i in range(len(entries)):
        src = windows[rank] if f.local[i] else buf
        got = src[f.start[i] : f.start[i] + f.length[i]]
        assert np.array_equal(got, windows[owner[i]][disp[i] : disp[i] + ln[i]])
    assert f.local.sum() == (owner == rank).sum()
    # Runs never overlap in the receive buffer and the remote bytes are exactly what is needed.
    assert f.remote_bytes == ln[owner != rank].sum()


def test_contiguous_samples_coalesce_into_one_get():
    f = plan.plan_fetch(np.array([1, 1, 1, 2]), np.array([20, 0, 10, 0]), np.array([10, 10, 10, 5]), 0)
    assert list(f.run_owner) == [1, 2] and list(f.run_len) == [30, 5]


def test_resume_point_checks_the_state():
    import pytest

    from dstore.errors import ConfigError

    cur = {
        "version": 1,
        "seed": 0,
        "epoch": 0,
        "step": 0,
        "position": 0,
        "batch_size": 8,
        "num_samples": 50,
        "shuffle": "global",
        "partial_fraction": 0.25,
        "drop_last": 0,
        "nranks": 2,
        "sample_start": 0,
        "sample_stop": 50,
    }
    assert resume_point(dict(cur, epoch=3, step=2, position=16), cur, 7) == (3, 2)
    assert resume_point(dict(cur, epoch=3, step=7, position=56), cur, 7) == (4, 0)
    for bad, key in (
        (dict(cur, batch_size=4), "batch_size"),
        (dict(cur, num_samples=9), "num_samples"),
        (dict(cur, version=9), "version"),
        ([], "version"),
        (dict(cur, step=9, position=72), "outside"),
    ):
        with pytest.raises(ConfigError, match=key):
            resume_point(bad, cur, 7)
