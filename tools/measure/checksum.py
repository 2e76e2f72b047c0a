"""What checking every byte read from storage costs: per sample, the CRC32 check the store makes
(dstore.formats.integrity.SampleChecks, one CRC32 per sample) against decoding the same sample
(dstore.codec.decode.decode_sample), and a tiered store's epoch with and without the check. One rank;
prints a table and writes JSON (docs/reliability.md, "What the checks cost").

    python -m dstore.tools.measure.checksum syn.h5 --samples 800 --repeat 5

The per-sample figures are medians over `--repeat` passes over the first `--samples` samples, read
once into memory first (what is timed is the CPU work, not the read). The epoch figures are the
median epoch time of a store whose budget keeps about `--resident` of the data resident (the rest
read from the page-cached file in each epoch), with the check on and off (alternately, `--epochs`
each, the first dropped).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np
from mpi4py import MPI

from dstore.codec.decode import decode_sample
from dstore.formats import integrity, open_container
from dstore.store.data_store import DataStore


def per_sample(path: str, count: int, repeat: int) -> dict:
    """Median seconds per sample of the CRC32 check and of decoding, over the first `count` samples."""
    with open_container(path) as r:
        n = min(count, r.num_samples)
        buf = r.read_range(0, n)
        checks = integrity.SampleChecks(r.offsets[: n + 1], r.checksums[:n])
        samples = [buf[int(r.offsets[i]) : int(r.offsets[i + 1])] for i in range(n)]
        info = r.info
    crc, dec = [], []
    for _ in range(repeat):
        t0 = time.perf_counter()
        checks.run(buf, 0, n)
        crc.append((time.perf_counter() - t0) / n)
        t0 = time.perf_counter()
        for s in samples:
            decode_sample(s, info)
        dec.append((time.perf_counter() - t0) / n)
    mean_bytes = buf.size / n
    c, d = statistics.median(crc), statistics.median(dec)
    return {
        "samples": n,
        "mean_bytes": mean_bytes,
        "crc_us": c * 1e6,
        "decode_us": d * 1e6,
        "crc_GBps": mean_bytes / c / 1e9,
        "crc_over_decode": c / d,
    }


def tiered_epochs(path: str, epochs: int, batch_size: int, checked: bool, resident: float) -> float:
    """Median epoch seconds of a tiered store (about `resident` of the bytes resident), its reads
    checked or not."""
    probe = DataStore(MPI.COMM_SELF, path, batch_size=batch_size)
    budget = probe.tier_overhead() + int(resident * int(probe.layout.nbytes.max()))
    probe.close()
    times = []
    with DataStore(MPI.COMM_SELF, path, batch_size=batch_size, memory_budget=budget) as st:
        if st.tier["storage_bytes"] == 0:
            raise SystemExit(f"the store is not tiered (budget {budget} bytes): lower --resident")
        if not checked:
            assert st.windows is not None  # populated on entry
            st.windows.checks = None  # measurement only: the epoch's storage reads go unchecked
        for e in range(epochs):
            t0 = time.perf_counter()
            for _ in st.epoch(e):
                pass
            times.append(time.perf_counter() - t0)
    return statistics.median(times[1:] if len(times) > 1 else times)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").partition("\n")[0])
    p.add_argument("container")
    p.add_argument("--samples", type=int, default=800, help="samples timed per pass")
    p.add_argument("--repeat", type=int, default=5, help="passes (median kept)")
    p.add_argument("--epochs", type=int, default=4, help="tiered store epochs per setting (first dropped)")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--resident", type=float, default=0.3, help="fraction of the bytes the tiered store keeps")
    p.add_argument("--out", default=None, help="write the figures as JSON here")
    args = p.parse_args(argv)
    row = per_sample(args.container, args.samples, args.repeat)
    on = tiered_epochs(args.container, args.epochs, args.batch_size, True, args.resident)
    off = tiered_epochs(args.container, args.epochs, args.batch_size, False, args.resident)
    row.update(epoch_checked_s=on, epoch_unchecked_s=off)
    print(
        f"| samples | mean bytes | CRC32 us/sample | decode us/sample | CRC GB/s | CRC / decode | "
        f"tiered epoch checked s | unchecked s |\n|---|---|---|---|---|---|---|---|\n"
        f"| {row['samples']} | {row['mean_bytes']:.0f} | {row['crc_us']:.1f} | {row['decode_us']:.1f} | "
        f"{row['crc_GBps']:.2f} | {100 * row['crc_over_decode']:.1f}% | {on:.3f} | {off:.3f} |"
    )
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"container": args.container, **row, "numpy": np.__version__}, f, indent=1)


if __name__ == "__main__":
    main()
