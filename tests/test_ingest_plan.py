"""The pure arithmetic of a parallel ingest: order, shards, groups, rounds, resize parsing."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dstore.errors import ConfigError
from dstore.ingest import plan


def test_sample_order_is_a_seeded_permutation():
    a = plan.sample_order(1000, seed=3)
    assert sorted(a.tolist()) == list(range(1000))
    assert np.array_equal(a, plan.sample_order(1000, seed=3))
    assert not np.array_equal(a, plan.sample_order(1000, seed=4))
    assert np.array_equal(plan.sample_order(7, seed=3, keep_order=True), np.arange(7))


def test_a_contiguous_block_of_the_order_mixes_classes():
    labels = np.arange(10_000) // 1000  # a source sorted by class, as an ImageFolder is
    block = labels[plan.sample_order(10_000, seed=0)[:200]]
    assert len(set(block.tolist())) == 10


@settings(max_examples=200, deadline=None)
@given(n=st.integers(1, 500), shards=st.integers(1, 16), ranks=st.integers(1, 12), chunk=st.integers(1, 40))
def test_every_position_is_written_once_by_exactly_one_group(n, shards, ranks, chunk):
    if shards > n:
        with pytest.raises(ConfigError):
            plan.shard_bounds(n, shards)
        return
    bounds = plan.shard_bounds(n, shards)
    assert bounds[0] == 0 and bounds[-1] == n and np.all(np.diff(bounds) >= 0)
    assert np.diff(bounds).max() - np.diff(bounds).min() <= 1
    groups = plan.num_groups(ranks, shards)
    members = [[r for r in range(ranks) if plan.group_of(r, ranks, shards) == g] for g in range(groups)]
    assert all(members), "every group has a rank"
    owner = {}
    for g in range(groups):
        for s in plan.shards_of_group(g, ranks, shards):
            assert s not in owner
            owner[s] = g
    assert sorted(owner) == list(range(shards))
    seen = np.zeros(n, dtype=int)
    for s in range(shards):
        m = len(members[owner[s]])
        rounds = plan.rounds(plan.chunk_bounds(int(bounds[s]), int(bounds[s + 1]), chunk), m)
        prev_end = int(bounds[s])
        for rnd in rounds:
            assert len(rnd) == m
            assert rnd[0][0] == prev_end, "a round's chunks continue where the last round ended"
            for (_, b), (c, _) in zip(rnd, rnd[1:]):
                assert b == c, "a round's chunks are consecutive, so the writer keeps the order"
            for a, b in rnd:
                seen[a:b] += 1
            prev_end = rnd[-1][1]
        assert prev_end == bounds[s + 1]
    assert np.all(seen == 1)


def test_group_layouts_for_multiples_and_divisors():
    # 8 shards on 4 ranks: each rank alone writes 2 shards.
    assert [plan.shards_of_group(plan.group_of(r, 4, 8), 4, 8) for r in range(4)] == [[0, 4], [1, 5], [2, 6], [3, 7]]
    # 2 shards on 4 ranks: two groups of two ranks, one shard each.
    assert [plan.group_of(r, 4, 2) for r in range(4)] == [0, 1, 0, 1]
    assert plan.shards_of_group(1, 4, 2) == [1]
    # 1 shard: everybody feeds rank 0.
    assert {plan.group_of(r, 4, 1) for r in range(4)} == {0}


def test_chunk_size_bounds():
    assert plan.chunk_size(110_000) == (8 << 20) // 110_000
    assert plan.chunk_size(10) == 4096
    assert plan.chunk_size(10 << 20) == 16


@pytest.mark.parametrize(
    "value, want",
    [("224x160", (224, 160)), ("64", (64, 64)), (32, (32, 32)), ((5, 7), (5, 7)), (None, None), ("8X9", (8, 9))],
)
def test_parse_resize(value, want):
    assert plan.parse_resize(value) == want


@pytest.mark.parametrize("value", ["", "0x5", "ax3", "1x2x3", -4, (1, 2, 3)])
def test_parse_resize_rejects(value):
    with pytest.raises(ConfigError, match="resize"):
        plan.parse_resize(value)
