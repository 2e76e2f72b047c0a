"""A whole bench run, in order: data, limits, baselines, the store, the training view, the growth sweep,
outputs. Every rank runs it; rank 0 prints the progress and writes the files."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import platform
import sys
import time

from dstore.memory.pagecache import container_files
from dstore.store.data_store import DataStore
from dstore.tools.bench import baselines, layouts, limits, mosaic, report, storage, store_bench, training_view
from dstore.tools.bench.common import STORE_GETS, Measurement, Progress, busy_cores, median_pass
from dstore.tools.bench.data import (
    DataSet,
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
    peers: tuple[str, ...] | None = None
    """Storage specs of --peers (the store beside WebDataset and LitData on each; tools/bench/peers_run.py)."""
    consume: tuple[int, ...] = (1500, 3000, 6000)
    dali: bool = True
    """--peers: also dstore's loader beside NVIDIA DALI's CPU pipeline, decoding (tools/bench/dali.py)."""
    dali_python: str | None = None
    """DALI's venv python (--dali-python; default $DSTORE_DALI_PYTHON or tools/setup_dali.sh's)."""
    """--consume: samples/s per rank of the emulated consumer (--peers)."""

    @property
    def data_path(self) -> str:
        """Where generated data and the baselines' copies are kept: --data-dir, or OUT/data."""
        return self.data_dir or os.path.join(self.out, "data")


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
    data_dir = cfg.data_path
    if cfg.container:
        hdf5, zarr_path = cfg.container, None
        notes.append(
            f"container given: {cfg.container}; the h5py (Zarr) per-sample baseline over the container "
            "as written runs only on an HDF5 (Zarr) container, the folder and Mosaic baselines only if "
            "its source files are on disk"
        )
    else:
        folder = prepare_data(
            comm, cfg.count, data_dir, seed=cfg.seed, mean_bytes=cfg.mean_bytes, sides=cfg.sides, progress=prog
        )
        tag = data_tag(cfg.count, cfg.seed, cfg.mean_bytes, cfg.sides)
        hdf5 = container_path(data_dir, tag, "hdf5")
        zarr_path = container_path(data_dir, tag, "zarr")
    data = load_dataset(hdf5, zarr_path, folder)
    prog.note(f"per-sample copies for the h5py and zarr baselines in {data_dir} (written once, then reused)")
    data.h5py_contiguous = layouts.contiguous_hdf5(comm, data.container, data.offsets, data.labels, data_dir)
    data.zarr_per_sample = layouts.per_sample_zarr(comm, data.container, data.offsets, data.labels, data_dir)
    return data


def _run(comm, cfg: BenchConfig, stack: contextlib.ExitStack) -> dict:
    """The bench's passes, in order; `stack` holds the --storage mount."""
    bench = _BenchRun(comm, cfg, stack)
    bench.check_idle()
    bench.data_pass()
    bench.limits_pass()
    bench.baselines_pass()
    bench.store_pass()
    step_s, n_tv = bench.decode_pass()
    tv = bench.training_view_pass(step_s, n_tv)
    growth = bench.growth_pass()
    results = bench.results(tv, growth)
    bench.write(results)
    comm.Barrier()
    return results


class _BenchRun:
    """One bench run: the state its passes share, and each pass as a method (`_run` calls them in order).

    Attributes:
        comm: the ranks; every rank runs every pass.
        cfg: what to measure.
        stack: holds the --storage mount until `results` closes it.
        caches: the page-cache states measured (`cold` before `warm`).
        prog: the progress display (rank 0 prints).
        notes: the report's notes, in order.
        ms: every measurement, in the order taken (the order of results.json).
        data: the data set every reader reads (set by `data_pass`).
        evict_paths: the container's files, whose pages a cold pass evicts.
        mnt: the --storage mount, or None.
    """

    def __init__(self, comm, cfg: BenchConfig, stack: contextlib.ExitStack):
        self.comm, self.cfg, self.stack = comm, cfg, stack
        self.caches = [c for c in ("cold", "warm") if c in cfg.caches]
        self.prog = Progress(comm, 14 + 5 * len(self.caches) + (1 if cfg.growth else 0))
        self.notes: list[str] = []
        self.ms: list[Measurement] = []
        self.t_start = time.perf_counter()
        self.load_start = os.getloadavg()[0]
        self.busy: float | None = None
        self.data: DataSet | None = None
        self.evict_paths: list[str] = []
        self.mnt = None

    @property
    def dataset(self) -> DataSet:
        """The data set every reader reads, once `data_pass` has set it."""
        if self.data is None:
            raise RuntimeError("the bench's data set is read before data_pass() set it")
        return self.data

    def add(self, m: Measurement) -> None:
        """Keeps a measurement and prints it."""
        self.ms.append(m)
        self.prog.result(m)

    def check_idle(self) -> None:
        """Samples the cores busy before the run (rank 0) and warns when other work is running."""
        # Every rank sleeps through the sample (MPICH ranks waiting in a barrier spin, and would count).
        self.comm.Barrier()
        self.busy = busy_cores() if self.comm.Get_rank() == 0 else time.sleep(0.5)
        self.comm.Barrier()
        if self.busy is not None and self.busy > 0.5:
            self.prog.note(
                f"warning: {self.busy:.1f} of {os.cpu_count()} cores busy before the run: other work is "
                "running and every figure below is lower than this machine can do"
            )

    # --- data ------------------------------------------------------------------------------------
    def data_pass(self) -> None:
        """The data set (generated or given, mounted with --storage) and the notes that describe it."""
        self.prog.start("data")
        self.data = prepare(self.comm, self.cfg, self.prog, self.notes)
        if self.cfg.storage is not None:
            self._mount(self.cfg.storage)
        self._layout_notes()
        data = self.dataset
        self.prog.note(
            f"{data.num_samples:,} samples, {data.total_bytes / 1e6:,.0f} MB, "
            f"mean {data.total_bytes / data.num_samples / 1e3:.0f} KB"
        )
        self.evict_paths = container_files(data.container)

    def _mount(self, model: PfsModel) -> None:
        """--storage (`model`): every reader reads the data through a pfs mount, unmounted when `stack` closes."""
        cfg = self.cfg
        mnt = self.stack.enter_context(
            storage.mounted(self.comm, storage.mount_roots(cfg.data_path, cfg.container), model)
        )
        self.mnt = mnt
        self.data = mnt.translate_dataset(self.dataset)
        self.prog.note(
            f"--storage: every reader reads through a dstore pfs mount of {', '.join(mnt.roots)} "
            f"({model.describe()}) at {', '.join(mnt.mountpoints)}"
        )
        self.notes.append(
            f"storage: every reader (sequential read, store population, DataLoader over files, h5py, "
            f"zarr, the training view) read through a `dstore pfs` mount with {model.describe()}; "
            "files there have no page cache, so cold and warm passes both pay the model (the growth "
            "sweep's repeated container is on local disk)"
        )

    def _layout_notes(self) -> None:
        """What the h5py and zarr rows read: the per-sample copies, and the container as written."""
        data = self.dataset
        self.notes.append(
            f"{report.H5PY}: {data.h5py_contiguous}, a copy whose `data` is contiguous, read with "
            "h5py's defaults (the fair per-sample baseline; the goal ratio uses it). "
            f"{report.H5PY_CONTAINER}: the container as written, whose `data` is chunked (8 MiB when "
            "ingested by dstore): with h5py's default 1 MiB chunk cache each slice reads a whole "
            f"chunk; at most {CONTAINER_LAYOUT_LIMIT} samples per rank."
        )
        self.notes.append(
            f"{report.ZARR}: {data.zarr_per_sample}, a copy chunked in "
            f"{layouts.ZARR_CHUNK_BYTES // 1024} KiB; {report.ZARR_CONTAINER}: the Zarr container as "
            f"written (whole chunks read per slice), at most {CONTAINER_LAYOUT_LIMIT} samples per rank. "
            "zarr's own cost per read call (about 0.8 ms here) bounds both."
        )

    # --- limits ----------------------------------------------------------------------------------
    def limits_pass(self) -> None:
        """memcpy and raw RMA over the data set's sample sizes; per cache, the sequential read of the
        container beside the preload population it bounds."""
        comm, offsets, B, seed = self.comm, self.dataset.offsets, self.cfg.batch_size, self.cfg.seed
        self.prog.start("limit: memcpy")
        self.add(limits.memcpy_pass(comm, offsets, B, seed))
        self.prog.start("limit: raw RMA")
        self.add(limits.raw_rma_pass(comm, offsets, B, seed))
        self.prog.start("limit: raw RMA, one Get per sample")
        self.add(limits.raw_rma_pass(comm, offsets, B, seed, per_sample=True))
        for cache in self.caches:
            self._read_beside_population(cache)

    def _read_beside_population(self, cache: str) -> None:
        """The sequential-read limit and the preload population compared with it, side by side."""
        comm, cfg, data = self.comm, self.cfg, self.dataset
        self.prog.start(f"limit: sequential read, {cache}; store population (preload), {cache}")
        # The limit and the population it is compared with are taken side by side, alternating,
        # `cold_repeat` times, and the median pass of each kept: cold reads move by 2x from one
        # minute to the next on shared storage, so figures taken minutes apart do not compare.
        reads, pops = [], []
        for _ in range(cfg.cold_repeat if cache == "cold" else 1):
            if data.hdf5:
                reads.append(limits.sequential_read(comm, data.hdf5, cache))
            pops.append(
                store_bench.population(
                    comm,
                    data.container,
                    self.evict_paths,
                    mode="preload",
                    cache=cache,
                    batch_size=cfg.batch_size,
                    seed=cfg.seed,
                )
            )
        if reads:
            self.add(median_pass(reads))
        if data.hdf5 and cache == "cold":
            self.add(limits.sequential_read(comm, data.hdf5, cache, fresh=True))
        self.add(median_pass(pops))

    # --- baselines -------------------------------------------------------------------------------
    def baselines_pass(self) -> None:
        """The readers users use today: DataLoader over files, h5py and zarr per sample, Mosaic Streaming."""
        for cache in self.caches:
            self._folder_baseline(cache)
        for cache in self.caches:
            self._h5py_baselines(cache)
        for cache in self.caches:
            self._zarr_baselines(cache)
        self._mosaic_baseline()

    def _folder_baseline(self, cache: str) -> None:
        cfg, data = self.cfg, self.dataset
        self.prog.start(f"baseline: DataLoader over files, {cache}")
        if data.files is not None:
            ds = baselines.FileBytesDataset(data.files, data.labels)
            self.add(
                baselines.dataloader_pass(
                    self.comm,
                    ds,
                    name=report.FOLDER,
                    cache=cache,
                    evict_paths=data.files,
                    batch_size=cfg.batch_size,
                    num_workers=cfg.num_workers,
                    seed=cfg.seed,
                )
            )

    def _h5py_baselines(self, cache: str) -> None:
        comm, seed, data = self.comm, self.cfg.seed, self.dataset
        self.prog.start(f"baseline: h5py per-sample, {cache}")
        assert data.h5py_contiguous is not None  # prepare() writes the copy
        self.add(
            baselines.per_sample_pass(
                comm, data.h5py_contiguous, "h5py", data.offsets, data.labels, name=report.H5PY, cache=cache, seed=seed
            )
        )
        if data.hdf5:
            self.add(
                baselines.per_sample_pass(
                    comm,
                    data.hdf5,
                    "h5py",
                    data.offsets,
                    data.labels,
                    name=report.H5PY_CONTAINER,
                    cache=cache,
                    seed=seed,
                    limit=CONTAINER_LAYOUT_LIMIT,
                )
            )

    def _zarr_baselines(self, cache: str) -> None:
        comm, cfg, data = self.comm, self.cfg, self.dataset
        self.prog.start(f"baseline: zarr per-sample, {cache}")
        assert data.zarr_per_sample is not None  # prepare() writes the copy
        self.add(
            baselines.per_sample_pass(
                comm,
                data.zarr_per_sample,
                "zarr",
                data.offsets,
                data.labels,
                name=report.ZARR,
                cache=cache,
                seed=cfg.seed,
                limit=cfg.zarr_limit,
            )
        )
        if data.zarr:
            slow = CONTAINER_LAYOUT_LIMIT
            limit = slow if cfg.zarr_limit is None else min(slow, cfg.zarr_limit)
            self.add(
                baselines.per_sample_pass(
                    comm,
                    data.zarr,
                    "zarr",
                    data.offsets,
                    data.labels,
                    name=report.ZARR_CONTAINER,
                    cache=cache,
                    seed=cfg.seed,
                    limit=limit,
                )
            )

    def _mosaic_baseline(self) -> None:
        cfg, data = self.cfg, self.dataset
        self.prog.start("baseline: Mosaic Streaming")
        if cfg.storage is not None and cfg.mosaic:
            self.notes.append(
                "Mosaic Streaming: skipped under --storage (its MDS shards are written and read by its "
                "own process in its own venv, not routed through the mount)"
            )
        elif cfg.mosaic and data.files is not None:
            # MDS shards are kept beside the data and reused; keyed by the container they mirror.
            tag = os.path.splitext(os.path.basename(os.path.normpath(data.container)))[0]
            work = os.path.join(cfg.data_path, f"mosaic-{tag}")
            got, note = mosaic.run_peer(
                self.comm,
                list(zip(data.files, data.labels.tolist())),
                work,
                seed=cfg.seed,
                batch_size=cfg.batch_size,
                venv=cfg.mosaic_venv,
            )
            for m in got:
                if m.cache in self.caches:
                    self.add(m)
            self.notes.append("Mosaic Streaming: " + note)
            self.prog.note(note)
        elif not cfg.mosaic:
            self.notes.append("Mosaic Streaming: skipped (--no-mosaic)")

    # --- the store -------------------------------------------------------------------------------
    def store_pass(self) -> None:
        """Dynamic population per cache, then raw-byte delivery for each shuffle with prefetch on and
        off, and with every sample of another rank as an RMA get (node views off)."""
        comm, container, B, seed = self.comm, self.dataset.container, self.cfg.batch_size, self.cfg.seed
        for cache in self.caches:
            self.prog.start(f"store: population dynamic, {cache}")
            self.add(
                store_bench.population(
                    comm, container, self.evict_paths, mode="dynamic", cache=cache, batch_size=B, seed=seed
                )
            )
        for shuffle in ("global", "local", "partial"):
            for prefetch in (store_bench.PREFETCH_ON, 0):
                self.prog.start(f"store: delivery, {shuffle} shuffle, prefetch {prefetch}")
                self.add(
                    store_bench.delivery(comm, container, shuffle=shuffle, prefetch=prefetch, batch_size=B, seed=seed)
                )
        self.prog.start("store: delivery, global shuffle, gets only (node views off)")
        self.add(
            store_bench.delivery(
                comm,
                container,
                shuffle="global",
                prefetch=store_bench.PREFETCH_ON,
                batch_size=B,
                seed=seed,
                node_views=False,
                name=STORE_GETS,
            )
        )

    def decode_pass(self) -> tuple[float, int]:
        """One epoch of decoded images through StoreLoader over the training view's samples. Returns
        the slowest rank's seconds per step (the training view's compute is set from it) and that
        number of samples."""
        cfg, data = self.cfg, self.dataset
        self.prog.start("store: decode through StoreLoader")
        n_tv = min(cfg.train_samples or data.num_samples, data.num_samples)
        dec, step_s = store_bench.decode_pass(
            self.comm,
            data.container,
            batch_size=cfg.batch_size,
            seed=cfg.seed,
            num_threads=cfg.decode_threads,
            size=cfg.decode_size,
            sample_range=(0, n_tv),
        )
        self.add(dec)
        return step_s, n_tv

    # --- training view, growth -------------------------------------------------------------------
    def training_view_pass(self, step_s: float, n: int) -> dict:
        """The results' `training_view`: AU of the store and of each baseline (run_training_view)."""
        self.prog.start("training view (DLIO: sleep per step)")
        return run_training_view(self.comm, self.cfg, self.dataset, step_s, n, self.prog)

    def growth_pass(self) -> list[dict]:
        """The results' `growth` (run_growth); empty without --growth sizes."""
        if not self.cfg.growth:
            return []
        self.prog.start(f"growth: {', '.join(f'{n:,}' for n in self.cfg.growth)} samples")
        return run_growth(self.comm, self.cfg, self.dataset, self.prog)

    # --- outputs ---------------------------------------------------------------------------------
    def results(self, tv: dict, growth: list[dict]) -> dict:
        """The results (report.write_outputs adds the ratios); unmounts --storage first, so that what
        the mounts served is known and recorded."""
        results = {
            "meta": self._meta(self._unmount()),
            "measurements": report.measurement_dicts(self.ms),
            "training_view": tv,
            "growth": growth,
            "notes": self.notes,
        }
        results["meta"]["bench_seconds"] = round(time.perf_counter() - self.t_start, 1)
        return results

    def _unmount(self) -> dict | None:
        """Closes the --storage mount; returns what the results' `meta.storage` records of it."""
        if self.mnt is None or self.cfg.storage is None:  # (a mount is made only for --storage)
            return None
        self.stack.close()
        mnt, model = self.mnt, self.cfg.storage
        return {"spec": model.describe(), "model": model.to_dict(), "roots": mnt.roots, "mount_stats": mnt.stats}

    def _meta(self, storage_meta: dict | None) -> dict:
        """The results' `meta` (bench_seconds is set last, by `results`)."""
        cfg, data, busy = self.cfg, self.dataset, self.busy
        return {
            "ranks": self.comm.Get_size(),
            "num_samples": data.num_samples,
            "total_bytes": data.total_bytes,
            "mean_sample_bytes": data.total_bytes / max(1, data.num_samples),
            "batch_size": cfg.batch_size,
            "seed": cfg.seed,
            "caches": self.caches,
            "num_workers": cfg.num_workers,
            "decode_threads": cfg.decode_threads,
            "machine": machine(),
            "python": sys.version.split()[0],
            "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "command": cfg.command,
            "container": data.container,
            "zarr": data.zarr,
            "files": data.files is not None,
            "cores": os.cpu_count(),
            "bench_seconds": None,
            "load_average": [round(self.load_start, 2), round(os.getloadavg()[0], 2)],
            "busy_cores_at_start": None if busy is None else round(busy, 2),
            "storage": storage_meta,
        }

    def write(self, results: dict) -> None:
        """Rank 0 writes results.json, results.md and the plots, and prints each ratio against its goal."""
        if self.comm.Get_rank() != 0:
            return
        out, prog = self.cfg.out, self.prog
        paths = report.write_outputs(results, out, plots=self.cfg.plots)
        prog.note("wrote " + ", ".join(os.path.relpath(p, out) for p in paths) + f" in {out}")
        for r in results["ratios"]:
            val = "n/a" if r["value"] is None else f"{r['value']:.2f}"
            if r["goal"] is None:
                prog.note(f"{r['description']}: {val}")
                continue
            met = report.verdict(r, "met", "NOT met")
            prog.note(f"{r['description']}: {val} (goal >= {r['goal']:g}) {met}")


def run_training_view(comm, cfg: BenchConfig, data: DataSet, store_step_s: float, n: int, prog: Progress) -> dict:
    """AU of the store and of each baseline that can run, over the first `n` samples, with
    compute = factor x the store's fetch+decode time per step."""
    compute = max(store_step_s * cfg.compute_factor, 1e-3)
    rows = []
    with DataStore(
        comm, data.container, batch_size=cfg.batch_size, seed=cfg.seed, population="preload", sample_range=(0, n)
    ) as store:
        rows.append(
            training_view.run_store(
                comm, store, compute_seconds=compute, epoch=2, num_threads=cfg.decode_threads, size=cfg.decode_size
            )
        )
    rows += training_view.run_baselines(
        comm,
        data,
        n,
        compute_seconds=compute,
        batch_size=cfg.batch_size,
        num_workers=cfg.num_workers,
        seed=cfg.seed,
        decode_size=cfg.decode_size,
    )
    for r in rows:
        prog.note(f"{r['name']}: AU {r['au']:.3f} ({r['steps']} steps, wall {r['wall']:.2f}s, wait {r['wait']:.2f}s)")
    return {
        "compute_seconds": compute,
        "store_step_seconds": store_step_s,
        "factor": cfg.compute_factor,
        "num_samples": n,
        "num_workers": cfg.num_workers,
        "decode_threads": cfg.decode_threads,
        "loaders": rows,
    }


def run_growth(comm, cfg: BenchConfig, data: DataSet, prog: Progress) -> list[dict]:
    """Store delivery and raw RMA cost per sample over the first n samples, for each n in cfg.growth."""
    sizes = sorted(set(cfg.growth))
    big = data
    if sizes[-1] > data.num_samples:
        if cfg.container:
            sizes = [n for n in sizes if n <= data.num_samples]
            prog.note(f"growth limited to the container's {data.num_samples:,} samples")
        else:
            data_dir = cfg.data_path
            tag = data_tag(cfg.count, cfg.seed, cfg.mean_bytes, cfg.sides)
            path = os.path.join(data_dir, f"repeated-{sizes[-1]}-of-{tag}.h5")
            prog.note(f"growth container: {sizes[-1]:,} samples repeating the {data.num_samples:,} generated ones")
            big = repeated_container(comm, data, sizes[-1], path)
    out = []
    for n in sizes:
        st = store_bench.delivery(
            comm,
            big.container,
            shuffle="global",
            prefetch=store_bench.PREFETCH_ON,
            batch_size=cfg.batch_size,
            seed=cfg.seed,
            sample_range=(0, n),
            name=report.STORE_MAIN,
        )
        rm = limits.raw_rma_pass(comm, big.offsets[: n + 1], cfg.batch_size, cfg.seed, repeat=2)
        out.append(
            {"num_samples": n, "total_bytes": int(big.offsets[n]), "store": st.to_dict(), "raw_rma": rm.to_dict()}
        )
        prog.note(f"{n:,} samples: store {st.us_per_sample:.1f} us/sample, raw RMA {rm.us_per_sample:.1f} us/sample")
    return out


def run_storage_sweep(comm, cfg: BenchConfig) -> dict:
    """`--storage-sweep`: the training view (store and each baseline, decoded images, DLIO's sleep per
    step) on each storage model of `cfg.storage_sweep`, with the compute per step fixed once from the
    store's decode time on local disk. Rank 0 writes storage-sweep.{json,md,png} in cfg.out."""
    import json

    rank = comm.Get_rank()
    ladder = tuple(cfg.storage_sweep or ())
    prog = Progress(comm, 2 + len(ladder))
    notes: list[str] = []
    t_start = time.perf_counter()
    prog.start("data")
    data_dir = cfg.data_path
    data = prepare(comm, cfg, prog, notes)
    n = min(cfg.train_samples or data.num_samples, data.num_samples)
    prog.start("store: decode through StoreLoader on local disk (sets the compute per step)")
    _dec, step_s = store_bench.decode_pass(
        comm,
        data.container,
        batch_size=cfg.batch_size,
        seed=cfg.seed,
        num_threads=cfg.decode_threads,
        size=cfg.decode_size,
        sample_range=(0, n),
    )
    compute = max(step_s * cfg.compute_factor, 1e-3)
    prog.note(f"compute per step: {compute * 1e3:.1f} ms ({cfg.compute_factor:g} x the store's {step_s * 1e3:.1f} ms)")
    sw = storage.sweep(comm, cfg, data, data_dir, ladder, n, compute, prog)
    meta = {
        "ranks": comm.Get_size(),
        "num_samples": n,
        "batch_size": cfg.batch_size,
        "seed": cfg.seed,
        "num_workers": cfg.num_workers,
        "decode_threads": cfg.decode_threads,
        "machine": machine(),
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "command": cfg.command,
        "container": data.container,
        "cores": os.cpu_count(),
        "ladder": list(ladder),
        "bench_seconds": round(time.perf_counter() - t_start, 1),
    }
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
