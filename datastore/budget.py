"""A store's memory budget: the bytes a rank holds (its share of the data and its buffers), checked
against its budget on every rank alike (one allgather, which also compares the arguments that
shape the plan), and, where the data do not fit and overflow is served, the resident set.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import TYPE_CHECKING

import numpy as np

from dstore import plan, tiers
from dstore.errors import ConfigError, MemoryBudgetError
from dstore.memory import budget_error, default_budget, fmt_bytes

if TYPE_CHECKING:
    from dstore.collective import Topology
    from dstore.store import DataStore

log = logging.getLogger("dstore.store")


@dataclasses.dataclass(frozen=True)
class Residency:
    """What stays in the windows when the data exceed the budget and overflow is served (the same on
    every rank: computed from the same gathered rows).

    Attributes:
        resident: bool[N], the samples kept in their owner's window (dstore.tiers.resident_mask).
        layout: where they live: the windows hold the resident samples only.
        tier: the store's `tier` figures (resident_fraction, resident_bytes, storage_bytes).
    """

    resident: np.ndarray
    layout: plan.Layout
    tier: dict

READER_INDEX_BYTES = 20
"""Bytes per sample of an open container reader's index arrays (int64 offsets and labels, uint32
checksums; source indices are read on demand only): what each storage or population thread's
reader holds, unless its backend opens without them (ContainerReader.index_on_demand: HDF5, Zarr;
see reader_index)."""


def reader_index(store: DataStore) -> int:
    """Bytes of the index arrays one storage or population thread's reader holds: none where the
    backend reads them on demand only (the threads read byte ranges), else all of them."""
    if getattr(store.container, "index_on_demand", False):
        return 0
    return READER_INDEX_BYTES * int(store.container.num_samples)


def recv_bound(store: DataStore) -> int:
    """An upper bound on one receive buffer: the largest bytes a rank can get in one step."""
    per_step = -(-store.batch_size // store.size)
    if store.policy != "global":
        per_step = max(per_step, -(-int(np.diff(store.bounds).max()) // store.steps_per_epoch))
    per_step = min(per_step + 1, store.num_samples)
    return plan.largest_sum(store.offsets, per_step)


def receive_buffers(store: DataStore) -> int:
    """Bytes of a rank's receive buffers (none when replicated or alone)."""
    return 0 if (store.replicate or store.size == 1) else (store.prefetch + 1) * recv_bound(store)


def population_readers(store: DataStore) -> int:
    """Bytes of the index arrays of a preload's own reader threads (more than one thread): held
    during the population only, before the receive buffers exist."""
    if store.population_threads == 1 or (store.population == "dynamic" and not store.replicate):
        return 0
    return store.population_threads * reader_index(store)


def stream_buffers(store: DataStore) -> int:
    """Bytes a streaming preload (dstore.stream) holds during the epoch it serves besides the receive
    buffers: `prefetch + 1` buffers of a step's own reads and their threads' readers' index arrays
    (none for HDF5 and Zarr: the stream's StorageReader reads byte ranges)."""
    return (store.prefetch + 1) * recv_bound(store) + store.storage_threads * reader_index(store)


def tier_buffers(store: DataStore, bufs: int) -> int:
    """Bytes a rank holds besides resident data when tiered: receive buffers, storage buffers (the
    preload's scratch pieces fit in these and are gone before they exist), and the index arrays
    (offsets, labels, checksums, source indices) of each storage thread's own reader (the tiered
    preload reads with those threads)."""
    index = reader_index(store)
    return bufs + (store.storage_lookahead + 1) * recv_bound(store) + store.storage_threads * index


def memory_needs(store: DataStore) -> tuple[int, int]:
    """(all resident: the rank's share plus its peak buffers; nothing resident: the tier's buffers),
    as check_budget and choose_resident count them (a replicated store: the whole data set)."""
    bufs, peak = _buffers(store)
    data = int(store.offsets[-1]) if store.replicate else int(store.layout.nbytes[store.rank])
    return data + peak, tier_buffers(store, bufs)


def _buffers(store: DataStore) -> tuple[int, int]:
    """(a rank's receive buffers, the most it holds besides its data: those, or a preload's reader
    indexes, which are gone before the buffers exist)."""
    bufs = receive_buffers(store)
    if store.population == "stream" and not store.replicate:  # the stream runs beside epoch 0's buffers
        return bufs, bufs + stream_buffers(store) + population_readers(store)
    return bufs, max(bufs, population_readers(store))


def check_budget(store: DataStore, topology: Topology) -> Residency | None:
    """Collective: every rank raises the same MemoryBudgetError if any rank's share is over budget,
    or (overflow served) every rank computes the same resident set (None: everything fits)."""
    local_ranks = topology.local_size
    budget, source = ((store.config.memory_budget, store.budget_source) if store.config.memory_budget is not None
                      else default_budget(local_ranks))
    bufs, peak = _buffers(store)
    if store.replicate:
        data = int(store.offsets[-1]) if topology.local_rank == 0 else 0
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
        return choose_resident(store, [row[2] for row in rows], bufs)
    if msg:  # every rank saw the same rows, so every rank raises the same error
        raise MemoryBudgetError(msg)
    return None


def choose_resident(store: DataStore, caps: list, bufs: int) -> Residency:
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
    if store.layout.base is not None:  # blocks: the residency one block at a time, the windows' layout looked up
        resident = tiers.resident_blocks(store.sizes, store.bounds, keep, store.seed)
        roff = tiers.resident_offsets(store.sizes, resident)
        lay = plan.block_layout(roff, store.bounds)  # each window: its block's resident samples back to back
        # base None: a displacement is in the resident window, not from the container's offsets (dstore.epoch)
        layout = plan.Layout(lay.owner, lay.disp, lay.nbytes)
    else:
        resident = tiers.resident_mask(store.sizes, store.layout.owner, keep, store.seed)
        roff = tiers.resident_offsets(store.sizes, resident)
        layout = plan.scattered_layout(roff, store.layout.owner, store.size)
    total = int(store.offsets[-1])
    res_bytes = int(roff[-1])
    tier = {"resident_fraction": res_bytes / total if total else 1.0, "resident_bytes": res_bytes,
            "storage_bytes": total - res_bytes}
    if store.rank == 0:
        log.warning("the data set (%s) exceeds the memory budget: %.1f%% of its bytes (%d of %d samples) stay "
                    "in the ranks' memory, the other %s per epoch are read from %s by the ranks that need "
                    "them, %d steps ahead (overflow='serve'; overflow='error' refuses instead)",
                    fmt_bytes(total), 100.0 * tier["resident_fraction"], int(resident.sum()),
                    store.num_samples, fmt_bytes(total - res_bytes), getattr(store.container, "path", "storage"),
                    store.storage_lookahead)
    return Residency(resident, layout, tier)
