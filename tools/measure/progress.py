"""Measures passive-target progress: latency of gets from a rank that computes without MPI calls.

Run under `mpiexec -n 2` (rank 0 owns the data and computes, rank 1 fetches 100 KB samples from it):

    MPIR_CVAR_NOLOCAL=1 UCX_TLS=tcp,self mpiexec -n 2 python -m dstore.tools.measure.progress --period-ms 2

Prints one JSON line: the owner's compute rate (matmuls/s, what a progress mechanism costs it) and
the fetcher's get latency (median, p95, max in ms). `--period-ms 0`: no progress thread (MPICH's
asynchronous progress is chosen with MPIR_CVAR_ASYNC_PROGRESS=1 in the environment instead).
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np

from dstore.runtime.progress import ProgressThread
from dstore.store.window import Arena


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").partition("\n")[0])
    parser.add_argument("--compute-ms", type=float, default=200.0, help="owner's compute step without MPI calls")
    parser.add_argument("--steps", type=int, default=8, help="compute steps")
    parser.add_argument("--period-ms", type=float, default=0.0, help="progress thread period; 0: none")
    args = parser.parse_args()
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    sample = 100_000
    arena = Arena(comm, 64 << 20)
    arena.local[:] = rank + 1
    arena.publish()
    lat, matmuls, seconds = [], 0, 0.0
    with arena.reading():
        comm.Barrier()
        if rank == 0:
            a = np.random.default_rng(0).random((400, 400))
            progress = ProgressThread(comm, args.period_ms / 1e3).start() if args.period_ms > 0 else None
            t0 = time.perf_counter()
            for _ in range(args.steps):
                t = time.perf_counter()
                while (time.perf_counter() - t) * 1e3 < args.compute_ms:
                    a = a @ a
                    a /= np.abs(a).max()
                    matmuls += 1
            seconds = time.perf_counter() - t0
            if progress is not None:
                progress.stop()
        elif rank == 1:
            out = np.empty(sample, np.uint8)
            time.sleep(0.05)
            for k in range(args.steps * 4):  # about four gets per compute step
                t = time.perf_counter()
                arena.live().Get(out, 0, ((k * sample) % ((64 << 20) - sample), sample, MPI.BYTE))
                arena.live().Flush(0)
                lat.append((time.perf_counter() - t) * 1e3)
                time.sleep(args.compute_ms / 4e3)
        comm.Barrier()
    got = comm.gather((lat, matmuls, seconds), root=0)
    if got is not None:  # the root
        lats = np.array(got[1][0])
        print(
            json.dumps(
                {
                    "period_ms": args.period_ms,
                    "async_progress": os.environ.get("MPIR_CVAR_ASYNC_PROGRESS", "0"),
                    "nolocal": os.environ.get("MPIR_CVAR_NOLOCAL", "0"),
                    "compute_ms": args.compute_ms,
                    "owner_matmuls_per_s": round(got[0][1] / got[0][2], 1),
                    "gets": int(lats.size),
                    "get_median_ms": round(float(np.median(lats)), 3),
                    "get_p95_ms": round(float(np.percentile(lats, 95)), 3),
                    "get_max_ms": round(float(lats.max()), 3),
                }
            ),
            flush=True,
        )
    arena.free()


if __name__ == "__main__":
    main()
