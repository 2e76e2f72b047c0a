"""Pure arithmetic of the store: who owns which sample, which rank gets which sample in which step,
where a sample lives in its owner's window, and how a batch's gets coalesce. No MPI.

Rules (the store's docstring repeats them for users):

* Ownership: contiguous blocks balanced by bytes (plus one unit per sample, so a set of empty
  samples still spreads). ``owner_of`` is a binary search over the block bounds.
* Steps: ``steps_per_epoch = N // B`` with drop_last, else ``ceil(N / B)``; the same on every rank.
* Global policy: step s covers positions ``[s*B, s*B + n_s)`` of the epoch order, ``n_s = B`` except
  the last (``N - s*B``) when not dropping; rank r takes the contiguous part
  ``[s*B + n_s*r // P, s*B + n_s*(r+1) // P)``. drop_last drops the order's last ``N % B``.
* Local/partial policies (dstore.order.policy, `Policy.schedule`): rank r deals its own part of
  the epoch order over the same number of steps (step s gets items ``[len*s // S, len*(s+1) // S)``);
  nothing is dropped, even with drop_last.
* Padding: a rank whose share of a step would be empty (only when a step holds fewer samples than
  ranks) gets one pad sample instead, a repeat flagged in ``Schedule.pad`` (its own first sample
  of the epoch); pads are never counted as deliveries.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import numpy as np
from numpy.typing import ArrayLike

from dstore.errors import ConfigError

STATE_VERSION = 1
"""Version of the DataStore state dict layout."""


def block_bounds(offsets: np.ndarray, nranks: int) -> np.ndarray:
    """Block boundaries int64[nranks+1]: rank r owns samples ``bounds[r]:bounds[r+1]``.

    Blocks are contiguous and balanced by bytes: each holds at most ``total/nranks`` plus one
    sample's cost, where a sample costs its bytes plus one.
    """
    if nranks < 1:
        raise ConfigError(f"nranks={nranks} must be >= 1")
    offsets = np.asarray(offsets)
    n = offsets.size - 1

    def cum(i):  # cost of samples [0, i), looked up (no int64[N] temporary)
        return offsets[i].astype(np.int64) + i

    total = int(cum(n))
    targets = (np.arange(nranks + 1, dtype=np.int64) * total) // nranks
    # The boundary nearest each target: the first index whose cumulative cost reaches it (a
    # bisection over the increasing cum), or the one before if that is closer.
    lo_b, hi = np.zeros(targets.size, dtype=np.int64), np.full(targets.size, n + 1, dtype=np.int64)
    while np.any(lo_b < hi):
        mid = (lo_b + hi) // 2
        below = cum(np.minimum(mid, n)) < targets
        lo_b, hi = np.where(below & (lo_b < hi), mid + 1, lo_b), np.where(~below & (lo_b < hi), mid, hi)
    lo = np.maximum(hi - 1, 0)
    hi = np.minimum(hi, n)
    pick_lo = (targets - cum(lo)) < (cum(hi) - targets)
    bounds = np.where(pick_lo, lo, hi).astype(np.int64)
    bounds[0], bounds[-1] = 0, n
    return np.maximum.accumulate(bounds)


def owner_of(bounds: np.ndarray, ids) -> np.ndarray:
    """The owning rank of each sample index in `ids` (binary search over the bounds)."""
    return np.searchsorted(bounds, ids, side="right") - 1


def steps_per_epoch(num_samples: int, batch_size: int, drop_last: bool) -> int:
    """Steps every rank takes per epoch: ``N // B`` with drop_last, else ``ceil(N / B)``."""
    return num_samples // batch_size if drop_last else -(-num_samples // batch_size)


def share(n: int, nranks: int, rank: int) -> tuple[int, int]:
    """Rank's contiguous part ``[lo, hi)`` of n items split as evenly as possible over nranks."""
    return (n * rank) // nranks, (n * (rank + 1)) // nranks


@dataclasses.dataclass(frozen=True)
class Schedule:
    """One rank's deliveries in one epoch.

    Attributes:
        ids: int64[M], sample indices in delivery order.
        ptr: int64[S+1]; step s delivers ``ids[ptr[s]:ptr[s+1]]``.
        pad: bool[M]; True where the entry is a padding repeat (see the module docstring).
    """

    ids: np.ndarray | Derived
    ptr: np.ndarray
    pad: np.ndarray | Derived

    @property
    def steps(self) -> int:
        return self.ptr.size - 1

    def step(self, s: int) -> slice:
        return slice(int(self.ptr[s]), int(self.ptr[s + 1]))


def _with_pads(ids: np.ndarray, counts: np.ndarray, pad_id: int) -> Schedule:
    """A Schedule from per-step counts, with one pad entry in each empty step."""
    counts = np.asarray(counts, dtype=np.int64)
    empty = counts == 0
    newc = np.where(empty, 1, counts)
    ptr = np.zeros(counts.size + 1, dtype=np.int64)
    np.cumsum(newc, out=ptr[1:])
    if not empty.any():
        return Schedule(ids.astype(np.int64, copy=False), ptr, np.zeros(ids.size, dtype=bool))
    out = np.full(int(ptr[-1]), pad_id, dtype=np.int64)
    pad = np.ones(out.size, dtype=bool)
    oldptr = np.zeros(counts.size + 1, dtype=np.int64)
    np.cumsum(counts, out=oldptr[1:])
    step_of = np.repeat(np.arange(counts.size), counts)
    dest = ptr[step_of] + (np.arange(ids.size) - oldptr[step_of])
    out[dest] = ids
    pad[dest] = False
    return Schedule(out, ptr, pad)


def global_schedule(order, batch_size: int, nranks: int, rank: int, drop_last: bool) -> Schedule:
    """Rank's deliveries under the global policy (see the module docstring).

    `order` is the epoch's order as an int64 array or as a dstore.order.permute.Permutation. With an array
    the schedule's ids are an int64 array. With a Permutation and no pad entry, its `ids` and `pad`
    are `Derived`: an entry's id is computed when it is looked up (its position from the entry's
    index, then the bijection), so the schedule holds only `ptr` (O(steps)), not O(N/P) ids; with a
    pad entry (a step with fewer samples than ranks) only the rank's own positions are looked up
    once, O(N/P)."""
    n = order.size
    steps = steps_per_epoch(n, batch_size, drop_last)
    full = min(steps, n // batch_size)
    lo, hi = share(batch_size, nranks, rank)
    counts = [hi - lo] * full
    llo = lhi = 0
    if steps > full:  # the short last step
        llo, lhi = share(n - full * batch_size, nranks, rank)
        counts.append(lhi - llo)
    counts = np.asarray(counts, dtype=np.int64)
    w, head = hi - lo, full * (hi - lo)

    def positions(j: np.ndarray) -> np.ndarray:  # entry j of the rank's epoch -> its position in the order
        j = np.asarray(j, dtype=np.int64)
        s = j // max(w, 1)
        return np.where(j < head, s * batch_size + lo + (j - s * w), full * batch_size + llo + (j - head))

    if not isinstance(order, np.ndarray) and counts.size and counts.min() > 0:
        ptr = np.zeros(counts.size + 1, dtype=np.int64)
        np.cumsum(counts, out=ptr[1:])
        m = int(ptr[-1])
        return Schedule(
            Derived(m, _Blocks(lambda j: order[positions(j)], m)),
            ptr,
            Derived(m, lambda j: np.zeros(np.size(j), dtype=bool)),
        )
    idx = positions(np.arange(int(counts.sum()), dtype=np.int64))
    # A pad repeats the rank's own first sample of the epoch (so under dynamic population it is
    # one the rank holds); a rank with no sample at all in step 0 (N < ranks) repeats order[rank % N].
    l0, h0 = share(min(batch_size, n), nranks, rank)
    pad_id = int(order[l0]) if h0 > l0 else int(order[rank % n])
    return _with_pads(np.asarray(order[idx], dtype=np.int64), counts, pad_id)


BLOCK = 1 << 16
"""Entries of a schedule computed on lookup that one lookup computes at least (`_Blocks`): an epoch
reads its schedule step by step, and a step is too few positions to pay the bijection's per-call cost."""


class _Blocks:
    """`fn` (entries -> ids) computed BLOCK entries at a time, the last block kept: a lookup inside it
    is a copy. Memory O(BLOCK); a lookup wider than BLOCK is computed as it is."""

    def __init__(self, fn, m: int):
        self.fn, self.m = fn, int(m)
        self._block = (0, 0, np.zeros(0, dtype=np.int64))

    def __call__(self, j: np.ndarray) -> np.ndarray:
        if j.size == 0:
            return np.zeros(0, dtype=np.int64)
        a, b = int(j.min()), int(j.max()) + 1
        lo, hi, ids = self._block  # one tuple: a thread reading beside the epoch sees a whole block
        if a < lo or b > hi:
            if b - a > BLOCK:
                return self.fn(j)
            lo, hi = a, min(self.m, max(b, a + BLOCK))
            ids = self.fn(np.arange(lo, hi, dtype=np.int64))
            self._block = (lo, hi, ids)
        return ids[j - lo]


def dealt_schedule(seq: np.ndarray, steps: int, pad_id: int) -> Schedule:
    """`seq` dealt in order over `steps` steps (step s gets ``seq[len*s//S : len*(s+1)//S]``)."""
    ptr = (np.arange(steps + 1, dtype=np.int64) * seq.size) // max(steps, 1)
    return _with_pads(np.asarray(seq, dtype=np.int64), np.diff(ptr), pad_id)


def global_assignment(num_samples: int, batch_size: int, nranks: int, drop_last: bool) -> np.ndarray:
    """The rank that takes each position of a global-policy order (int64[N]; -1 where dropped)."""
    return assignment_at(np.arange(num_samples, dtype=np.int64), num_samples, batch_size, nranks, drop_last)


def assignment_at(positions: np.ndarray, num_samples: int, batch_size: int, nranks: int, drop_last: bool) -> np.ndarray:
    """`global_assignment` at `positions` only (int64, -1 where dropped): O(1) per position."""
    n = num_samples
    p = np.asarray(positions, dtype=np.int64)
    q = p % batch_size
    last_start = (n // batch_size) * batch_size
    size_of_step = np.where(p >= last_start, n - last_start, batch_size)
    # Largest r with n_s*r // P <= q, i.e. ((q+1)*P - 1) // n_s.
    out = ((q + 1) * nranks - 1) // np.maximum(size_of_step, 1)
    if drop_last:
        out = np.where(p >= last_start, -1, out)
    return out


def _whole(op: str):
    """`Derived`'s operator `op`: the whole array's (np.asarray, O(n))."""

    def method(self, *args):
        return getattr(np.asarray(self), op)(*args)

    method.__name__ = op
    return method


class Derived:
    """An int64[n] array that is never stored: each lookup computes its entries from `fn(ids)`.

    Indexed like an array (an int, a slice, an int array, a bool mask); `np.asarray` builds the
    whole of it (O(n): for the paths that need all of it, e.g. the tiered store's resident set).
    Comparisons with a scalar give the whole bool array, as an array's would.
    """

    def __init__(self, n: int, fn):
        self.n, self.fn = int(n), fn

    def __len__(self) -> int:
        return self.n

    @property
    def size(self) -> int:
        return self.n

    def __getitem__(self, ids):
        if type(ids) is np.ndarray and ids.dtype == np.int64 and ids.ndim == 1:  # the hot path: a step's ids
            if ids.size == 0 or ids.min() >= 0:
                return self.fn(ids)
        if isinstance(ids, slice):
            return self.fn(np.arange(*ids.indices(self.n), dtype=np.int64))
        ids = np.asarray(ids)
        if ids.dtype == bool:
            return self.fn(np.nonzero(ids)[0])
        if ids.ndim == 0:
            i = int(ids)
            return self.fn(np.asarray([i + self.n if i < 0 else i], dtype=np.int64))[0]
        return self.fn(np.where(ids < 0, ids + self.n, ids).astype(np.int64, copy=False))

    def __array__(self, dtype=None, copy=None):
        out = self[0 : self.n]
        return out if dtype is None else out.astype(dtype)

    def __getattr__(self, name):  # array methods (sum, max, ...) on the whole array
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(np.asarray(self), name)

    # The whole array's operators, written in the class (not set in a loop) so a type checker sees them.
    __eq__ = _whole("__eq__")
    __ne__ = _whole("__ne__")
    __lt__ = _whole("__lt__")
    __le__ = _whole("__le__")
    __gt__ = _whole("__gt__")
    __ge__ = _whole("__ge__")
    __add__ = _whole("__add__")
    __radd__ = _whole("__radd__")
    __sub__ = _whole("__sub__")
    __rsub__ = _whole("__rsub__")
    __mul__ = _whole("__mul__")
    __rmul__ = _whole("__rmul__")
    __neg__ = _whole("__neg__")
    __and__ = _whole("__and__")
    __rand__ = _whole("__rand__")
    __or__ = _whole("__or__")
    __ror__ = _whole("__ror__")
    __floordiv__ = _whole("__floordiv__")
    __mod__ = _whole("__mod__")
    __invert__ = _whole("__invert__")
    __hash__: ClassVar[None] = None  # pyright: ignore[reportIncompatibleMethodOverride] - unhashable as an array (== is elementwise)


def largest_sum(offsets: np.ndarray, k: int, chunk: int = 1 << 20) -> int:
    """Bytes of the k largest samples (sizes from `offsets`), reading the sizes in chunks: memory
    O(k + chunk), not O(N)."""
    n = len(offsets) - 1
    k = min(int(k), n)
    if k <= 0:
        return 0
    best = np.zeros(0, dtype=np.int64)
    for a in range(0, n, chunk):
        cand = np.concatenate([best, np.diff(offsets[a : min(a + chunk, n) + 1])])
        best = np.partition(cand, cand.size - k)[-k:] if cand.size > k else cand
    return int(best.sum())


def sizes_of(offsets: np.ndarray) -> Derived:
    """Each sample's bytes, ``offsets[i+1] - offsets[i]``, computed on lookup (no int64[N] copy)."""
    return Derived(len(offsets) - 1, lambda ids: offsets[ids + 1] - offsets[ids])


@dataclasses.dataclass(frozen=True)
class Layout:
    """Where every sample lives: ``owner[i]`` holds it at byte ``disp[i]`` of its window.

    Attributes:
        owner: int64[N] (or a `Derived` computing it: block layouts store nothing per sample).
        disp: int64[N], byte displacement inside the owner's window (likewise).
        nbytes: int64[P], each rank's window size.
        base: int64[P+1] for a block layout (``disp[i] = offsets[i] - base[owner[i]]``, which a
            caller that has the offsets and owners at hand computes without a lookup), else None.
    """

    owner: np.ndarray | Derived
    disp: np.ndarray | Derived
    nbytes: np.ndarray
    base: np.ndarray | None = None


def block_layout(offsets: np.ndarray, bounds: np.ndarray) -> Layout:
    """Layout of contiguous blocks: rank r's window is bytes ``offsets[bounds[r]]:offsets[bounds[r+1]]``.
    Owner and displacement are computed on lookup (a binary search over the P+1 bounds), so the
    layout holds O(P), not O(N)."""
    offsets = np.asarray(offsets, dtype=np.int64)
    bounds = np.asarray(bounds, dtype=np.int64)
    n = offsets.size - 1
    base = offsets[bounds]
    owner = Derived(n, lambda ids: owner_of(bounds, ids))
    disp = Derived(n, lambda ids: offsets[ids] - base[owner_of(bounds, ids)])
    return Layout(owner, disp, np.diff(base), base)


def scattered_layout(offsets: np.ndarray, owner: ArrayLike, nranks: int) -> Layout:
    """Layout where rank r holds the samples with ``owner == r`` back to back in index order."""
    offsets = np.asarray(offsets, dtype=np.int64)
    sizes = np.diff(offsets)
    owner = np.asarray(owner, dtype=np.int64)
    perm = np.lexsort((np.arange(owner.size), owner))  # by owner, then index
    csum = np.zeros(owner.size + 1, dtype=np.int64)
    np.cumsum(sizes[perm], out=csum[1:])
    counts = np.bincount(owner, minlength=nranks)
    first = np.zeros(nranks + 1, dtype=np.int64)
    np.cumsum(counts, out=first[1:])
    disp = np.empty(owner.size, dtype=np.int64)
    disp[perm] = csum[:-1] - csum[first[owner[perm]]]
    return Layout(owner, disp, csum[first[1:]] - csum[first[:-1]])


def dynamic_owner(num_samples: int, batch_size: int, nranks: int, drop_last: bool, order0: np.ndarray) -> np.ndarray:
    """Owners under dynamic population: whoever takes the sample in epoch 0 (global policy);
    samples epoch 0 drops go round-robin by position."""
    who = global_assignment(num_samples, batch_size, nranks, drop_last)
    dropped = who < 0
    who[dropped] = np.nonzero(dropped)[0] % nranks
    owner = np.empty(num_samples, dtype=np.int64)
    owner[order0] = who
    return owner


def dynamic_owner_of(num_samples: int, batch_size: int, nranks: int, drop_last: bool, perm0) -> Derived:
    """`dynamic_owner` computed on lookup from epoch 0's bijection (`perm0`, a
    dstore.order.permute.Permutation): a sample's position by the inverse, then its taker (O(1) each)."""

    def fn(ids: np.ndarray) -> np.ndarray:
        pos = perm0.position_of(ids)
        who = assignment_at(pos, num_samples, batch_size, nranks, drop_last)
        return np.where(who < 0, pos % nranks, who)

    return Derived(num_samples, fn)


def owner_layout(offsets: np.ndarray, owner, nranks: int, chunk: int = 1 << 20) -> Layout:
    """`scattered_layout` (rank r holds the samples with ``owner == r`` back to back in index order)
    for an `owner` computed on lookup (a `Derived`), read in chunks of `chunk` samples: the owners
    are kept in the smallest unsigned type that holds a rank (1 byte per sample up to 256 ranks:
    a step's lookups stay array reads), the displacements as int64; temporaries O(chunk), not O(N)."""
    offsets = np.asarray(offsets, dtype=np.int64)
    n = offsets.size - 1
    kind = next(t for t in (np.uint8, np.uint16, np.uint32, np.int64) if nranks - 1 <= np.iinfo(t).max)
    kept = np.empty(n, dtype=kind)
    disp = np.empty(n, dtype=np.int64)
    total = np.zeros(nranks, dtype=np.int64)  # each rank's bytes of the samples before the chunk
    for a in range(0, n, chunk):
        b = min(n, a + chunk)
        own = np.asarray(owner[a:b], dtype=np.int64)
        kept[a:b] = own
        sz = offsets[a + 1 : b + 1] - offsets[a:b]
        perm = np.argsort(own, kind="stable")  # by owner, then index
        cs = np.cumsum(sz[perm])
        o = own[perm]
        first = np.searchsorted(o, o, side="left")
        before = np.where(first > 0, cs[np.maximum(first - 1, 0)], 0)  # the owner's bytes earlier in the chunk
        disp[a + perm] = total[o] + cs - sz[perm] - before
        if o.size:  # each owner's bytes in the chunk: its group's last cumulative sum less the one before
            last = np.nonzero(np.r_[o[1:] != o[:-1], True])[0]
            ends = cs[last]
            total[o[last]] += ends - np.r_[0, ends[:-1]]
    return Layout(kept, disp, total)


@dataclasses.dataclass(frozen=True)
class Fetch:
    """How one batch is gathered: remote entries coalesced into runs, local ones served in place.

    Attributes:
        local: bool[b], entry served in place: from this rank's own window, or from a node peer's
            window this rank maps.
        start: int64[b], byte start of each entry: in its owner's window if local, else in the
            receive buffer.
        length: int64[b], each entry's bytes.
        run_owner, run_disp, run_len, run_buf: int64[R], one Get each: ``run_len`` bytes from
            ``run_owner``'s window at ``run_disp`` into the receive buffer at ``run_buf``.
        remote_bytes: bytes the receive buffer needs.
    """

    local: np.ndarray
    start: np.ndarray
    length: np.ndarray
    run_owner: np.ndarray
    run_disp: np.ndarray
    run_len: np.ndarray
    run_buf: np.ndarray
    remote_bytes: int


def plan_fetch(
    owner: np.ndarray, disp: np.ndarray, length: np.ndarray, rank: int, mapped: np.ndarray | None = None
) -> Fetch:
    """Groups a batch's entries (their owner, displacement, length) by owner and coalesces entries
    contiguous in the owner's window into one run. Entries owned by `rank`, or by a rank whose
    window this rank maps (`mapped[owner]`, a bool per rank: a node peer), need no get; their
    `start` is their displacement in the owner's window."""
    owner = np.asarray(owner, dtype=np.int64)
    disp = np.asarray(disp, dtype=np.int64)
    length = np.asarray(length, dtype=np.int64)
    local = owner == rank if mapped is None else np.asarray(mapped, dtype=bool)[owner]
    start = disp.copy()
    rem = np.nonzero(~local)[0]
    if rem.size == 0:
        e = np.zeros(0, dtype=np.int64)
        return Fetch(local, start, length, e, e, e, e, 0)
    s = rem[np.lexsort((disp[rem], owner[rem]))]
    o, d, ln = owner[s], disp[s], length[s]
    buf = np.zeros(s.size + 1, dtype=np.int64)
    np.cumsum(ln, out=buf[1:])
    start[s] = buf[:-1]
    new = np.ones(s.size, dtype=bool)
    new[1:] = (o[1:] != o[:-1]) | (d[1:] != d[:-1] + ln[:-1])
    heads = np.nonzero(new)[0]
    run_len = np.add.reduceat(ln, heads)
    keep = run_len > 0
    return Fetch(local, start, length, o[heads][keep], d[heads][keep], run_len[keep], buf[heads][keep], int(buf[-1]))
