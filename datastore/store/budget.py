"""A store's memory budget applied to its plan (dstore.store.storeplan.StorePlan): the bytes a rank
holds, checked against its budget on every rank alike (one allgather, which also compares the
arguments that shape the plan), and, where the data do not fit and overflow is served, the resident
set. The arithmetic is dstore.memory.budget's, on plain values (NOTE [ Budget arithmetic on plain
values ]).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import numpy as np

from dstore.errors import ConfigError, MemoryBudgetError
from dstore.memory.budget import (
    Residency,
    peak_bytes,
    population_index_bytes,
    receive_bytes,
    resident_room,
    step_bound,
    stream_bytes,
    tier_bytes,
)
from dstore.memory.limits import budget_error, default_budget, fmt_bytes
from dstore.order import plan, tiers

if TYPE_CHECKING:
    from dstore.runtime.collective import Topology
    from dstore.store.storeplan import StorePlan

log = logging.getLogger("dstore.store")


def recv_bound(p: StorePlan) -> int:
    """An upper bound on one receive buffer: the largest bytes a rank can get in one step (step_bound)."""
    return step_bound(
        p.offsets,
        p.num_samples,
        p.batch_size,
        p.size,
        largest_block=p.order_policy.largest_block(p.bounds),
        steps_per_epoch=p.steps_per_epoch,
    )


def receive_buffers(p: StorePlan) -> int:
    """Bytes of a rank's receive buffers (none when replicated or alone)."""
    return receive_bytes(recv_bound(p), prefetch=p.prefetch, nranks=p.size, replicate=p.replicate)


def population_readers(p: StorePlan) -> int:
    """Bytes of the index arrays of a preload's own reader threads (more than one thread): held
    during the population only, before the receive buffers exist."""
    return population_index_bytes(
        p.reader_index, population_threads=p.population_threads, population=p.population, replicate=p.replicate
    )


def stream_buffers(p: StorePlan) -> int:
    """Bytes a streaming preload (dstore.store.stream) holds during the epoch it serves besides the receive
    buffers: `prefetch + 1` buffers of a step's own reads and their threads' readers' index arrays
    (none for HDF5 and Zarr: the stream's StorageReader reads byte ranges)."""
    return stream_bytes(recv_bound(p), p.reader_index, prefetch=p.prefetch, storage_threads=p.storage_threads)


def tier_buffers(p: StorePlan, bufs: int) -> int:
    """Bytes a rank holds besides resident data when tiered: receive buffers, storage buffers (the
    preload's scratch pieces fit in these and are gone before they exist), and the index arrays
    (offsets, labels, checksums, source indices) of each storage thread's own reader (the tiered
    preload reads with those threads); and the served fields' window and buffer, always resident."""
    return (
        tier_bytes(
            bufs,
            recv_bound(p),
            p.reader_index,
            storage_lookahead=p.storage_lookahead,
            storage_threads=p.storage_threads,
        )
        + p.field_bytes
    )


def memory_needs(p: StorePlan) -> tuple[int, int]:
    """(all resident: the rank's share plus its peak buffers; nothing resident: the tier's buffers),
    as check_budget and choose_resident count them (a replicated store: the whole data set)."""
    bufs, peak = _buffers(p)
    data = int(p.offsets[-1]) if p.replicate else int(p.layout.nbytes[p.rank])
    return data + peak, tier_buffers(p, bufs)


def _buffers(p: StorePlan) -> tuple[int, int]:
    """(a rank's receive buffers, the most it holds besides its data: peak_bytes)."""
    bufs = receive_buffers(p)
    streaming = p.population == "stream" and not p.replicate  # the stream runs beside epoch 0's buffers
    # the served fields (dstore.store.fieldstore) are always resident, beside everything else
    return bufs, peak_bytes(bufs, population_readers(p), stream_buffers(p) if streaming else None) + p.field_bytes


def check_budget(p: StorePlan, comm, topology: Topology, name: str = "storage") -> Residency | None:
    """Collective over `comm`, the store's: every rank raises the same MemoryBudgetError if any rank's
    share is over budget, or (overflow served) every rank computes the same resident set (None:
    everything fits; `name`: the container, for the log)."""
    local_ranks = topology.local_size
    budget, source = (
        (p.config.memory_budget, p.budget_source) if p.config.memory_budget is not None else default_budget(local_ranks)
    )
    bufs, peak = _buffers(p)
    if p.replicate:
        data = int(p.offsets[-1]) if topology.local_rank == 0 else 0
        cap = budget * local_ranks  # the node's ranks pool their budgets for the one copy
    else:
        data, cap = int(p.layout.nbytes[p.rank]), budget
    key = (("num_samples", p.num_samples), ("total_bytes", int(p.offsets[-1])), *p.config.agreed())
    # NOTE [ Store agreement protocol ], 2
    rows = comm.allgather((data + peak, data, cap, source, local_ranks, key))
    odd = [r for r, row in enumerate(rows) if row[5] != rows[0][5]]
    if odd:  # ranks that disagree on the plan or the resident set would exchange wrong bytes or wait forever
        diff = {n: (a, b) for (n, a), (_, b) in zip(rows[0][5], rows[odd[0]][5]) if a != b}
        raise ConfigError(f"DataStore arguments differ between ranks: rank 0 vs rank {odd[0]}: {diff}")
    msg = budget_error([row[:5] for row in rows], offsets=p.offsets, bufs=peak, replicate=p.replicate)
    if msg and p.overflow == "serve" and not p.replicate:
        return choose_resident(p, [row[2] for row in rows], bufs)
    if msg:  # every rank saw the same rows, so every rank raises the same error
        raise MemoryBudgetError(msg)
    return None


def choose_resident(p: StorePlan, caps: list, bufs: int, name: str = "storage") -> Residency:
    """Overflow served: every rank computes the same resident set from the gathered budgets."""
    extra = tier_buffers(p, bufs)
    keep = resident_room(caps, extra)
    if keep.min() < 0:
        r = int(np.argmin(keep))
        served = ", and the served fields (always resident)" if p.field_bytes else ""
        raise MemoryBudgetError(
            f"the data store does not fit its memory budget even with nothing resident: rank {r} needs "
            f"{fmt_bytes(extra)} of buffers (receive, and {p.storage_lookahead + 1} steps of storage "
            f"reads{served}) but its memory budget is {fmt_bytes(caps[r])}; raise memory_budget / "
            f"$DSTORE_MEMORY_BUDGET or lower batch_size/prefetch/storage_lookahead"
        )
    if p.layout.base is not None:  # blocks: the residency one block at a time, the windows' layout looked up
        resident = tiers.resident_blocks(p.sizes, p.bounds, keep, p.seed)
        roff = tiers.resident_offsets(p.sizes, resident)
        lay = plan.block_layout(roff, p.bounds)  # each window: its block's resident samples back to back
        # base None: a displacement is in the resident window, not from the container's offsets (dstore.store.epoch)
        layout = plan.Layout(lay.owner, lay.disp, lay.nbytes)
    else:
        resident = tiers.resident_mask(p.sizes, p.layout.owner, keep, p.seed)
        roff = tiers.resident_offsets(p.sizes, resident)
        layout = plan.scattered_layout(roff, p.layout.owner, p.size)
    total = int(p.offsets[-1])
    res_bytes = int(roff[-1])
    tier = {
        "resident_fraction": res_bytes / total if total else 1.0,
        "resident_bytes": res_bytes,
        "storage_bytes": total - res_bytes,
    }
    if p.rank == 0:
        log.warning(
            "the data set (%s) exceeds the memory budget: %.1f%% of its bytes (%d of %d samples) stay "
            "in the ranks' memory, the other %s per epoch are read from %s by the ranks that need "
            "them, %d steps ahead (overflow='serve'; overflow='error' refuses instead)",
            fmt_bytes(total),
            100.0 * tier["resident_fraction"],
            int(resident.sum()),
            p.num_samples,
            fmt_bytes(total - res_bytes),
            name,
            p.storage_lookahead,
        )
    return Residency(resident, layout, tier)
