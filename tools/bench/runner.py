"""A whole bench run, in order: data, limits, baselines, the store, the training view, the growth sweep,
outputs. Every rank runs it; rank 0 prints the progress and writes the files."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import platform
import sys
import time

from dstore.store import DataStore
from dstore.tools.bench import baselines, layouts, limits, mosaic, report, storage, store_bench, training_view
from dstore.tools.bench.common import STORE_GETS, Measurement, Progress, busy_cores, median_pass
from dstore.tools.bench.data import (
    DataSet,
    container_files,
    container_path,
    data_tag,
    load_dataset,
    prepare_data,
    repeated_container,
)
from dstore.tools.bench.training_view import TV_H5PY, TV_ZARR  # noqa: F401 - the bench's row names, read from here
from dstore.tools.pfs.model import PfsModel


@dataclasses.dataclass
class BenchConfig:
    """What one run measures (the CLI's options; see tools/cmd_bench.py for their meaning)."""

    out: str
    count: int = 4096
    mean_bytes: int = 110_000
    sides: tuple[int, int] = (333, 500)
    data_dir: str | None = None
    container: str | None = None
    batch_size: int = 64
    seed: int = 0
    caches: tuple[str, ...] = ("cold", "warm")
    num_workers: int = 2
    decode_threads: int = 2
    decode_size: int = 224
    growth: tuple[int, ...] = (2048, 8192, 32768)
    compute_factor: float = 1.25
    train_samples: int | None = None
    cold_repeat: int = 3
    zarr_limit: int | None = None
    mosaic: bool = True
    mosaic_venv: str | None = None
    plots: bool = True
    command: str = ""
    storage: PfsModel | None = None
    """Every reader reads through a `dstore pfs` mount of the data with this model (--storage)."""
    storage_sweep: tuple[str, ...] | None = None
    """Storage specs of --storage-sweep (the training view on each)."""


CONTAINER_LAYOUT_LIMIT = 1024
"""Samples per rank of the per-sample passes over the container as written: each slice reads a whole
8 MiB chunk, so they are slow, and the rate is what they show."""


def machine() -> str:
    """One line describing this machine: CPU model, cores, memory, OS, MPI library."""
    cpu = "?"
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
        with open("/proc/meminfo") as fh:
            mem = int(fh.readline().split()[1]) / 2**20
    except OSError:
        mem = 0.0
    from mpi4py import MPI

    mpi = " ".join(MPI.Get_library_version().splitlines()[0].split())
    return f"{cpu}, {os.cpu_count()} cores, {mem:.0f} GiB RAM, {platform.system()} {platform.release()}, {mpi}"


def run(comm, cfg: BenchConfig) -> dict:
    """Runs the whole bench on every rank of `comm`; rank 0 writes the outputs and returns the results.
    With `cfg.storage`, every reader reads through a pfs mount that is always unmounted at the end."""
    with contextlib.ExitStack() as stack:
        return _run(comm, cfg, stack)


def prepare(comm, cfg: BenchConfig, prog: Progress, notes: list[str]) -> DataSet:
    """The data every reader reads (generated or given), with the per-sample copies of the baselines."""
    folder = None
    data_dir = cfg.data_dir or os.path.join(cfg.out, "data")
    if cfg.container:
        hdf5, zarr_path = cfg.container, None
        notes.append(f"container given: {cfg.container}; the h5py (Zarr) per-sample baseline over the container "
                     "as written runs only on an HDF5 (Zarr) container, the folder and Mosaic baselines only if "
                     "its source files are on disk")
    else:
        folder = prepare_data(comm, cfg.count, data_dir, seed=cfg.seed, mean_bytes=cfg.mean_bytes, sides=cfg.sides,
                              progress=prog)
        tag = data_tag(cfg.count, cfg.seed, cfg.mean_bytes, cfg.sides)
        hdf5 = container_path(data_dir, tag, "hdf5")
        zarr_path = container_path(data_dir, tag, "zarr")
    data = load_dataset(hdf5, zarr_path, folder)
    prog.note(f"per-sample copies for the h5py and zarr baselines in {data_dir} (written once, then reused)")
    data.h5py_contiguous = layouts.contiguous_hdf5(comm, data.container, data.offsets, data.labels, data_dir)
    data.zarr_per_sample = layouts.per_sample_zarr(comm, data.container, data.offsets, data.labels, data_dir)
    return data


def _run(comm, cfg: BenchConfig, stack: contextlib.ExitStack) -> dict:
    rank, size = comm.Get_rank(), comm.Get_size()
    caches = [c for c in ("cold", "warm") if c in cfg.caches]
    steps = 14 + 5 * len(caches) + (1 if cfg.growth else 0)
    prog = Progress(comm, steps)
    notes: list[str] = []
    ms: list[Measurement] = []
    t_start = time.perf_counter()
    load_start = os.getloadavg()[0]
    # Every rank sleeps through the sample (MPICH ranks waiting in a barrier spin, and would count).
    comm.Barrier()
    busy = busy_cores() if rank == 0 else time.sleep(0.5)
    comm.Barrier()
    if busy is not None and busy > 0.5:
        prog.note(f"warning: {busy:.1f} of {os.cpu_count()} cores busy before the run: other work is running "
                  "and every figure below is lower than this machine can do")

    # --- data ------------------------------------------------------------------------------------
    prog.start("data")
    data_dir = cfg.data_dir or os.path.join(cfg.out, "data")
    data = prepare(comm, cfg, prog, notes)
    mnt = None
    if cfg.storage is not None:
        mnt = stack.enter_context(storage.mounted(comm, storage.mount_roots(data_dir, cfg.container), cfg.storage))
        data = mnt.translate_dataset(data)
        prog.note(f"--storage: every reader reads through a dstore pfs mount of {', '.join(mnt.roots)} "
                  f"({cfg.storage.describe()}) at {', '.join(mnt.mountpoints)}")
        notes.append(f"storage: every reader (sequential read, store population, DataLoader over files, h5py, "
                     f"zarr, the training view) read through a `dstore pfs` mount with {cfg.storage.describe()}; "
                     "files there have no page cache, so cold and warm passes both pay the model (the growth "
                     "sweep's repeated container is on local disk)")
    notes.append(f"{report.H5PY}: {data.h5py_contiguous}, a copy whose `data` is contiguous, read with h5py's "
                 f"defaults (the fair per-sample baseline; the goal ratio uses it). {report.H5PY_CONTAINER}: the "
                 "container as written, whose `data` is chunked (8 MiB when ingested by dstore): with h5py's "
                 "default 1 MiB chunk cache each slice reads a whole chunk; at most "
                 f"{CONTAINER_LAYOUT_LIMIT} samples per rank.")
    notes.append(f"{report.ZARR}: {data.zarr_per_sample}, a copy chunked in "
                 f"{layouts.ZARR_CHUNK_BYTES // 1024} KiB; {report.ZARR_CONTAINER}: the Zarr container as written "
                 f"(whole chunks read per slice), at most {CONTAINER_LAYOUT_LIMIT} samples per rank. zarr's own "
                 "cost per read call (about 0.8 ms here) bounds both.")
    prog.note(f"{data.num_samples:,} samples, {data.total_bytes / 1e6:,.0f} MB, "
              f"mean {data.total_bytes / data.num_samples / 1e3:.0f} KB")
    B = cfg.batch_size

    def add(m):
        ms.append(m)
        prog.result(m)

    # --- limits ----------------------------------------------------------------------------------
    prog.start("limit: memcpy")
    add(limits.memcpy_pass(comm, data.offsets, B, cfg.seed))
    prog.start("limit: raw RMA")
    add(limits.raw_rma_pass(comm, data.offsets, B, cfg.seed))
    prog.start("limit: raw RMA, one Get per sample")
    add(limits.raw_rma_pass(comm, data.offsets, B, cfg.seed, per_sample=True))
    evict_paths = container_files(data.container)
    for cache in caches:
        prog.start(f"limit: sequential read, {cache}; store population (preload), {cache}")
        # The limit and the population it is compared with are taken side by side, alternating,
        # `cold_repeat` times, and the median pass of each kept: cold reads move by 2x from one
        # minute to the next on shared storage, so figures taken minutes apart do not compare.
        reads, pops = [], []
        for _ in range(cfg.cold_repeat if cache == "cold" else 1):
            if data.hdf5:
                reads.append(limits.sequential_read(comm, data.hdf5, cache))
            pops.append(store_bench.population(comm, data.container, evict_paths, mode="preload", cache=cache,
                                               batch_size=B, seed=cfg.seed))
        if reads:
            add(median_pass(reads))
        if data.hdf5 and cache == "cold":
            add(limits.sequential_read(comm, data.hdf5, cache, fresh=True))
        add(median_pass(pops))

    # --- baselines -------------------------------------------------------------------------------
    for cache in caches:
        prog.start(f"baseline: DataLoader over files, {cache}")
        if data.files is not None:
            ds = baselines.FileBytesDataset(data.files, data.labels)
            add(baselines.dataloader_pass(comm, ds, name=report.FOLDER, cache=cache, evict_paths=data.files,
                                          batch_size=B, num_workers=cfg.num_workers, seed=cfg.seed))
    slow = CONTAINER_LAYOUT_LIMIT
    for cache in caches:
        prog.start(f"baseline: h5py per-sample, {cache}")
        add(baselines.per_sample_pass(comm, data.h5py_contiguous, "h5py", data.offsets, data.labels,
                                      name=report.H5PY, cache=cache, seed=cfg.seed))
        if data.hdf5:
            add(baselines.per_sample_pass(comm, data.hdf5, "h5py", data.offsets, data.labels,
                                          name=report.H5PY_CONTAINER, cache=cache, seed=cfg.seed, limit=slow))
    for cache in caches:
        prog.start(f"baseline: zarr per-sample, {cache}")
        add(baselines.per_sample_pass(comm, data.zarr_per_sample, "zarr", data.offsets, data.labels,
                                      name=report.ZARR, cache=cache, seed=cfg.seed, limit=cfg.zarr_limit))
        if data.zarr:
            limit = slow if cfg.zarr_limit is None else min(slow, cfg.zarr_limit)
            add(baselines.per_sample_pass(comm, data.zarr, "zarr", data.offsets, data.labels,
                                          name=report.ZARR_CONTAINER, cache=cache, seed=cfg.seed, limit=limit))
    prog.start("baseline: Mosaic Streaming")
    if cfg.storage is not None and cfg.mosaic:
        notes.append("Mosaic Streaming: skipped under --storage (its MDS shards are written and read by its own "
                     "process in its own venv, not routed through the mount)")
    elif cfg.mosaic and data.files is not None:
        # MDS shards are kept beside the data and reused; keyed by the container they mirror.
        tag = os.path.splitext(os.path.basename(os.path.normpath(data.container)))[0]
        work = os.path.join(cfg.data_dir or os.path.join(cfg.out, "data"), f"mosaic-{tag}")
        got, note = mosaic.run_peer(comm, list(zip(data.files, data.labels.tolist())), work, seed=cfg.seed,
                                    batch_size=B, venv=cfg.mosaic_venv)
        for m in got:
            if m.cache in caches:
                add(m)
        notes.append("Mosaic Streaming: " + note)
        prog.note(note)
    elif not cfg.mosaic:
        notes.append("Mosaic Streaming: skipped (--no-mosaic)")

    # --- the store -------------------------------------------------------------------------------
    for cache in caches:
        prog.start(f"store: population dynamic, {cache}")
        add(store_bench.population(comm, data.container, evict_paths, mode="dynamic", cache=cache, batch_size=B,
                                   seed=cfg.seed))
    for shuffle in ("global", "local", "partial"):
        for prefetch in (store_bench.PREFETCH_ON, 0):
            prog.start(f"store: delivery, {shuffle} shuffle, prefetch {prefetch}")
            add(store_bench.delivery(comm, data.container, shuffle=shuffle, prefetch=prefetch, batch_size=B,
                                     seed=cfg.seed))
    prog.start("store: delivery, global shuffle, gets only (node views off)")
    add(store_bench.delivery(comm, data.container, shuffle="global", prefetch=store_bench.PREFETCH_ON, batch_size=B,
                             seed=cfg.seed, node_views=False, name=STORE_GETS))
    prog.start("store: decode through StoreLoader")
    n_tv = min(cfg.train_samples or data.num_samples, data.num_samples)
    dec, step_s = store_bench.decode_pass(comm, data.container, batch_size=B, seed=cfg.seed,
                                          num_threads=cfg.decode_threads, size=cfg.decode_size,
                                          sample_range=(0, n_tv))
    add(dec)

    # --- training view ---------------------------------------------------------------------------
    prog.start("training view (DLIO: sleep per step)")
    tv = run_training_view(comm, cfg, data, step_s, n_tv, prog)

    # --- growth ----------------------------------------------------------------------------------
    growth = []
    if cfg.growth:
        prog.start(f"growth: {', '.join(f'{n:,}' for n in cfg.growth)} samples")
        growth = run_growth(comm, cfg, data, prog)

    storage_meta = None
    if mnt is not None:
        stack.close()  # unmount now, so that what the mounts served is known and recorded
        storage_meta = {"spec": cfg.storage.describe(), "model": cfg.storage.to_dict(), "roots": mnt.roots,
                        "mount_stats": mnt.stats}
    results = {
        "meta": {
            "ranks": size, "num_samples": data.num_samples, "total_bytes": data.total_bytes,
            "mean_sample_bytes": data.total_bytes / max(1, data.num_samples), "batch_size": B,
            "seed": cfg.seed, "caches": caches, "num_workers": cfg.num_workers,
            "decode_threads": cfg.decode_threads, "machine": machine(), "python": sys.version.split()[0],
            "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "command": cfg.command,
            "container": data.container, "zarr": data.zarr, "files": data.files is not None,
            "cores": os.cpu_count(), "bench_seconds": None, "load_average": [round(load_start, 2), round(os.getloadavg()[0], 2)],
            "busy_cores_at_start": None if busy is None else round(busy, 2),
            "storage": storage_meta,
        },
        "measurements": report.measurement_dicts(ms),
        "training_view": tv,
        "growth": growth,
        "notes": notes,
    }
    results["meta"]["bench_seconds"] = round(time.perf_counter() - t_start, 1)
    if rank == 0:
        paths = report.write_outputs(results, cfg.out, plots=cfg.plots)
        prog.note("wrote " + ", ".join(os.path.relpath(p, cfg.out) for p in paths) + f" in {cfg.out}")
        for r in results["ratios"]:
            val = "n/a" if r["value"] is None else f"{r['value']:.2f}"
            if r["goal"] is None:
                prog.note(f"{r['description']}: {val}")
                continue
            met = "n/a" if r["met"] is None else ("met" if r["met"] else "NOT met")
            prog.note(f"{r['description']}: {val} (goal >= {r['goal']:g}) {met}")
    comm.Barrier()
    return results


def run_training_view(comm, cfg: BenchConfig, data: DataSet, store_step_s: float, n: int, prog: Progress) -> dict:
    """AU of the store and of each baseline that can run, over the first `n` samples, with
    compute = factor x the store's fetch+decode time per step."""
    compute = max(store_step_s * cfg.compute_factor, 1e-3)
    rows = []
    with DataStore(comm, data.container, batch_size=cfg.batch_size, seed=cfg.seed, population="preload",
                   sample_range=(0, n)) as store:
        rows.append(training_view.run_store(comm, store, compute_seconds=compute, epoch=2,
                                            num_threads=cfg.decode_threads, size=cfg.decode_size))
    rows += training_view.run_baselines(comm, data, n, compute_seconds=compute, batch_size=cfg.batch_size,
                                        num_workers=cfg.num_workers, seed=cfg.seed, decode_size=cfg.decode_size)
    for r in rows:
        prog.note(f"{r['name']}: AU {r['au']:.3f} ({r['steps']} steps, wall {r['wall']:.2f}s, wait {r['wait']:.2f}s)")
    return {"compute_seconds": compute, "store_step_seconds": store_step_s, "factor": cfg.compute_factor,
            "num_samples": n, "num_workers": cfg.num_workers, "decode_threads": cfg.decode_threads, "loaders": rows}


def run_growth(comm, cfg: BenchConfig, data: DataSet, prog: Progress) -> list[dict]:
    """Store delivery and raw RMA cost per sample over the first n samples, for each n in cfg.growth."""
    sizes = sorted(set(cfg.growth))
    big = data
    if sizes[-1] > data.num_samples:
        if cfg.container:
            sizes = [n for n in sizes if n <= data.num_samples]
            prog.note(f"growth limited to the container's {data.num_samples:,} samples")
        else:
            data_dir = cfg.data_dir or os.path.join(cfg.out, "data")
            tag = data_tag(cfg.count, cfg.seed, cfg.mean_bytes, cfg.sides)
            path = os.path.join(data_dir, f"repeated-{sizes[-1]}-of-{tag}.h5")
            prog.note(f"growth container: {sizes[-1]:,} samples repeating the {data.num_samples:,} generated ones")
            big = repeated_container(comm, data, sizes[-1], path)
    out = []
    for n in sizes:
        st = store_bench.delivery(comm, big.container, shuffle="global", prefetch=store_bench.PREFETCH_ON,
                                  batch_size=cfg.batch_size, seed=cfg.seed, sample_range=(0, n),
                                  name=report.STORE_MAIN)
        rm = limits.raw_rma_pass(comm, big.offsets[:n + 1], cfg.batch_size, cfg.seed, repeat=2)
        out.append({"num_samples": n, "total_bytes": int(big.offsets[n]), "store": st.to_dict(), "raw_rma": rm.to_dict()})
        prog.note(f"{n:,} samples: store {st.us_per_sample:.1f} us/sample, raw RMA {rm.us_per_sample:.1f} us/sample")
    return out


def run_storage_sweep(comm, cfg: BenchConfig) -> dict:
    """`--storage-sweep`: the training view (store and each baseline, decoded images, DLIO's sleep per
    step) on each storage model of `cfg.storage_sweep`, with the compute per step fixed once from the
    store's decode time on local disk. Rank 0 writes storage-sweep.{json,md,png} in cfg.out."""
    import json

    rank = comm.Get_rank()
    ladder = tuple(cfg.storage_sweep)
    prog = Progress(comm, 2 + len(ladder))
    notes: list[str] = []
    t_start = time.perf_counter()
    prog.start("data")
    data_dir = cfg.data_dir or os.path.join(cfg.out, "data")
    data = prepare(comm, cfg, prog, notes)
    n = min(cfg.train_samples or data.num_samples, data.num_samples)
    prog.start("store: decode through StoreLoader on local disk (sets the compute per step)")
    _dec, step_s = store_bench.decode_pass(comm, data.container, batch_size=cfg.batch_size, seed=cfg.seed,
                                           num_threads=cfg.decode_threads, size=cfg.decode_size,
                                           sample_range=(0, n))
    compute = max(step_s * cfg.compute_factor, 1e-3)
    prog.note(f"compute per step: {compute * 1e3:.1f} ms ({cfg.compute_factor:g} x the store's {step_s * 1e3:.1f} ms)")
    sw = storage.sweep(comm, cfg, data, data_dir, ladder, n, compute, prog)
    meta = {"ranks": comm.Get_size(), "num_samples": n, "batch_size": cfg.batch_size, "seed": cfg.seed,
            "num_workers": cfg.num_workers, "decode_threads": cfg.decode_threads, "machine": machine(),
            "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "command": cfg.command,
            "container": data.container, "cores": os.cpu_count(), "ladder": list(ladder),
            "bench_seconds": round(time.perf_counter() - t_start, 1)}
    results = {"meta": meta, "storage_sweep": sw, "notes": notes}
    if rank == 0:
        os.makedirs(cfg.out, exist_ok=True)
        paths = [os.path.join(cfg.out, "storage-sweep.json"), os.path.join(cfg.out, "storage-sweep.md")]
        with open(paths[0], "w") as fh:
            json.dump(results, fh, indent=1)
        with open(paths[1], "w") as fh:
            fh.write(storage.sweep_markdown(sw, meta))
        if cfg.plots:
            paths.append(storage.sweep_plot(sw, os.path.join(cfg.out, "storage-sweep.png")))
        prog.note("wrote " + ", ".join(paths))
        print(storage.sweep_markdown(sw, meta), flush=True)
    comm.Barrier()
    return results
