"""Filling a store's windows from its container: the preload (a rank's block, or a node's part of a
replicated copy), the tiered preload (only the resident samples, dstore.tiers) and the dynamic
population (what epoch 0 needs), after the memory budget is checked (dstore.budget); the reads
themselves, several in flight, are dstore.preload's. A failed read is raised on the rank that read
it and agreed with every other rank (dstore.collective) before anything collective.
"""

from __future__ import annotations

import time

import numpy as np

from dstore import plan
from dstore.budget import check_budget, recv_bound
from dstore.collective import AGREED, node_comm, topology_of
from dstore.errors import ConfigError, MemoryBudgetError
from dstore.heartbeat import Heartbeat
from dstore.integrity import SampleChecks
from dstore.memory import fmt_bytes
from dstore.preload import RangeReads, preload, preload_resident, read_samples
from dstore.storage import StorageReader
from dstore.window import Arena


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
