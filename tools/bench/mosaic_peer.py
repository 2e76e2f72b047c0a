"""Mosaic Streaming baseline, run by `dstore bench` inside the separate Mosaic venv (tools/setup_mosaic.sh).

It imports nothing from this project (the Mosaic venv does not have it installed): it reads a JSON
list of (file, label), writes MDS shards of the files' bytes once, then reads them back shuffled with
`StreamingDataset` in one process, cold (pages evicted) and then warm, and prints one JSON object.

Usage: python mosaic_peer.py --samples LIST.json --mds DIR [--seed S] [--batch-size B]
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import time


def evict(root: str) -> None:
    """Drops the page-cache pages of every file under root (os.sync first: dirty pages cannot be dropped)."""
    os.sync()
    for d, _dirs, names in os.walk(root):
        for n in names:
            fd = os.open(os.path.join(d, n), os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def convert(samples: list, out: str) -> float:
    """Writes MDS shards (columns image: bytes, label: int; no compression); returns seconds."""
    # by name, here and in main(): Mosaic's venv holds streaming; the type check's environment does not
    MDSWriter = importlib.import_module("streaming").MDSWriter

    t0 = time.perf_counter()
    tmp = out + ".tmp"
    with MDSWriter(
        out=tmp, columns={"image": "bytes", "label": "int"}, compression=None, size_limit=1 << 26, progress_bar=False
    ) as w:
        for path, label in samples:
            with open(path, "rb") as fh:
                w.write({"image": fh.read(), "label": int(label)})
    os.replace(tmp, out)
    return time.perf_counter() - t0


def read_pass(ds, epoch_label: str) -> dict:
    n = b = 0
    t0 = time.perf_counter()
    for item in ds:
        n += 1
        b += len(item["image"])
    return {"cache": epoch_label, "samples": n, "bytes": b, "seconds": time.perf_counter() - t0}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").partition("\n")[0])
    p.add_argument("--samples", required=True, help="JSON list of [path, label]")
    p.add_argument("--mds", required=True, help="MDS directory (written if absent)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--batch-size", type=int, default=64)
    args = p.parse_args(argv)

    streaming = importlib.import_module("streaming")
    StreamingDataset = streaming.StreamingDataset
    clean_stale_shared_memory = importlib.import_module("streaming.base.util").clean_stale_shared_memory

    with open(args.samples) as fh:
        samples = json.load(fh)
    convert_s = None
    if not os.path.isfile(os.path.join(args.mds, "index.json")):
        convert_s = convert(samples, args.mds)
    clean_stale_shared_memory()
    ds = StreamingDataset(
        local=args.mds, shuffle=True, shuffle_seed=args.seed, batch_size=args.batch_size, predownload=None
    )
    evict(args.mds)
    cold = read_pass(ds, "cold")
    warm = read_pass(ds, "warm")
    mds_bytes = sum(os.path.getsize(os.path.join(d, n)) for d, _, ns in os.walk(args.mds) for n in ns)
    print(
        json.dumps(
            {
                "streaming_version": streaming.__version__,
                "convert_seconds": convert_s,
                "mds_bytes": mds_bytes,
                "processes": 1,
                "passes": [cold, warm],
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
