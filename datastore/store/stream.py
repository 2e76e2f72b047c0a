"""The streaming preload (``population="stream"``): each rank reads its block in big pieces in a
background thread, in the order the first epoch needs them, while that epoch is already served.

Why: a preload serves nothing before every rank has read its whole block, so the first batch waits
for the slowest rank's block (1.3 s at 300 operations/s for 100 MB); a per-sample population
(``dynamic``) starts at once but pays a storage request per sample. Here each rank still reads its
contiguous block in `dstore.store.preload` pieces (the same big sequential reads as the preload), first
the pieces holding the samples needed earliest (`plan_pieces`), and tells the others how far it
has come. A step's sample whose piece is in its owner's window is served from there (a view or a
get, as after a preload); one whose piece is not yet read is read from the container by the rank
that delivers it (coalesced runs, in the storage tier's threads) and checked against the
container's checksum. Which samples a step takes, and in what order, does not depend on where
its bytes come from: the global order and exactly-once are the preload's.

Progress protocol (cited as "the stream's exchange"): every rank's exchange thread runs a
nonblocking allgather, on a communicator of its own (no other collective is matched with it), of
(pieces read in order, failed, finished, first step's reads in), `EXCHANGE_PERIOD` apart, until a result in which every
rank has finished; the k-th result is the same on every rank, so every rank runs the same number.
The thread runs whatever the consumer does: a rank waiting for a peer's piece never depends on that
peer's main thread (which may be in another collective, or done with the epoch). The main thread
adopts the newest result after `Arena.sync` (MPI_Win_sync inside its read epoch) and only then reads
the pieces it counts. On the owner the count is taken after the reading thread's `done` (a lock
handoff, then MPI's own fences on the send): Win_sync cannot be issued from a thread outside the
main thread's passive-target epoch. A step whose samples are not all in yet reads them itself
(the first, `OWN_READS`) or waits for them. Without MPI_THREAD_MULTIPLE the main thread runs the
exchange at each step (count, Win_sync, send; receive, Win_sync, read) and never waits: every
missing sample is then read by its consumer. At the end of an epoch served while streaming, and in
`DataStore.close`, every rank waits for its own stream and the exchange's end (`drain`); a rank
whose stream failed reports it, no rank reads that window, and the agreement after the drain
raises the error on every rank.
"""

from __future__ import annotations

import concurrent.futures
import functools
import threading
import time
from typing import TYPE_CHECKING

import numpy as np
from mpi4py import MPI

from dstore.formats.integrity import read_error
from dstore.store import budget, preload
from dstore.store.storage import StorageReader

if TYPE_CHECKING:
    from dstore.formats.integrity import SampleChecks
    from dstore.order.plan import Schedule
    from dstore.store.storeplan import StorePlan
    from dstore.store.window import Arena

OWN_READS = 1
"""Steps of the first epoch served while streaming whose missing samples the delivering rank reads
itself: the first batch. Later steps wait for their owners' pieces: a sample read alone costs a
storage request for ~0.1 MB where a piece moves 4 MB per request, so a rank reading ahead of the
stream would only take requests from it and make the epoch longer."""
_FIELDS = 4
"""Per rank in the exchange: pieces read in order, failed, finished, first step's reads in."""
EXCHANGE_PERIOD = 0.002
"""Seconds between two exchanges of the exchange thread (a few microseconds of CPU each)."""
START_GRACE = 0.5
"""Seconds the stream waits for the first step's own reads to complete, on every rank (the
exchange tells), before it starts (it starts at once when they have): the first batch's small
reads go to storage ahead of the big pieces that would otherwise queue in front of them, including
another rank's (a job shares its file system's operations; a rank's first batch that waits behind
its peer's pieces is the job's first batch). If no epoch starts within this time, it starts anyway."""


def start(
    p: StorePlan,
    comm,
    container,
    arena: Arena,
    checks: SampleChecks | None,
    first_epoch: int = 0,
    first_step: tuple[int, Schedule] | None = None,
) -> Stream:
    """Collective over `comm`, the store's: starts reading this rank's block of `container` into its
    window `arena` (after the population's agreement; each read checked with `checks`), in the order
    epoch `first_epoch` needs it; with `first_step` (step, that epoch's schedule), that step's
    samples are read first (`Stream`). The store keeps it as `Windows.stream` and ends it with
    `Windows.end_stream`."""
    lo, hi = int(p.bounds[p.rank]), int(p.bounds[p.rank + 1])
    threads = p.population_threads
    args = (container, p.start, p.offsets, p.base_byte, lo, hi, arena.local)

    def fill(order, done):
        pool = StorageReader(
            container.path, threads, container.opened_identity, shared=container
        )  # RangeReads never reads with the store's reader itself
        try:
            preload.preload(
                preload.RangeReads(container, threads, pool=pool), *args, checks=checks, order=order, done=done
            )
        finally:
            pool.close()

    return Stream(
        p,
        comm,
        container,
        arena,
        checks,
        fill,
        preload.piece_bytes(threads),
        budget.recv_bound(p),
        first_epoch,
        first_step,
    )


def plan_block(
    offsets: np.ndarray, lo: int, hi: int, piece: int, use: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One rank's part of `plan_pieces`: block [lo, hi) cut into pieces as dstore.store.preload.preload
    cuts it (`preload.sample_cuts`), read earliest first use first (`use`: the step of each of the
    block's samples, int64[hi-lo]; ties in file order).

    Returns:
        (order, cuts, place): the piece indices in read order; the pieces' byte cuts from the block's
        start (int64[pieces+1]); each piece's place in the read order, from 1 (the pieces a sample
        of it waits for).
    """
    rel = offsets[lo : hi + 1] - offsets[lo]
    cuts = preload.sample_cuts(offsets, lo, hi, max(1, int(piece)))
    count = cuts.size - 1
    full = np.nonzero(np.diff(rel) > 0)[0]
    which = np.searchsorted(cuts, rel[full], side="right") - 1  # each sample lies in one piece
    earliest = np.full(count, np.iinfo(np.int64).max, dtype=np.int64)
    np.minimum.at(earliest, which, np.asarray(use)[full])
    order = np.argsort(earliest, kind="stable")
    place = np.empty(count, dtype=np.int64)
    place[order] = np.arange(1, count + 1, dtype=np.int64)
    return order, cuts, place


class PieceWaits:
    """What each sample waits for (`plan_pieces`' `need`), looked up from every rank's pieces instead
    of held per sample: O(pieces of the data set), not O(N).

    Args:
        offsets: int64[N+1] of the served samples; bounds: int64[P+1], the blocks.
        blocks: per rank, (cuts, place) of `plan_block`.
    """

    def __init__(self, offsets: np.ndarray, bounds: np.ndarray, blocks):
        starts = [int(offsets[int(bounds[r])]) + np.asarray(c[:-1], dtype=np.int64) for r, (c, _) in enumerate(blocks)]
        self.offsets = offsets
        self.starts = np.concatenate(starts) if starts else np.zeros(0, dtype=np.int64)  # pieces in byte order
        self.place = np.concatenate([np.asarray(p, dtype=np.int64) for _, p in blocks]) if blocks else self.starts

    def __getitem__(self, ids) -> np.ndarray:
        """int64 per sample of `ids`: its owner's pieces, in read order, that must be read before it is whole
        in its window (0 for an empty sample)."""
        ids = np.asarray(ids, dtype=np.int64)
        a = self.offsets[ids]
        full = self.offsets[ids + 1] > a
        if not self.starts.size:
            return np.zeros(ids.shape, dtype=np.int64)
        g = np.maximum(np.searchsorted(self.starts, a, side="right") - 1, 0)  # the piece a sample starts in
        return np.where(full, self.place[g], 0)


def plan_pieces(offsets: np.ndarray, bounds: np.ndarray, piece: int, use: np.ndarray) -> tuple[list, np.ndarray]:
    """Every rank's read order of its block's pieces, and what each sample waits for (O(N): a
    store plans its own block, `plan_block`, and looks the rest up, `PieceWaits`).

    Rank r's block (samples [bounds[r], bounds[r+1])) is cut into pieces of whole samples as
    dstore.store.preload.preload cuts it (`preload.sample_cuts`, at most `piece` bytes, or one longer
    sample); they are read earliest first use first (`use`: the step of each sample; a piece's is
    the least of its samples'), ties in file order.

    Returns:
        (orders, need): orders[r] the piece indices of rank r in read order; need int64[N] the
        number of rank r's pieces, in that order, that must be read before sample i is in its window
        (0 for an empty sample).
    """
    need = np.zeros(offsets.size - 1, dtype=np.int64)
    orders = []
    for r in range(bounds.size - 1):
        lo, hi = int(bounds[r]), int(bounds[r + 1])
        order, cuts, place = plan_block(offsets, lo, hi, piece, use[lo:hi])
        rel = offsets[lo : hi + 1] - offsets[lo]
        full = np.nonzero(np.diff(rel) > 0)[0]
        need[lo + full] = place[np.searchsorted(cuts, rel[full], side="right") - 1]
        orders.append(order)
    return orders, need


class Stream:
    """One rank's streaming preload and its view of every rank's progress (see the module docstring).

    Args:
        p: the store's plan (dstore.store.storeplan); comm: its communicator; container: its container.
        arena: its window (allocated, nothing read yet); checks: the served samples' checksums
            (dstore.formats.integrity.SampleChecks) every read is checked against, or None.
        fill: fill(order, done) reads this rank's block into its window in that piece order,
            calling done(k) as the first k pieces are in (dstore.store.preload.preload), in a thread.
        piece: the bytes per piece `fill` reads.
        buffer_bytes: bytes of each of the `prefetch + 1` buffers a step's own reads land in.
        first_epoch: the epoch whose order the pieces are read in (a loaded state's, else 0).
        first_step: (step, schedule of `first_epoch`): the step whose samples are read first
            (`_first_reads`), or None (a mix's source: its steps are the mix's, set per epoch).

    Attributes:
        done: every rank has read its whole block (after that, epochs need no stream).
        prefix: int64[P], the pieces of each rank known to be in its window.
        bytes, reads: what this rank read from the container for steps served while streaming.
    """

    def __init__(
        self,
        p: StorePlan,
        comm,
        container,
        arena: Arena,
        checks: SampleChecks | None,
        fill,
        piece: int,
        buffer_bytes: int,
        first_epoch: int = 0,
        first_step: tuple[int, Schedule] | None = None,
    ):
        self.plan, self.container, self.arena, self.checks = p, container, arena, checks
        self.done = False
        self.failed = False
        self.bufs = [np.empty(max(1, int(buffer_bytes)), dtype=np.uint8) for _ in range(p.prefetch + 1)]
        self.reader: StorageReader | None = StorageReader(
            container.path, p.storage_threads, container.opened_identity, shared=container
        )
        self.bytes = self.reads = 0
        self._go = threading.Event()  # set when the first step's own reads are in (or by stop)
        self._early = self._first_reads(first_step)  # before the plan below: its storage requests overlap that work
        # This rank plans its own block's pieces (O(N/P)) and learns the others' (O(pieces)): no
        # order or first-use step of all N samples is built (but under `partial`, whose order is).
        lo, hi = int(p.bounds[p.rank]), int(p.bounds[p.rank + 1])
        use = p.order_policy.block_first_use(
            p.num_samples, p.bounds, p.rank, p.seed, first_epoch, p.batch_size, p.steps_per_epoch, p.partial_fraction
        )
        own, cuts, place = plan_block(p.offsets, lo, hi, piece, use)
        del use
        self.need = PieceWaits(p.offsets, p.bounds, comm.allgather((cuts, place)))
        self.owner = p.layout.owner
        self.prefix = np.zeros(p.size, dtype=np.int64)
        self._comm: MPI.Intracomm | None = comm.Dup()  # the exchange's own: no other collective is matched with it
        self._req: MPI.Request | None = None
        self._send = np.zeros(_FIELDS, dtype=np.int64)
        self._recv = np.zeros(_FIELDS * p.size, dtype=np.int64)
        self._count = 0
        self._error = None
        self._finished = False
        self._cancel = threading.Event()
        self._own_reads = OWN_READS
        self._t0 = time.perf_counter()
        self._seconds = 0.0
        self._latest = self._adopted = None
        self._xthread = None
        if MPI.Query_thread() == MPI.THREAD_MULTIPLE:  # else the main thread exchanges at each step
            self._xthread = threading.Thread(target=self._exchange, daemon=True, name="dstore-stream-exchange")
        self._thread = threading.Thread(target=self._run, args=(fill, own), daemon=True, name="dstore-stream")
        self._thread.start()
        if self._xthread is not None:
            self._xthread.start()

    # ----------------------------------------------------------------- the reading thread
    def _run(self, fill, order) -> None:
        def done(k):
            self._count = k
            if self._cancel.is_set():
                raise InterruptedError("the store is closing")

        deadline = time.perf_counter() + START_GRACE
        self._go.wait(START_GRACE)
        while self._xthread is not None and not self._cancel.is_set() and time.perf_counter() < deadline:
            rows = self._latest  # every rank's first step read: no piece queues in front of their reads
            if rows is not None and rows[:, 3].all():
                break
            time.sleep(0.001)
        self._t0 = time.perf_counter()
        try:
            if self._cancel.is_set():
                raise InterruptedError("the store is closing")
            fill(order, done)
        except BaseException as exc:  # noqa: BLE001 - reported through the exchange, raised by drain's caller
            self._error = exc
        finally:
            self._seconds = time.perf_counter() - self._t0
            self._finished = True

    @property
    def error(self) -> BaseException | None:
        """This rank's stream failure, once its thread has ended (else None)."""
        return self._error if self._finished else None

    # ----------------------------------------------------------------- the exchange
    def _start(self, sync: bool) -> MPI.Request:
        count, finished = self._count, self._finished  # counted first: the sync below covers them
        self._send[:] = (count, int(finished and self._error is not None), int(finished), int(self._go.is_set()))
        if sync:
            self.arena.sync()
        comm = self._comm
        if comm is None:
            raise ValueError("the stream is closed")
        self._req = req = comm.Iallgather(self._send, self._recv)
        return req

    def _exchange(self) -> None:
        """The exchange thread: exchanges, EXCHANGE_PERIOD apart, until every rank has finished."""
        while True:
            self._start(sync=False).Wait()  # Win_sync belongs to the main thread's epoch: see the module docstring
            self._req = None
            rows = self._recv.reshape(self.plan.size, _FIELDS).copy()
            self._latest = rows
            if rows[:, 2].all():
                return
            time.sleep(EXCHANGE_PERIOD)

    def _adopt(self, rows: np.ndarray) -> None:
        self.arena.sync()  # the owners' counted pieces are visible to this rank's reads from here on
        ok = rows[:, 1] == 0
        self.prefix = np.where(ok, rows[:, 0], 0)  # a failed rank's window is never read
        if rows[:, 2].all():
            self.done = True
            self.failed = not ok.all()

    def poll(self) -> None:
        """Adopts the newest exchange result (never blocks); without the exchange thread, takes a
        completed exchange, if any, and starts the next."""
        if self.done:
            return
        if self._xthread is not None:
            rows = self._latest
            if rows is not None and rows is not self._adopted:
                self._adopted = rows
                self._adopt(rows)
            return
        req = self._req if self._req is not None else self._start(sync=True)
        if req.Test():
            self._req = None
            self._adopt(self._recv.reshape(self.plan.size, _FIELDS).copy())
            if not self.done:
                self._start(sync=True)

    def drain(self) -> None:
        """Waits for this rank's stream, then for every rank's (collective without the exchange thread)."""
        self._go.set()
        self._thread.join()
        if self._xthread is not None:
            self._xthread.join()
            self.poll()
            return
        while not self.done:
            (self._req if self._req is not None else self._start(sync=True)).Wait()
            self._req = None
            self._adopt(self._recv.reshape(self.plan.size, _FIELDS).copy())

    # ----------------------------------------------------------------- a step's own reads
    def may_read(self) -> bool:
        """Whether a step with missing samples reads them itself (OWN_READS; without the exchange
        thread, always: waiting would need the other ranks' main threads; or a rank's stream failed,
        so its window will never hold them), else waits for them (`wait_for`)."""
        return self._xthread is None or self._own_reads > 0 or (self.done and self.failed)

    def wait_for(self, ids: np.ndarray) -> None:
        """Polls the exchange until every sample of `ids` is whole in its owner's window, or every
        stream has ended (a failed one's samples are then read by `read`)."""
        while not self.done and self.missing(ids).any():
            self.poll()
            time.sleep(0.0005)

    def missing(self, ids: np.ndarray) -> np.ndarray:
        """bool per entry: the sample is not yet whole in its owner's window, as far as known."""
        if self.done and not self.failed:
            return np.zeros(ids.size, dtype=bool)
        return self.need[ids] > self.prefix[self.owner[ids]]

    def _first_reads(self, first_step: tuple[int, Schedule] | None):
        """Starts reading the first step's samples of this rank (the first epoch's, from a resumed
        step) into buffer 0, where that step will ask for them (`read`): nothing is in any window
        yet, so all of them will be missing. Their completion lets the stream start (`_go`). None
        without `first_step` (a mix's source: its steps are the mix's, set per epoch) or where the
        step is empty."""
        if first_step is None:
            return None
        step, sched = first_step
        if step >= sched.steps or self.plan.sizes[sched.ids[sched.step(step)]].sum() == 0:
            return None
        pending = self._submit(sched.ids[sched.step(step)], 0)
        left = [len(pending[3])]
        lock = threading.Lock()

        def one_done(_):
            with lock:
                left[0] -= 1
                if left[0] == 0:
                    self._go.set()

        for f in pending[3]:
            f.add_done_callback(one_done)
        return pending

    def read(self, ids: np.ndarray, slot: int):
        """Starts reading the samples `ids` (a step's missing entries) into buffer `slot`, runs of
        consecutive samples in one read each (or takes the first step's, if these are among them).
        Returns what `take` needs."""
        self._own_reads -= 1
        early, self._early = self._early, None
        if early is not None:
            if slot == early[2] and np.isin(ids, early[0]).all():
                return early
            concurrent.futures.wait(early[3])  # not this step's: its buffer may be reused only once they end
        return self._submit(ids, slot)

    def _submit(self, ids: np.ndarray, slot: int):
        p = self.plan
        uniq = np.unique(ids)
        sizes = p.sizes[uniq]
        at = np.zeros(uniq.size + 1, dtype=np.int64)
        np.cumsum(sizes, out=at[1:])
        heads = np.nonzero(np.diff(uniq, prepend=-2) != 1)[0]
        ends = np.append(heads[1:], uniq.size)
        lo, hi = uniq[heads], uniq[ends - 1] + 1
        base, sc = p.base_byte, self.checks
        checks = [
            None if sc is None else functools.partial(sc.ids, ids=uniq[h:e], at=int(p.offsets[uniq[h]]))
            for h, e in zip(heads.tolist(), ends.tolist())
        ]  # in the thread that read the run
        if self.reader is None:
            raise ValueError("the stream is stopped")
        futs = self.reader.submit(self.bufs[slot], base + p.offsets[lo], base + p.offsets[hi], at[heads], checks)
        self.reads += len(futs)
        self.bytes += int(at[-1])
        return uniq, at, slot, futs, int(lo.size)

    def take(self, pending, ids: np.ndarray) -> list:
        """Waits for `read`'s reads (each checked against the container's checksums in its thread);
        the bytes of each entry of `ids` (read-only views of the buffer)."""
        uniq, at, slot, futs, _ = pending
        p, reader = self.plan, self.reader
        if reader is None:
            raise ValueError("the stream is stopped")
        try:
            reader.wait(futs)
        except Exception as exc:  # a failed read, or bytes that do not match their checksums
            raise read_error(self.container, p.start, exc, 0, 0, ids=uniq) from exc
        buf = self.bufs[slot]
        self._go.set()  # the first step's reads are in: the stream may start
        view = buf.view()
        view.flags.writeable = False
        pos = np.searchsorted(uniq, ids)
        return [view[int(at[p]) : int(at[p + 1])] for p in pos.tolist()]

    # ----------------------------------------------------------------- lifetime
    def population(self) -> tuple[float, int]:
        """(seconds, bytes) of this rank's block read, once its stream has finished."""
        return self._seconds, int(self.arena.local.size)

    def close(self) -> None:
        """Collective after `drain` (frees the exchange's communicator); safe twice."""
        self.stop()
        comm, self._comm = self._comm, None
        if comm is not None and not (self._xthread is not None and self._xthread.is_alive()):
            comm.Free()

    def stop(self) -> None:
        """Local: ends the reading thread (at its next piece) and the step reads; safe twice."""
        self._cancel.set()
        self._go.set()
        self._thread.join()
        reader, self.reader = self.reader, None
        if reader is not None:
            reader.close()
