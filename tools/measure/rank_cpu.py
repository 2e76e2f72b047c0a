"""The rank's own CPU time per delivered sample of a plain StoreLoader (the library path, no trainer).

    python -m dstore.tools.measure.rank_cpu syn480.h5 --workers 2 --batch-size 48 --epochs 1 2
    python -m dstore.tools.measure.rank_cpu syn480.h5 --transform trainer     # the trainer's, for comparison
    mpiexec -n 2 python -m dstore.tools.measure.rank_cpu syn480.h5 --epochs 1 2 3 4 5 6

Builds `StoreLoader(store, size=(S, S), channels=3, workers=N)` on COMM_WORLD (no transform by
default, or the trainer's training transform), runs epoch 0 untimed (the workers' start, the pages'
first touch), then times the epochs given: the rank process's own CPU (getrusage RUSAGE_SELF, user +
system: its threads included, its decode workers not, as they are other processes never waited for)
over the samples it delivered, per batch and per thread of the rank (its main thread, the copier that
sends the workers their requests and copies what they do not read in place, MPI's and the rest),
and the workers' CPU (/proc/PID/stat) beside it. One JSON line per epoch, then the total. The
decode workers load their compiled kernels in the background; the figure is about the rank, whose
own share does not depend on that. Under mpiexec every rank measures its own share and rank 0
prints a line per rank: a rank that finishes its epoch first waits for the others at the next
epoch's start (the store's check of the epoch, dstore.runtime.collective.gather_ints, asleep), and
how it waits is part of its CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import threading
import time

from mpi4py import MPI

from dstore.loader.store_loader import StoreLoader
from dstore.store.data_store import DataStore


def rank_cpu() -> float:
    """CPU seconds (user + system) of this process, all its threads, not its children."""
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def workers_cpu(pids) -> float:
    """CPU seconds (user + system) of the processes `pids`, from /proc/PID/stat."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for pid in pids:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        total += (int(fields[11]) + int(fields[12])) / tick
    return total


def threads_cpu() -> dict[str, float]:
    """CPU seconds of this process's threads by their Python name (MainThread, dstore-copy_0, ...), from
    /proc/self/task; threads Python did not start (MPI's, numba's) together as "other"."""
    tick, names, out = os.sysconf("SC_CLK_TCK"), {t.native_id: t.name for t in threading.enumerate()}, {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
        except OSError:  # a thread that ended meanwhile
            continue
        name = names.get(int(tid), "other")
        out[name] = out.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / tick
    return out


def transform_for(name: str, size: int):
    """None, or the trainer's training transform at `size` (uint8 out, as `dstore train` on the CPU)."""
    if name == "none":
        return None
    from dstore.training.augment import ImageTransform, default_augmentation

    pad, flip = default_augmentation((size, size))
    return ImageTransform(
        size=(size, size),
        channels=3,
        mean=(0.45,) * 3,
        std=(0.25,) * 3,
        train=True,
        pad=pad,
        flip=flip,
        normalize=False,
    )


def measure(
    path: str,
    *,
    workers: int,
    threads: int | None,
    batch_size: int,
    size: int,
    epochs: list[int],
    transform: str = "none",
) -> dict:
    """Per timed epoch and in total: samples, seconds, the rank's and the workers' CPU us per sample."""
    rows = []
    with (
        DataStore(MPI.COMM_WORLD, path, batch_size=batch_size, seed=0) as st,
        StoreLoader(
            st,
            transform=transform_for(transform, size),
            size=(size, size),
            channels=3,
            workers=workers,
            decode_threads=threads,
        ) as ld,
    ):
        for _ in ld.epoch(0):  # untimed: the workers' start, the pages' first touch
            pass
        pids = list(ld.workers.pids) if ld.workers is not None else []
        for e in epochs:
            n, b, t0, c0, w0, th0 = 0, 0, time.perf_counter(), rank_cpu(), workers_cpu(pids), threads_cpu()
            for _ in ld.epoch(e):
                n += int((~ld.last_pad).sum())
                b += 1
            secs, cpu, wcpu = time.perf_counter() - t0, rank_cpu() - c0, workers_cpu(pids) - w0
            per_thread = {k: round(1e3 * (v - th0.get(k, 0.0)) / max(b, 1), 3) for k, v in threads_cpu().items()}
            rows.append(
                {
                    "epoch": e,
                    "samples": n,
                    "batches": b,
                    "seconds": secs,
                    "rank_cpu_us_per_sample": 1e6 * cpu / n,
                    "rank_cpu_ms_per_batch": 1e3 * cpu / max(b, 1),
                    "threads_cpu_ms_per_batch": per_thread,
                    "workers_cpu_us_per_sample": 1e6 * wcpu / n,
                }
            )
    n = sum(r["samples"] for r in rows)
    total = {
        "samples": n,
        "seconds": sum(r["seconds"] for r in rows),
        "rank_cpu_us_per_sample": sum(r["rank_cpu_us_per_sample"] * r["samples"] for r in rows) / n,
        "workers_cpu_us_per_sample": sum(r["workers_cpu_us_per_sample"] * r["samples"] for r in rows) / n,
    }
    return {"rows": rows, "total": total}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m dstore.tools.measure.rank_cpu",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("container", help="a container of JPEGs (e.g. `dstore ingest synthetic x.h5 --count 480`)")
    p.add_argument("--workers", type=int, default=2, help="decode worker processes (0: decode threads)")
    p.add_argument("--threads", type=int, default=None, help="decode threads (with --workers 0)")
    p.add_argument("--batch-size", type=int, default=48)
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--epochs", type=int, nargs="+", default=[1, 2], help="the epochs timed (after epoch 0)")
    p.add_argument("--transform", choices=("none", "trainer"), default="none")
    args = p.parse_args(argv)
    res = measure(
        args.container,
        workers=args.workers,
        threads=args.threads,
        batch_size=args.batch_size,
        size=args.size,
        epochs=args.epochs,
        transform=args.transform,
    )
    every = MPI.COMM_WORLD.gather(res, root=0)
    if every is None:  # not rank 0
        return 0
    for rank, one in enumerate(every):
        for r in one["rows"]:
            print(json.dumps({"rank": rank, **r}))
    for rank, one in enumerate(every):
        t = one["total"]
        print(
            f"rank {rank}: rank CPU {t['rank_cpu_us_per_sample']:.0f} us/sample, workers' CPU "
            f"{t['workers_cpu_us_per_sample']:.0f} us/sample over {t['samples']} samples ({args.transform} transform, "
            f"{args.workers} workers, batch {args.batch_size}, load {os.getloadavg()[0]:.1f})"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
