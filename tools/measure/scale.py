"""Memory, open time and bytes read per rank of a DataStore over many tiny samples (issue 20).

Two steps, each a program with printed and JSON output:

    python tools/measure/scale.py make /tmp/tiny10M.h5 10000000 [--bytes 64]
        writes a container of N samples of `--bytes` bytes (HDF5, the library's writer) and reports
        the writer's peak RSS (the ingest's memory at scale);
    mpiexec -n P python tools/measure/scale.py run /tmp/tiny10M.h5 [--epochs 2] [--json out.json]
        opens a DataStore (global order, preload or `--population stream`, batch 1024) on P ranks
        and reports per rank:
        VmRSS (private and shared parts) before the open, after it (window excluded), during the
        first epoch, bytes read by the open (/proc/self/io), open and epoch times; checks that the
        last epoch delivered every sample exactly once (a count per sample, summed over ranks).

`--src DIR` imports `dstore` from DIR/datastore instead (e.g. a checkout of an older commit, for a
before/after table). Figures taken on a shared machine: record `uptime` with them.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import resource
import sys
import time


def _use_source(src: str | None) -> None:
    if not src:
        return
    pkg = os.path.join(src, "datastore")
    spec = importlib.util.spec_from_file_location(
        "dstore", os.path.join(pkg, "__init__.py"), submodule_search_locations=[pkg]
    )
    if spec is None or spec.loader is None:
        raise SystemExit(f"--src {src}: no importable datastore/ there")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["dstore"] = mod
    spec.loader.exec_module(mod)


def _trim() -> None:
    """Returns freed heap memory to the system (glibc's malloc_trim), so RSS counts live memory,
    not what temporaries left in malloc's free lists (which glibc may keep for reuse)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: figures include free lists
        pass


def status() -> dict:
    """This process's memory figures (bytes) from /proc/self/status, after a malloc_trim."""
    _trim()
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, rest = line.partition(":")
            if key in ("VmRSS", "VmHWM", "RssAnon", "RssShmem", "RssFile"):
                out[key] = int(rest.split()[0]) * 1024
    return out


def reset_peak() -> None:
    """Resets this process's peak RSS (VmHWM) to its RSS now (Linux: clear_refs 5), so a later
    VmHWM is the peak since; does nothing where the kernel refuses."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def io_read() -> int:
    """Bytes this process has read through read calls so far (rchar)."""
    with open("/proc/self/io") as f:
        return next(int(x.split()[1]) for x in f if x.startswith("rchar"))


def make(path: str, n: int, nbytes: int, batch: int = 200_000) -> dict:
    """Writes n samples of nbytes (each its index's bytes, repeated) with the library's writer."""
    import numpy as np

    from dstore.formats import create_writer

    base = status()["VmRSS"]  # the interpreter and its imports, before the writer
    t0 = time.perf_counter()
    with create_writer(
        path,
        "hdf5",
        encoding="raw",
        class_names=[str(i) for i in range(10)],
        raw_dtype="uint8",
        raw_shape=(nbytes,),
        overwrite=True,
    ) as w:
        for a in range(0, n, batch):
            k = min(batch, n - a)
            ids = np.arange(a, a + k, dtype=np.int64)
            data = np.repeat(ids.astype("<u8").view(np.uint8).reshape(k, 8), -(-nbytes // 8), axis=1)[:, :nbytes]
            w.extend(data.ravel(), [nbytes] * k, (ids % 10).tolist(), [f"s/{i}" for i in ids.tolist()])
    out = {
        "samples": n,
        "sample_bytes": nbytes,
        "seconds": time.perf_counter() - t0,
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "baseline_rss_bytes": base,
    }
    grown = out["peak_rss_bytes"] - base
    print(
        f"made {path}: {n} samples of {nbytes} B in {out['seconds']:.1f} s, writer peak RSS "
        f"{out['peak_rss_bytes'] / 1e6:.0f} MB, {grown / 1e6:.0f} MB over the interpreter's ({grown / n:.0f} B/sample)"
    )
    return out


def _stream_plan_bytes(store) -> int:
    """Bytes of what a streaming store's rank holds to know when each sample is in its window (the
    piece plan), while it streams; 0 otherwise."""
    st = getattr(store, "_stream", None)
    need = getattr(st, "need", None)
    if need is None:
        return 0
    if hasattr(need, "nbytes"):
        return int(need.nbytes)  # one int64 per sample of N
    return int(need.starts.nbytes + need.place.nbytes)  # per piece


def run(path: str, epochs: int, batch: int, population: str = "preload") -> dict | None:
    import numpy as np
    from mpi4py import MPI

    from dstore.store.data_store import DataStore

    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    comm.Barrier()
    s0, r0 = status(), io_read()
    reset_peak()
    t0 = time.perf_counter()
    store = DataStore(comm, path, batch_size=batch, seed=1, population_threads=1, population=population)
    comm.Barrier()
    t_open = time.perf_counter() - t0
    s_open, r_open = status(), io_read()
    t_pop = time.perf_counter()
    store.populate()
    window = int(store.layout.nbytes[rank])
    s_pop = status()
    n = store.num_samples
    row = {
        "rank": rank,
        "size": size,
        "samples": n,
        "open_seconds": t_open,
        "open_read_bytes": r_open - r0,
        "window_bytes": window,
        "after_open_bytes": s_open["VmRSS"] - s0["VmRSS"],
        "open_peak_bytes": s_open["VmHWM"] - s0["VmRSS"],  # the open's temporary peak (RSS, shared pages too)
        "after_open_anon_bytes": s_open["RssAnon"] - s0["RssAnon"],
        "after_population_anon_bytes": s_pop["RssAnon"] - s0["RssAnon"],
        "after_population_shmem_bytes": s_pop["RssShmem"] - s0["RssShmem"],
    }
    with store:
        t1 = time.perf_counter()
        store.schedule(0)  # what building this rank's part of an epoch's order costs
        row["schedule_seconds"] = time.perf_counter() - t1
        seen = None  # the last epoch's deliveries per sample
        for e in range(epochs):
            last = e == epochs - 1
            seen = np.zeros(n, dtype=np.uint8) if last else None
            comm.Barrier()
            t1 = time.perf_counter()
            first = True
            peak = 0
            for b in store.epoch(e):
                if first:
                    sb = status()
                    peak = sb["RssAnon"] - s_pop["RssAnon"]
                    if e == 0:
                        row["first_batch_anon_bytes"] = sb["RssAnon"] - s0["RssAnon"]
                        row["stream_plan_bytes"] = _stream_plan_bytes(store)
                    first = False
                if seen is not None:  # the last epoch
                    seen[b.ids[~b.pad]] += 1
            comm.Barrier()
            row[f"epoch{e}_seconds"] = time.perf_counter() - t1
            if e == 0:  # the population (a stream's reads run on into epoch 0) and epoch 0 together
                row["population_to_epoch0_end_seconds"] = time.perf_counter() - t_pop
            if e == 0:
                row["epoch_anon_bytes"] = peak  # what the epoch's plan adds, at its first batch
        if population == "stream":  # the windows are filled only now
            row["after_population_shmem_bytes"] = status()["RssShmem"] - s0["RssShmem"]
        if seen is None:
            raise ValueError(f"epochs={epochs}: no epoch ran")
        total = np.zeros_like(seen)
        comm.Allreduce(seen, total, op=MPI.SUM)
        row["exactly_once"] = bool(np.all(total == 1))
    row["peak_rss_bytes"] = max(s0["VmHWM"], status()["VmHWM"])  # (reset before the open: the larger of the two)
    # Metadata: private memory at the first batch less the window where the window is private (one
    # rank: MPI allocates it from the heap); shared memory beyond the window is the node's index.
    shm = row["after_population_shmem_bytes"]
    row["window_private"] = shm < window // 2
    row["metadata_private_bytes"] = row["first_batch_anon_bytes"] - (window if row["window_private"] else 0)
    row["index_shared_bytes"] = max(0, shm - window)
    rows = comm.gather(row, root=0)
    if rows is None:  # not the root
        return None
    node = sum(r["metadata_private_bytes"] for r in rows) + rows[0]["index_shared_bytes"]
    for r in rows:
        print(
            f"rank {r['rank']}/{size} N={n}: open {r['open_seconds']:.2f} s, read {r['open_read_bytes'] / 1e6:.1f} MB, "
            f"peak +{r['open_peak_bytes'] / 1e6:.1f} MB ({r['open_peak_bytes'] / n:.1f} B/sample); "
            f"private after open +{r['after_open_anon_bytes'] / 1e6:.1f} MB "
            f"({r['after_open_anon_bytes'] / n:.1f} B/sample); epoch plan +{r['epoch_anon_bytes'] / 1e6:.1f} MB "
            f"({r['epoch_anon_bytes'] / n:.1f} B/sample); shared +{r['after_population_shmem_bytes'] / 1e6:.1f} MB "
            f"(window {r['window_bytes'] / 1e6:.1f} MB); epochs "
            + ", ".join(f"{r[f'epoch{e}_seconds']:.2f}" for e in range(epochs))
            + f" s; exactly once: {r['exactly_once']}; "
            f"metadata private {r['metadata_private_bytes'] / n:.1f} B/sample; stream plan "
            f"{r['stream_plan_bytes'] / n:.2f} B/sample"
        )
    print(
        f"P={size} N={n}: metadata per rank (private) max {max(r['metadata_private_bytes'] for r in rows) / n:.1f} "
        f"B/sample, node index (shared) {rows[0]['index_shared_bytes'] / n:.1f} B/sample, per node (all ranks + "
        f"shared) {node / n:.1f} B/sample; open {max(r['open_seconds'] for r in rows):.2f} s, read at open "
        f"{sum(r['open_read_bytes'] for r in rows) / 1e6:.1f} MB over all ranks"
    )
    return {
        "container": path,
        "ranks": size,
        "samples": n,
        "batch_size": batch,
        "population": population,
        "node_metadata_bytes": node,
        "rows": rows,
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").partition("\n")[0], allow_abbrev=False)
    p.add_argument("--src", help="import dstore from DIR/datastore (an older checkout)")
    p.add_argument("--json", help="write the figures here as JSON")
    sub = p.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("make")
    m.add_argument("path")
    m.add_argument("samples", type=int)
    m.add_argument("--bytes", type=int, default=64)
    r = sub.add_parser("run")
    r.add_argument("path")
    r.add_argument("--epochs", type=int, default=2)
    r.add_argument("--batch", type=int, default=1024)
    r.add_argument(
        "--population",
        default="preload",
        choices=("preload", "stream"),
        help="stream: the first batch is measured while the windows still fill (dstore.store.stream)",
    )
    a = p.parse_args(argv)
    _use_source(a.src)
    out = make(a.path, a.samples, a.bytes) if a.cmd == "make" else run(a.path, a.epochs, a.batch, a.population)
    if out is not None and a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
