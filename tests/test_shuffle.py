"""Property tests of the epoch orders (dstore.order.shuffle): permutations, determinism, policies."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dstore.errors import ConfigError
from dstore.order import shuffle
from dstore.order.plan import block_bounds
from dstore.order.policy import POLICIES, policy

sizes = st.lists(st.integers(0, 50), min_size=1, max_size=120)


@given(n=st.integers(0, 500), seed=st.integers(0, 2**32), epoch=st.integers(0, 50))
def test_global_order_is_a_deterministic_permutation(n, seed, epoch):
    a = shuffle.global_order(n, seed, epoch)
    assert a.dtype == np.int64
    assert np.array_equal(np.sort(a), np.arange(n))
    assert np.array_equal(a, shuffle.global_order(n, seed, epoch))


def test_orders_change_with_epoch_and_seed():
    a = shuffle.global_order(1000, 1, 0)
    assert not np.array_equal(a, shuffle.global_order(1000, 1, 1))
    assert not np.array_equal(a, shuffle.global_order(1000, 2, 0))


@settings(max_examples=60)
@given(sz=sizes, nranks=st.integers(1, 6), seed=st.integers(0, 1000), epoch=st.integers(0, 5), frac=st.floats(0, 1))
def test_local_and_partial_are_permutations_and_local_stays_home(sz, nranks, seed, epoch, frac):
    offsets = np.concatenate([[0], np.cumsum(sz)])
    bounds = block_bounds(offsets, nranks)
    loc = POLICIES["local"].order(len(sz), bounds, seed, epoch, 0.25)
    assert np.array_equal(np.sort(loc), np.arange(len(sz)))
    for r in range(nranks):  # every rank's part holds only its own samples
        part = loc[bounds[r] : bounds[r + 1]]
        assert np.all((part >= bounds[r]) & (part < bounds[r + 1]))
    par = POLICIES["partial"].order(len(sz), bounds, seed, epoch, frac)
    assert np.array_equal(np.sort(par), np.arange(len(sz)))
    # At most round(frac*N) slots differ from the local order.
    assert np.count_nonzero(par != loc) <= round(frac * len(sz))


def test_partial_moves_about_the_fraction():
    offsets = np.arange(0, 40001, 10)
    bounds = block_bounds(offsets, 4)
    par = shuffle.partial_order(bounds, 3, 1, 0.25)
    owner_slot = np.searchsorted(bounds, np.arange(4000), side="right") - 1
    owner_sample = np.searchsorted(bounds, par, side="right") - 1
    moved = np.mean(owner_slot != owner_sample)
    assert 0.15 < moved < 0.25  # 0.25 * (1 - 1/4) expected


@pytest.mark.parametrize("bad", [-1, 1.5, "x", True, None, 2**63])
def test_bad_seed_is_a_config_error(bad):
    with pytest.raises(ConfigError, match="seed"):
        shuffle.global_order(10, bad, 0)


def test_bad_policy_and_fraction():
    with pytest.raises(ConfigError, match="shuffle='nope'"):
        policy("nope")
    with pytest.raises(ConfigError, match="partial_fraction"):
        shuffle.partial_order(np.array([0, 10]), 0, 0, 1.5)
