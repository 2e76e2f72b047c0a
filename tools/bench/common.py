"""Shared pieces of the benchmark: the measurement record, collective timing, page-cache eviction, rank splits."""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from dstore.memory.pagecache import evict_files
from dstore.runtime.collective import topology
from dstore.tools.pfs.mount import pfs_mountpoints, under_pfs_mount

MB = 1e6
"""Throughput unit: 10^6 bytes (MB/s), as disks and networks are quoted."""

# Names of the measurements the ratios and the scaling table look up.
STORE_MAIN = "store global, prefetch on"
"""The store configuration the ratios use: global shuffle with prefetch, raw bytes."""
STORE_GETS = "store global, gets only (node views off)"
"""The same with `node_views=False`: every sample of another rank comes with an RMA get, as samples of
other nodes do in a multi-node job (on one node the default serves them in place)."""
RAW_RMA = "raw RMA (Win.Allocate + Get)"
RAW_RMA_PER_SAMPLE = "raw RMA, one Get per sample"
SEQ_READ = "sequential file read"
SEQ_READ_FRESH = "sequential file read into new memory"
H5PY = "h5py per-sample, contiguous"
"""h5py over a copy whose `data` is contiguous (tools/bench/layouts.py): the fair per-sample baseline."""
H5PY_CONTAINER = "h5py per-sample, container's chunks"
"""h5py over the container as written (its `data` in 8 MiB chunks: each slice reads a whole chunk)."""
ZARR = "zarr per-sample, 128 KiB chunks"
"""zarr over a copy chunked in about one sample (tools/bench/layouts.py)."""
ZARR_CONTAINER = "zarr per-sample, container's chunks"
FOLDER = "DataLoader over files"
POP_PRELOAD = "store population (preload)"


@dataclasses.dataclass
class Measurement:
    """One reader's throughput over one pass, measured on every rank at once.

    Attributes:
        name: what was measured (`h5py per-sample`, `store global prefetch=2`, ...).
        group: `limit`, `baseline`, `store`, `population` or `decode`.
        cache: `cold` (the files' pages were evicted first), `warm`, or `memory` (no file I/O).
        samples: per rank, samples delivered.
        nbytes: per rank, bytes delivered.
        seconds: per rank, wall time of the pass.
        extra: anything else worth keeping (batch size, workers, notes).
    """

    name: str
    group: str
    cache: str
    samples: list[int]
    nbytes: list[int]
    seconds: list[float]
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def ranks(self) -> int:
        return len(self.seconds)

    @property
    def wall(self) -> float:
        """The pass ends when the slowest rank ends."""
        return max(self.seconds) if self.seconds else 0.0

    @property
    def total_samples_per_s(self) -> float:
        return sum(self.samples) / self.wall if self.wall > 0 else 0.0

    @property
    def total_mb_per_s(self) -> float:
        return sum(self.nbytes) / MB / self.wall if self.wall > 0 else 0.0

    @property
    def rank_mb_per_s(self) -> list[float]:
        return [b / MB / s if s > 0 else 0.0 for b, s in zip(self.nbytes, self.seconds)]

    @property
    def rank_samples_per_s(self) -> list[float]:
        return [n / s if s > 0 else 0.0 for n, s in zip(self.samples, self.seconds)]

    @property
    def us_per_sample(self) -> float:
        """Wall time per delivered sample over all ranks, in microseconds (cost per sample)."""
        n = sum(self.samples)
        return self.wall / n * 1e6 if n else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "group": self.group,
            "cache": self.cache,
            "ranks": self.ranks,
            "samples": list(self.samples),
            "bytes": list(self.nbytes),
            "seconds": [round(s, 6) for s in self.seconds],
            "total_samples_per_s": round(self.total_samples_per_s, 2),
            "total_mb_per_s": round(self.total_mb_per_s, 2),
            "rank_samples_per_s": [round(x, 2) for x in self.rank_samples_per_s],
            "rank_mb_per_s": [round(x, 2) for x in self.rank_mb_per_s],
            "us_per_sample": round(self.us_per_sample, 3),
            "extra": dict(self.extra),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Measurement:
        return cls(
            d["name"],
            d["group"],
            d["cache"],
            list(d["samples"]),
            list(d["bytes"]),
            list(d["seconds"]),
            dict(d.get("extra", {})),
        )


def measure(
    comm, name: str, group: str, cache: str, fn: Callable[[], tuple[int, int]], *, repeat: int = 1, **extra
) -> Measurement:
    """Runs `fn` on every rank at once, between barriers, and gathers what each rank timed.

    Args:
        comm: the communicator every rank of the measurement belongs to.
        name, group, cache: labels of the `Measurement`.
        fn: does one pass on this rank; returns (samples, bytes) this rank delivered.
        repeat: passes to run; the one whose slowest rank was fastest is kept (for passes over
            memory, where the first pass also pays one-off costs such as page faults).
        **extra: kept in `Measurement.extra`.
    """
    best = None
    for _ in range(max(1, repeat)):
        comm.Barrier()
        t0 = time.perf_counter()
        samples, nbytes = fn()
        dt = time.perf_counter() - t0
        got = comm.allgather((int(samples), int(nbytes), float(dt)))
        if best is None or max(g[2] for g in got) < max(g[2] for g in best):
            best = got
    assert best is not None  # one pass at least
    if repeat > 1:
        extra["repeat"] = repeat
    return Measurement(
        name, group, cache, [g[0] for g in best], [g[1] for g in best], [g[2] for g in best], dict(extra)
    )


def busy_cores(interval: float = 0.5) -> float | None:
    """How many cores' worth of CPU time the whole machine used over the last `interval` seconds
    (from /proc/stat; None where there is none). Unlike the load average, which trails by a minute,
    this says whether other work is running now: right after a previous run, the 1-minute load is
    still high from our own processes."""

    def sample():
        with open("/proc/stat") as fh:
            fields = [int(x) for x in fh.readline().split()[1:]]
        idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
        return sum(fields) - idle, sum(fields)

    try:
        busy0, total0 = sample()
        time.sleep(interval)
        busy1, total1 = sample()
    except (OSError, ValueError, IndexError):
        return None
    if total1 <= total0:
        return None
    return (busy1 - busy0) / (total1 - total0) * (os.cpu_count() or 1)


def median_pass(passes: list[Measurement]) -> Measurement:
    """The pass whose slowest rank took the median time among repeated passes of one measurement, with
    every pass's total MB/s kept in `extra["passes_MBps"]` (cold file reads on a VM or a shared file
    system move by 2x from one pass to the next; a median of passes taken side by side is what
    can be compared)."""
    if not passes:
        raise ValueError("median_pass needs at least one pass")
    ranked = sorted(passes, key=lambda m: m.wall)
    m = ranked[(len(ranked) - 1) // 2]
    m.extra["passes_MBps"] = [round(p.total_mb_per_s, 1) for p in passes]
    m.extra["repeat"] = len(passes)
    return m


def files_under(paths) -> list[str]:
    """Every regular file named in `paths` or found below the directories among them."""
    out: list[str] = []
    for p in paths:
        p = os.fspath(p)
        if os.path.isdir(p):
            for root, _dirs, names in os.walk(p):
                out.extend(os.path.join(root, n) for n in names)
        elif os.path.exists(p):
            out.append(p)
    return out


def evict(paths) -> int:
    """Drops the page-cache pages of every file under `paths` (files or directories, an image
    folder included), so the next read is cold; files that cannot be opened are left out.
    Returns the bytes advised (dstore.memory.pagecache.evict_files)."""
    # Files served by a `dstore pfs` mount have no page cache (direct I/O): every read already pays the
    # model, and opening each one to advise it would spend the model's operations between passes.
    mps = pfs_mountpoints()
    paths = [p for p in paths if not under_pfs_mount(p, mps)]
    return evict_files(files_under(paths), skip_unopenable=True)


def quiet_barrier(comm, poll: float = 0.01) -> None:
    """A barrier whose waiting ranks sleep between checks: MPICH's blocking calls spin a core while
    they wait, which would take CPU from work one rank does alone (the Mosaic peer)."""
    req = comm.Ibarrier()
    while not req.Test():
        time.sleep(poll)


def evict_on_nodes(comm, paths) -> None:
    """Evicts `paths` once per node (one rank of each machine's real shared-memory node: the page cache
    is per machine), then waits for all."""
    if topology(comm).local_rank == 0:
        evict(paths)
    comm.Barrier()


def rank_split(num_samples: int, rank: int, size: int, seed: int, epoch: int = 0) -> np.ndarray:
    """The indices rank `rank` reads in a shuffled pass, as torch's DistributedSampler splits them:
    one seeded permutation of all samples, every `size`-th element from position `rank`."""
    perm = np.random.default_rng([seed, epoch]).permutation(num_samples)
    return perm[rank::size]


def fmt_rate(mb_per_s: float) -> str:
    """`412 MB/s` or `12.3 GB/s`."""
    return f"{mb_per_s / 1000:.2f} GB/s" if mb_per_s >= 1000 else f"{mb_per_s:.0f} MB/s"


class Progress:
    """The progress display: numbered one-line steps, printed on rank 0 only."""

    def __init__(self, comm, total: int, *, enabled: bool = True):
        self.rank = comm.Get_rank()
        self.total = total
        self.step = 0
        self.enabled = enabled and self.rank == 0
        self.t0 = time.perf_counter()

    def start(self, what: str) -> None:
        self.step += 1
        if self.enabled:
            print(f"[{self.step:2d}/{self.total}] {time.perf_counter() - self.t0:6.1f}s  {what} ...", flush=True)

    def result(self, m: Measurement) -> None:
        if self.enabled:
            sps = f"{m.total_samples_per_s:,.0f} samples/s, " if sum(m.samples) else ""
            print(
                f"        {m.name} ({m.cache}): {sps}{fmt_rate(m.total_mb_per_s)} total over {m.ranks} rank(s)",
                flush=True,
            )

    def note(self, text: str) -> None:
        if self.enabled:
            print(f"        {text}", flush=True)
