"""Mixing data sets by proportion: each epoch's samples of every source and their global order, as
pure functions of (sizes, weights, seed, epoch, epoch size). No MPI.

The rules (docs/training.md, "Mixing data sets"):

* Epoch size E: ``epoch_size`` if given, else the sum of the sources' sizes.
* Counts: source k gets ``c_k`` samples per epoch, the largest-remainder rounding of
  ``E * w_k / sum(w)``: each source first gets the floor of its share, then the sources with the
  largest fractional parts get one more each until the counts sum to E (ties to the lower source
  index). The shares are exact rationals of the weights as written in decimal (0.7 is 7/10). So
  the counts sum to E exactly and each is within one of its exact share.
* Which samples: with ``c_k = q * n_k + r`` (n_k the source's size), every sample of the source
  appears q times (whole passes; with replacement across passes), plus r distinct samples drawn
  without replacement from a seeded permutation that rotates over epochs: with ``R = ceil(n_k / r)``
  epochs per round, epoch e uses permutation ``j = e // R`` (of (seed, source, j)) and takes its
  positions ``(i*r + t) mod n_k`` for ``t < r``, ``i = e mod R``. So a source smaller than its share
  repeats whole passes, and a larger one is subsampled (no repeat inside an epoch) and rotates:
  each round of R epochs draws every sample at least once (the permutation's first ``R*r - n_k``
  twice), so every sample is seen every R epochs.
* Order: the epoch's E (source, sample) pairs, sources in index order and each source's pairs in
  the order above, are permuted by one seeded permutation of E drawn from (seed, epoch). The result
  depends on nothing else, in particular not on the number of ranks.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

from dstore.errors import ConfigError
from dstore.order.shuffle import check_seed, epoch_rng

_ORDER, _WALK = 10, 11  # random stream tags apart from dstore.order.shuffle's (0-2); source k uses _WALK + k


def check_weights(weights, nsources: int, names=None) -> np.ndarray:
    """`weights` as float64[nsources], or ConfigError naming the bad one (each finite, >= 0, some > 0).

    Args:
        names: each source's name for the messages (its container); None: its index only.
    """
    weights = list(weights)

    def src(i: int) -> str:
        return f"source {i}" + (f" ({names[i]})" if names is not None and i < len(names) else "")

    if len(weights) != nsources:
        raise ConfigError(f"{len(weights)} weights for {nsources} sources")
    w = np.empty(nsources, dtype=np.float64)
    for i, x in enumerate(weights):
        try:
            w[i] = float(x)
        except (TypeError, ValueError):
            raise ConfigError(f"{src(i)}: weight {x!r} must be a number (a finite ratio >= 0)") from None
        if not math.isfinite(w[i]) or w[i] < 0:
            raise ConfigError(f"{src(i)}: weight {float(w[i])!r} must be a finite number >= 0")
    if not (w > 0).any():
        raise ConfigError(f"the weights {[float(x) for x in w]} must not all be 0: give some source a weight > 0")
    return w


def mix_counts(epoch_size: int, weights) -> np.ndarray:
    """Samples per source per epoch (int64[K]): the largest-remainder rounding of
    ``epoch_size * w / sum(w)`` (see the module docstring); they sum to `epoch_size`."""
    if isinstance(epoch_size, bool) or int(epoch_size) != epoch_size or epoch_size < 1:
        raise ConfigError(f"epoch_size={epoch_size!r} must be an integer >= 1")
    e = int(epoch_size)
    # Exact rationals of the weights as written in decimal (0.7 is 7/10): ties are real ties.
    w = [Fraction(repr(float(x))) for x in weights]
    share = [e * x / sum(w) for x in w]
    counts = [math.floor(s) for s in share]
    # Python's sort is stable: equal remainders go to the lower index first.
    for k in sorted(range(len(w)), key=lambda k: -(share[k] - counts[k]))[: e - sum(counts)]:
        counts[k] += 1
    return np.asarray(counts, dtype=np.int64)


def rotating_subset(n: int, r: int, seed: int, source: int, epoch: int) -> np.ndarray:
    """The r distinct samples (r < n) source `source` draws in `epoch` (see the module docstring)."""
    if r == 0:
        return np.zeros(0, dtype=np.int64)
    rounds = -(-n // r)
    j, i = divmod(int(epoch), rounds)
    perm = epoch_rng(seed, j, _WALK + int(source)).permutation(n).astype(np.int64, copy=False)
    return perm[(i * r + np.arange(r)) % n]


def source_samples(n: int, count: int, seed: int, source: int, epoch: int) -> np.ndarray:
    """The sample ids source `source` (n samples) contributes to `epoch` (int64[count], unordered)."""
    q, r = divmod(int(count), int(n))
    whole = np.tile(np.arange(n, dtype=np.int64), q)
    return np.concatenate([whole, rotating_subset(int(n), r, seed, source, epoch)])


def _checked(sizes, weights, seed: int, epoch_size: int | None) -> tuple[list[int], int, np.ndarray]:
    """(sizes, seed, counts) of a mix, each checked (ConfigError)."""
    sizes = [int(s) for s in sizes]
    if not sizes or min(sizes) < 1:
        raise ConfigError(f"sizes={sizes!r}: every source needs at least one sample")
    w = check_weights(weights, len(sizes))
    seed = check_seed(seed)
    e_size = sum(sizes) if epoch_size is None else epoch_size
    return sizes, seed, mix_counts(e_size, w)


def mix_plan(sizes, weights, seed: int, epoch: int, epoch_size: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The epoch's global order of a mix: (source index int64[E], sample id int64[E]).

    Args:
        sizes: each source's number of samples (each >= 1).
        weights: each source's weight (>= 0, not all 0); only their ratios matter.
        seed, epoch: as for dstore.order.shuffle.global_order.
        epoch_size: samples per epoch E; None: the sum of `sizes`.
    """
    sizes, seed, counts = _checked(sizes, weights, seed, epoch_size)
    rng = epoch_rng(seed, epoch, _ORDER)  # validates epoch
    src = np.repeat(np.arange(len(sizes), dtype=np.int64), counts)
    ids = np.concatenate([source_samples(n, c, seed, k, epoch) for k, (n, c) in enumerate(zip(sizes, counts))])
    perm = rng.permutation(src.size)
    return src[perm], ids[perm]


def mix_at(
    sizes, weights, seed: int, epoch: int, positions, epoch_size: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """``mix_plan(...)`` at `positions` only: (source index, sample id) of each, without building the
    epoch's E pairs. The order's permutation of E is still drawn whole (numpy's permutation is not
    evaluated per position: O(E) memory, 8 bytes per pair, a sixth of mix_plan's), each source's
    rotating subset too (O(its size))."""
    sizes, seed, counts = _checked(sizes, weights, seed, epoch_size)
    rng = epoch_rng(seed, epoch, _ORDER)  # validates epoch; drawn as mix_plan draws it
    pos = np.asarray(positions, dtype=np.int64)
    pair = rng.permutation(int(counts.sum()))[pos]  # index into the pairs in source order
    cum = np.zeros(len(sizes) + 1, dtype=np.int64)
    np.cumsum(counts, out=cum[1:])
    src = np.searchsorted(cum, pair, side="right") - 1
    t = pair - cum[src]  # the pair's index within its source's pairs (source_samples' order)
    ids = np.empty(pos.shape, dtype=np.int64)
    for k, (n, c) in enumerate(zip(sizes, counts.tolist())):
        sel = src == k
        if not sel.any():
            continue
        q, r = divmod(int(c), n)
        tk = t[sel]
        whole = tk < q * n
        out = tk % n
        if r and not whole.all():
            out[~whole] = rotating_subset(n, r, seed, k, epoch)[tk[~whole] - q * n]
        ids[sel] = out
    return src, ids
