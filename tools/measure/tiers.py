"""Measures the tiered store (data larger than the memory budget) in the bench's training view.

    mpiexec -n 2 python -m dstore.tools.measure.tiers --data-dir DIR [--count 1500] [--fractions 1 0.5 0.25 0]

For each resident fraction f the store gets a budget of its buffers plus f of a rank's share
(f >= 1: no limit); the page cache is evicted before every epoch; one epoch of decoded batches runs
with a fixed sleep per step as compute (dstore.tools.bench.training_view: AU = compute / wall). Printed per
fraction: samples/s, AU, bytes read from storage in the epoch (all ranks) against the non-resident
bytes, and each rank's peak RSS growth over the epoch against its budget. A DataLoader over the
source files (cold) is the baseline. Prints one JSON line per row, then a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import time

from dstore.formats import open_container
from dstore.order import tiers
from dstore.store.data_store import DataStore
from dstore.store.storage import StorageReader
from dstore.tools.bench import baselines, training_view
from dstore.tools.bench.common import evict_on_nodes
from dstore.tools.bench.data import container_path, data_tag, load_dataset, prepare_data


def _vm(key: str) -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    return 0


class _PeakPss:
    """Samples this process's proportional set size (/proc/self/smaps_rollup: shared window pages
    count once over the ranks mapping them) every 50 ms in a thread; `peak` is the largest seen."""

    def __init__(self):
        import threading

        self.peak = self._pss()
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    @staticmethod
    def _pss() -> int:
        try:
            with open("/proc/self/smaps_rollup") as fh:
                for line in fh:
                    if line.startswith("Pss:"):
                        return int(line.split()[1]) * 1024
        except OSError:
            pass
        return 0

    def _run(self):
        while not self._stop.wait(0.05):
            self.peak = max(self.peak, self._pss())

    def stop(self) -> int:
        self._stop.set()
        self._t.join()
        return max(self.peak, self._pss())


def _reset_peak() -> None:
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")  # resets VmHWM to the current RSS (Linux >= 4.0)
    except OSError:
        pass


def _raw_reads(comm, container, args) -> list:
    """Storage reads alone (no decode, no compute) of each rank's non-resident half of its epoch:
    one read per sample in delivery order through StorageReader's threads, then the same number of
    bytes as contiguous 4 MiB pieces of the container (as an order reading big storage chunks
    would). Rows carry samples/s (pieces: bytes/s over the mean sample size)."""
    import numpy as np

    rows = []
    with open_container(container) as r:
        offsets = np.asarray(r.offsets)
    sizes = np.diff(offsets)
    with DataStore(comm, container, batch_size=args.batch_size, seed=0) as st:
        sched = st.schedule(1)
    owner = np.zeros(sizes.size, dtype=np.int64)
    res = tiers.resident_mask(sizes, owner, np.array([int(offsets[-1]) // 2]), 0)
    ids = sched.ids[~np.asarray(sched.pad)]
    ids = ids[~res[ids]]
    reader = StorageReader(container, args.storage_threads)
    try:
        buf = np.empty(int(sizes.max()) * 64, dtype=np.uint8)
        evict_on_nodes(comm, [container])
        comm.Barrier()
        t0 = time.perf_counter()
        for k in range(0, ids.size, 64):  # 64 reads in flight, one per sample
            part = ids[k : k + 64]
            pos = np.arange(part.size) * int(sizes.max())
            reader.wait(reader.submit(buf, offsets[part], offsets[part + 1], pos))
        dt = comm.allreduce(time.perf_counter() - t0, op=__import__("mpi4py").MPI.MAX)
        n = comm.allreduce(int(ids.size))
        nbytes = comm.allreduce(int(sizes[ids].sum()))
        rows.append(
            {
                "name": "storage reads alone: per sample, epoch order",
                "samples_per_s": n / dt,
                "MBps": nbytes / 1e6 / dt,
                "reads": comm.allreduce(reader.reads),
            }
        )
        piece = 4 << 20
        mine = int(sizes[ids].sum())
        start = (int(offsets[-1]) // comm.size) * comm.rank
        buf = np.empty(piece * args.storage_threads, dtype=np.uint8)
        evict_on_nodes(comm, [container])
        reads0 = reader.reads
        t0 = time.perf_counter()
        pos = 0
        while pos < mine:
            lo = [start + pos + j * piece for j in range(args.storage_threads)]
            hi = [min(a + piece, start + mine, int(offsets[-1])) for a in lo]
            lo, hi = [a for a, b in zip(lo, hi) if b > a], [b for a, b in zip(lo, hi) if b > a]
            reader.wait(reader.submit(buf, lo, hi, [j * piece for j in range(len(lo))]))
            pos += piece * args.storage_threads
        dt = comm.allreduce(time.perf_counter() - t0, op=__import__("mpi4py").MPI.MAX)
        rows.append(
            {
                "name": "storage reads alone: 4 MiB pieces, same bytes",
                "samples_per_s": n / dt,
                "MBps": nbytes / 1e6 / dt,
                "reads": comm.allreduce(reader.reads - reads0),
            }
        )
    finally:
        reader.close()
    return rows


def _parse(argv) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").partition("\n")[0])
    p.add_argument("--data-dir", required=True)
    p.add_argument("--count", type=int, default=1500)
    p.add_argument("--container", default=None, help="use this container instead of generated data")
    p.add_argument("--fractions", type=float, nargs="+", default=[1.0, 0.5, 0.25, 0.0])
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--compute-ms", type=float, default=40.0)
    p.add_argument("--threads", type=int, default=2, help="decode threads per rank")
    p.add_argument("--storage-threads", type=int, default=4)
    p.add_argument("--size", type=int, default=96, help="decode size")
    p.add_argument("--no-baseline", action="store_true")
    p.add_argument("--folder", default=None, help="the source image folder for the baseline (e.g. through a mount)")
    p.add_argument(
        "--raw-reads",
        action="store_true",
        help="also time the storage reads alone: the non-resident half per sample in the epoch's "
        "order, against the same bytes in 4 MiB pieces (what a block-shuffled order could read)",
    )
    return p.parse_args(argv)


def main(argv=None) -> None:
    from mpi4py import MPI

    args = _parse(argv)
    comm = MPI.COMM_WORLD
    if args.container:
        container = args.container
    else:
        prepare_data(comm, args.count, args.data_dir, seed=0, formats=("hdf5",))
        container = container_path(args.data_dir, data_tag(args.count, 0), "hdf5")
    # Warm-up (imports, decode pool, allocator): a short resident epoch, not reported.
    with _store(comm, container, args, sample_range=(0, 4 * args.batch_size)) as st:
        training_view.run_store(
            comm, st, compute_seconds=0.0, epoch=0, num_threads=args.threads, size=(args.size, args.size)
        )
    rows = [_store_row(comm, container, args, f) for f in args.fractions]
    if args.raw_reads:
        rows += _raw_reads(comm, container, args)
    if not args.no_baseline:
        rows += _baseline_rows(comm, container, args)
    if comm.rank == 0:
        _print_rows(comm, rows, args)


def _store(comm, container: str, args, **more) -> DataStore:
    return DataStore(comm, container, batch_size=args.batch_size, seed=0, storage_threads=args.storage_threads, **more)


class _Growth:
    """Each rank's peak RSS and PSS growth from construction to `gather`."""

    def __init__(self):
        _reset_peak()
        self.rss0 = _vm("VmRSS")
        self.pss = _PeakPss()
        self.pss0 = self.pss.peak

    def gather(self, comm) -> tuple[list[int], list[int]]:
        """(RSS growth, PSS growth) of every rank (collective)."""
        rss = comm.allgather(_vm("VmHWM") - self.rss0)
        return rss, comm.allgather(self.pss.stop() - self.pss0)


def _budget(comm, container: str, args, fraction: float) -> int:
    """The memory budget that keeps `fraction` of a rank's share resident (fraction >= 1: no limit)."""
    probe = _store(comm, container, args)
    share = int(probe.layout.nbytes.max())
    budget = probe.tier_overhead() + int(fraction * share) if fraction < 1 else 100 * int(probe.offsets[-1]) + (1 << 30)
    probe.close()
    return budget


def _store_row(comm, container: str, args, f: float) -> dict:
    """One epoch of the store with `f` of a rank's share resident, the page cache evicted first."""
    budget = _budget(comm, container, args, f)
    growth = _Growth()
    with _store(comm, container, args, memory_budget=budget) as st:
        evict_on_nodes(comm, [container])
        row = training_view.run_store(
            comm,
            st,
            compute_seconds=args.compute_ms / 1e3,
            epoch=1,
            num_threads=args.threads,
            size=(args.size, args.size),
        )
        stats = st.gather_stats()
        assert st.windows is not None  # populated on entry
        res = st.windows.resident
        nonres = 0 if res is None else int(st.sizes[~res].sum())
        tier = dict(st.tier)
    grow, pss_grow = growth.gather(comm)
    samples = sum(s["samples"] - s["pads"] for s in stats)
    return {
        "name": f"store, {100 * tier['resident_fraction']:.0f}% resident",
        "fraction_asked": f,
        "resident_fraction": round(tier["resident_fraction"], 4),
        "samples_per_s": samples / row["wall"],
        "au": row["au"],
        "au_steady": row["au_steady"],
        "storage_bytes": sum(s["bytes_storage"] for s in stats),
        "nonresident_bytes": nonres,
        "storage_reads": sum(s["storage_reads"] for s in stats),
        "storage_wait_s": max(s["storage_wait_seconds"] for s in stats),
        "consumer_wait_s": max(s["wait_seconds"] for s in stats),
        "peak_rss_growth_per_rank": grow,
        "peak_pss_growth_per_rank": pss_grow,
        "budget_per_rank": budget if f < 1 else None,
        "window_bytes_per_rank": [int(b) for b in comm.allgather(int(st.layout.nbytes[comm.rank]))],
    }


def _baseline_rows(comm, container: str, args) -> list[dict]:
    """A DataLoader over the source files, cold (no row without them); the page cache evicted after."""
    rows = []
    data = load_dataset(container, None, args.folder)
    if data.files is not None:
        growth = _Growth()
        t = training_view.run_baseline(
            comm,
            "DataLoader over files",
            baselines.FileBytesDataset(data.files, data.labels, decode=True, size=(args.size, args.size)),
            data.files,
            compute_seconds=args.compute_ms / 1e3,
            batch_size=args.batch_size,
            num_workers=2,
            seed=0,
        )
        grow, pss_grow = growth.gather(comm)
        rows.append(
            {
                "name": "DataLoader over files (2 workers)",
                "samples_per_s": len(data.files) / t["wall"],
                "au": t["au"],
                "au_steady": t["au_steady"],
                "storage_bytes": int(data.offsets[-1]),
                "peak_rss_growth_per_rank": grow,
                "peak_pss_growth_per_rank": pss_grow,
            }
        )
    evict_on_nodes(comm, [container])
    return rows


def _print_rows(comm, rows: list[dict], args) -> None:
    """One JSON line per row, then the Markdown table."""
    for r in rows:
        print(json.dumps(r), flush=True)
    print(
        f"\n{comm.size} ranks, global batch {args.batch_size}, compute {args.compute_ms:g} ms/step, "
        f"{args.threads} decode threads, page cache evicted before every epoch; "
        f"{time.strftime('%H:%M UTC', time.gmtime())}"
    )
    print(
        "| reader | resident | samples/s | AU | storage MB/epoch (non-resident MB) | reads | "
        "peak PSS growth/rank MB (budget MB) | peak RSS growth/rank MB |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(_table_line(r))


def _table_line(r: dict) -> str:
    if "au" not in r:
        return f"| {r['name']} | - | {r['samples_per_s']:.0f} | - | {r['MBps']:.0f} MB/s | {r['reads']} | - | - |"
    nr = r.get("nonresident_bytes")
    b = r.get("budget_per_rank")
    return (
        f"| {r['name']} | {r.get('resident_fraction', '-')} | {r['samples_per_s']:.0f} | {r['au']:.2f} | "
        f"{r['storage_bytes'] / 1e6:.1f}"
        + (f" ({nr / 1e6:.1f})" if nr is not None else "")
        + f" | {r.get('storage_reads', '-')} | {max(r['peak_pss_growth_per_rank']) / 1e6:.0f}"
        + (f" ({b / 1e6:.0f})" if b else "")
        + f" | {max(r['peak_rss_growth_per_rank']) / 1e6:.0f} |"
    )


if __name__ == "__main__":
    main()
