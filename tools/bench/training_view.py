"""The training view, by DLIO's method: each loader feeds a loop whose compute is a fixed sleep per step;
accelerator utilisation AU = compute time / wall time. Every loader delivers decoded images."""

from __future__ import annotations

import time
from typing import Any

from dstore.loader.store_loader import StoreLoader
from dstore.tools.bench.baselines import ContainerSampleDataset, FileBytesDataset, collate_list
from dstore.tools.bench.common import evict_on_nodes, rank_split

TV_H5PY = "h5py Dataset (contiguous) + DataLoader"
TV_ZARR = "zarr Dataset (128 KiB chunks) + DataLoader"
"""The training view's names of the h5py and zarr per-sample baselines (runner and storage sweep)."""


def au_loop(comm, name: str, make_iter, compute_seconds: float) -> dict:
    """Runs one epoch of `make_iter()` with `compute_seconds` of sleep per step, on every rank.

    The sleep releases the GIL, so loader threads (the store's decode pool) work beside it, as they
    would beside a GPU step. Ranks are not synchronised per step (their step counts may differ by
    one for the baselines' DistributedSampler-like split), so AU is per rank and the job's AU is
    the lowest.

    Returns:
        {name, steps, wall, wait, first_wait, au, au_steady, rank_au}: wall, wait (seconds spent
        waiting for batches) and first_wait (for the first batch: the pipeline filling) of the least
        utilised rank; `au` over the whole epoch, `au_steady` without the first batch's wait.
    """
    comm.Barrier()
    t0 = time.perf_counter()
    it = iter(make_iter())
    steps = 0
    wait = first_wait = 0.0
    while True:
        tw = time.perf_counter()
        try:
            next(it)
        except StopIteration:
            wait += time.perf_counter() - tw
            break
        dt = time.perf_counter() - tw
        wait += dt
        if steps == 0:
            first_wait = dt
        time.sleep(compute_seconds)
        steps += 1
    wall = time.perf_counter() - t0
    got = comm.allgather((steps, wall, wait, first_wait))
    rank_au = [s * compute_seconds / w if w > 0 else 0.0 for s, w, _, _ in got]
    worst = min(range(len(got)), key=lambda r: rank_au[r])
    steps, wall, wait, first_wait = got[worst]
    steady = wall - first_wait
    return {
        "name": name,
        "steps": steps,
        "wall": wall,
        "wait": wait,
        "first_wait": first_wait,
        "au": rank_au[worst],
        "au_steady": steps * compute_seconds / steady if steady > 0 else 0.0,
        "rank_au": [round(a, 4) for a in rank_au],
    }


def run_store(comm, store, *, compute_seconds: float, epoch: int, num_threads: int, size) -> dict:
    """The training view of the store: one epoch of decoded batches from `StoreLoader`."""
    with StoreLoader(store, decode_threads=num_threads, size=size) as loader:
        row = au_loop(comm, "store (StoreLoader)", lambda: loader.epoch(epoch), compute_seconds)
    row["cache"] = "memory"
    return row


def dataloader_iter(comm, dataset, *, batch_size: int, num_workers: int, seed: int, epoch: int = 0):
    """A factory for one epoch of a torch DataLoader over `dataset` (rank's DistributedSampler-like share)."""
    from torch.utils.data import DataLoader

    rank, size = comm.Get_rank(), comm.Get_size()
    indices = rank_split(len(dataset), rank, size, seed, epoch).tolist()
    per_rank = max(1, batch_size // size)
    return lambda: DataLoader(
        dataset,
        batch_size=per_rank,
        sampler=indices,
        num_workers=num_workers,
        collate_fn=collate_list,
        prefetch_factor=4 if num_workers else None,
    )


def run_baseline(
    comm, name: str, dataset, evict_paths, *, compute_seconds: float, batch_size: int, num_workers: int, seed: int
) -> dict:
    """The training view of one DataLoader baseline, cold (its files evicted first): a data set larger
    than the page cache is read from storage every epoch."""
    evict_on_nodes(comm, evict_paths)
    row = au_loop(
        comm,
        name,
        dataloader_iter(comm, dataset, batch_size=batch_size, num_workers=num_workers, seed=seed),
        compute_seconds,
    )
    row["cache"] = "cold"
    row["num_workers"] = num_workers
    return row


def run_baselines(
    comm, data, n: int, *, compute_seconds: float, batch_size: int, num_workers: int, seed: int, decode_size: int
) -> list[dict]:
    """The training view of every baseline over the first `n` samples of `data` (a bench DataSet):
    a DataLoader over the files (where the data set has them), and DataLoaders over the per-sample
    h5py and zarr copies (tools/bench/layouts.py), as a user training from HDF5 or Zarr would lay
    them out. Every one decodes to decode_size x decode_size."""
    kw: dict[str, Any] = dict(
        compute_seconds=compute_seconds, batch_size=batch_size, num_workers=num_workers, seed=seed
    )
    size = (decode_size, decode_size)
    offsets, labels = data.offsets[: n + 1], data.labels[:n]
    rows = []
    if data.files is not None:
        rows.append(
            run_baseline(
                comm,
                "DataLoader over files",
                FileBytesDataset(data.files[:n], labels, decode=True, size=size),
                data.files[:n],
                **kw,
            )
        )
    rows.append(
        run_baseline(
            comm,
            TV_H5PY,
            ContainerSampleDataset(data.h5py_contiguous, "h5py", offsets, labels, decode=True, size=size),
            [data.h5py_contiguous],
            **kw,
        )
    )
    rows.append(
        run_baseline(
            comm,
            TV_ZARR,
            ContainerSampleDataset(data.zarr_per_sample, "zarr", offsets, labels, decode=True, size=size),
            [data.zarr_per_sample],
            **kw,
        )
    )
    return rows
