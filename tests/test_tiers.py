"""The tiered store's pure arithmetic (dstore.order.tiers): the resident set and a step's storage reads."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dstore.errors import ConfigError
from dstore.order import plan, tiers


@st.composite
def _case(draw):
    n = draw(st.integers(1, 300))
    sizes = np.array(draw(st.lists(st.integers(0, 5000), min_size=n, max_size=n)), dtype=np.int64)
    p = draw(st.integers(1, 5))
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(sizes, out=offsets[1:])
    owner = plan.owner_of(plan.block_bounds(offsets, p), np.arange(n))
    keep = np.array(draw(st.lists(st.integers(-10, int(sizes.sum()) + 10), min_size=p, max_size=p)), dtype=np.int64)
    return sizes, owner, keep, draw(st.integers(0, 2**31))


@settings(max_examples=80, deadline=None)
@given(_case())
def test_each_rank_keeps_a_prefix_of_its_random_order_that_fits(case):
    sizes, owner, keep, seed = case
    res = tiers.resident_mask(sizes, owner, keep, seed)
    assert np.array_equal(res, tiers.resident_mask(sizes, owner, keep, seed))  # deterministic
    assert res[sizes == 0].all()
    for r in range(keep.size):
        mine = owner == r
        kept = int(sizes[mine & res].sum())
        assert kept <= max(int(keep[r]), 0)
        left = sizes[mine & ~res]
        # greedy prefix: the first sample that did not fit, added, would exceed what may be kept
        if left.size:
            assert kept + int(left.min()) > keep[r] or kept + int(left.max()) > keep[r]
        if keep[r] >= int(sizes[mine].sum()):
            assert res[mine].all()
    offs = tiers.resident_offsets(sizes, res)
    lay = plan.scattered_layout(offs, owner, keep.size)
    assert np.array_equal(lay.nbytes, np.bincount(owner, weights=sizes * res, minlength=keep.size).astype(np.int64))


@settings(max_examples=80, deadline=None)
@given(_case(), st.integers(1, 40))
def test_the_residency_and_windows_of_blocks_computed_block_by_block_are_the_whole_ones(case, chunk):
    sizes, owner, keep, seed = case
    bounds = np.concatenate([[0], np.cumsum(np.bincount(owner, minlength=keep.size))]).astype(np.int64)
    res = tiers.resident_mask(sizes, owner, keep, seed)
    offsets = np.zeros(sizes.size + 1, dtype=np.int64)
    np.cumsum(sizes, out=offsets[1:])
    assert np.array_equal(tiers.resident_blocks(plan.sizes_of(offsets), bounds, keep, seed), res)
    whole = tiers.resident_offsets(sizes, res)
    old, tiers.CHUNK = tiers.CHUNK, chunk
    try:
        assert np.array_equal(tiers.resident_offsets(plan.sizes_of(offsets), res), whole)  # in chunks
    finally:
        tiers.CHUNK = old
    ref = plan.scattered_layout(whole, owner, keep.size)
    lay = plan.block_layout(whole, bounds)  # what a block store's tier uses (computed on lookup)
    ids = np.arange(sizes.size)
    assert np.array_equal(lay.owner[ids], ref.owner) and np.array_equal(lay.disp[ids], ref.disp)
    assert np.array_equal(lay.nbytes, ref.nbytes)


def test_the_resident_set_is_a_random_subset_spread_over_the_order():
    # 10,000 equal samples on 2 ranks keeping half each: about half of every global batch of the
    # epoch order is resident (what spreads each epoch's storage reads evenly over its steps).
    n, b = 10_000, 100
    sizes = np.full(n, 100, dtype=np.int64)
    owner = plan.owner_of(np.array([0, n // 2, n]), np.arange(n))
    res = tiers.resident_mask(sizes, owner, np.array([250_000, 250_000]), seed=3)
    assert res.sum() == n // 2
    from dstore.order.shuffle import global_order

    per_step = res[global_order(n, 3, 0)].reshape(-1, b).sum(axis=1)
    assert 30 < per_step.min() and per_step.max() < 70  # hypergeometric(100 of 10,000, half): sd 5
    assert not np.array_equal(res, tiers.resident_mask(sizes, owner, np.array([250_000, 250_000]), seed=4))


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, 50), min_size=1, max_size=40, unique=True), st.data())
def test_storage_reads_coalesce_consecutive_samples_and_cover_each_wanted_byte_once(ids, data):
    ids = np.array(ids, dtype=np.int64)
    want = np.array(data.draw(st.lists(st.booleans(), min_size=ids.size, max_size=ids.size)))
    sizes = np.array(data.draw(st.lists(st.integers(0, 9), min_size=51, max_size=51)), dtype=np.int64)
    offsets = np.zeros(52, dtype=np.int64)
    np.cumsum(sizes, out=offsets[1:])
    p = tiers.plan_storage(ids, want, offsets)
    assert (p.entry[~want] == -1).all()
    covered = np.concatenate([np.arange(lo, hi) for lo, hi in zip(p.run_lo, p.run_hi)]) if p.run_lo.size else []
    assert sorted(covered) == sorted(ids[want].tolist())  # each wanted sample in exactly one read
    assert all(a < b for a, b in zip(p.run_hi[:-1], p.run_lo[1:]))  # reads are separated: coalesced
    assert p.nbytes == int(sizes[ids[want]].sum())
    for j in np.nonzero(want)[0]:  # entry j's bytes sit in its read's part of the buffer
        r = int(np.searchsorted(p.run_lo, ids[j], side="right")) - 1
        assert p.entry[j] == p.run_buf[r] + offsets[ids[j]] - offsets[p.run_lo[r]]


def test_bad_overflow_is_named():
    with pytest.raises(ConfigError, match="overflow"):
        tiers.check_overflow("spill")
