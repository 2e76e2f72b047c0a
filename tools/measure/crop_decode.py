"""The crop-aware decode's options, per core, on the same JPEGs: CPU microseconds per sample (thread
CPU time, tight loops, median of rounds) of simplejpeg's full decode alone, and of the ImageNet
recipe's per-sample path (the sample's plan, the decode, the resize/crop/flip into a batch buffer)
with (a) a full decode then the crop, (b) the DCT scale chosen from the crop (1/2, 1/4, 1/8 where
the crop still covers the output), (c) (b) with libjpeg-turbo's partial decode (dstore.codec._jpegcrop).
Also the mean crop area and how often each DCT scale is taken. Prints a Markdown table.
`--extension PATH` adds a row of (c) with another build of the extension (an older one, say).
The rows take turns within each round (a change of load falls on all of them).

    python -m dstore.tools.measure.crop_decode syn480.h5 --size 224 --count 200 --rounds 5
"""

from __future__ import annotations

import argparse
import collections
import importlib.util
import statistics
import time

import numpy as np
import simplejpeg
from mpi4py import MPI

from dstore.codec import decode, kernels
from dstore.loader.draws import KeyedDraws
from dstore.store.data_store import DataStore
from dstore.training.augment import ImageTransform


def _blobs(path: str, count: int) -> tuple[list[bytes], object]:
    with DataStore(MPI.COMM_SELF, path, batch_size=64, seed=0) as st:
        blobs, it = [], st.epoch(0)
        for b in it:
            blobs += [bytes(s) for s in b.samples]
            if len(blobs) >= count:
                break
        it.close()
        return blobs[:count], st.info


def _us(cases, blobs, rounds: int) -> list[float]:
    """Per case (fn(i, blob), extension module or None), the median over `rounds` of thread CPU
    microseconds per sample of fn over `blobs`, decoding with the case's module (decode.using_extension). The
    cases take turns within each round, so a change of the machine's load falls on all of them."""
    per: list[list[float]] = [[] for _ in cases]
    for _ in range(rounds):
        for k, (fn, module) in enumerate(cases):
            with decode.using_extension(module):
                t0 = time.thread_time()
                for i, b in enumerate(blobs):
                    fn(i, b)
                per[k].append(1e6 * (time.thread_time() - t0) / len(blobs))
    return [statistics.median(p) for p in per]


def measure(args) -> list[tuple[str, float]]:
    blobs, info = _blobs(args.container, args.count)
    size = (args.size, args.size)
    tf = ImageTransform(
        size=size,
        channels=3,
        mean=(0.45,) * 3,
        std=(0.25,) * 3,
        train=True,
        flip=True,
        normalize=False,
        recipe="imagenet",
    )
    kernels.available()
    out = np.empty((3, *size), np.uint8)
    area, scales = [], collections.Counter()
    for i, b in enumerate(blobs):
        h, w = (int(v) for v in simplejpeg.decode_jpeg_header(b)[:2])  # (its stub: SupportsInt)
        box, _ = tf.plan((h, w), KeyedDraws(0, 0, i))
        area.append(box[2] * box[3] / (h * w))
        scales[decode.crop_divisor(box[2:], size)] += 1

    def full_then_crop(i, b):
        img = decode.decode_image(b)
        tf.sample_into(img, KeyedDraws(0, 0, i), out, finish=True)

    def crop_aware(i, b):
        rng = KeyedDraws(0, 0, i)
        img, where, params = decode.decode_crop(b, info, lambda s: tf.plan(s, rng), size, scratch=True)
        tf.sample_into(img, None, out, finish=True, plan=(where, params))

    ext = decode.extension()
    cases = [
        ("simplejpeg full decode alone (the baseline)", lambda i, b: simplejpeg.decode_jpeg(b), ext),
        ("(a) full decode, then the plan's crop resized/flipped into the batch", full_then_crop, ext),
        ("(b) DCT scale from the crop (simplejpeg), then the same", crop_aware, None),
    ]
    if ext is not None:
        cases.append(("(c) (b) with libjpeg-turbo's partial decode (dstore.codec._jpegcrop)", crop_aware, ext))
    cases += [(f"(c) with the extension at {path}", crop_aware, _load(path)) for path in args.extension]
    us = _us([(fn, module) for _, fn, module in cases], blobs, args.rounds)
    rows = [(name, t) for (name, _, _), t in zip(cases, us)]
    print(
        f"{len(blobs)} samples at {size}: mean crop area {np.mean(area):.2f} of the image; DCT divisors "
        f"{dict(sorted(scales.items()))}"
    )
    return rows


def _load(path: str):
    """The extension module built at `path` (a .so file), loaded beside this dstore's own."""
    spec = importlib.util.spec_from_file_location("_jpegcrop", path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"--extension {path}: not a loadable extension module")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m dstore.tools.measure.crop_decode",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("container", help="a container of JPEGs (e.g. `dstore ingest synthetic x.h5 --count 480`)")
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--count", type=int, default=200)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument(
        "--extension",
        action="append",
        default=[],
        metavar="PATH",
        help="also (c) with the build of dstore.codec._jpegcrop at PATH (repeatable)",
    )
    args = p.parse_args(argv)
    rows = measure(args)
    base = rows[0][1]
    print("| per sample | CPU us | per core samples/s | against the decoder alone |\n|---|---:|---:|---:|")
    for name, us in rows:
        print(f"| {name} | {us:,.0f} | {1e6 / us:,.0f} | {base / us:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
