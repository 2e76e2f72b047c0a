"""Measures `dstore ingest --max-side S`: container bytes and decode cost per sample against the
originals, how close the pixels a model is fed stay, and the accuracy effect on real handwriting.
Prints Markdown tables and writes JSON.

    python -m dstore.tools.measure.reencode --count 512 --sides 256 384 512 --out /tmp/reencode.json
    python -m dstore.tools.measure.reencode --count 0 --accuracy --digit-side 32 --digit-sides 24 16 8 \\
        --epochs 6 --train-seeds 0 1 2 --out /tmp/reencode-digits.json

Part 1 (`--count` > 0): `count` synthetic ImageNet-like JPEGs (dstore.ingest.synthetic: sides
333..500, ~110 KB) written as an image folder, ingested as they are and with each `--sides` S.
Per container: stored bytes; simplejpeg decode time per sample, one thread, full size and at the
reduced DCT scale the loader uses for a 224x224 input (`decode_image(min_size=(224, 224))`), best
of `--repeat` passes over samples held in memory; and the PSNR between what the model is fed
(resized to 224x224) from the original and from the stored sample.

Part 2 (`--accuracy`): scikit-learn's 1,797 handwritten digits upscaled (bilinear) to
`--digit-side` px PNGs, ingested as they are and with each `--digit-sides` S, each container
trained the same way (`dstore train`, resnet_small at the PNG size, fixed seed, --deterministic);
the held-out accuracy of each (a run per --train-seeds seed). Real strokes at a resolution where S below the model's input
removes detail, so a loss shows where there is one.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any

import numpy as np


def _ingest(source: str, output: str, side: int | None, quality: int | None) -> None:
    from mpi4py import MPI

    from dstore.ingest import ingest

    ingest(
        source,
        output,
        comm=MPI.COMM_SELF,
        progress=False,
        seed=0,
        overwrite=True,
        reencode_max_side=side,
        reencode_quality=quality,
    )


def _samples(path: str) -> tuple[list[bytes], int]:
    from dstore.formats import open_container

    with open_container(path) as c:
        return [bytes(c.sample(j)[0]) for j in range(c.num_samples)], c.total_bytes


def _decode_us(samples: list[bytes], repeat: int, min_size=None) -> float:
    """Best per-sample microseconds of `repeat` single-threaded passes."""
    from dstore.codec.decode import decode_image

    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        for s in samples:
            decode_image(s, channels=3, min_size=min_size)
        best = min(best, time.perf_counter() - t0)
    return best / len(samples) * 1e6


def _fed(data: bytes, size: int = 224) -> np.ndarray:
    """What a model at `size` x `size` is fed: the decoded image resized (bilinear) to it."""
    from PIL import Image

    from dstore.codec.decode import decode_image

    return np.asarray(
        Image.fromarray(decode_image(data, channels=3)).resize((size, size), Image.Resampling.BILINEAR),
        dtype=np.float64,
    )


def _psnr(a: list[bytes], b: list[bytes]) -> float:
    mse = np.mean([np.mean((_fed(x) - _fed(y)) ** 2) for x, y in zip(a, b)])
    return float("inf") if mse == 0 else float(10 * np.log10(255.0**2 / mse))


def measure_sizes(work: str, count: int, sides: list[int], quality: int | None, repeat: int) -> list[dict]:
    from dstore.ingest.synthetic import generate_image_folder

    folder = os.path.join(work, "synthetic")
    generate_image_folder(folder, count, seed=0)
    rows, sets = [], []
    for side in [None, *sides]:
        out = os.path.join(work, f"set-{side or 'orig'}.h5")
        t0 = time.perf_counter()
        _ingest(folder, out, side, quality if side else None)
        ingest_s = time.perf_counter() - t0
        samples, total = _samples(out)
        sets.append(samples)
        rows.append(
            {
                "max_side": side or "original",
                "samples": len(samples),
                "bytes": total,
                "mean_bytes": round(total / len(samples)),
                "ingest_s": round(ingest_s, 2),
                "psnr_at_224": None if side is None else round(_psnr(sets[0], samples), 2),
            }
        )
    # Decode timing in rounds, every container once per round, the best round kept: a change of
    # the machine's load moves all containers alike.
    full = [float("inf")] * len(sets)
    scaled = [float("inf")] * len(sets)
    for _ in range(repeat):
        for k, samples in enumerate(sets):
            full[k] = min(full[k], _decode_us(samples, 1))
            scaled[k] = min(scaled[k], _decode_us(samples, 1, (224, 224)))
    for row, f, s in zip(rows, full, scaled):
        row.update(
            decode_full_us=round(f, 1),
            decode_224_us=round(s, 1),
            decode_speedup=round(full[0] / f, 2),
            bytes_ratio=round(row["bytes"] / rows[0]["bytes"], 3),
        )
        print(json.dumps(row), flush=True)
    return rows


def _digit_folder(root: str, side: int) -> None:
    from PIL import Image

    from dstore.ingest.digits import digits_arrays

    images, labels = digits_arrays()
    for i, (img, label) in enumerate(zip(images, labels)):
        d = os.path.join(root, str(int(label)))
        os.makedirs(d, exist_ok=True)
        Image.fromarray(img[:, :, 0]).resize((side, side), Image.Resampling.BILINEAR).save(
            os.path.join(d, f"{i:04d}.png")
        )


def measure_accuracy(
    work: str, digit_side: int, sides: list[int], quality: int | None, epochs: int, seeds: list[int]
) -> list[dict]:
    folder = os.path.join(work, "digits")
    _digit_folder(folder, digit_side)
    rows = []
    for side in [None, *sides]:
        out = os.path.join(work, f"digits-{side or 'orig'}.h5")
        _ingest(folder, out, side, quality if side else None)
        accuracy = []
        for seed in seeds:
            run_dir = os.path.join(work, f"run-{side or 'orig'}-{seed}")
            cmd = [
                sys.executable,
                "-m",
                "dstore.tools",
                "train",
                out,
                "--model",
                "resnet_small",
                "--epochs",
                str(epochs),
                "--seed",
                str(seed),
                "--deterministic",
                "--no-progress",
                "--run-dir",
                run_dir,
                "--image-size",
                str(digit_side),
                "--channels",
                "1",
            ]
            subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
            records = [json.loads(line) for line in open(os.path.join(run_dir, "metrics.jsonl"))]
            accuracy.append(round(float([r for r in records if "val_accuracy" in r][-1]["val_accuracy"]), 4))
        rows.append(
            {
                "max_side": side or "original",
                "png_side": digit_side,
                "epochs": epochs,
                "seeds": seeds,
                "val_accuracy": accuracy,
                "bytes": _samples(out)[1],
            }
        )
        print(json.dumps(rows[-1]), flush=True)
    return rows


def table(rows: list[dict]) -> str:
    keys = list(rows[0])
    lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    lines += ["| " + " | ".join(str(r[k]) for k in keys) + " |" for r in rows]
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--count", type=int, default=256, help="synthetic JPEGs for part 1 (0: skip it)")
    p.add_argument("--sides", type=int, nargs="+", default=[256, 384, 512])
    p.add_argument("--quality", type=int, default=None, help="JPEG quality of re-encoded images (default 90)")
    p.add_argument("--repeat", type=int, default=5, help="decode rounds; the best is kept")
    p.add_argument("--accuracy", action="store_true", help="part 2: train on digits at each --digit-sides")
    p.add_argument("--digit-side", type=int, default=32)
    p.add_argument("--digit-sides", type=int, nargs="+", default=[24, 16, 8])
    p.add_argument("--epochs", type=int, default=8)
    p.add_argument("--train-seeds", type=int, nargs="+", default=[0], help="a training run per seed and container")
    p.add_argument("--workdir", default=None, help="where the images and containers go (default: a temporary dir)")
    p.add_argument("--out", default=None, help="JSON file for the results")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(dir=args.workdir) as work:
        result: dict[str, Any] = {"load_before": os.getloadavg()}
        if args.count > 0:
            result["sizes"] = measure_sizes(work, args.count, args.sides, args.quality, args.repeat)
            print(table(result["sizes"]))
        if args.accuracy:
            result["accuracy"] = measure_accuracy(
                work, args.digit_side, args.digit_sides, args.quality, args.epochs, args.train_seeds
            )
            print(table(result["accuracy"]))
        result["load_after"] = os.getloadavg()
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
