"""Soak: many epochs (and many store lifetimes) on N ranks, prefetch on; resident memory, threads and
open file descriptors per rank, sampled as it goes, must stay flat.

    mpiexec -n 4 python -m dstore.tools.measure.soak digits.h5 --epochs 200 --stores 20

Prints one JSON line: per rank, RSS (MiB) after the first epoch / at the middle / at the end of the
long-lived store's epochs, and after each of the store lifetimes (construct, one epoch, close); the
thread and descriptor counts at the same points; and whether every epoch delivered each sample once.
"""

from __future__ import annotations

import argparse
import json
import os
import threading

import numpy as np

from dstore.store.data_store import DataStore


def _rss_mib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def _point() -> dict:
    return {
        "rss_mib": round(_rss_mib(), 1),
        "threads": threading.active_count(),
        "fds": len(os.listdir("/proc/self/fd")),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").partition("\n")[0])
    parser.add_argument("container")
    parser.add_argument("--epochs", type=int, default=200)
    parser.add_argument("--stores", type=int, default=20, help="store lifetimes after the long run")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--prefetch", type=int, default=2)
    args = parser.parse_args()
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    long_run, lifetimes, exact = [], [], True
    with DataStore(comm, args.container, batch_size=args.batch_size, prefetch=args.prefetch, seed=1) as store:
        n = store.num_samples
        for e in range(args.epochs):
            ids = [b.ids[~b.pad] for b in store.epoch(e)]
            got = np.sort(np.concatenate(comm.allgather(np.concatenate(ids) if ids else np.zeros(0, np.int64))))
            exact = exact and bool(np.array_equal(got, np.arange(n)))
            if e in (0, args.epochs // 2, args.epochs - 1):
                long_run.append({"epoch": e, **_point()})
    for k in range(args.stores):
        with DataStore(comm, args.container, batch_size=args.batch_size, prefetch=args.prefetch, seed=k) as store:
            for _ in store.epoch(0):
                pass
        if k in (0, args.stores // 2, args.stores - 1):
            lifetimes.append({"store": k, **_point()})
    parts = comm.gather({"rank": comm.Get_rank(), "long_run": long_run, "lifetimes": lifetimes}, root=0)
    exact = comm.allreduce(exact, op=MPI.LAND)
    if comm.Get_rank() == 0:
        print(
            json.dumps(
                {
                    "ranks": comm.Get_size(),
                    "epochs": args.epochs,
                    "stores": args.stores,
                    "prefetch": args.prefetch,
                    "each_sample_once_every_epoch": exact,
                    "per_rank": parts,
                }
            ),
            flush=True,
        )


if __name__ == "__main__":
    main()
