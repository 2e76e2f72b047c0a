"""A store's memory budget in plain values: the bytes a rank holds (its share of the data and its
buffers), each a pure function of numbers and arrays, and the resident set's record (Residency).
dstore.store.budget applies them to a store's plan, checks them on every rank alike and chooses the
resident set.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from dstore.order import plan


@dataclasses.dataclass(frozen=True)
class Residency:
    """What stays in the windows when the data exceed the budget and overflow is served (the same on
    every rank: computed from the same gathered rows).

    Attributes:
        resident: bool[N], the samples kept in their owner's window (dstore.order.tiers.resident_mask).
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
StorePlan.reader_index)."""


# NOTE [ Budget arithmetic on plain values ]: each figure is a pure function of plain values,
# tested without MPI or a store (tests/test_budget_arithmetic.py); the functions that take a store's
# plan (dstore.store.budget) only read its values and call these, so they are tested on a plan built
# without MPI too.


def index_bytes(num_samples: int, index_on_demand: bool) -> int:
    """Bytes of the index arrays one thread's reader of a container of `num_samples` holds: none
    where its backend reads them on demand only (the threads read byte ranges)."""
    return 0 if index_on_demand else READER_INDEX_BYTES * int(num_samples)


def step_bound(
    offsets,
    num_samples: int,
    batch_size: int,
    nranks: int,
    *,
    largest_block: int | None = None,
    steps_per_epoch: int = 1,
) -> int:
    """An upper bound on one receive buffer: the bytes of the largest samples one rank can get in one
    step: its part of a global batch, ``ceil(batch_size / nranks)`` samples (with `largest_block`,
    the local and partial policies, at least that block's samples spread over the epoch's steps),
    plus one, at most `num_samples`; the largest such samples of `offsets` (dstore.order.plan.largest_sum)."""
    per_step = -(-int(batch_size) // int(nranks))
    if largest_block is not None:
        per_step = max(per_step, -(-int(largest_block) // int(steps_per_epoch)))
    return plan.largest_sum(offsets, min(per_step + 1, int(num_samples)))


def receive_bytes(bound: int, *, prefetch: int, nranks: int, replicate: bool) -> int:
    """A rank's receive buffers: `prefetch + 1` of `bound` bytes (the step consumed and those in
    flight); none when replicated or alone."""
    return 0 if (replicate or nranks == 1) else (int(prefetch) + 1) * int(bound)


def population_index_bytes(index: int, *, population_threads: int, population: str, replicate: bool) -> int:
    """The index arrays (`index` bytes each) of a preload's own reader threads: none with one thread,
    or under a dynamic population that is not replicated (it reads through the epoch's storage)."""
    if population_threads == 1 or (population == "dynamic" and not replicate):
        return 0
    return int(population_threads) * int(index)


def stream_bytes(bound: int, index: int, *, prefetch: int, storage_threads: int) -> int:
    """A streaming preload's buffers besides the receive buffers: `prefetch + 1` buffers of a
    step's own reads, and each storage thread's reader's index arrays."""
    return (int(prefetch) + 1) * int(bound) + int(storage_threads) * int(index)


def tier_bytes(bufs: int, bound: int, index: int, *, storage_lookahead: int, storage_threads: int) -> int:
    """What a tiered rank holds besides resident data: its receive buffers `bufs`,
    `storage_lookahead + 1` storage buffers of `bound` bytes (the step consumed and those read
    ahead), and each storage thread's reader's index arrays."""
    return int(bufs) + (int(storage_lookahead) + 1) * int(bound) + int(storage_threads) * int(index)


def peak_bytes(bufs: int, pop_index: int, stream: int | None) -> int:
    """The most a rank holds besides its data: the receive buffers `bufs` or a preload's reader
    indexes `pop_index`, which are gone before the buffers exist; a streaming preload (`stream`
    its buffers, not None) runs beside epoch 0's receive buffers, so all three at once."""
    return int(bufs) + int(stream) + int(pop_index) if stream is not None else max(int(bufs), int(pop_index))


def resident_room(caps, extra: int) -> np.ndarray:
    """Each rank's bytes for resident data (int64): its budget in `caps` less the tier's `extra`
    buffers (negative: not even the buffers fit)."""
    return np.asarray(caps, dtype=np.int64) - int(extra)
