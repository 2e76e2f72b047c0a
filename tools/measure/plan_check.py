"""`dstore plan` against the real store (issue 20): for each storage rung, rank count and memory
budget, the forecast (dstore.memory.capacity, the inputs the store gets) beside a measured run: the
resident fraction, the memory per rank and the population time, with the error of each.

    python -m dstore.tools.measure.plan_check /tmp/plan/set-2048.h5 --make 2048 --ranks 1 2 \\
        --rungs local pfs:local pfs:latency=2ms,iops=300 pfs:latency=2ms,iops=2000 --repeat 3 \\
        --cached-source --json /tmp/plan/check.json --md /tmp/plan/check.md

    dstore ingest synthetic /tmp/plan/jpeg-512.h5 --count 512 --mean-bytes 110k
    python -m dstore.tools.measure.plan_check /tmp/plan/jpeg-512.h5 --loader 0 1 2 4 --batch 64 --repeat 3

The second form measures the trainer's loader instead (its augmentation, 224 px, decoding in
threads or W worker processes) beside `capacity.loader_reserve`, the part of a rank's budget that
`dstore train` and `dstore plan` give the loaders: the rank's Pss above its store plus its workers'
at batch boundaries, and the peak RSS (the rank's rise, VmHWM reset at the start, plus each
worker's whole VmHWM, its interpreter included).

`--make N` first writes N samples of `--bytes` (110 KB) where the container is missing. Each run is
its own `mpiexec -n R` job (this module with --worker), the container evicted from the page cache
first (on local disk: a cold read; through `dstore pfs`: its source cold too). A run opens a
DataStore (global order, `--batch` samples per rank per step, population_threads 4) with
`memory_budget` either unlimited ("resident") or `--tiered F` of the rank's share of the bytes (the
store then keeps what fits beside its buffers), populates it and iterates epoch 0. Measured per
rank: the store's resident fraction; its window; the memory it added, as the proportional set size
(Pss: pages shared by the node's ranks counted once over them) above what the rank held before the
open, at the peak of four points (after the population, at the first, middle and last batch); the
slowest rank's population seconds and bytes read. The disk's bandwidth is the model's one fitted
figure: the median of the local one-rank resident runs (so that cell is 0% by construction);
`--cached-source` instead runs the `dstore pfs` rungs over a source in the page cache, and their
floor is the mount's own rate (FUSE and its Python server on this machine's cores): the median of
the one-rank resident runs of the rung `pfs:local` (a mount without delays or caps), which the
rungs should then include. The
ranks' interpreter (`capacity.RANK_BASE_BYTES`) and decode workers are not part of this program's
runs (no decoding): the memory compared is the metadata and what the store's budget holds.
Figures taken on a shared machine: record `uptime` with them.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

from dstore.memory import pagecache
from dstore.tools.measure.population import run_job
from dstore.tools.measure.scale import status
from dstore.tools.pfs.model import parse_spec
from dstore.tools.pfs.mount import pfs_mount

UNLIMITED = 1 << 40
"""The budget of a fully resident run: more than any share here."""


def pss(pid: str = "self") -> int:
    """A process's proportional set size (bytes; this process's after a malloc_trim, as scale.status)."""
    if pid == "self":
        status()  # trims
    with open(f"/proc/{pid}/smaps_rollup") as f:
        return next(int(x.split()[1]) * 1024 for x in f if x.startswith("Pss:"))


def loader_worker(path: str, batch: int, workers: int, batches: int = 24) -> None:
    """One rank on COMM_SELF: a resident store and the trainer's training loader (its augmentation,
    224 px, uint8 out) decoding in `workers` processes (0: 2 threads); prints the loader's memory
    (the rank's Pss above the store's, plus its workers' Pss) at its peak over `batches` batches,
    beside `capacity.loader_reserve` for the same inputs."""
    import numpy as np
    import torch  # noqa: F401 - imported before the baseline: the interpreter's, not the loader's
    from mpi4py import MPI

    from dstore.loader.store_loader import StoreLoader
    from dstore.memory import capacity
    from dstore.store.data_store import DataStore
    from dstore.training.augment import ImageTransform, default_augmentation

    pad, flip = default_augmentation((224, 224))
    tf = ImageTransform(
        size=(224, 224), channels=3, mean=(0.45,) * 3, std=(0.25,) * 3, train=True, pad=pad, flip=flip, normalize=False
    )
    with DataStore(MPI.COMM_SELF, path, batch_size=batch, seed=1) as store:
        base = pss()
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM: the peak from here on is the loader's
        rss0 = status()["VmRSS"]
        images = []
        with StoreLoader(
            store, transform=tf, workers=workers or None, decode_threads=2, channels=3, size=(224, 224)
        ) as loader:
            peak, pids = 0, []
            for k, (x, _) in enumerate(loader):
                images.append(tuple(x.shape))
                pids = [] if loader.workers is None else loader.workers.pids
                peak = max(peak, pss() - base + sum(pss(str(p)) for p in pids))
                if k + 1 >= batches:
                    break
            high = status()["VmHWM"] - rss0 + sum(_hwm(p) for p in pids)
        shape = _decoded_shape(store)
        mean = int(store.offsets[-1]) / store.num_samples
    reserve = capacity.loader_reserve(
        local_batch=batch,
        input_shape=(224, 224, 3),
        image_shape=shape,
        mean_sample_bytes=mean,
        decode_threads=2,
        workers=workers,
    )
    print(
        json.dumps(
            {
                "workers": workers,
                "memory_bytes": peak,
                "peak_rss_bytes": high,
                "reserve_bytes": reserve,
                "image_shape": shape,
                "batch_shape": images[0],
                "batches": len(images),
                "mean_bytes": float(np.float64(mean)),
            }
        )
    )


def _hwm(pid) -> int:
    """A process's peak RSS (VmHWM, bytes): its interpreter and libraries included."""
    with open(f"/proc/{pid}/status") as f:
        return next(int(x.split()[1]) * 1024 for x in f if x.startswith("VmHWM"))


def _decoded_shape(store) -> tuple:
    """(H, W, 3) of the store's first sample, decoded."""
    import simplejpeg

    it = store.epoch(0)
    blob = bytes(next(it).samples[0])
    it.close()
    return tuple(simplejpeg.decode_jpeg(blob).shape)


def worker(path: str, batch: int, tiered: float) -> None:
    # Here, not at the top: importing them initialises MPI, and the driver that starts mpiexec must not.
    import h5py  # noqa: F401 - imported before the baseline: the interpreter's, not the store's
    from mpi4py import MPI

    from dstore.store.data_store import DataStore

    comm = MPI.COMM_WORLD
    kw = dict(batch_size=batch * comm.size, seed=1, population_threads=4)
    budget = UNLIMITED
    if tiered:
        probe = DataStore(comm, path, **kw)  # not populated: its sizes only
        budget = int(tiered * int(probe.offsets[-1]) / comm.size)
        probe.close()
    comm.Barrier()
    base = pss()
    store = DataStore(comm, path, memory_budget=budget, **kw)
    store.populate()
    peak = pss() - base
    with store:
        steps = store.steps_per_epoch
        for k, _ in enumerate(store.epoch(0)):
            if k in (0, steps // 2, steps - 1):
                peak = max(peak, pss() - base)
        assert store.windows is not None  # populated on entry
        row = {
            "rank": comm.rank,
            "memory_bytes": peak,
            "window_bytes": int(store.layout.nbytes[comm.rank]),
            **{k: store.windows.population[k] for k in ("population_seconds", "population_bytes")},
            "resident_fraction": store.tier["resident_fraction"],
            "budget_bytes": budget,
        }
    rows = comm.gather(row, root=0)
    if comm.rank == 0:
        print(json.dumps(rows), flush=True)


def run_once(path: str, ranks: int, batch: int, tiered: float) -> dict:
    """One mpiexec job: the ranks' rows folded into the run's figures."""
    rows = run_job(
        ranks, "dstore.tools.measure.plan_check", "--worker", path, "--batch", str(batch), "--tiered", str(tiered)
    )
    return {
        "ranks": ranks,
        "tiered": tiered,
        "budget_bytes": rows[0]["budget_bytes"],
        "resident_fraction": rows[0]["resident_fraction"],
        "population_seconds": max(r["population_seconds"] for r in rows),
        "population_bytes": sum(r["population_bytes"] for r in rows),
        "memory_bytes": sum(r["memory_bytes"] for r in rows) / ranks,  # mean per rank: Pss sums to the node's
        "memory_max_bytes": max(r["memory_bytes"] for r in rows),
        "window_bytes": sum(r["window_bytes"] for r in rows) / ranks,
    }


def predict(path: str, ranks: int, batch: int, budget: int, spec: str, disk: float) -> dict:
    """`dstore plan`'s forecast for the run's inputs (one node of `ranks` ranks, the store's defaults)."""
    import numpy as np

    from dstore.formats import open_container
    from dstore.memory import capacity
    from dstore.order import plan

    with open_container(path) as c:
        n, total, offsets = c.num_samples, c.total_bytes, np.asarray(c.offsets)
        reader_index = 0 if getattr(c, "index_on_demand", False) else capacity.READER_INDEX_BYTES
    model = parse_spec(spec)
    storage = capacity.Storage(latency=model.latency, iops=model.iops, bandwidth=model.bandwidth)
    cl = capacity.Cluster(
        nodes=1,
        ranks_per_node=ranks,
        memory_per_node=float(UNLIMITED),
        batch_size=batch * ranks,
        threads=4,
        memory_budget=budget,
        local_bandwidth=disk,
        reader_index_bytes=reader_index,
        trainer=False,
    )  # a DataStore alone: no loaders share its budget
    largest = plan.largest_sum(offsets, min(batch + 1, n))
    return capacity.forecast(n, total / n, cl, storage, largest_step_bytes=largest, replicate=False)


def _err(pred: float, meas: float) -> float:
    return 100.0 * (pred - meas) / meas if meas else float("nan")


def _fitted(runs: list, spec: str) -> float:
    """The median rate of `spec`'s one-rank resident runs (inf if none): the floor the forecast uses."""
    rates = [
        r["population_bytes"] / r["population_seconds"]
        for r in runs
        if (r["spec"], r["ranks"], r["tiered"]) == (spec, 1, 0.0)
    ]
    return statistics.median(rates) if rates else float("inf")


def compare(path: str, runs: list, batch: int, cached: bool = False) -> list:
    """One row per (rung, ranks, tiered): medians of the runs beside the forecast (`cached`: the
    `dstore pfs` rungs' source was in the page cache, so no disk floor)."""
    disk = _fitted(runs, "local")
    fuse = _fitted(runs, "pfs:local") if cached else disk  # the mount's own ceiling over a cached source
    out = []
    keys = sorted({(r["spec"], r["ranks"], r["tiered"]) for r in runs}, key=lambda k: (k[0] != "local", k))
    for spec, ranks, tiered in keys:
        rs = [r for r in runs if (r["spec"], r["ranks"], r["tiered"]) == (spec, ranks, tiered)]
        med = {
            k: statistics.median(r[k] for r in rs)
            for k in ("resident_fraction", "population_seconds", "population_bytes", "memory_bytes", "window_bytes")
        }
        f = predict(path, ranks, batch, rs[0]["budget_bytes"], spec, disk if spec == "local" else fuse)
        pr = f["per_rank"]
        mem = pr["metadata_bytes"] + pr["store_bytes"]
        out.append(
            {
                "spec": spec,
                "ranks": ranks,
                "tiered": tiered,
                "runs": len(rs),
                "disk_Bps": disk,
                "measured": med,
                "population_runs": [r["population_seconds"] for r in rs],
                "predicted": {
                    "resident_fraction": f["resident_fraction"],
                    "memory_bytes": mem,
                    "window_bytes": pr["data_share_bytes"] * f["resident_fraction"],
                    "population_seconds": f["population_seconds"],
                    "population_bytes": f["population_bytes"],
                },
                "error_pct": {
                    "resident_fraction": _err(f["resident_fraction"], med["resident_fraction"]),
                    "memory": _err(mem, med["memory_bytes"]),
                    "population": _err(f["population_seconds"], med["population_seconds"]),
                },
            }
        )
    return out


def markdown(rows: list) -> str:
    """The comparison as a markdown table."""
    lines = [
        "| storage | ranks | budget | resident: predicted / measured | memory per rank: predicted / measured "
        "(window) | population: predicted / measured (runs) | errors: resident, memory, population |",
        "|---|---:|---|---:|---:|---:|---:|",
    ]
    for r in rows:
        p, m, e = r["predicted"], r["measured"], r["error_pct"]
        kind = f"{r['tiered']:.0%} of share" if r["tiered"] else "unlimited"
        runs = ", ".join(f"{x:.2f}" for x in r["population_runs"])
        fit = " (fitted)" if (r["spec"] in ("local", "pfs:local") and r["ranks"] == 1 and not r["tiered"]) else ""
        lines.append(
            f"| {r['spec']} | {r['ranks']} | {kind} | {100 * p['resident_fraction']:.1f}% / "
            f"{100 * m['resident_fraction']:.1f}% | {p['memory_bytes'] / 1e6:.1f} / {m['memory_bytes'] / 1e6:.1f} "
            f"MB ({m['window_bytes'] / 1e6:.1f}) | {p['population_seconds']:.2f} / "
            f"{m['population_seconds']:.2f} s ({runs}) | {e['resident_fraction']:+.0f}%, {e['memory']:+.0f}%, "
            f"{e['population']:+.0f}%{fit} |"
        )
    return "\n".join(lines)


def loaders(args) -> int:
    """`--loader W ...`: one run per worker count, each its own process; a table of reserve vs measured."""
    rows = []
    for _ in range(args.repeat):
        for w in args.loader:
            rows.append(
                run_job(
                    1,
                    "dstore.tools.measure.plan_check",
                    "--loader-worker",
                    str(w),
                    "--batch",
                    str(args.batch),
                    args.container,
                )
            )
            print(rows[-1], flush=True)
    lines = [
        f"load average {_load()}; {args.batch} samples per batch, image {rows[0]['image_shape']}",
        "",
        "| decode | loader_reserve | Pss at batches (rank above its store, plus workers) | peak RSS (rank's "
        "rise, plus workers' whole) | error against Pss / peak RSS |",
        "|---|---:|---:|---:|---:|",
    ]
    for w in args.loader:
        mine = [r for r in rows if r["workers"] == w]
        res = mine[0]["reserve_bytes"]
        m = statistics.median(r["memory_bytes"] for r in mine)
        h = statistics.median(r["peak_rss_bytes"] for r in mine)
        kind = f"{w} worker{'s' * (w > 1)}" if w else "2 threads"
        lines.append(
            f"| {kind} | {res / 1e6:.0f} MB | {m / 1e6:.0f} MB | {h / 1e6:.0f} MB | {_err(res, m):+.0f}% / "
            f"{_err(res, h):+.0f}% |"
        )
    print("\n".join(lines))
    if args.md:
        with open(args.md, "w") as fh:
            fh.write("\n".join(lines) + "\n")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rows, fh, indent=1)
    return 0


def _warm(path: str) -> None:
    """Reads `path` once, so its pages are in the page cache."""
    with open(path, "rb") as f:
        while f.read(8 << 20):
            pass


def _load() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("container")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--loader-worker", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument(
        "--loader",
        type=int,
        nargs="+",
        help="instead: the trainer's loader memory with these numbers of "
        "decode workers (0: threads) over a JPEG container, beside capacity.loader_reserve",
    )
    p.add_argument("--make", type=int, default=0, help="write this many samples first where the container is missing")
    p.add_argument("--bytes", type=int, default=110_000, help="bytes per sample of --make")
    p.add_argument("--ranks", type=int, nargs="+", default=[1, 2])
    p.add_argument("--batch", type=int, default=32, help="samples per rank per step")
    p.add_argument("--tiered", type=float, default=0.7, help="the tiered runs' budget, a fraction of a rank's share")
    p.add_argument("--rungs", nargs="+", default=["local", "pfs:latency=2ms,iops=300", "pfs:latency=2ms,iops=2000"])
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument(
        "--cached-source",
        action="store_true",
        help="`dstore pfs` rungs over a source in the page cache (not evicted), their floor the rate of "
        "the rung pfs:local (the mount alone) instead of the disk's",
    )
    p.add_argument("--json", help="write every run and the comparison here")
    p.add_argument("--md", help="write the markdown table here")
    args = p.parse_args(argv)
    if args.worker:
        worker(args.container, args.batch, args.tiered)
        return 0
    if args.loader_worker is not None:
        loader_worker(args.container, args.batch, args.loader_worker)
        return 0
    if args.loader:
        return loaders(args)
    src = os.path.realpath(args.container)
    if args.make and not os.path.exists(src):
        from dstore.tools.measure.scale import make

        os.makedirs(os.path.dirname(src), exist_ok=True)
        make(src, args.make, args.bytes)
    runs, loads = [], [_load()]
    for rep in range(args.repeat):
        for spec in args.rungs:
            for ranks in args.ranks:
                for tiered in (0.0, args.tiered):
                    if spec == "local" or not args.cached_source:
                        pagecache.evict(src)
                    else:
                        _warm(src)
                    t0 = time.perf_counter()
                    if spec == "local":
                        row = run_once(src, ranks, args.batch, tiered)
                    else:
                        with pfs_mount(os.path.dirname(src), model=parse_spec(spec)) as mnt:
                            row = run_once(mnt.path(os.path.basename(src)), ranks, args.batch, tiered)
                    row.update(spec=spec, repeat=rep, wall=time.perf_counter() - t0, load=_load())
                    runs.append(row)
                    print(
                        f"{spec:>26} ranks {ranks} tiered {tiered:.2f}: resident {row['resident_fraction']:.3f}, "
                        f"memory {row['memory_bytes'] / 1e6:.1f} MB, population {row['population_seconds']:.2f} s "
                        f"({row['population_bytes'] / 1e6:.0f} MB); load {row['load']}",
                        flush=True,
                    )
    loads.append(_load())
    rows = compare(src, runs, args.batch, args.cached_source)
    table = markdown(rows)
    print(f"\nload average at start / end: {loads[0]} / {loads[1]}\n\n{table}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"loads": loads, "runs": runs, "comparison": rows}, fh, indent=1)
    if args.md:
        with open(args.md, "w") as fh:
            fh.write(f"load average at start / end: {loads[0]} / {loads[1]}\n\n{table}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
