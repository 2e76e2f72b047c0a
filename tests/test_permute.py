"""The O(N/P) arithmetic of issue 20: the keyed bijection (dstore.order.permute), a rank's part of an
epoch's order built from it alone, lookups that replace per-sample arrays (plan.Derived), and the
bounds computed without an int64[N] temporary. Pure: no MPI."""

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from dstore.order import permute, plan, shuffle


@settings(max_examples=80)
@given(n=st.integers(0, 3000), key=st.lists(st.integers(0, 2**40), min_size=1, max_size=3))
def test_permutation_is_a_bijection_with_its_inverse(n, key):
    p = permute.Permutation(n, key)
    a = np.asarray(p)
    assert a.dtype == np.int64
    assert np.array_equal(np.sort(a), np.arange(n))
    if n:
        assert np.array_equal(p.position_of(a), np.arange(n))
        pos = np.arange(n)[::-7]
        assert np.array_equal(p[pos], a[pos])  # any positions, in any order, alone
        assert int(p[n - 1]) == a[n - 1]


def test_permutation_does_not_depend_on_the_chunking(monkeypatch):
    want = np.asarray(permute.Permutation(5000, (3, 1)))
    monkeypatch.setattr(permute, "CHUNK", 97)
    assert np.array_equal(np.asarray(permute.Permutation(5000, (3, 1))), want)


def test_permutation_refuses_positions_outside_its_domain():
    p = permute.Permutation(10, (0,))
    with pytest.raises(IndexError):
        p[np.array([3, 10])]
    with pytest.raises(IndexError):
        p[-1]


def test_keys_give_unrelated_orders_and_positions_are_uniform():
    n, trials = 8, 4000
    counts = np.zeros((n, n))
    firsts_before = 0
    for k in range(trials):
        a = np.asarray(permute.Permutation(n, (k, 5)))
        counts[np.arange(n), a] += 1
        firsts_before += int(np.argmax(a == 0) < np.argmax(a == 1))
    expected = trials / n
    # Each sample at each position about 1/n of the time (chi-square, 49 dof; 99.9% point ~86).
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 90, chi2
    assert abs(firsts_before / trials - 0.5) < 0.04  # pairwise order unbiased
    a, b = (np.asarray(permute.Permutation(1000, (1, e))) for e in (0, 1))
    assert abs(np.corrcoef(a, b)[0, 1]) < 0.15


@settings(max_examples=60)
@given(
    n=st.integers(1, 400),
    bs=st.integers(1, 50),
    nranks=st.integers(1, 5),
    drop=st.booleans(),
    seed=st.integers(0, 99),
    epoch=st.integers(0, 3),
)
def test_a_ranks_schedule_from_the_permutation_equals_the_one_from_the_whole_order(n, bs, nranks, drop, seed, epoch):
    assume(bs >= nranks and not (drop and n < bs))
    perm = shuffle.global_permutation(n, seed, epoch)
    order = shuffle.global_order(n, seed, epoch)
    for r in range(nranks):
        a = plan.global_schedule(perm, bs, nranks, r, drop)
        b = plan.global_schedule(order, bs, nranks, r, drop)
        assert np.array_equal(a.ids, b.ids) and np.array_equal(a.ptr, b.ptr) and np.array_equal(a.pad, b.pad)


@settings(max_examples=80)
@given(
    n=st.integers(1, 300), bs=st.integers(1, 40), nranks=st.integers(1, 6), drop=st.booleans(), seed=st.integers(0, 99)
)
def test_a_schedule_computed_on_lookup_serves_each_step_as_the_built_one(n, bs, nranks, drop, seed):
    assume(not (drop and n < bs))
    perm = shuffle.global_permutation(n, seed, 2)
    order = np.asarray(perm)
    for r in range(nranks):
        lazy = plan.global_schedule(perm, bs, nranks, r, drop)
        built = plan.global_schedule(order, bs, nranks, r, drop)
        # No pad entry: nothing per entry is held (ids and pad are computed per lookup).
        assert isinstance(lazy.ids, plan.Derived) == (not built.pad.any())
        assert np.array_equal(lazy.ptr, built.ptr)
        for s in range(built.steps):
            sl = built.step(s)
            assert np.array_equal(lazy.ids[sl], built.ids[sl]) and np.array_equal(lazy.pad[sl], built.pad[sl])
        assert np.array_equal(lazy.ids[~lazy.pad], built.ids[~built.pad])


def test_a_schedule_computed_on_lookup_answers_any_lookup_across_its_blocks(monkeypatch):
    monkeypatch.setattr(plan, "BLOCK", 7)  # lookups inside, across and wider than a block
    perm = shuffle.global_permutation(1000, 4, 0)
    lazy = plan.global_schedule(perm, 30, 3, 2, True)
    built = plan.global_schedule(np.asarray(perm), 30, 3, 2, True)
    rng = np.random.default_rng(0)
    for _ in range(200):
        a = int(rng.integers(0, built.ids.size))
        j = a + rng.integers(0, int(rng.choice([3, 7, 20])), size=int(rng.integers(0, 12)))
        j = j[j < built.ids.size]
        assert np.array_equal(lazy.ids[j], built.ids[j])
    assert np.array_equal(np.asarray(lazy.ids), built.ids)


@settings(max_examples=60)
@given(
    sz=st.lists(st.integers(0, 40), min_size=1, max_size=150),
    nranks=st.integers(1, 6),
    seed=st.integers(0, 99),
    epoch=st.integers(0, 4),
)
def test_local_block_is_its_slice_of_the_local_order(sz, nranks, seed, epoch):
    offsets = np.concatenate([[0], np.cumsum(sz)]).astype(np.int64)
    bounds = plan.block_bounds(offsets, nranks)
    whole = shuffle.local_order(bounds, seed, epoch)
    for r in range(nranks):
        assert np.array_equal(shuffle.local_block(bounds, r, seed, epoch), whole[bounds[r] : bounds[r + 1]])


def _reference_bounds(offsets, nranks):
    """block_bounds as it was written with the int64[N] cumulative cost (the reference)."""
    n = offsets.size - 1
    cum = offsets + np.arange(n + 1, dtype=np.int64)
    targets = (np.arange(nranks + 1, dtype=np.int64) * int(cum[-1])) // nranks
    hi = np.searchsorted(cum, targets, side="left")
    lo = np.maximum(hi - 1, 0)
    hi = np.minimum(hi, n)
    bounds = np.where((targets - cum[lo]) < (cum[hi] - targets), lo, hi).astype(np.int64)
    bounds[0], bounds[-1] = 0, n
    return np.maximum.accumulate(bounds)


@settings(max_examples=100)
@given(sz=st.lists(st.integers(0, 1000), min_size=1, max_size=300), nranks=st.integers(1, 9))
def test_bounds_bisection_equals_the_searchsorted_reference(sz, nranks):
    offsets = np.concatenate([[0], np.cumsum(sz)]).astype(np.int64)
    assert np.array_equal(plan.block_bounds(offsets, nranks), _reference_bounds(offsets, nranks))


@settings(max_examples=60)
@given(
    sz=st.lists(st.integers(0, 1000), min_size=1, max_size=200),
    nranks=st.integers(1, 5),
    k=st.integers(1, 30),
    chunk=st.integers(1, 64),
)
def test_derived_lookups_equal_the_arrays_they_replace(sz, nranks, k, chunk):
    offsets = np.concatenate([[0], np.cumsum(sz)]).astype(np.int64)
    sizes = np.diff(offsets)
    bounds = plan.block_bounds(offsets, nranks)
    lay = plan.block_layout(offsets, bounds)
    owner = plan.owner_of(bounds, np.arange(sizes.size))
    disp = offsets[:-1] - offsets[bounds][owner]
    d = plan.sizes_of(offsets)
    ids = np.arange(sizes.size)[::-3]
    mask = sizes % 2 == 0
    for got, want in ((lay.owner, owner), (lay.disp, disp), (d, sizes)):
        assert np.array_equal(np.asarray(got), want)
        assert np.array_equal(got[ids], want[ids]) and np.array_equal(got[mask], want[mask])
        assert got[-1] == want[-1] and np.array_equal(got[1:4], want[1:4])
        assert np.array_equal(got == 0, want == 0)
    assert plan.largest_sum(offsets, k, chunk) == int(np.sort(sizes)[::-1][:k].sum())
