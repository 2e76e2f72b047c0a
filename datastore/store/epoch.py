"""One epoch of a DataStore on one rank: `EpochRun` (the batches) and `EpochStats` (its figures).

`DataStore.epoch(e)` iterates an `EpochRun` of the store's plan (dstore.store.storeplan), its
communicator, container and windows, from the first step the store agreed on (NOTE [ The store as
values ]); its named steps, per step of the schedule, are: `issue` (plan the step's gets and start
them, up to `prefetch + 1` steps ahead), `complete` (wait for them and for the step's storage
reads; assemble the `Batch`) and `account` (add the step to the epoch's `EpochStats`). Before the
first step `start` checks the container and fills a dynamic population where needed, and `_plan`
sizes the receive buffers; after the last, `_finish` agrees on a read failure and logs the
figures. The run yields batches; the store records each one's step as its position and keeps the
run's `stats` as `store.stats`; `as_dict()` gives the plain dict that `gather_stats()`, the
trainer's log and the benchmarks write (the same keys, in the same order, as the fields below).
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import dataclasses
import logging
import time
from typing import TYPE_CHECKING

import numpy as np

from dstore.formats.integrity import read_error
from dstore.order import plan
from dstore.runtime.collective import agree
from dstore.runtime.watchdog import NOTHING
from dstore.store.populate import Windows, fill_dynamic
from dstore.store.storage import StorageEpoch

if TYPE_CHECKING:
    from dstore.store.storeplan import StorePlan

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
        pad: bool[b], True for padding repeats (see dstore.store.data_store's module docstring).
        fields: with `DataStore(fields=[...])`, {field: [each sample's value as stored, bytes]}
            from the owners' windows (dstore.store.fieldstore); None without fields.
        where: int64[b], each sample's address in this process where it is a view of a window
            (valid while the store is open: its windows never move), 0 where it is a view of a
            buffer the store reuses (gets, storage reads); None where not known. Decode workers
            read the samples of a window from there themselves (dstore.loader.vmread).
    """

    samples: list
    labels: np.ndarray
    ids: np.ndarray
    epoch: int
    step: int
    pad: np.ndarray
    fields: dict | None = None
    where: np.ndarray | None = None

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
        fetch: its plan (dstore.order.plan.Fetch), or None for a step deferred while streaming (planned
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
    """Epoch `e` of a store on this rank, iterated once (collective: every rank iterates it).

    Args:
        p: the store's plan (dstore.store.storeplan); comm, container: the store's.
        windows: what its population built (dstore.store.populate.Windows).
        e: the epoch; first: its first step (agreed by the store: a loaded state's, else 0).
        schedule: this rank's deliveries in `e` (a mix's source's part), or None for the plan's own.
        fail_fast: a read failure is raised at once on its rank (DataStore.fail_fast).

    Attributes:
        stats: the epoch's EpochStats, from `start` on.
        agreement_failed: an agreement of this run raised (every rank raised the same error): the
            store makes no further agreement.

    Nothing happens before `start` (the store calls it at the first `next()`); an abandoned
    iteration (the generator closed) completes the gets in flight before it unlocks the windows."""

    def __init__(
        self,
        p: StorePlan,
        comm,
        container,
        windows: Windows,
        e: int,
        first: int,
        schedule: plan.Schedule | None = None,
        fail_fast: bool = False,
    ):
        self.plan, self.comm, self.container, self.windows = p, comm, container, windows
        self.e, self.first, self.fail_fast = e, first, fail_fast
        self._schedule = schedule
        self.agreement_failed = False
        self.failure: BaseException | None = (
            None  # a read error on this rank, agreed with the others where they next meet
        )

    def _watching(self, what: str, owners):
        """The watchdog's `waiting` around a wait for gets from `owners` (NOTE [ Waits on another
        node ]), or nothing on a single host."""
        watch = self.windows.watch
        return NOTHING if watch is None else watch.waiting(what, owners)

    def _agree(self, exc) -> None:
        """Collective (dstore.runtime.collective.agree): raises on every rank if `exc` is set on any."""
        try:
            agree(self.comm, exc)
        except BaseException:
            self.agreement_failed = True
            raise

    def __iter__(self):
        p, w, st = self.plan, self.windows, self.stats
        self.t_epoch = time.perf_counter()
        self._plan()
        steps, nbuf, lazy, tier, arena = self.steps, self.nbuf, self.lazy, self.tier, w.arena
        pending = collections.deque()
        t_in = self.t_epoch  # the consumer waits from its first next() on
        reading = contextlib.nullcontext() if (p.replicate or lazy) else arena.reading()
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
                            n = fill_dynamic(p, self.container, w, self.ids_all[self.sched.step(s)])
                        except Exception as exc:
                            self.failure = exc
                            if self.fail_fast:
                                raise
                            break
                        w.add_population(time.perf_counter() - t1, n)
                        pending.append(self.issue(s, 0))
                    item = pending.popleft()
                    try:
                        batch = self.complete(item)
                    except _StepFailed as failed:
                        if self.fail_fast:  # the job aborts on it; the others may be waiting in a DDP step
                            raise failed.error from None
                        break  # NOTE [ Store agreement protocol ]: told to the others in _finish
                    st.wait_seconds += time.perf_counter() - t_in
                    yield batch  # the store records batch.step + 1 as the next to serve
                    t_in = time.perf_counter()
                    if k < len(steps) and not lazy:  # reuse the slot the caller just gave back
                        pending.append(self.issue(steps[k], item.slot))
                        k += 1
                    if tier is not None:
                        tier.release()
            finally:
                for item in pending:  # an abandoned epoch: complete what is in flight before unlocking
                    if item.reqs:
                        with self._watching("an abandoned epoch's gets", item.fetch.run_owner):
                            arena.wait(item.reqs)
                    if item.stream_read is not None:  # and the stream's reads, whose buffers the next epoch reuses
                        concurrent.futures.wait(item.stream_read[1][3])
                if tier is not None:
                    tier.close()
        self._finish()

    # ------------------------------------------------------------ before the first step
    def start(self) -> plan.Schedule:
        """Collective: checks the container where this epoch may read from it; the epoch's schedule;
        and, with a dynamic population not yet complete, whether to read lazily (every rank serves
        only its own samples: each step reads them) or to fill everything first. Then `stats`.
        Returns the schedule."""
        p, w, first = self.plan, self.windows, self.first
        # This epoch may read from storage (the same answer on every rank: a collective follows).
        if w.resident is not None or (p.population != "preload" and not p.replicate):
            self._check_unchanged()
        self.sched = sched = self._schedule if self._schedule is not None else p.schedule(self.e)
        self.ids_all = sched.ids
        self.lazy = False
        if w.loaded is not None:
            need = self.ids_all[sched.ptr[first] :]
            flags = self.comm.allgather((bool(w.loaded.all()), bool(np.all(p.layout.owner[need] == p.rank))))
            if not all(f[0] for f in flags):
                self.lazy = all(f[1] for f in flags)
                if not self.lazy:  # someone needs samples nobody has read yet: fill everything first
                    self._fill_the_rest()
        self.stats = st = EpochStats(epoch=self.e, rank=p.rank, size=p.size)
        st.set_population(w.population)
        return sched

    def _plan(self) -> None:
        """Per entry of the schedule: whose window serves it (or storage); the receive buffers."""
        p, w, sched, first = self.plan, self.windows, self.sched, self.first
        self.steps = list(range(first, sched.steps))
        if w.view is not None:  # replicated: the node's full copy serves every sample
            self.owner_of = plan.Derived(p.num_samples, lambda ids: np.full(ids.size, p.rank, dtype=np.int64))
            self.disp, segs = p.offsets[:-1], {p.rank: w.view}
            self.base = np.zeros(p.size, dtype=np.int64)  # the node's copy: displacement = offset
        else:
            self.owner_of, self.disp, segs = p.layout.owner, p.layout.disp, w.segs
            self.base = p.layout.base
        self.segs = {r: readonly(a) for r, a in segs.items()}  # rank -> window served in place
        self.mapped = np.zeros(p.size, dtype=bool)
        self.mapped[list(self.segs)] = True
        self.seg_at = np.zeros(p.size, dtype=np.int64)  # each mapped window's address here (Batch.where)
        for r, a in self.segs.items():
            self.seg_at[r] = a.ctypes.data
        self.nbuf = p.prefetch + 1
        self.stream = w.stream  # a streaming preload still filling the windows (dstore.store.stream), or None
        self.tier = None
        if w.resident is not None:  # non-resident samples: read ahead from storage by this rank
            assert w.storage is not None  # opened with the resident set (dstore.store.populate)
            self.tier = StorageEpoch(
                w.storage,
                sched,
                first,
                w.resident,
                p.offsets,
                p.base_byte,
                p.storage_lookahead,
                w.storage_bufs,
                w.checks,
            )
            w.storage_bufs = self.tier.bufs
        if not p.replicate:  # exact receive buffer sizes for this epoch
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
            own = np.where(self.tier.from_storage[sl], self.plan.rank, own)
        return own

    def _largest_remote_step(self, first: int) -> int:
        """Bytes of the largest step's samples in windows this rank does not map (its receive
        buffer), over steps from `first`; the schedule is read in chunks of about CHUNK entries."""
        p, ptr = self.plan, self.sched.ptr
        steps = self.sched.steps
        per = max(1, int(ptr[-1]) // max(steps, 1))
        need = 0
        for a in range(first, steps, max(1, CHUNK // per)):
            b = min(steps, a + max(1, CHUNK // per))
            sl = slice(int(ptr[a]), int(ptr[b]))
            ids = self.ids_all[sl]
            rb = np.where(~self.mapped[self.owners(ids, sl)], p.sizes[ids], 0)
            csum = np.concatenate([[0], np.cumsum(rb)])  # not reduceat: a step may be empty (dstore.store.mixed)
            need = max(need, int((csum[ptr[a + 1 : b + 1] - ptr[a]] - csum[ptr[a:b] - ptr[a]]).max(initial=0)))
        return need

    # ------------------------------------------------------------ per step
    def issue(self, s: int, slot: int) -> Issued:
        """Plans step `s`'s gets into receive buffer `slot` and starts them."""
        t = time.perf_counter()
        p = self.plan
        sl = self.sched.step(s)
        ids = self.ids_all[sl]
        own, sread = self.owners(ids, sl), None
        start = p.offsets[ids]  # one look-up of the shared offsets gives both length and displacement
        length = p.offsets[ids + 1] - start
        disp = start - self.base[own] if self.base is not None else self.disp[ids]  # in the owner's window
        if self.stream is not None:  # samples whose piece is not yet in its owner's window: read them here
            self.stream.poll()
            miss = self.stream.missing(ids)
            if miss.any():
                if not self.stream.may_read():  # deferred to `complete`, which waits for the windows
                    return Issued(s, slot, ids, self.sched.pad[sl], None, [], own, None)
                own = np.where(miss, p.rank, own)
                sread = (miss, self.stream.read(ids[miss], slot))
        f = plan.plan_fetch(own, disp, length, p.rank, self.mapped)
        reqs = []
        if f.run_len.size:
            with self._watching("a batch's gets", f.run_owner):
                reqs = self.windows.arena.start_gets(
                    self.windows.recv_bufs[slot], f.run_owner, f.run_disp, f.run_len, f.run_buf
                )
        self.stats.fetch_seconds += time.perf_counter() - t
        return Issued(s, slot, ids, self.sched.pad[sl], f, reqs, own, sread)

    def complete(self, item: Issued) -> Batch:
        """Waits for an issued step's gets (and its storage reads) and assembles its Batch.

        Raises:
            _StepFailed: a read failed; its error (naming the samples) is also kept in `failure`.
        """
        p, st, tier = self.plan, self.stats, self.tier
        if item.fetch is None:  # a step deferred while streaming
            item = self._issue_deferred(item)
        s, slot, ids, pad, f, reqs = item.step, item.slot, item.ids, item.pad, item.fetch, item.reqs
        own, sread = item.owner, item.stream_read
        assert f is not None  # issued above
        t1 = time.perf_counter()
        if reqs:
            with self._watching("a batch's gets", f.run_owner):
                self.windows.arena.wait(reqs)
        t2 = time.perf_counter()
        st.get_wait_seconds += t2 - t1
        st.fetch_seconds += t2 - t1
        buf = self.ro[slot] if self.ro else _NO_BUFFER  # replicated: every sample is in a window
        sl = self.sched.step(s)
        segs = self.segs
        samples = [
            (segs[o] if loc else buf)[a : a + n]
            for loc, o, a, n in zip(f.local.tolist(), own.tolist(), f.start.tolist(), f.length.tolist())
        ]
        mine = own == p.rank
        where = np.where(f.local, self.seg_at[own] + f.start, 0)
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
            where[miss] = 0
            mine &= ~miss
            st.samples_storage += int(miss.sum())
            st.bytes_storage += int(p.sizes[ids[miss]].sum())
            st.storage_reads += sread[1][4]
        if tier is not None:
            try:
                views, nread, nruns = tier.take(s)
            except Exception as exc:  # told to the others at the epoch's end (NOTE [ Store agreement protocol ])
                self.failure = error = read_error(self.container, p.start, exc, 0, 0, ids=ids[tier.from_storage[sl]])
                raise _StepFailed(error) from exc
            t3 = time.perf_counter()
            st.storage_wait_seconds += t3 - t2
            st.fetch_seconds += t3 - t2
            stor = tier.from_storage[sl]
            samples = [v if v is not None else x for v, x in zip(views, samples)]
            where[stor] = 0
            mine &= ~stor
            st.samples_storage += int(stor.sum())
            st.bytes_storage += int(p.sizes[ids[stor]].sum())
            st.storage_reads += nruns
        batch = Batch(samples, p.labels[ids].astype(np.int64), ids + p.start, self.e, s, pad, where=where)
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
        p, st, failure = self.plan, self.stats, self.failure
        if self.tier is not None and not self.lazy:  # a rank whose storage read failed waits here for the others
            self._agree(failure)  # NOTE [ Store agreement protocol ], 5
        elif self.stream is not None:  # every rank's block is in from here on (or every rank raises)
            self._agree(self.windows.end_stream() or failure)
        st.finish(time.perf_counter() - self.t_epoch)
        if self.lazy:  # epoch 0 done: read what it did not need (dropped samples), then let others read
            self._fill_the_rest(failure)
        st.set_population(self.windows.population)
        if log.isEnabledFor(logging.INFO):  # formatted only when logged (~30 us an epoch)
            log.info(
                "epoch %d rank %d/%d: %s",
                self.e,
                p.rank,
                p.size,
                ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in st.as_dict().items()),
            )

    def _check_unchanged(self) -> None:
        """Collective: a container whose files changed since the store opened it (another file at its
        path, another size or modification time) is raised on every rank, naming the file, before an
        epoch reads from it; one stat per file and one small agreement."""
        exc = None
        try:
            self.container.check_unchanged()
        except Exception as e:  # noqa: BLE001 - every rank must learn of it, or they would wait forever
            exc = e
        self._agree(exc)

    def _fill_the_rest(self, failure: BaseException | None = None) -> None:
        """Collective (dynamic population): reads this rank's samples not read yet, unless `failure`
        already happened; agrees on a failure on any rank (raised on every rank), then publishes the
        windows and counts the time and bytes as population."""
        w = self.windows
        t0 = time.perf_counter()
        n = 0
        if failure is None:
            try:
                n = fill_dynamic(self.plan, self.container, w, np.nonzero(~w.loaded)[0]) if w.loaded is not None else 0
            except Exception as exc:  # noqa: BLE001 - the others wait in publish(): they must learn of it
                failure = exc
        self._agree(failure)
        w.arena.publish()
        w.add_population(time.perf_counter() - t0, n)
