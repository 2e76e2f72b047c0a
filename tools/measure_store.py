"""Measures the store's delivery throughput beside a raw `Win.Allocate` + `Get` loop and warm
per-sample h5py reads, over the same samples in the same order, in one MPI job.

    mpiexec -n 2 python -m mpi4py tools/measure_store.py --samples 4000 --size 110000 --json out.json

Every rank serves its part of each global batch; a figure is the bytes delivered by all ranks
divided by the slowest rank's time (aggregate GB/s), after one warm-up epoch. This is a
measurement program, not a test.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

import numpy as np
from mpi4py import MPI

from dstore import plan, shuffle
from dstore.formats import create_writer, open_container
from dstore.store import DataStore


def make_data(path: str, n: int, size: int, seed: int = 0) -> None:
    """n random samples of size +-10% bytes (random bytes: the store never decodes)."""
    rng = np.random.default_rng(seed)
    with create_writer(path, "hdf5", encoding="image", class_names=["a", "b"], overwrite=True) as w:
        for i in range(n):
            k = int(size * rng.uniform(0.9, 1.1))
            w.append(rng.integers(0, 256, k, dtype=np.uint8).tobytes(), i % 2, f"s{i}", i)


def aggregate(comm, nbytes: int, nsamples: int, seconds: float) -> dict:
    tot_b = comm.allreduce(nbytes)
    tot_s = comm.allreduce(nsamples)
    t = comm.allreduce(seconds, op=MPI.MAX)
    return {"GBps": tot_b / 1e9 / t, "samples_per_s": tot_s / t, "seconds": t, "bytes": tot_b, "samples": tot_s}


def measure_store(comm, path, batch, epochs, **kw) -> dict:
    with DataStore(comm, path, batch_size=batch, **kw) as st:
        for _ in st.epoch(0):
            pass
        nb = ns = 0
        comm.Barrier()
        t0 = time.perf_counter()
        for e in range(1, epochs + 1):
            for b in st.epoch(e):
                ns += len(b.samples)
                nb += sum(x.nbytes for x in b.samples)
        t = time.perf_counter() - t0
        out = aggregate(comm, nb, ns, t)
        out["population"] = comm.allreduce(st.stats["population_bytes"]) / 1e9 / comm.allreduce(
            st.stats["population_seconds"], op=MPI.MAX)
        out["stats_rank0"] = {k: v for k, v in st.stats.items()}
    return out


def measure_raw(comm, reader, batch, epochs) -> dict:
    """Win.Allocate over the byte-balanced blocks, then one Get per sample into a preallocated
    buffer, Flush_all per batch: the floor of what any RMA store can do from Python."""
    offsets = np.asarray(reader.offsets, dtype=np.int64)
    n = offsets.size - 1
    bounds = plan.block_bounds(offsets, comm.size)
    lay = plan.block_layout(offsets, bounds)
    mine = int(lay.nbytes[comm.rank])
    win = MPI.Win.Allocate(mine, 1, comm=comm)
    try:
        local = np.frombuffer(win.tomemory(), dtype=np.uint8) if mine else None
        if mine:
            reader.read_range(int(bounds[comm.rank]), int(bounds[comm.rank + 1]), out=local)
        comm.Barrier()
        sizes = np.diff(offsets)
        buf = np.empty(int(np.sort(sizes)[-(batch // comm.size + 1):].sum()), dtype=np.uint8)
        mv = memoryview(buf)
        nb = ns = 0
        t0 = 0.0
        win.Lock_all()
        try:
            for e in range(0, epochs + 1):
                if e == 1:
                    comm.Barrier()
                    t0 = time.perf_counter()
                sched = plan.global_schedule(shuffle.global_order(n, 0, e), batch, comm.size, comm.rank, False)
                own, disp, ln = (lay.owner[sched.ids].tolist(), lay.disp[sched.ids].tolist(),
                                 sizes[sched.ids].tolist())
                for s in range(sched.steps):
                    pos = 0
                    for j in range(int(sched.ptr[s]), int(sched.ptr[s + 1])):
                        k = ln[j]
                        win.Get(mv[pos:pos + k], own[j], (disp[j], k, MPI.BYTE))
                        pos += k
                    win.Flush_all()
                    if e:
                        nb += pos
                        ns += int(sched.ptr[s + 1] - sched.ptr[s])
        finally:
            win.Unlock_all()
        t = time.perf_counter() - t0
    finally:
        win.Free()
    return aggregate(comm, nb, ns, t)


def measure_h5py(comm, path, batch, max_samples) -> dict:
    """Warm per-sample reads with h5py (`data[lo:hi]` per sample) of the same order."""
    import h5py

    reader = open_container(path)
    offsets = np.asarray(reader.offsets, dtype=np.int64)
    reader.close()
    n = offsets.size - 1
    sched = plan.global_schedule(shuffle.global_order(n, 0, 1), batch, comm.size, comm.rank, False)
    ids = sched.ids[: max_samples // comm.size]
    with h5py.File(path, "r", locking=False) as f:
        data = f["data"]
        for i in ids[:50]:  # warm the file handle and chunk cache path
            data[offsets[i]:offsets[i + 1]]
        comm.Barrier()
        t0 = time.perf_counter()
        nb = 0
        for i in ids.tolist():
            nb += data[offsets[i]:offsets[i + 1]].nbytes
        t = time.perf_counter() - t0
    return aggregate(comm, nb, ids.size, t)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--samples", type=int, default=4000)
    ap.add_argument("--size", type=int, default=110_000, help="mean sample bytes")
    ap.add_argument("--batch", type=int, default=64, help="global batch size")
    ap.add_argument("--epochs", type=int, default=2, help="timed epochs after one warm-up")
    ap.add_argument("--h5py-samples", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=5, help="interleaved repetitions (best and median kept)")
    ap.add_argument("--path", default=None, help="container to use (made if missing)")
    ap.add_argument("--json", default=None, help="write the results here (rank 0)")
    args = ap.parse_args(argv)
    comm = MPI.COMM_WORLD
    path = args.path or os.path.join(tempfile.gettempdir(), f"dstore_measure_{args.samples}_{args.size}.h5")
    if comm.rank == 0 and not os.path.exists(path):
        make_data(path, args.samples, args.size)
    comm.Barrier()
    reader = open_container(path)
    reader.read_range(0, reader.num_samples)  # warm the page cache for everyone
    res = {"ranks": comm.size, "samples": reader.num_samples, "total_bytes": int(reader.offsets[-1]),
           "batch": args.batch, "epochs": args.epochs}
    # The machine may be shared: interleave the methods and repeat, then keep best and median.
    runs = {"raw_rma": [], "store": [], "store_prefetch0": []}
    for _ in range(args.repeats):
        runs["raw_rma"].append(measure_raw(comm, reader, args.batch, args.epochs))
        runs["store"].append(measure_store(comm, path, args.batch, args.epochs))
        runs["store_prefetch0"].append(measure_store(comm, path, args.batch, args.epochs, prefetch=0))
    runs["store_replicate"] = [measure_store(comm, path, args.batch, args.epochs, replicate=True)]
    runs["h5py_warm_per_sample"] = [measure_h5py(comm, path, args.batch, args.h5py_samples)]
    for key, rs in runs.items():
        g = sorted(r["GBps"] for r in rs)
        best = max(rs, key=lambda r: r["GBps"])
        res[key] = dict(best, median_GBps=g[len(g) // 2], all_GBps=g)
    reader.close()
    if comm.rank == 0:
        raw, h5 = res["raw_rma"]["GBps"], res["h5py_warm_per_sample"]["GBps"]
        print(f"{comm.size} ranks, {res['samples']} samples, {res['total_bytes'] / 1e6:.0f} MB, "
              f"global batch {args.batch}")
        print(f"{'method':24s} {'best GB/s':>10s} {'median':>8s} {'samples/s':>10s} {'vs raw':>7s} "
              f"{'med/med':>7s} {'vs h5py':>8s}")
        for key in ("raw_rma", "store", "store_prefetch0", "store_replicate", "h5py_warm_per_sample"):
            r = res[key]
            print(f"{key:24s} {r['GBps']:10.2f} {r['median_GBps']:8.2f} {r['samples_per_s']:10.0f} "
                  f"{r['GBps'] / raw:7.2f} {r['median_GBps'] / res['raw_rma']['median_GBps']:7.2f} "
                  f"{r['GBps'] / h5:8.1f}")
        print(f"store population (preload, aggregate): {res['store']['population']:.2f} GB/s")
        if args.json:
            with open(args.json, "w") as f:
                json.dump(res, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
