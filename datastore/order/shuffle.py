"""Epoch orders as pure functions of (sizes, seed, epoch): index arrays, no MPI, no global state.

The orders of the three policies (dstore.order.policy holds the policy objects, `POLICIES`), each one
int64 permutation of ``range(num_samples)``:

* ``global``: one permutation of all samples; it depends only on (seed, epoch, N), never on the
  number of ranks. It is a keyed bijection (dstore.order.permute: a Feistel network with cycle-walking)
  that maps a position of the order to its sample in O(1), so a rank computes only the positions
  it serves (`global_permutation`; O(N/P) memory), never the whole order. The plan (dstore.order.plan)
  cuts it into global batches and per-rank slices. (Before this bijection, the order was numpy's
  ``Generator.permutation``; the same seed gives another order since.)
* ``local``: each rank's contiguous block (``bounds[r]:bounds[r+1]``) is permuted within itself,
  so rank r's part of the result is ``result[bounds[r]:bounds[r+1]]`` and holds only its own
  samples (no traffic). The within-block order comes from one random key per sample drawn from
  (seed, epoch), so it is the order those keys induce, whatever the block boundaries are. A rank
  draws only its block's keys (`local_block`: the generator advanced to the block's first key),
  so its part costs O(N/P) memory.
* ``partial``: the ``local`` result, then a random ``fraction`` of all slots exchange their
  contents among themselves (one seeded permutation of the chosen slots' contents): about that
  fraction of the samples change hands each epoch. The chosen slots span all ranks, so this
  policy still builds the whole order on every rank (O(N) per rank during the schedule's making).
"""

from __future__ import annotations

from typing import cast

import numpy as np

from dstore.errors import ConfigError
from dstore.order.permute import Permutation
from dstore.runtime import values

# Stream tags keep the random streams of different uses apart for one (seed, epoch).
_GLOBAL, _LOCAL, _PARTIAL = 0, 1, 2


def check_seed(seed) -> int:
    """`seed` as an int, or ConfigError if it is not a non-negative integer."""
    return values.seed("seed", seed)


def epoch_rng(seed: int, epoch: int, stream: int = 0) -> np.random.Generator:
    """The generator for (seed, epoch, stream): the only source of randomness in the orders."""
    seed = check_seed(seed)
    if isinstance(epoch, bool) or not isinstance(epoch, (int, np.integer)) or epoch < 0:
        raise ConfigError(f"epoch={epoch!r} must be a non-negative integer")
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, int(epoch), int(stream)])))


def global_permutation(num_samples: int, seed: int, epoch: int) -> Permutation:
    """The epoch's order as a bijection: ``perm[positions]`` are the samples at those positions."""
    epoch_rng(seed, epoch)  # validates seed and epoch
    return Permutation(int(num_samples), (int(seed), int(epoch), _GLOBAL))


def global_order(num_samples: int, seed: int, epoch: int) -> np.ndarray:
    """The epoch's permutation of all samples (int64[num_samples]); independent of rank count.
    O(N) memory: a store builds only its own positions (`global_permutation`)."""
    return np.asarray(global_permutation(num_samples, seed, epoch))


def local_block(bounds: np.ndarray, rank: int, seed: int, epoch: int) -> np.ndarray:
    """Block `rank` of `local_order` (its samples in the order of their keys), drawing only the
    block's keys: O(block) memory. Equal to ``local_order(bounds, seed, epoch)[bounds[rank]:bounds[rank+1]]``."""
    lo, hi = int(bounds[rank]), int(bounds[rank + 1])
    rng = epoch_rng(seed, epoch, _LOCAL)
    # One 64-bit draw per double (PCG64 + Generator.random): skipping lo draws lands on key lo.
    cast(np.random.PCG64, rng.bit_generator).advance(lo)  # numpy types it as the base BitGenerator
    keys = rng.random(hi - lo)
    return lo + np.argsort(keys, kind="stable").astype(np.int64, copy=False)


def local_order(bounds: np.ndarray, seed: int, epoch: int) -> np.ndarray:
    """Each block ``bounds[r]:bounds[r+1]`` permuted within itself (int64[N], N = bounds[-1])."""
    bounds = np.asarray(bounds, dtype=np.int64)
    n = int(bounds[-1])
    keys = epoch_rng(seed, epoch, _LOCAL).random(n)
    block = np.repeat(np.arange(len(bounds) - 1), np.diff(bounds))
    # Sort by block first, then by key: block r's slots receive block r's samples in key order.
    return np.lexsort((keys, block)).astype(np.int64, copy=False)


def partial_order(bounds: np.ndarray, seed: int, epoch: int, fraction: float) -> np.ndarray:
    """The local order with a random `fraction` of slots exchanging contents (int64[N])."""
    fraction = check_fraction(fraction)
    out = local_order(bounds, seed, epoch)
    n = out.size
    m = int(round(fraction * n))
    if m >= 2:
        rng = epoch_rng(seed, epoch, _PARTIAL)
        slots = np.sort(rng.choice(n, size=m, replace=False))
        out[slots] = out[slots][rng.permutation(m)]
    return out


def check_fraction(fraction) -> float:
    """`fraction` as a float in [0, 1], or ConfigError."""
    return values.number("partial_fraction", fraction, 0.0, 1.0)
