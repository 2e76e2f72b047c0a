"""What the machine allows, measured in the same run as everything else: memcpy and raw RMA over the
data set's own sample sizes, and sequential reads of the container file, cold and warm."""

from __future__ import annotations

import dataclasses
import os

import numpy as np

from dstore.order.plan import block_bounds, global_schedule
from dstore.order.shuffle import global_order
from dstore.tools.bench.common import (
    RAW_RMA,
    RAW_RMA_PER_SAMPLE,
    SEQ_READ,
    SEQ_READ_FRESH,
    Measurement,
    evict_on_nodes,
    measure,
)


def batch_plan(num_samples: int, batch_size: int, rank: int, size: int, seed: int, epoch: int = 0) -> list[np.ndarray]:
    """Rank `rank`'s sample indices, step by step, in the store's own global-shuffle epoch
    (dstore.order.shuffle.global_order + dstore.order.plan.global_schedule, last short batch kept)."""
    sched = global_schedule(global_order(num_samples, seed, epoch), batch_size, size, rank, False)
    return [sched.ids[sched.step(s)][~sched.pad[sched.step(s)]] for s in range(sched.steps)]


def memcpy_pass(comm, offsets: np.ndarray, batch_size: int, seed: int, *, repeat: int = 3) -> Measurement:
    """Per-sample memcpy of this rank's share of an epoch, sample sizes and order as the data set's.

    The source is this rank's own block of the data set's bytes (as a store rank holds it): a sample
    from another rank's block is copied from the same-sized range at its offset modulo this block,
    so every copy has the true size and a random source position.
    """
    rank, size = comm.Get_rank(), comm.Get_size()
    bounds = block_bounds(offsets, size)
    lo, hi = int(offsets[bounds[rank]]), int(offsets[bounds[rank + 1]])
    sizes = np.diff(offsets)
    arena = np.ones(max(hi - lo, int(sizes.max()) + 1), dtype=np.uint8)
    steps = batch_plan(len(sizes), batch_size, rank, size, seed)
    dst = _destination(sizes, steps)
    span = len(arena)

    def run():
        n = b = 0
        for step in steps:
            pos = 0
            for i in step:
                s = int(sizes[i])
                src = int(offsets[i]) % (span - s + 1)
                dst[pos : pos + s] = arena[src : src + s]
                pos += s
            n += len(step)
            b += pos
        return n, b

    return measure(comm, "memcpy", "limit", "memory", run, repeat=repeat, batch_size=batch_size)


def raw_rma_pass(
    comm, offsets: np.ndarray, batch_size: int, seed: int, *, per_sample: bool = False, repeat: int = 3
) -> Measurement:
    """The bare RMA the store is built on: each rank's block in a `Win.Allocate` arena (the store's
    ownership), then every rank gets its share of a shuffled epoch (the store's order) from whichever
    rank owns each sample, `Flush_all` per batch, inside one `Lock_all` epoch. No prefetch, no
    bookkeeping beyond the owner lookup.

    Args:
        per_sample: one `Get` per sample (a plain Python loop: bounded by per-call overhead). The
            default issues one `Get` per owner and batch with an hindexed target datatype that
            lists the samples, so the MPI library moves the bytes with no Python in between: the
            ceiling the store is compared against.
    """
    rank, size = comm.Get_rank(), comm.Get_size()
    where = _Placement.of(offsets, size)
    steps = batch_plan(len(where.sizes), batch_size, rank, size, seed)
    dst = _destination(where.sizes, steps)
    get = _get_per_sample if per_sample else _get_indexed
    win = _filled_window(comm, where.block_bytes(rank))
    try:

        def run():
            return _rma_epoch(win, steps, lambda step: get(win, dst, where, step))

        name = RAW_RMA_PER_SAMPLE if per_sample else RAW_RMA
        return measure(comm, name, "limit", "memory", run, repeat=repeat, batch_size=batch_size)
    finally:
        win.Free()


@dataclasses.dataclass(frozen=True)
class _Placement:
    """Where each sample lives under the store's ownership: its size, the rank whose block holds it,
    and its byte displacement in that rank's window."""

    sizes: np.ndarray
    owners: np.ndarray
    disps: np.ndarray
    base: np.ndarray
    """Byte offset where each rank's block starts (and, last, the total)."""

    @classmethod
    def of(cls, offsets: np.ndarray, size: int) -> _Placement:
        bounds = block_bounds(offsets, size)
        base = offsets[bounds]
        sizes = np.diff(offsets)
        owners = np.searchsorted(bounds, np.arange(len(sizes)), side="right") - 1
        return cls(sizes, owners, offsets[:-1] - base[owners], base)

    def block_bytes(self, rank: int) -> int:
        return int(self.base[rank + 1] - self.base[rank])


def _destination(sizes: np.ndarray, steps: list[np.ndarray]) -> np.ndarray:
    """A buffer for the largest batch, its pages faulted in before timing."""
    dst = np.zeros(int(sizes.max()) * max(len(s) for s in steps), dtype=np.uint8)
    dst[:] = 1
    return dst


def _filled_window(comm, nbytes: int):
    """This rank's block as a `Win.Allocate` window, every page touched before timing (collective)."""
    from mpi4py import MPI

    win = MPI.Win.Allocate(max(nbytes, 1), 1, comm=comm)
    try:
        arena = np.frombuffer(win.tomemory().cast("B"), dtype=np.uint8)
        arena[:] = comm.Get_rank() + 1
        del arena
        comm.Barrier()
    except BaseException:
        win.Free()
        raise
    return win


def _rma_epoch(win, steps: list[np.ndarray], get) -> tuple[int, int]:
    """One pass over `steps` inside one `Lock_all` epoch; `get(step)` fetches a batch and returns its bytes."""
    from mpi4py import MPI

    n = b = 0
    win.Lock_all(MPI.MODE_NOCHECK)
    try:
        for step in steps:
            b += get(step)
            n += len(step)
    finally:
        win.Unlock_all()
    return n, b


def _get_per_sample(win, dst: np.ndarray, where: _Placement, step: np.ndarray) -> int:
    """One `Get` per sample, then `Flush_all`."""
    from mpi4py import MPI

    pos = 0
    for i in step:
        s = int(where.sizes[i])
        win.Get([dst[pos : pos + s], MPI.BYTE], int(where.owners[i]), (int(where.disps[i]), s, MPI.BYTE))
        pos += s
    win.Flush_all()
    return pos


def _get_indexed(win, dst: np.ndarray, where: _Placement, step: np.ndarray) -> int:
    """One `Get` per owner with an hindexed datatype listing its samples, then `Flush_all`."""
    from mpi4py import MPI

    step = step[np.argsort(where.owners[step], kind="stable")]
    cuts = np.flatnonzero(np.diff(where.owners[step])) + 1
    pos, types = 0, []
    for grp in np.split(step, cuts):
        lens = where.sizes[grp]
        n = int(lens.sum())
        t = MPI.BYTE.Create_hindexed(lens.tolist(), where.disps[grp].tolist()).Commit()
        types.append(t)
        win.Get([dst[pos : pos + n], MPI.BYTE], int(where.owners[grp[0]]), (0, 1, t))
        pos += n
    win.Flush_all()
    for t in types:
        t.Free()
    return pos


def sequential_read(comm, path: str, cache: str, *, chunk: int = 8 << 20, fresh: bool = False) -> Measurement:
    """Each rank reads its share of the file (one contiguous byte range) in large sequential reads.

    Args:
        comm: all ranks read at once, as a store's preload does.
        path: one file (the HDF5 container).
        cache: `cold` evicts the file's pages first; `warm` reads what the page cache holds.
        chunk: bytes per read call.
        fresh: read into a newly allocated buffer of the share's size (every page faulted in
            during the read, as a loader that keeps the bytes pays) instead of reusing one
            `chunk`-sized buffer (the file system alone).
    """
    if cache == "cold":
        evict_on_nodes(comm, [path])
    rank, size = comm.Get_rank(), comm.Get_size()
    total = os.path.getsize(path)
    lo, hi = total * rank // size, total * (rank + 1) // size

    def run():
        got = 0
        buf = np.empty(hi - lo if fresh else min(chunk, hi - lo), dtype=np.uint8)
        view = buf.data
        fd = os.open(path, os.O_RDONLY)
        try:
            pos = lo
            while pos < hi:
                at = pos - lo if fresh else 0
                k = os.preadv(fd, [view[at : at + min(chunk, hi - pos)]], pos)
                if k <= 0:
                    break
                pos += k
                got += k
        finally:
            os.close(fd)
        return 0, got

    return measure(
        comm, SEQ_READ_FRESH if fresh else SEQ_READ, "limit", cache, run, file=os.path.basename(path), chunk=chunk
    )
