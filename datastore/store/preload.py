"""The preload's reads: a block of samples (or only its resident ones) read from the container into
window memory in pieces, several range reads in flight, each checked where it was read.

One stream of synchronous reads pays one storage round trip per request (the kernel splits a large
read into requests of about 1 MiB that a FUSE or parallel file system serves one after the other),
so a preload reads its block in pieces of `PARALLEL_PIECE` bytes, `population_threads` at a time.
Each read thread opens its own reader of the container (dstore.store.storage.StorageReader: file
descriptors and chunk caches are not shared between threads; the backends read with `os.preadv`,
which releases the GIL), and a further thread faults in the pages of the pieces ahead of the reads
(dstore.store.prefault). A failed piece is named by its samples (each tried alone) and raised in the
thread that waits for it; dstore.store.populate agrees on it with every other rank.
"""

from __future__ import annotations

import collections
import concurrent.futures
import functools

import numpy as np

from dstore.formats.integrity import SampleChecks, read_error
from dstore.order import tiers
from dstore.order.plan import Derived
from dstore.store import prefault
from dstore.store.storage import StorageReader

PRELOAD_SCRATCH = 8 << 20
"""The most bytes of one read of a tiered preload (and of each scratch buffer that a read crossing
non-resident samples lands in before its resident samples are copied out)."""

GAP_BYTES = 256 << 10
"""The most bytes of non-resident samples one read of a tiered preload crosses (reads and drops)
between two resident samples instead of starting another read. A gap is worth reading while it
costs less than a request: bytes < bandwidth x the time one more request costs. A parallel file
system job's share (dstore pfs's defaults: 1 GB/s, 2,000 requests/s, so 0.5 ms a request even with
2 ms round trips overlapped 4 deep) gives about 500 KB; local NVMe (~2 GB/s, ~0.1 ms) about
200 KB. Only where the container is byte-addressable (ContainerReader.byte_addressable: unfiltered
HDF5, shards of it); elsewhere a read decodes whole chunks, so the preload reads pieces of the block."""

PARALLEL_PIECE = 4 << 20
"""Bytes per read of a preload with several reads in flight: a few storage requests each, and
enough pieces in a block for the threads to share."""


def _done(fn, *args) -> concurrent.futures.Future:
    """`fn(*args)` run now, in this thread, as a completed future (a one-thread population)."""
    f = concurrent.futures.Future()
    try:
        f.set_result(fn(*args))
    except Exception as exc:  # noqa: BLE001 - handed to whoever waits for the future
        f.set_exception(exc)
    return f


def _read_checked(container, lo: int, hi: int, out: np.ndarray, check) -> None:
    container.read_bytes(lo, hi, out)
    if check is not None:
        check(out)


class RangeReads:
    """Data byte ranges of a container read into caller's arrays, `threads` at a time.

    One thread: the store's own reader, in the calling thread. More: a StorageReader (`pool`, e.g.
    the storage tier's, whose readers the budget counts already), or one opened here and closed
    with `close()`.
    """

    def __init__(self, container, threads: int, pool: StorageReader | None = None):
        if pool is None and getattr(container, "path", None) is None:
            threads = 1  # a reader without a path cannot be opened again per thread
        self.container, self.threads = container, max(1, int(threads))
        self._own = None
        self.pool = pool
        if self.threads > 1 and pool is None:
            self.pool = self._own = StorageReader(container.path, self.threads, container.opened_identity)

    def submit(self, lo: int, hi: int, out: np.ndarray, check=None) -> concurrent.futures.Future:
        """Starts reading data bytes [lo, hi) into `out`, then `check(out)` in the reading thread."""
        if self.pool is None:
            return _done(_read_checked, self.container, lo, hi, out, check)
        return self.pool.submit(out, [lo], [hi], [0], [check])[0]

    def close(self) -> None:
        own, self._own = self._own, None
        if own is not None:
            own.close()


def piece_bytes(threads: int) -> int:
    """Bytes per piece of a preload reading with `threads` reads in flight."""
    return prefault.PIECE_BYTES if threads == 1 else min(PARALLEL_PIECE, prefault.PIECE_BYTES)


def read_pieces(submit, out: np.ndarray, piece: int, inflight: int, fail, cuts=None, order=None, done=None) -> None:
    """Fills `out` with `submit(a, b, out[a:b])` reads of its pieces, `inflight` at a time, while a
    thread faults in the pages of the pieces ahead of the reads (the first `inflight` take their
    faults in their reads).

    Waits for every read and fault started before it returns or raises, so nothing writes into
    `out` afterwards. A failed piece raises `fail(a, b, exc)` (the first failed piece in order).
    The pieces are `piece` bytes long, or cut at `cuts` (increasing, from 0 to out.size) where given.

    Args:
        order: the pieces' indices in the order to read them (default: consecutive).
        done: called with k after the first k pieces of that order are all in `out` (the streaming
            preload publishes its progress so; dstore.store.stream).
    """
    n = out.size
    if n == 0:
        return
    piece, inflight = max(1, int(piece)), max(1, int(inflight))
    cuts = list(range(0, n, piece)) + [n] if cuts is None else list(cuts)
    pieces = list(zip(cuts[:-1], cuts[1:]))
    if order is not None:
        pieces = [pieces[int(j)] for j in order]
    finished = [0]
    depth = inflight + 1  # faults run this many pieces ahead of the newest read, absorbing jitter
    reads = collections.deque()  # (a, b, future), in piece order
    touched = collections.deque()  # (k, future)
    queued = min(inflight, len(pieces))

    def finish():
        a, b, f = reads.popleft()
        try:
            f.result()
        except Exception as exc:
            raise fail(a, b, exc) from exc
        finished[0] += 1
        if done is not None:
            done(finished[0])

    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="dstore-prefault") as faults:
        try:
            for k, (a, b) in enumerate(pieces):
                while queued < len(pieces) and queued <= k + depth:
                    lo, hi = pieces[queued]
                    touched.append((queued, faults.submit(prefault.touch, out[lo:hi])))
                    queued += 1
                if touched and touched[0][0] == k:
                    touched.popleft()[1].result()  # piece k is faulted in
                while len(reads) >= inflight:
                    finish()
                reads.append((a, b, submit(a, b, out[a:b])))
            while reads:
                finish()
        finally:
            for _, f in touched:
                f.cancel()
            for _, _, f in reads:
                f.cancel()
            concurrent.futures.wait([f for _, f in touched] + [f for _, _, f in reads])


def preload(
    reads: RangeReads,
    container,
    start: int,
    offsets: np.ndarray,
    base: int,
    lo: int,
    hi: int,
    out: np.ndarray,
    checks: SampleChecks | None = None,
    order=None,
    done=None,
) -> None:
    """Served samples [lo, hi) into `out`, fresh window memory (its pages faulted in ahead), in
    pieces of whole samples, each checked against `checks` in the thread that read it; `order` and
    `done` as read_pieces's (the cuts: `sample_cuts(offsets, lo, hi, piece_bytes(reads.threads))`).

    Args:
        offsets: int64[N+1] of the served samples; `base` is the data byte of served sample 0.
        order, done: read_pieces's (the pieces are `piece_bytes(reads.threads)` long).
    """
    if hi <= lo:
        return
    first = int(offsets[lo])
    at = base + first

    def fail(a, b, exc):  # name the samples whose bytes the failed piece holds
        s = int(np.searchsorted(offsets, first + a, side="right")) - 1
        e = int(np.searchsorted(offsets, first + b, side="left"))
        return read_error(container, start, exc, max(s, lo), min(max(e, s + 1), hi))

    def submit(a, b, view):  # a piece holds whole samples: checked in the thread that read it
        s, e = (int(x) for x in np.searchsorted(offsets, (first + a, first + b), side="left"))
        return reads.submit(at + a, at + b, view, None if checks is None else functools.partial(checks.run, lo=s, hi=e))

    piece = piece_bytes(reads.threads)
    read_pieces(
        submit, out, piece, reads.threads, fail, cuts=sample_cuts(offsets, lo, hi, piece), order=order, done=done
    )


def sample_cuts(offsets: np.ndarray, lo: int, hi: int, piece: int) -> np.ndarray:
    """Byte cuts (from 0 to the bytes of samples [lo, hi)) into pieces of whole samples, each the
    longest run of samples within `piece` bytes, or one sample where it alone is longer."""
    rel = offsets[lo : hi + 1] - offsets[lo]
    cuts, at = [0], 0
    total = int(rel[-1])
    while at < total:
        k = int(np.searchsorted(rel, at + piece, side="right")) - 1  # the last boundary within the piece
        nxt = int(rel[k]) if rel[k] > at else int(rel[np.searchsorted(rel, at, side="right")])
        cuts.append(nxt)
        at = nxt
    return np.asarray(cuts, dtype=np.int64)


def preload_resident(
    reads: RangeReads,
    container,
    start: int,
    offsets: np.ndarray,
    base: int,
    lo: int,
    hi: int,
    resident: np.ndarray,
    local: np.ndarray,
    disp: np.ndarray | Derived,
    scratch_bytes: int,
    gap: float | None = None,
    checks: SampleChecks | None = None,
) -> int:
    """Tiered preload: the resident samples of block [lo, hi) into `local` at `disp`, read as
    dstore.order.tiers.preload_reads plans them: runs of resident samples joined across at most `gap`
    bytes of non-resident ones (default GAP_BYTES where the container is byte-addressable, else any
    gap: pieces of the block), each read at most one scratch buffer long. A read without a gap goes
    straight into the window; one with gaps into one of `reads.threads` scratch buffers (together
    at most `scratch_bytes`), its resident samples then copied out. Each read's resident samples
    are checked against `checks` in the thread that read them. Returns the bytes read."""
    off, sizes = offsets, np.diff(offsets)
    ids = np.arange(lo, hi)
    ids = ids[resident[ids] & (sizes[ids] > 0)]
    if ids.size == 0:
        return 0
    if gap is None:
        gap = GAP_BYTES if getattr(container, "byte_addressable", False) else float("inf")
    nbuf = reads.threads
    size = max(1, min(PRELOAD_SCRATCH, max(1, int(scratch_bytes)) // nbuf, int(off[hi] - off[lo])))
    groups = tiers.preload_reads(ids, off, size, gap)
    kept = np.zeros(ids.size + 1, dtype=np.int64)  # resident bytes of ids[:k]
    np.cumsum(sizes[ids], out=kept[1:])
    gaps = sum(int(off[ids[m - 1] + 1] - off[ids[k]]) > int(kept[m] - kept[k]) for k, m in groups)
    scratch = [np.empty(size, dtype=np.uint8) for _ in range(min(nbuf, gaps))]
    free = list(range(len(scratch)))
    pending = collections.deque()  # (k, m, slot or None, future)
    nread = 0

    def finish():
        k, m, slot, f = pending.popleft()
        a, b = int(ids[k]), int(ids[m - 1]) + 1
        try:
            f.result()
        except Exception as exc:
            raise read_error(container, start, exc, a, b) from exc
        if slot is not None:
            _copy_runs(ids[k:m], off, scratch[slot], local, disp)
            free.append(slot)

    try:
        for k, m in groups:
            a, b = int(ids[k]), int(ids[m - 1]) + 1
            n = int(off[b] - off[a])
            if n == int(kept[m] - kept[k]):  # no gap: the window holds these bytes back to back
                while len(pending) >= nbuf:
                    finish()
                dst, slot = local[int(disp[a]) : int(disp[a]) + n], None
            else:
                while len(pending) >= nbuf or (not free and pending):
                    finish()
                slot = free.pop()
                dst = scratch[slot][:n]
            check = None if checks is None else functools.partial(checks.ids, ids=ids[k:m], at=int(off[a]))
            pending.append((k, m, slot, reads.submit(base + int(off[a]), base + int(off[b]), dst, check)))
            nread += n
        while pending:
            finish()
    finally:  # a read failed: nothing may still write into the window or the scratch buffers
        for *_, f in pending:
            f.cancel()
        concurrent.futures.wait([f for *_, f in pending])
    return nread


def _copy_runs(
    part: np.ndarray, off: np.ndarray, buf: np.ndarray, local: np.ndarray, disp: np.ndarray | Derived
) -> None:
    """Copies the resident samples `part` (sorted ids) out of `buf`, which holds the bytes from
    sample part[0] on, into the window `local` at `disp`: one copy per run of consecutive ids."""
    heads = np.nonzero(np.diff(part, prepend=-2) != 1)[0]
    ends = np.append(heads[1:], part.size)
    a = int(part[0])
    for h, e in zip(heads.tolist(), ends.tolist()):
        x, y = int(part[h]), int(part[e - 1]) + 1
        src, cnt = int(off[x] - off[a]), int(off[y] - off[x])
        local[int(disp[x]) : int(disp[x]) + cnt] = buf[src : src + cnt]


def read_samples(container, start: int, lo: int, hi: int, out: np.ndarray, checks: SampleChecks | None = None) -> None:
    """Served samples [lo, hi) into `out` with one range read, checked against `checks` (errors
    name the samples)."""
    if hi > lo:
        try:
            container.read_range(start + lo, start + hi, out=out)
            if checks is not None:
                checks.run(out, lo, hi)
        except Exception as exc:
            raise read_error(container, start, exc, lo, hi) from exc
