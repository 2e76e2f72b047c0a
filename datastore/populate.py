"""Filling a store's windows from its container: the memory budget and the resident set, the preload
(a rank's block, or a node's part of a replicated copy), the tiered preload (only the resident
samples) and the dynamic population (what epoch 0 needs), with several range reads in flight.

One stream of synchronous reads pays one storage round trip per request (the kernel splits a large
read into requests of about 1 MiB that a FUSE or parallel file system serves one after the other),
so a preload reads its block in pieces of `PARALLEL_PIECE` bytes, `population_threads` at a time.
Each read thread opens its own reader of the container (dstore.storage.StorageReader: file
descriptors and chunk caches are not shared between threads; the backends read with `os.preadv`,
which releases the GIL), and a further thread faults in the pages of the pieces ahead of the reads
(dstore.prefault). A failed piece is named by its samples (each tried alone), raised on the rank
that read it and agreed with every other rank (dstore.collective) before anything collective.
"""

from __future__ import annotations

import collections
import concurrent.futures
import functools
import logging
import time

import numpy as np

from dstore import plan, prefault, tiers
from dstore.collective import AGREED, node_comm, topology_of
from dstore.errors import ConfigError, MemoryBudgetError
from dstore.heartbeat import Heartbeat
from dstore.integrity import SampleChecks, read_error
from dstore.memory import budget_error, default_budget, fmt_bytes
from dstore.storage import StorageReader
from dstore.window import Arena

log = logging.getLogger("dstore.store")

READER_INDEX_BYTES = 28
"""Bytes per sample of an open container reader's index arrays (int64 offsets, labels and source
indices, uint32 checksums): what each storage or population thread's reader holds, unless its
backend opens without them (ContainerReader.index_on_demand: HDF5, Zarr; see reader_index)."""


def reader_index(store) -> int:
    """Bytes of the index arrays one storage or population thread's reader holds: none where the
    backend reads them on demand only (the threads read byte ranges), else all of them."""
    if getattr(store.container, "index_on_demand", False):
        return 0
    return READER_INDEX_BYTES * int(store.container.num_samples)

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


# ----------------------------------------------------------------------------- reads
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


def read_pieces(submit, out: np.ndarray, piece: int, inflight: int, fail, cuts=None, order=None,
                done=None) -> None:
    """Fills `out` with `submit(a, b, out[a:b])` reads of its pieces, `inflight` at a time, while a
    thread faults in the pages of the pieces ahead of the reads (the first `inflight` take their
    faults in their reads).

    Waits for every read and fault started before it returns or raises, so nothing writes into
    `out` afterwards. A failed piece raises `fail(a, b, exc)` (the first failed piece in order).
    The pieces are `piece` bytes long, or cut at `cuts` (increasing, from 0 to out.size) where given.

    Args:
        order: the pieces' indices in the order to read them (default: consecutive).
        done: called with k after the first k pieces of that order are all in `out` (the streaming
            preload publishes its progress so; dstore.stream).
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


def preload(reads: RangeReads, container, start: int, offsets: np.ndarray, base: int, lo: int, hi: int,
            out: np.ndarray, checks: SampleChecks | None = None, order=None, done=None) -> None:
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
    read_pieces(submit, out, piece, reads.threads, fail, cuts=sample_cuts(offsets, lo, hi, piece), order=order,
                done=done)


def sample_cuts(offsets: np.ndarray, lo: int, hi: int, piece: int) -> np.ndarray:
    """Byte cuts (from 0 to the bytes of samples [lo, hi)) into pieces of whole samples, each the
    longest run of samples within `piece` bytes, or one sample where it alone is longer."""
    rel = offsets[lo:hi + 1] - offsets[lo]
    cuts, at = [0], 0
    total = int(rel[-1])
    while at < total:
        k = int(np.searchsorted(rel, at + piece, side="right")) - 1  # the last boundary within the piece
        nxt = int(rel[k]) if rel[k] > at else int(rel[np.searchsorted(rel, at, side="right")])
        cuts.append(nxt)
        at = nxt
    return np.asarray(cuts, dtype=np.int64)


def preload_resident(reads: RangeReads, container, start: int, offsets: np.ndarray, base: int, lo: int, hi: int,
                     resident: np.ndarray, local: np.ndarray, disp: np.ndarray, scratch_bytes: int,
                     gap: float | None = None, checks: SampleChecks | None = None) -> int:
    """Tiered preload: the resident samples of block [lo, hi) into `local` at `disp`, read as
    dstore.tiers.preload_reads plans them: runs of resident samples joined across at most `gap`
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
                dst, slot = local[int(disp[a]):int(disp[a]) + n], None
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


def _copy_runs(part: np.ndarray, off: np.ndarray, buf: np.ndarray, local: np.ndarray, disp: np.ndarray) -> None:
    """Copies the resident samples `part` (sorted ids) out of `buf`, which holds the bytes from
    sample part[0] on, into the window `local` at `disp`: one copy per run of consecutive ids."""
    heads = np.nonzero(np.diff(part, prepend=-2) != 1)[0]
    ends = np.append(heads[1:], part.size)
    a = int(part[0])
    for h, e in zip(heads.tolist(), ends.tolist()):
        x, y = int(part[h]), int(part[e - 1]) + 1
        src, cnt = int(off[x] - off[a]), int(off[y] - off[x])
        local[int(disp[x]):int(disp[x]) + cnt] = buf[src:src + cnt]


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


def fill_dynamic(store, ids: np.ndarray) -> int:
    """Reads the not yet loaded own samples among `ids` (runs of consecutive ones coalesced)."""
    loaded = store._loaded
    ids = np.unique(ids[~loaded[ids]])
    if ids.size == 0:
        return 0
    heads = np.nonzero(np.diff(ids, prepend=-2) != 1)[0]
    ends = np.append(heads[1:], ids.size)
    local, disp, off = store._arena.local, store.layout.disp, store.offsets
    for h, e in zip(heads.tolist(), ends.tolist()):
        lo, hi = int(ids[h]), int(ids[e - 1]) + 1
        d = int(disp[lo])
        read_samples(store.container, store.start, lo, hi, local[d:d + int(off[hi] - off[lo])], store._checks)
    loaded[ids] = True
    return int(store.sizes[ids].sum())


# ----------------------------------------------------------------------------- budget
def recv_bound(store) -> int:
    """An upper bound on one receive buffer: the largest bytes a rank can get in one step."""
    per_step = -(-store.batch_size // store.size)
    if store.policy != "global":
        per_step = max(per_step, -(-int(np.diff(store.bounds).max()) // store.steps_per_epoch))
    per_step = min(per_step + 1, store.num_samples)
    return plan.largest_sum(store.offsets, per_step)


def receive_buffers(store) -> int:
    """Bytes of a rank's receive buffers (none when replicated or alone)."""
    return 0 if (store.replicate or store.size == 1) else (store.prefetch + 1) * recv_bound(store)


def population_readers(store) -> int:
    """Bytes of the index arrays of a preload's own reader threads (more than one thread): held
    during the population only, before the receive buffers exist."""
    if store.population_threads == 1 or (store.population == "dynamic" and not store.replicate):
        return 0
    return store.population_threads * reader_index(store)


def stream_buffers(store) -> int:
    """Bytes a streaming preload (dstore.stream) holds during the epoch it serves besides the receive
    buffers: `prefetch + 1` buffers of a step's own reads and their threads' readers' index arrays
    (none for HDF5 and Zarr: the stream's StorageReader reads byte ranges)."""
    return (store.prefetch + 1) * recv_bound(store) + store.storage_threads * reader_index(store)


def tier_buffers(store, bufs: int) -> int:
    """Bytes a rank holds besides resident data when tiered: receive buffers, storage buffers (the
    preload's scratch pieces fit in these and are gone before they exist), and the index arrays
    (offsets, labels, checksums, source indices) of each storage thread's own reader (the tiered
    preload reads with those threads)."""
    index = reader_index(store)
    return bufs + (store.storage_lookahead + 1) * recv_bound(store) + store.storage_threads * index


def memory_needs(store) -> tuple[int, int]:
    """(all resident: the rank's share plus its peak buffers; nothing resident: the tier's buffers),
    as check_budget and choose_resident count them (a replicated store: the whole data set)."""
    bufs, peak = _buffers(store)
    data = int(store.offsets[-1]) if store.replicate else int(store.layout.nbytes[store.rank])
    return data + peak, tier_buffers(store, bufs)


def _buffers(store) -> tuple[int, int]:
    """(a rank's receive buffers, the most it holds besides its data: those, or a preload's reader
    indexes, which are gone before the buffers exist)."""
    bufs = receive_buffers(store)
    if store.population == "stream" and not store.replicate:  # the stream runs beside epoch 0's buffers
        return bufs, bufs + stream_buffers(store) + population_readers(store)
    return bufs, max(bufs, population_readers(store))


def check_budget(store) -> None:
    """Collective: every rank raises the same MemoryBudgetError if any rank's share is over budget,
    or (overflow served) every rank computes the same resident set."""
    local_ranks = store._topology.local_size
    budget, source = ((store._budget_arg, store._budget_source) if store._budget_arg is not None
                      else default_budget(local_ranks))
    bufs, peak = _buffers(store)
    if store.replicate:
        data = int(store.offsets[-1]) if store._topology.local_rank == 0 else 0
        cap = budget * local_ranks  # the node's ranks pool their budgets for the one copy
    else:
        data, cap = int(store.layout.nbytes[store.rank]), budget
    key = (("num_samples", store.num_samples), ("total_bytes", int(store.offsets[-1])), *store.config.agreed())
    # NOTE [ Store agreement protocol ], 2
    rows = store.comm.allgather((data + peak, data, cap, source, local_ranks, key))
    odd = [r for r, row in enumerate(rows) if row[5] != rows[0][5]]
    if odd:  # ranks that disagree on the plan or the resident set would exchange wrong bytes or wait forever
        diff = {n: (a, b) for (n, a), (_, b) in zip(rows[0][5], rows[odd[0]][5]) if a != b}
        raise ConfigError(f"DataStore arguments differ between ranks: rank 0 vs rank {odd[0]}: {diff}")
    msg = budget_error([row[:5] for row in rows], offsets=store.offsets, bufs=peak, replicate=store.replicate)
    if msg and store.overflow == "serve" and not store.replicate:
        choose_resident(store, [row[2] for row in rows], bufs)
    elif msg:  # every rank saw the same rows, so every rank raises the same error
        raise MemoryBudgetError(msg)


def choose_resident(store, caps, bufs: int) -> None:
    """Overflow served: every rank computes the same resident set from the gathered budgets."""
    extra = tier_buffers(store, bufs)
    keep = np.asarray(caps, dtype=np.int64) - extra
    if keep.min() < 0:
        r = int(np.argmin(keep))
        raise MemoryBudgetError(
            f"the data store does not fit its memory budget even with nothing resident: rank {r} needs "
            f"{fmt_bytes(extra)} of buffers (receive, and {store.storage_lookahead + 1} steps of storage "
            f"reads) but its memory budget is {fmt_bytes(caps[r])}; raise memory_budget / "
            f"$DSTORE_MEMORY_BUDGET or lower batch_size/prefetch/storage_lookahead")
    resident = tiers.resident_mask(store.sizes, store.layout.owner, keep, store.seed)
    store._resident = resident
    store.layout = plan.scattered_layout(tiers.resident_offsets(store.sizes, resident), store.layout.owner,
                                         store.size)
    total = int(store.offsets[-1])
    res_bytes = int(store.sizes[resident].sum())
    store.tier = {"resident_fraction": res_bytes / total if total else 1.0, "resident_bytes": res_bytes,
                  "storage_bytes": total - res_bytes}
    if store.rank == 0:
        log.warning("the data set (%s) exceeds the memory budget: %.1f%% of its bytes (%d of %d samples) stay "
                    "in the ranks' memory, the other %s per epoch are read from %s by the ranks that need "
                    "them, %d steps ahead (overflow='serve'; overflow='error' refuses instead)",
                    fmt_bytes(total), 100.0 * store.tier["resident_fraction"], int(resident.sum()),
                    store.num_samples, fmt_bytes(total - res_bytes), getattr(store.container, "path", "storage"),
                    store.storage_lookahead)


# ----------------------------------------------------------------------------- population
def _fill(store, peers) -> int:
    """This rank's part of the population (no collective): returns the bytes read."""
    args = (store.container, store.start, store.offsets, store._base_byte)
    if store.replicate:
        store._view = store._arena.segment(0)
        nc = store._nodecomm
        nb = plan.block_bounds(store.offsets, nc.Get_size())
        lo, hi = int(nb[nc.Get_rank()]), int(nb[nc.Get_rank() + 1])
        a, b = int(store.offsets[lo]), int(store.offsets[hi])
        reads = RangeReads(store.container, store.population_threads)
        try:
            preload(reads, *args, lo, hi, store._view[a:b], store._checks)
        finally:
            reads.close()
        return b - a
    store._segs = store._arena.map_peers(peers, store.layout.nbytes)
    if store._resident is not None:
        store._storage = StorageReader(store.container.path, store.storage_threads, store.container.opened_identity)
    if store.population == "dynamic":
        store._loaded = np.zeros(store.num_samples, dtype=bool)
        store._loaded[store.layout.owner != store.rank] = True  # only own samples are tracked
        if store._resident is not None:
            store._loaded[~store._resident] = True  # served from storage, never loaded
        return 0
    lo, hi = int(store.bounds[store.rank]), int(store.bounds[store.rank + 1])
    if store._resident is None and store.population == "stream":  # read in the background: DataStore.populate
        return 0
    if store._resident is None:
        reads = RangeReads(store.container, store.population_threads)
        try:
            preload(reads, *args, lo, hi, store._arena.local, store._checks)
        finally:
            reads.close()
        return store._arena.local.size
    # tiered: the storage tier's threads (and readers, counted in the budget) read the block
    threads = min(store.population_threads, store.storage_threads)
    reads = RangeReads(store.container, threads, pool=store._storage if threads > 1 else None)
    scratch = max(1, (store.storage_lookahead + 1) * recv_bound(store))  # counted in the budget
    return preload_resident(reads, *args, lo, hi, store._resident, store._arena.local, store.layout.disp, scratch,
                            checks=store._checks)


def populate(store) -> None:
    """Collective: checks the budget, allocates the windows and (preload/replicate) fills them;
    a read error on any rank frees the windows and is raised on every rank."""
    # Every byte read from storage is checked against the container's checksums where it was read.
    store._checks = SampleChecks(store.offsets, store.checksums)  # the node's shared copy (dstore.index)
    nodecomm = node_comm(store.comm, emulate=True)  # the store's nodes: tests cut them with $DSTORE_RANKS_PER_NODE
    try:
        store._topology = topology_of(store.comm, nodecomm)
        check_budget(store)
    except BaseException as exc:
        nodecomm.Free()
        if isinstance(exc, (ConfigError, MemoryBudgetError)):
            setattr(exc, AGREED, True)  # every rank saw the same gathered rows and raises alike
        raise
    t0 = time.perf_counter()
    exc = None
    peers = None
    try:  # window allocation is collective: a rank that fails it tells the others below
        if store.replicate:
            store._nodecomm = nodecomm
            store._arena = Arena(nodecomm, int(store.offsets[-1]) if nodecomm.Get_rank() == 0 else 0, shared=True)
        else:
            peers = nodecomm.allgather(store.rank)  # always: node_views may differ between ranks
            if not store.node_views:
                peers = [store.rank]
            nodecomm.Free()
            store._arena = Arena(store.comm, int(store.layout.nbytes[store.rank]))
    except Exception as e:  # noqa: BLE001 - every rank must learn of it, or they would wait forever
        exc = e
    store._agree(exc)  # NOTE [ Store agreement protocol ], 3
    nbytes = 0
    try:
        with Heartbeat(f"population of rank 0's {fmt_bytes(int(store.layout.nbytes[0]))}", enabled=store.rank == 0):
            nbytes = _fill(store, peers)
    except Exception as e:  # noqa: BLE001 - the others wait in publish(): they must learn of it
        exc = e
    try:
        store._agree(exc)
    except BaseException:
        store._free_windows()  # collective, and every rank is here: nothing is left to MPI_Finalize
        raise
    store._arena.publish()
    store._add_population(time.perf_counter() - t0, nbytes)
