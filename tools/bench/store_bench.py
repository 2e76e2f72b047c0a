"""The store itself: population (preload and dynamic, cold and warm), per-epoch delivery of raw bytes for
each shuffle policy with prefetch on and off, and decoding through `StoreLoader` (reported apart)."""

from __future__ import annotations

import numpy as np

from dstore.codec import kernels
from dstore.loader.store_loader import StoreLoader
from dstore.memory.costs import NATIVE_MIN_PIXELS
from dstore.runtime import rc
from dstore.store.data_store import DataStore
from dstore.tools.bench.common import Measurement, evict_on_nodes, measure

PREFETCH_ON = 2
"""Batches in flight ahead of the consumer when prefetch is on (the store's default)."""


def _epoch_bytes(store, epoch: int) -> tuple[int, int]:
    n = b = 0
    for batch in store.epoch(epoch):
        n += len(batch.samples)
        b += sum(int(s.nbytes) for s in batch.samples)
    return n, b


def population(
    comm, container: str, evict_paths, *, mode: str, cache: str, batch_size: int, seed: int, sample_range=None
) -> Measurement:
    """Time to fill the store's windows from the container, on every rank at once.

    `preload` is timed from construction to the end of `__enter__` (each rank reads its block);
    `dynamic` fills during epoch 0, so epoch 0 is timed (file reads plus delivery: what a
    user waits for in the first epoch).

    Args:
        evict_paths: the container's files, evicted first when `cache` is `cold`.
    """
    if cache == "cold":
        evict_on_nodes(comm, evict_paths)
    holder = {}

    def run():
        store = DataStore(comm, container, batch_size=batch_size, seed=seed, population=mode, sample_range=sample_range)
        holder["store"] = store
        store.__enter__()
        if mode == "dynamic":
            _epoch_bytes(store, 0)
        held = store_bytes_held(store)
        return int(np.count_nonzero(store.layout.owner == store.rank)), held

    try:
        m = measure(comm, f"store population ({mode})", "population", cache, run, mode=mode)
        if mode == "dynamic":
            m.extra["note"] = "epoch 0 timed: file reads plus delivery"
        stats = _stats_dict(holder["store"])
        if stats:
            m.extra["stats"] = stats
    finally:
        if "store" in holder:
            holder["store"].__exit__(None, None, None)
    return m


def store_bytes_held(store) -> int:
    """Bytes this rank has read into its window: the store's `population_bytes` once an epoch has
    run (dynamic), else the size of its window (preload fills it whole)."""
    if store.stats is not None:
        return int(store.stats.population_bytes)
    return int(store.layout.nbytes[store.rank])


def _stats_dict(store) -> dict:
    """The store's last epoch's figures as a plain dict ({} before the first epoch)."""
    return store.stats.as_dict() if store.stats is not None else {}


def delivery(
    comm,
    container: str,
    *,
    shuffle: str,
    prefetch: int,
    batch_size: int,
    seed: int,
    sample_range=None,
    name: str | None = None,
    repeat: int = 3,
    node_views=None,
) -> Measurement:
    """Raw bytes out of a preloaded store: epoch 0 untimed as warm-up, then epochs 1, 2, 3 timed, the
    fastest kept (as for the memory limits: an epoch over memory takes tens of milliseconds, so one
    descheduled rank would otherwise decide the figure)."""
    with DataStore(
        comm,
        container,
        batch_size=batch_size,
        seed=seed,
        shuffle=shuffle,
        population="preload",
        prefetch=prefetch,
        sample_range=sample_range,
        node_views=node_views,
    ) as store:
        _epoch_bytes(store, 0)
        epochs = iter(range(1, 1 + repeat))
        m = measure(
            comm,
            name or f"store {shuffle}, prefetch {'on' if prefetch else 'off'}",
            "store",
            "memory",
            lambda: _epoch_bytes(store, next(epochs)),
            repeat=repeat,
            shuffle=shuffle,
            prefetch=prefetch,
            batch_size=batch_size,
            node_views=store.node_views,
        )
        stats = _stats_dict(store)
    if stats:
        m.extra["stats"] = stats
    return m


def decode_pass(
    comm,
    container: str,
    *,
    batch_size: int,
    seed: int,
    num_threads: int,
    size: int | None,
    epoch: int = 1,
    sample_range=None,
) -> tuple[Measurement, float]:
    """One epoch through `StoreLoader` (fetch + decode in threads, images as tensors) over
    `sample_range`. Returns the measurement and the slowest rank's mean seconds per step (what the
    training view's compute time is set from).

    The compiled kernels (dstore.codec.kernels) are loaded first where this pass and the training
    view's store pass after it, in the same process and over the same samples, reach
    DSTORE_NATIVE_AFTER (2,000) samples together: else their one-time load (about 1 s of CPU per
    process, more on a loaded machine) starts near this pass's end and falls on the view's store
    pass, while this pass ran on the numpy path, and the view set the store against a step time it
    did not measure (docs/benchmarks.md, "The training view")."""
    with DataStore(
        comm, container, batch_size=batch_size, seed=seed, population="preload", sample_range=sample_range
    ) as store:
        with StoreLoader(store, decode_threads=num_threads, size=size) as loader:
            per_rank = len(loader) * batch_size // comm.Get_size()
            if size is not None and size * size >= NATIVE_MIN_PIXELS and 2 * per_rank >= rc.NATIVE_AFTER.get():
                kernels.available()
            steps = {"n": 0}

            def run():
                n = b = 0
                for images, _labels in loader.epoch(epoch):
                    n += int(images.shape[0])
                    b += int(images.numel() * images.element_size())
                    steps["n"] += 1
                return n, b

            m = measure(
                comm,
                "store + StoreLoader decode",
                "decode",
                "memory",
                run,
                num_threads=num_threads,
                size=size,
                note="bytes are decoded pixels",
            )
    per_step = comm.allreduce(m.seconds[comm.Get_rank()] / max(steps["n"], 1), op=_max())
    m.extra["seconds_per_step"] = per_step
    return m, per_step


def _max():
    from mpi4py import MPI

    return MPI.MAX
