"""One epoch of a DataStore on one rank: `EpochRun` (the batches) and `EpochStats` (its figures).

`DataStore.epoch(e)` iterates an `EpochRun`; its named steps, per step of the schedule, are:
`issue` (plan the step's gets and start them, up to `prefetch + 1` steps ahead), `complete` (wait
for them and for the step's storage reads; assemble the `Batch`) and `account` (add the step to
the epoch's `EpochStats`). Before the first step `_start` agrees on the epoch and its start and
fills a dynamic population where needed, and `_plan` sizes the receive buffers; after the last,
`_finish` agrees on a read failure and logs the figures. `store.stats` is the current epoch's
`EpochStats`; `as_dict()` gives the plain dict that `gather_stats()`, the trainer's log and the
benchmarks write (the same keys, in the same order, as the fields below).
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import dataclasses
import logging
import time
from typing import TYPE_CHECKING, cast

import numpy as np

from dstore import plan, stream
from dstore.integrity import read_error
from dstore.populate import Windows, fill_dynamic
from dstore.storage import StorageEpoch

if TYPE_CHECKING:
    from dstore.epoch import EpochStats as _EpochStats  # NOTE [ One class, two names ] (dstore.store)
    from dstore.store import DataStore

log = logging.getLogger("dstore.store")

_NO_BUFFER = np.empty(0, dtype=np.uint8)

CHUNK = 1 << 20
"""Schedule entries looked at per pass where an epoch's set-up reads all of them (receive buffer sizes)."""


@dataclasses.dataclass
class Batch:
    """One rank's part of one global batch.

    Attributes:
        samples: list of uint8 arrays, each a sample's bytes (read-only views, valid until the next
            batch is requested; copy to keep).
        labels: int64[b].
        ids: int64[b], container sample indices.
        epoch: the epoch.
        step: the step within the epoch.
        pad: bool[b], True for padding repeats (see dstore.store's module docstring).
    """

    samples: list
    labels: np.ndarray
    ids: np.ndarray
    epoch: int
    step: int
    pad: np.ndarray

    def __len__(self) -> int:
        return len(self.samples)


def readonly(a: np.ndarray) -> np.ndarray:
    """A read-only view of `a` (what consumers get: they must not write into windows or buffers)."""
    v = a.view()
    v.flags.writeable = False
    return v


@dataclasses.dataclass
class EpochStats:
    """This rank's figures for one epoch (see `DataStore`'s `stats` attribute for their meaning)."""

    epoch: int = 0
    rank: int = 0
    size: int = 1
    steps: int = 0
    samples: int = 0
    samples_local: int = 0
    samples_node: int = 0
    samples_remote: int = 0
    pads: int = 0
    bytes_local: int = 0
    bytes_node: int = 0
    bytes_remote: int = 0
    gets: int = 0
    samples_storage: int = 0
    bytes_storage: int = 0
    storage_reads: int = 0
    storage_wait_seconds: float = 0.0
    wait_seconds: float = 0.0
    fetch_seconds: float = 0.0
    get_wait_seconds: float = 0.0
    population_seconds: float = 0.0
    population_bytes: int = 0
    population_MBps: float = 0.0
    epoch_seconds: float = 0.0
    delivered_GBps: float = 0.0

    def as_dict(self) -> dict:
        """The figures as a plain dict (JSON-able), keyed by field name."""
        return dataclasses.asdict(self)

    def set_population(self, pop: dict) -> None:
        """Copies the store's population totals so far (population_seconds/_bytes/_MBps)."""
        for k, v in pop.items():
            setattr(self, k, v)

    def finish(self, seconds: float) -> None:
        """Records the epoch's wall time and the delivery rate it implies."""
        self.epoch_seconds = seconds
        delivered = self.bytes_local + self.bytes_node + self.bytes_remote + self.bytes_storage
        self.delivered_GBps = delivered / 1e9 / seconds if seconds else 0.0


@dataclasses.dataclass
class Issued:
    """A step whose gets are in flight (what `EpochRun.issue` starts and `complete` finishes).

    Attributes:
        step: the step of the epoch; slot: the receive buffer its gets land in.
        ids: int64[b], its entries (served sample indices); pad: bool[b], padding repeats.
        fetch: its plan (dstore.plan.Fetch), or None for a step deferred while streaming (planned
            and issued by `complete` once its samples' pieces are in the windows).
        reqs: the MPI requests of its gets.
        owner: int64[b], the rank whose window serves each entry (this rank's for entries it reads).
        stream_read: while streaming, (bool[b] entries this rank reads itself, the stream's read), or None.
    """

    step: int
    slot: int
    ids: np.ndarray
    pad: np.ndarray
    fetch: plan.Fetch | None
    reqs: list
    owner: np.ndarray
    stream_read: tuple | None


class _StepFailed(Exception):
    """A step's read failed: the epoch stops there (`error`, naming the samples, is also kept in
    `EpochRun.failure`)."""

    def __init__(self, error: BaseException):
        super().__init__(str(error))
        self.error = error


class EpochRun:
    """Epoch `e` of `store` on this rank, iterated once (collective: every rank iterates it).

    Nothing happens before the first `next()`; an abandoned iteration (the generator closed)
    completes the gets in flight before it unlocks the windows."""

    def __init__(self, store: DataStore, e: int):
        self.store = store
        self.e = e
        self.failure: BaseException | None = None  # a read error on this rank, agreed with the others where they next meet

    def __iter__(self):
        store = self.store
        w = self._start()  # what the population built (dstore.populate.Windows)
        self.stats = st = EpochStats(epoch=self.e, rank=store.rank, size=store.size)
        st.set_population(w.population)
        store.stats = cast("_EpochStats", st)
        self.t_epoch = time.perf_counter()
        self._plan()
        steps, nbuf, lazy, tier, arena = self.steps, self.nbuf, self.lazy, self.tier, w.arena
        pending = collections.deque()
        t_in = self.t_epoch  # the consumer waits from its first next() on
        reading = contextlib.nullcontext() if (store.replicate or lazy) else arena.reading()
        with reading:
            try:
                k = 0
                while k < len(steps) and k < nbuf and not lazy:
                    pending.append(self.issue(steps[k], k % nbuf))
                    k += 1
                for s in steps:
                    if lazy:
                        t1 = time.perf_counter()
                        try:
                            n = fill_dynamic(store, w, self.ids_all[self.sched.step(s)])
                        except Exception as exc:
                            self.failure = exc
                            if store.fail_fast:
                                raise
                            break
                        w.add_population(time.perf_counter() - t1, n)
                        pending.append(self.issue(s, 0))
                    item = pending.popleft()
                    try:
                        batch = self.complete(item)
                    except _StepFailed as failed:
                        if store.fail_fast:  # the job aborts on it; the others may be waiting in a DDP step
                            raise failed.error from None
                        break  # NOTE [ Store agreement protocol ]: told to the others in _finish
                    store._advance(self.e, s + 1, self.sched.steps)
                    st.wait_seconds += time.perf_counter() - t_in
                    yield batch
                    t_in = time.perf_counter()
                    if k < len(steps) and not lazy:  # reuse the slot the caller just gave back
                        pending.append(self.issue(steps[k], item.slot))
                        k += 1
                    if tier is not None:
                        tier.release()
            finally:
                for item in pending:  # an abandoned epoch: complete what is in flight before unlocking
                    arena.wait(item.reqs)
                    if item.stream_read is not None:  # and the stream's reads, whose buffers the next epoch reuses
                        concurrent.futures.wait(item.stream_read[1][3])
                if tier is not None:
                    tier.close()
        self._finish()

    # ------------------------------------------------------------ before the first step
    def _start(self) -> Windows:
        """Collective: the epoch's first step (a loaded state's), agreed; its schedule; and, with a
        dynamic population not yet complete, whether to read lazily (every rank serves only its own
        samples: each step reads them) or to fill everything first. Returns the store's windows."""
        store, e = self.store, self.e
        store.populate()
        if store.windows is None:  # populate() raises instead
            raise ValueError("the DataStore is closed")
        self.windows = w = store.windows
        first = store._begin(e)
        # This epoch may read from storage (the same answer on every rank: a collective follows).
        if w.resident is not None or (store.population != "preload" and not store.replicate):
            _check_unchanged(store)
        self.first = first
        self.sched = sched = store.schedule(e)
        self.ids_all = sched.ids
        self.lazy = False
        if w.loaded is not None:
            need = self.ids_all[sched.ptr[first]:]
            flags = store.comm.allgather((bool(w.loaded.all()), bool(np.all(store.layout.owner[need] == store.rank))))
            if not all(f[0] for f in flags):
                self.lazy = all(f[1] for f in flags)
                if not self.lazy:  # someone needs samples nobody has read yet: fill everything first
                    _fill_the_rest(store, w)
        return w

    def _plan(self) -> None:
        """Per entry of the schedule: whose window serves it (or storage); the receive buffers."""
        store, w, sched, first = self.store, self.windows, self.sched, self.first
        self.steps = list(range(first, sched.steps))
        store._advance(self.e, first, sched.steps)
        if w.view is not None:  # replicated: the node's full copy serves every sample
            self.owner_of = plan.Derived(store.num_samples, lambda ids: np.full(ids.size, store.rank, dtype=np.int64))
            self.disp, segs = store.offsets[:-1], {store.rank: w.view}
            self.base = np.zeros(store.size, dtype=np.int64)  # the node's copy: displacement = offset
        else:
            self.owner_of, self.disp, segs = store.layout.owner, store.layout.disp, w.segs
            self.base = store.layout.base
        self.segs = {r: readonly(a) for r, a in segs.items()}  # rank -> window served in place
        self.mapped = np.zeros(store.size, dtype=bool)
        self.mapped[list(self.segs)] = True
        self.nbuf = store.prefetch + 1
        self.stream = w.stream  # a streaming preload still filling the windows (dstore.stream), or None
        self.tier = None
        if w.resident is not None:  # non-resident samples: read ahead from storage by this rank
            assert w.storage is not None  # opened with the resident set (dstore.populate)
            self.tier = StorageEpoch(w.storage, sched, first, w.resident, store.offsets, store.base_byte,
                                     store.storage_lookahead, w.storage_bufs, w.checks)
            w.storage_bufs = self.tier.bufs
        if not store.replicate:  # exact receive buffer sizes for this epoch
            need = 0 if self.mapped.all() else self._largest_remote_step(first)
            if len(w.recv_bufs) != self.nbuf or w.recv_bufs[0].size < need:
                w.recv_bufs = [np.empty(need, dtype=np.uint8) for _ in range(self.nbuf)]
        self.ro = [readonly(b) for b in w.recv_bufs]

    def owners(self, ids: np.ndarray, sl: slice) -> np.ndarray:
        """Whose window serves each of schedule entries `sl` (their ids `ids`): this rank's for the
        entries the storage tier reads. Computed per step (a search over the P+1 block bounds), not
        held per entry of the epoch."""
        own = np.asarray(self.owner_of[ids], dtype=np.int64)
        if self.tier is not None:
            own = np.where(self.tier.from_storage[sl], self.store.rank, own)
        return own

    def _largest_remote_step(self, first: int) -> int:
        """Bytes of the largest step's samples in windows this rank does not map (its receive
        buffer), over steps from `first`; the schedule is read in chunks of about CHUNK entries."""
        store, ptr = self.store, self.sched.ptr
        steps = self.sched.steps
        per = max(1, int(ptr[-1]) // max(steps, 1))
        need = 0
        for a in range(first, steps, max(1, CHUNK // per)):
            b = min(steps, a + max(1, CHUNK // per))
            sl = slice(int(ptr[a]), int(ptr[b]))
            ids = self.ids_all[sl]
            rb = np.where(~self.mapped[self.owners(ids, sl)], store.sizes[ids], 0)
            csum = np.concatenate([[0], np.cumsum(rb)])  # not reduceat: a step may be empty (dstore.mixed)
            need = max(need, int((csum[ptr[a + 1:b + 1] - ptr[a]] - csum[ptr[a:b] - ptr[a]]).max(initial=0)))
        return need

    # ------------------------------------------------------------ per step
    def issue(self, s: int, slot: int) -> Issued:
        """Plans step `s`'s gets into receive buffer `slot` and starts them."""
        t = time.perf_counter()
        store = self.store
        sl = self.sched.step(s)
        ids = self.ids_all[sl]
        own, sread = self.owners(ids, sl), None
        start = store.offsets[ids]  # one look-up of the shared offsets gives both length and displacement
        length = store.offsets[ids + 1] - start
        disp = start - self.base[own] if self.base is not None else self.disp[ids]  # in the owner's window
        if self.stream is not None:  # samples whose piece is not yet in its owner's window: read them here
            self.stream.poll()
            miss = self.stream.missing(ids)
            if miss.any():
                if not self.stream.may_read():  # deferred to `complete`, which waits for the windows
                    return Issued(s, slot, ids, self.sched.pad[sl], None, [], own, None)
                own = np.where(miss, store.rank, own)
                sread = (miss, self.stream.read(ids[miss], slot))
        f = plan.plan_fetch(own, disp, length, store.rank, self.mapped)
        reqs = self.windows.arena.start_gets(self.windows.recv_bufs[slot], f.run_owner, f.run_disp, f.run_len, f.run_buf) \
            if f.run_len.size else []
        self.stats.fetch_seconds += time.perf_counter() - t
        return Issued(s, slot, ids, self.sched.pad[sl], f, reqs, own, sread)

    def complete(self, item: Issued) -> Batch:
        """Waits for an issued step's gets (and its storage reads) and assembles its Batch.

        Raises:
            _StepFailed: a read failed; its error (naming the samples) is also kept in `failure`.
        """
        store, st, tier = self.store, self.stats, self.tier
        if item.fetch is None:  # a step deferred while streaming
            item = self._issue_deferred(item)
        s, slot, ids, pad, f, reqs = item.step, item.slot, item.ids, item.pad, item.fetch, item.reqs
        own, sread = item.owner, item.stream_read
        assert f is not None  # issued above
        t1 = time.perf_counter()
        self.windows.arena.wait(reqs)
        t2 = time.perf_counter()
        st.get_wait_seconds += t2 - t1
        st.fetch_seconds += t2 - t1
        buf = self.ro[slot] if self.ro else _NO_BUFFER  # replicated: every sample is in a window
        sl = self.sched.step(s)
        segs = self.segs
        samples = [(segs[o] if loc else buf)[a:a + n] for loc, o, a, n in
                   zip(f.local.tolist(), own.tolist(), f.start.tolist(), f.length.tolist())]
        mine = own == store.rank
        if sread is not None:
            assert self.stream is not None  # only a stream reads a step's samples
            miss = sread[0]
            try:
                got = iter(self.stream.take(sread[1], ids[miss]))
            except Exception as exc:  # told to the others at the epoch's end (NOTE [ Store agreement protocol ])
                self.failure = exc  # a FormatError naming the samples
                raise _StepFailed(exc) from exc
            st.storage_wait_seconds += time.perf_counter() - t2
            samples = [next(got) if m else x for m, x in zip(miss.tolist(), samples)]
            mine &= ~miss
            st.samples_storage += int(miss.sum())
            st.bytes_storage += int(store.sizes[ids[miss]].sum())
            st.storage_reads += sread[1][4]
        if tier is not None:
            try:
                views, nread, nruns = tier.take(s)
            except Exception as exc:  # told to the others at the epoch's end (NOTE [ Store agreement protocol ])
                self.failure = error = read_error(store.container, store.start, exc, 0, 0, ids=ids[tier.from_storage[sl]])
                raise _StepFailed(error) from exc
            t3 = time.perf_counter()
            st.storage_wait_seconds += t3 - t2
            st.fetch_seconds += t3 - t2
            stor = tier.from_storage[sl]
            samples = [v if v is not None else x for v, x in zip(views, samples)]
            mine &= ~stor
            st.samples_storage += int(stor.sum())
            st.bytes_storage += int(store.sizes[ids[stor]].sum())
            st.storage_reads += nruns
        batch = Batch(samples, store.labels[ids].astype(np.int64), ids + store.start, self.e, s, pad)
        peer = f.local & ~mine if tier is None else f.local & ~mine & ~tier.from_storage[sl]
        if sread is not None:
            peer &= ~sread[0]
        self.account(ids, pad, f, mine, peer)
        return batch

    def _issue_deferred(self, item: Issued) -> Issued:
        """A step deferred while streaming: waits for its samples' pieces, then plans and starts its gets."""
        assert self.stream is not None  # only a stream defers a step
        t0 = time.perf_counter()
        self.stream.wait_for(item.ids)
        self.stats.storage_wait_seconds += time.perf_counter() - t0
        return self.issue(item.step, item.slot)

    def account(self, ids, pad, f, mine, peer) -> None:
        """Adds a delivered step to the epoch's figures."""
        st = self.stats
        st.steps += 1
        st.samples += ids.size
        st.pads += int(pad.sum())
        st.samples_local += int(mine.sum())
        st.samples_node += int(peer.sum())
        st.samples_remote += int((~f.local).sum())
        st.bytes_remote += f.remote_bytes
        st.bytes_local += int(f.length[mine].sum())
        st.bytes_node += int(f.length[peer].sum())
        st.gets += f.run_len.size

    # ------------------------------------------------------------ after the last step
    def _finish(self) -> None:
        """Collective: a storage read failure on any rank raised on every rank; a lazy population
        completed (then published); the figures logged."""
        store, st, failure = self.store, self.stats, self.failure
        if self.tier is not None and not self.lazy:  # a rank whose storage read failed waits here for the others
            store._agree(failure)  # NOTE [ Store agreement protocol ], 5
        elif self.stream is not None:  # every rank's block is in from here on (or every rank raises)
            store._agree(stream.end(self.windows) or failure)
        st.finish(time.perf_counter() - self.t_epoch)
        if self.lazy:  # epoch 0 done: read what it did not need (dropped samples), then let others read
            _fill_the_rest(store, self.windows, failure)
        st.set_population(self.windows.population)
        log.info("epoch %d rank %d/%d: %s", self.e, store.rank, store.size,
                 ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in st.as_dict().items()))


def _check_unchanged(store: DataStore) -> None:
    """Collective: a container whose files changed since the store opened it (another file at its
    path, another size or modification time) is raised on every rank, naming the file, before an
    epoch reads from it; one stat per file and one small agreement."""
    exc = None
    try:
        store.container.check_unchanged()
    except Exception as e:  # noqa: BLE001 - every rank must learn of it, or they would wait forever
        exc = e
    store._agree(exc)


def _fill_the_rest(store: DataStore, w: Windows, failure: BaseException | None = None) -> None:
    """Collective (dynamic population): reads this rank's samples not read yet, unless `failure`
    already happened; agrees on a failure on any rank (raised on every rank), then publishes the
    windows and counts the time and bytes as population."""
    t0 = time.perf_counter()
    n = 0
    if failure is None:
        try:
            n = fill_dynamic(store, w, np.nonzero(~w.loaded)[0]) if w.loaded is not None else 0
        except Exception as exc:  # noqa: BLE001 - the others wait in publish(): they must learn of it
            failure = exc
    store._agree(failure)
    w.arena.publish()
    w.add_population(time.perf_counter() - t0, n)
