"""Filling a store's windows from its container: the preload (a rank's block, or a node's part of a
replicated copy), the tiered preload (only the resident samples, dstore.order.tiers) and the dynamic
population (what epoch 0 needs), after the memory budget is checked (dstore.store.budget); the reads
themselves, several in flight, are dstore.store.preload's. A failed read is raised on the rank that read
it and agreed with every other rank (dstore.runtime.collective) before anything collective.

What the population builds is one `Windows` value, which the store keeps (`DataStore.windows`) and
frees; the store hands it to the modules serving epochs (dstore.store.epoch, dstore.store.stream).
"""

from __future__ import annotations

import dataclasses
import time
from typing import TYPE_CHECKING, Any

import numpy as np

from dstore.errors import ConfigError, MemoryBudgetError
from dstore.formats.integrity import SampleChecks
from dstore.memory.limits import fmt_bytes
from dstore.order import plan
from dstore.runtime.collective import AGREED, Topology, agree, node_comm, topology_of
from dstore.runtime.heartbeat import Heartbeat
from dstore.runtime.watchdog import Watchdog, close_watchdog, open_watchdog
from dstore.store.budget import check_budget, recv_bound
from dstore.store.preload import RangeReads, preload, preload_resident, read_samples
from dstore.store.storage import StorageReader
from dstore.store.window import Arena, Probe

if TYPE_CHECKING:
    from dstore.store.storeplan import StorePlan
    from dstore.store.stream import Stream


@dataclasses.dataclass(eq=False)
class Windows:
    """What a store's population built (`populate`), kept by the store as `DataStore.windows` until it
    frees them (`free`, collective) or drops them after an error (`abandon`, local).

    Attributes:
        arena: this rank's window (replicated: the node's shared one).
        topology: the store's view of its nodes.
        layout: where each sample lives: the store's plan, or over budget its resident samples only
            (the store's `layout` from the population on).
        tier: the store's `tier` figures (resident_fraction, resident_bytes, storage_bytes).
        checks: the served samples' checksums, that every read from storage is checked against (None:
            unchecked, a measurement's choice only).
        resident: bool[N], the samples kept in a window when only part of the data fits, else None.
        segs: rank -> its window served in place: this rank's and the node peers' it maps ({} when
            replicated).
        view: replicated: the node's full copy, else None.
        nodecomm: replicated: the node communicator of the shared window (freed with it), else None.
        storage: tiered: the storage tier's StorageReader, else None.
        loaded: dynamic: bool[N], which of this rank's samples are in its window (others' are True).
        stream: population="stream": the dstore.store.stream.Stream while it fills the windows, else None.
        recv_bufs: the receive buffers an epoch sized (dstore.store.epoch), reused by the next.
        storage_bufs: the storage tier's read buffers (dstore.store.storage.StorageEpoch), reused likewise.
        population: the population's figures so far (population_seconds, population_bytes,
            population_MBps): the preload's, then epoch 0's dynamic reads or the stream's.
        watch: the watchdog over this rank's waits on other nodes (dstore.runtime.watchdog), where the
            store's ranks are on several hosts, else None.
    """

    arena: Arena
    topology: Topology
    layout: plan.Layout
    tier: dict
    checks: SampleChecks | None
    resident: np.ndarray | None = None
    segs: dict = dataclasses.field(default_factory=dict)
    view: np.ndarray | None = None
    nodecomm: Any = None
    storage: StorageReader | None = None
    loaded: np.ndarray | None = None
    stream: Stream | None = None
    recv_bufs: list = dataclasses.field(default_factory=list)
    storage_bufs: list = dataclasses.field(default_factory=list)
    population: dict = dataclasses.field(default_factory=lambda: {"population_seconds": 0.0, "population_bytes": 0})
    watch: Watchdog | None = None

    def add_population(self, seconds: float, nbytes: int) -> None:
        """Counts `nbytes` read in `seconds` as population."""
        p = self.population
        p["population_seconds"] += seconds
        p["population_bytes"] += int(nbytes)
        p["population_MBps"] = p["population_bytes"] / 1e6 / p["population_seconds"] if p["population_seconds"] else 0.0

    def end_stream(self) -> BaseException | None:
        """Collective: waits for every rank's stream (dstore.store.stream.Stream.drain) and ends this one's;
        returns this rank's stream failure, for the agreement that follows (None without a stream)."""
        st, self.stream = self.stream, None
        if st is None:
            return None
        try:
            st.drain()
            self.add_population(*st.population())
        finally:
            st.close()
        return st.error

    def close_storage(self) -> None:
        """Closes the storage tier's reader and drops its buffers (local; safe twice)."""
        storage, self.storage = self.storage, None
        self.storage_bufs = []
        if storage is not None:
            storage.close()

    def free(self) -> None:
        """Collective: stops the stream, closes the storage reader, frees the window and the node
        communicator. Safe twice."""
        if self.stream is not None:
            self.stream.stop()  # nothing may write into a window being freed
        self._drop()
        watch, self.watch = self.watch, None
        close_watchdog(watch, free=True)
        self.arena.free()
        nodecomm, self.nodecomm = self.nodecomm, None
        if nodecomm is not None:
            nodecomm.Free()

    def abandon(self) -> None:
        """Local teardown after an error: stops the stream (nothing writes into the windows after
        it), closes the storage reader; the window and the node communicator are left to
        MPI_Finalize, since another rank may never reach a collective free."""
        if self.stream is not None:
            self.stream.stop()
        self._drop()
        watch, self.watch = self.watch, None
        close_watchdog(watch, free=False)
        self.nodecomm = None

    def _drop(self) -> None:
        self.view, self.segs, self.recv_bufs = None, {}, []
        self.close_storage()


def fill_dynamic(p: StorePlan, container, windows: Windows, ids: np.ndarray) -> int:
    """Reads the not yet loaded own samples among `ids` (runs of consecutive ones coalesced) from
    `container` into the dynamic population's window."""
    loaded = windows.loaded
    if loaded is None:
        raise ValueError("fill_dynamic: the store's population is not dynamic")
    ids = np.unique(ids[~loaded[ids]])
    if ids.size == 0:
        return 0
    heads = np.nonzero(np.diff(ids, prepend=-2) != 1)[0]
    ends = np.append(heads[1:], ids.size)
    local, disp, off = windows.arena.local, windows.layout.disp, p.offsets
    for h, e in zip(heads.tolist(), ends.tolist()):
        lo, hi = int(ids[h]), int(ids[e - 1]) + 1
        d = int(disp[lo])
        read_samples(container, p.start, lo, hi, local[d : d + int(off[hi] - off[lo])], windows.checks)
    loaded[ids] = True
    return int(p.sizes[ids].sum())


def _fill(p: StorePlan, container, w: Windows, peers: list | None) -> int:
    """This rank's part of the population (no collective) into `w`: returns the bytes read."""
    args = (container, p.start, p.offsets, p.base_byte)
    if w.nodecomm is not None:  # replicated: this rank's part of the node's copy
        w.view = view = w.arena.segment(0)
        nc = w.nodecomm
        nb = plan.block_bounds(p.offsets, nc.Get_size())
        lo, hi = int(nb[nc.Get_rank()]), int(nb[nc.Get_rank() + 1])
        a, b = int(p.offsets[lo]), int(p.offsets[hi])
        reads = RangeReads(container, p.population_threads)
        try:
            preload(reads, *args, lo, hi, view[a:b], w.checks)
        finally:
            reads.close()
        return b - a
    w.segs = w.arena.map_peers(peers, w.layout.nbytes)
    if w.resident is not None:
        # shared: where the job's reader allows concurrent reads (HDF5's positioned reads), the
        # threads read with it; opening the container again costs storage requests per thread.
        w.storage = StorageReader(container.path, p.storage_threads, container.opened_identity, shared=container)
    if p.population == "dynamic":
        w.loaded = loaded = np.zeros(p.num_samples, dtype=bool)
        loaded[w.layout.owner != p.rank] = True  # only own samples are tracked
        if w.resident is not None:
            loaded[~w.resident] = True  # served from storage, never loaded
        return 0
    lo, hi = int(p.bounds[p.rank]), int(p.bounds[p.rank + 1])
    if w.resident is None and p.population == "stream":  # read in the background: DataStore.populate
        return 0
    if w.resident is None:
        reads = RangeReads(container, p.population_threads)
        try:
            preload(reads, *args, lo, hi, w.arena.local, w.checks)
        finally:
            reads.close()
        return w.arena.local.size
    # tiered: the storage tier's threads (and readers, counted in the budget) read the block
    threads = min(p.population_threads, p.storage_threads)
    reads = RangeReads(container, threads, pool=w.storage if threads > 1 else None)
    scratch = max(1, (p.storage_lookahead + 1) * recv_bound(p))  # counted in the budget
    return preload_resident(reads, *args, lo, hi, w.resident, w.arena.local, w.layout.disp, scratch, checks=w.checks)


def _allocate(p: StorePlan, comm, nodecomm: Any, layout: plan.Layout) -> tuple[Arena, Any, list | None]:
    """Collective: this rank's window, as (the arena, the node communicator it keeps (replicated:
    the shared window's) or None, the node peers whose windows it maps (else None))."""
    if p.replicate:
        return Arena(nodecomm, int(p.offsets[-1]) if nodecomm.Get_rank() == 0 else 0, shared=True), nodecomm, None
    peers = nodecomm.allgather(p.rank)  # always: node_views may differ between ranks
    nodecomm.Free()
    return Arena(comm, int(layout.nbytes[p.rank])), None, peers if p.node_views else [p.rank]


def populate(p: StorePlan, comm, container) -> Windows:
    """Collective over `comm`, the store's: checks the budget, allocates the windows and
    (preload/replicate) fills them from `container`;
    a read error on any rank frees the windows and is raised on every rank."""
    # Every byte read from storage is checked against the container's checksums where it was read.
    checks = SampleChecks(p.offsets, p.checksums)  # the node's shared copy (dstore.store.index)
    nodecomm = node_comm(comm, emulate=True)  # the store's nodes: tests cut them with $DSTORE_RANKS_PER_NODE
    try:
        topology = topology_of(comm, nodecomm)
        residency = check_budget(p, comm, topology, str(getattr(container, "path", "storage")))
    except BaseException as exc:
        nodecomm.Free()
        if isinstance(exc, (ConfigError, MemoryBudgetError)):
            setattr(exc, AGREED, True)  # every rank saw the same gathered rows and raises alike
        raise
    layout, tier = (p.layout, p.tier) if residency is None else (residency.layout, residency.tier)
    t0 = time.perf_counter()
    exc = made = None
    try:  # window allocation is collective: a rank that fails it tells the others below
        made = _allocate(p, comm, nodecomm, layout)
    except Exception as e:  # noqa: BLE001 - every rank must learn of it, or they would wait forever
        exc = e
    agree(comm, exc)  # NOTE [ Store agreement protocol ], 3
    assert made is not None  # else agree raised
    arena, kept, peers = made
    w = Windows(
        arena,
        topology,
        layout,
        tier,
        checks,
        nodecomm=kept,
        resident=None if residency is None else residency.resident,
        watch=open_watchdog(comm, Probe),
    )  # collective: every rank is here (agreed above)
    nbytes = 0
    try:
        with Heartbeat(f"population of rank 0's {fmt_bytes(int(layout.nbytes[0]))}", enabled=p.rank == 0):
            nbytes = _fill(p, container, w, peers)
    except Exception as e:  # noqa: BLE001 - the others wait in publish(): they must learn of it
        exc = e
    try:
        agree(comm, exc)
    except BaseException:
        w.free()  # collective, and every rank is here: nothing is left to MPI_Finalize
        raise
    arena.publish()
    w.add_population(time.perf_counter() - t0, nbytes)
    return w
