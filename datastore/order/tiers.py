"""Pure arithmetic of the tiered store: which samples stay resident in their owner's window when the
data set exceeds the memory budget, and how a step's storage reads coalesce. No MPI, no I/O.

* Residency: each rank keeps a seeded random subset of the samples it owns, as many as fit the
  bytes it may keep (its budget less its buffers): its samples in the order of one random key per
  sample drawn from the seed, the longest prefix that fits. Empty samples are always resident. A
  sample is resident in exactly one window (its owner's) or in none; the non-resident ones are read
  from the container by the rank that needs them. A random subset is spread evenly over every
  epoch's steps in expectation, whatever the shuffle policy, since each epoch's order is drawn
  independently of it.
* Storage reads of one step: the step's non-resident entries (pads excluded; see the store),
  sorted by sample index, runs of consecutive indices coalesced into one read each.
* Reads of the tiered preload: a rank's resident samples in index order, runs of them joined
  across a gap of non-resident bytes no larger than a threshold (reading a small gap costs less
  than another request), each read at most a piece long.
"""

from __future__ import annotations

import dataclasses

import numpy as np
from numpy.typing import ArrayLike

from dstore.errors import ConfigError

OVERFLOWS = ("serve", "error")
"""What a store does when its data exceed the budget: serve the rest from storage, or refuse."""
POPULATIONS = ("preload", "dynamic", "stream")
"""How a store fills its windows: every resident sample at construction, during epoch 0 as its
batches need them, or in big pieces in the background while epoch 0 is served (dstore.store.stream)."""

_STREAM = 7  # the residency's random stream, apart from the shuffles' streams of the same seed


def check_overflow(overflow) -> str:
    """`overflow` if it is one of OVERFLOWS, else ConfigError."""
    if overflow not in OVERFLOWS:
        raise ConfigError(f"overflow={overflow!r} is not one of {OVERFLOWS}")
    return overflow


def resident_mask(sizes: ArrayLike, owner: ArrayLike, keep: ArrayLike, seed: int) -> np.ndarray:
    """bool[N]: True where a sample stays in its owner's window (see the module docstring).

    Args:
        sizes: int64[N], each sample's bytes.
        owner: int64[N], each sample's owning rank.
        keep: int64[P], bytes each rank may keep (negative counts as 0).
        seed: the residency seed.
    """
    sizes = np.asarray(sizes, dtype=np.int64)
    owner = np.asarray(owner, dtype=np.int64)
    keep = np.maximum(np.asarray(keep, dtype=np.int64), 0)
    n = sizes.size
    if n == 0:
        return np.zeros(0, dtype=bool)
    keys = np.random.Generator(np.random.PCG64(np.random.SeedSequence([int(seed), _STREAM]))).random(n)
    perm = np.lexsort((keys, owner))  # by owner, then by key
    cum = np.cumsum(sizes[perm])
    o = owner[perm]
    first = np.searchsorted(o, o, side="left")  # index in perm of the first sample of each owner
    before = np.where(first > 0, cum[np.maximum(first - 1, 0)], 0)
    within = cum - before  # bytes of the owner's samples up to and including this one
    out = np.empty(n, dtype=bool)
    out[perm] = within <= keep[o]
    out[sizes == 0] = True
    return out


def resident_blocks(sizes, bounds: np.ndarray, keep: np.ndarray, seed: int) -> np.ndarray:
    """`resident_mask` where rank r owns the contiguous block ``bounds[r]:bounds[r+1]`` (a block
    layout), computed one block at a time: the same bool[N], with O(N/P) temporaries instead of
    O(N) (the keys are the same stream, drawn block after block; a block's samples in key order,
    ties by index, as the lexsort by owner then key orders them).

    Args:
        sizes: each sample's bytes (an int64[N] array or a dstore.order.plan.Derived: sliced per block).
        bounds: int64[P+1], the blocks; keep: int64[P], bytes each rank may keep; seed: the residency seed.
    """
    bounds = np.asarray(bounds, dtype=np.int64)
    keep = np.maximum(np.asarray(keep, dtype=np.int64), 0)
    n = int(bounds[-1])
    out = np.ones(n, dtype=bool)
    gen = np.random.Generator(np.random.PCG64(np.random.SeedSequence([int(seed), _STREAM])))
    for r in range(bounds.size - 1):
        lo, hi = int(bounds[r]), int(bounds[r + 1])
        if hi == lo:
            continue
        keys = gen.random(hi - lo)  # one 64-bit draw per key: block r's keys are draws [lo, hi)
        sz = np.asarray(sizes[lo:hi], dtype=np.int64)
        order = np.argsort(keys, kind="stable")
        res = np.empty(hi - lo, dtype=bool)
        res[order] = np.cumsum(sz[order]) <= keep[r]
        res[sz == 0] = True
        out[lo:hi] = res
    return out


CHUNK = 1 << 20
"""Samples per pass of `resident_offsets` (its temporaries are a few times this, not N)."""


def resident_offsets(sizes, resident: np.ndarray) -> np.ndarray:
    """Offsets int64[N+1] over the resident samples only (a non-resident sample takes no bytes), the
    input of dstore.order.plan.scattered_layout (or block_layout) for windows that hold only the resident
    samples. `sizes` may be a dstore.order.plan.Derived (read in chunks of CHUNK samples)."""
    n = len(resident)
    out = np.zeros(n + 1, dtype=np.int64)
    for a in range(0, n, CHUNK):
        b = min(n, a + CHUNK)
        eff = np.where(resident[a:b], np.asarray(sizes[a:b], dtype=np.int64), 0)
        np.cumsum(eff, out=out[a + 1 : b + 1])
        out[a + 1 : b + 1] += out[a]
    return out


@dataclasses.dataclass(frozen=True)
class StorageReads:
    """One step's storage reads.

    Attributes:
        entry: int64[b], each entry's byte start in the step's storage buffer, -1 if not read from
            storage.
        run_lo, run_hi: int64[R], sample index ranges ``[run_lo, run_hi)``, one read each.
        run_buf: int64[R], each read's byte start in the buffer.
        nbytes: bytes the buffer needs.
    """

    entry: np.ndarray
    run_lo: np.ndarray
    run_hi: np.ndarray
    run_buf: np.ndarray
    nbytes: int


def plan_storage(ids: np.ndarray, want: np.ndarray, offsets: np.ndarray) -> StorageReads:
    """The reads for the entries `ids[want]` (distinct sample indices), consecutive indices coalesced.

    Args:
        ids: int64[b], a step's sample indices.
        want: bool[b], entries read from storage.
        offsets: int64[N+1], the samples' byte offsets.
    """
    ids = np.asarray(ids, dtype=np.int64)
    want = np.asarray(want, dtype=bool)
    entry = np.full(ids.size, -1, dtype=np.int64)
    sel = np.nonzero(want)[0]
    if sel.size == 0:
        e = np.zeros(0, dtype=np.int64)
        return StorageReads(entry, e, e, e, 0)
    s = sel[np.argsort(ids[sel], kind="stable")]
    u = ids[s]
    if np.any(u[1:] == u[:-1]):
        raise ValueError("plan_storage: a sample is wanted twice in one step")
    sizes = offsets[u + 1] - offsets[u]
    pos = np.zeros(u.size + 1, dtype=np.int64)
    np.cumsum(sizes, out=pos[1:])
    entry[s] = pos[:-1]
    heads = np.nonzero(np.diff(u, prepend=-2) != 1)[0]
    ends = np.append(heads[1:], u.size)
    return StorageReads(entry, u[heads], u[ends - 1] + 1, pos[heads], int(pos[-1]))


def preload_reads(ids: np.ndarray, offsets: np.ndarray, piece: int, gap: float) -> list:
    """The reads of a tiered preload: groups ``(k, m)``, each one read of the bytes
    ``[offsets[ids[k]], offsets[ids[m - 1] + 1])``, in order, covering every sample of `ids`.

    A group joins consecutive samples of `ids` while the bytes between two of them (non-resident
    samples) are at most `gap` and the group's bytes stay within `piece`; a sample larger than
    `piece` is a group of its own. `gap=inf` joins across any gap (pieces of the block that skip
    only what holds no sample of `ids`).

    Args:
        ids: int64[n], increasing sample indices (the resident, non-empty samples of a block).
        offsets: int64[N+1], the samples' byte offsets.
        piece: the most bytes of one read (>= 1).
        gap: the most bytes of non-resident samples one read may cross between two of `ids`.
    """
    ids = np.asarray(ids, dtype=np.int64)
    if ids.size == 0:
        return []
    starts, ends = offsets[ids], offsets[ids + 1]
    breaks = np.nonzero(starts[1:] - ends[:-1] > gap)[0] + 1
    groups = []
    k = 0
    for stop in np.append(breaks, ids.size).tolist():
        while k < stop:
            m = k + int(np.searchsorted(ends[k:stop], starts[k] + piece, side="right"))
            groups.append((k, max(m, k + 1)))
            k = max(m, k + 1)
    return groups
