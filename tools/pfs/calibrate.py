"""`python -m dstore.tools.pfs.calibrate DIR`: the file system's own overhead against the plain disk, and the
model's delivered latency / iops / bandwidth against what was asked. Prints Markdown tables.

Both sides read the same file with its pages in the page cache (read once first), so the overhead
row is what FUSE and this Python file system add per request, not the disk.
"""

from __future__ import annotations

import argparse
import os
import random
import threading
import time

from dstore.tools.pfs.model import parse_spec
from dstore.tools.pfs.mount import pfs_mount


def _sequential(path: str, block: int = 1 << 20) -> tuple[int, float]:
    t0 = time.perf_counter()
    n = 0
    fd = os.open(path, os.O_RDONLY)
    try:
        while True:
            b = os.read(fd, block)
            if not b:
                break
            n += len(b)
    finally:
        os.close(fd)
    return n, time.perf_counter() - t0


def _random(path: str, count: int, size: int, threads: int = 1, seed: int = 0) -> tuple[int, float]:
    end = os.path.getsize(path) - size

    def work(k, out):
        rng = random.Random(seed + k)
        fd = os.open(path, os.O_RDONLY)
        try:
            for _ in range(count):
                out.append(len(os.pread(fd, size, rng.randrange(0, end))))
        finally:
            os.close(fd)

    out: list[int] = []
    ts = [threading.Thread(target=work, args=(k, out)) for k in range(threads)]
    t0 = time.perf_counter()
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return sum(out), time.perf_counter() - t0


def overhead(src_dir: str, name: str, count: int = 2000) -> list[dict]:
    """Sequential 1 MiB reads of the whole file and `count` random 110 KB preads, disk vs mount (local model)."""
    path = os.path.join(src_dir, name)
    _sequential(path)  # page cache warm on both sides
    rows = []
    with pfs_mount(src_dir, model=parse_spec("local")) as mnt:
        for what, fn in (
            ("sequential 1 MiB reads", lambda p: _sequential(p)),
            ("random 110 KB reads, 1 thread", lambda p: _random(p, count, 110_000)),
            ("random 110 KB reads, 4 threads", lambda p: _random(p, count // 4, 110_000, 4)),
        ):
            nd, td = fn(path)
            nm, tm = fn(mnt.path(name))
            reads = count if "random" in what else max(1, nd // (1 << 20))
            rows.append(
                {
                    "what": what,
                    "disk_MBps": nd / td / 1e6,
                    "fuse_MBps": nm / tm / 1e6,
                    "overhead_us_per_read": (tm - td) / reads * 1e6,
                    "slowdown": tm / td,
                }
            )
    return rows


def caps(src_dir: str, name: str) -> list[dict]:
    """The model's delivered rate against the asked one (4 threads of readers)."""
    path_rel = name
    rows = []
    for spec, n, size, threads, kind in (
        ("pfs:latency=2ms,open_latency=0,iops=unlimited,bandwidth=unlimited", 200, 4096, 1, "latency"),
        ("pfs:latency=0,iops=500,bandwidth=unlimited", 250, 4096, 4, "iops"),
        ("pfs:latency=0,iops=2000,bandwidth=unlimited", 1000, 4096, 4, "iops"),
        ("pfs:latency=0,iops=unlimited,bandwidth=200MB/s", 100, 110_000, 4, "bandwidth"),
    ):
        model = parse_spec(spec)
        with pfs_mount(src_dir, model=model) as mnt:
            nbytes, t = _random(mnt.path(path_rel), n, size, threads)
        reads = n * threads
        if kind == "latency":
            asked, got = model.latency * 1e3, t / reads * 1e3
            unit = "ms per read"
        elif kind == "iops":
            asked, got, unit = model.iops, reads / t, "reads/s"
        else:
            asked, got, unit = model.bandwidth / 1e6, nbytes / t / 1e6, "MB/s"
        rows.append({"spec": spec, "kind": kind, "asked": asked, "measured": got, "unit": unit, "ratio": got / asked})
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m dstore.tools.pfs.calibrate", description=__doc__)
    p.add_argument("dir", help="a directory to create the test file in (on the disk to compare with)")
    p.add_argument("--size-mb", type=int, default=400)
    p.add_argument("--count", type=int, default=2000)
    args = p.parse_args(argv)
    src = os.path.join(args.dir, "pfs-calibrate")
    os.makedirs(src, exist_ok=True)
    name = "data.bin"
    path = os.path.join(src, name)
    if not os.path.exists(path) or os.path.getsize(path) != args.size_mb * 10**6:
        with open(path, "wb") as fh:
            for _ in range(args.size_mb):
                fh.write(os.urandom(10**6))
    print(
        f"| read pattern ({args.size_mb} MB file, page cache warm) | plain disk MB/s | through dstore pfs "
        "(local) MB/s | slowdown | added per read |"
    )
    print("|---|---:|---:|---:|---:|")
    for r in overhead(src, name, args.count):
        print(
            f"| {r['what']} | {r['disk_MBps']:,.0f} | {r['fuse_MBps']:,.0f} | {r['slowdown']:.1f}x | "
            f"{r['overhead_us_per_read']:.0f} us |"
        )
    print()
    print("| model | asked | measured | measured / asked |")
    print("|---|---:|---:|---:|")
    for r in caps(src, name):
        print(f"| `{r['spec']}` | {r['asked']:g} {r['unit']} | {r['measured']:.3g} {r['unit']} | {r['ratio']:.3f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
