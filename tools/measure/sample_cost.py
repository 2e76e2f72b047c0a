"""Where a decode worker's time per sample goes: the CPU time of each step of the trainer's per-sample
path, timed in one process over the same samples, in rounds that alternate the steps (load drift
moves them alike); the median round of each is printed as a Markdown table (and JSON with --out).

    python -m dstore.tools.measure.sample_cost syn480.h5 --size 224 --count 200 --rounds 5

Steps: simplejpeg's full decode and its DCT-scaled decode (the loader's before: the smallest M/8
scale at least --size); Pillow's bilinear resize of the DCT-scaled image to --size (the loader's resize
before dstore.codec.resize, with its array conversions); `dstore.codec.resize` of the centred part (the numpy
reference); the transform's `sample_part` (that resize plus the crop with padding); the part a
worker does when the resize runs on the device (`sample_part(defer_resize=True)`: the centred part,
block-averaged past 2x); the seeded generator; the CHW copy into a batch buffer. Then the path as
it is now: simplejpeg at the loader's scale (1/2, 1/4, 1/8 or full), the draws from numpy's
Generator against KeyedDraws, the compiled resize-crop-flip-copy (dstore.codec.kernels) and a worker's
whole path (decode, draws, `sample_into`). A step in a tight loop over the same inputs runs with
warm caches; between two decodes it costs more, which the "whole path" row includes.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import numpy as np
import simplejpeg

from dstore.codec import kernels
from dstore.codec.decode import dct_scale, decode_image
from dstore.formats import open_container
from dstore.loader.draws import KeyedDraws
from dstore.training.augment import ImageTransform, box, default_augmentation


def _samples(path: str, count: int) -> list[bytes]:
    with open_container(path) as r:
        return [bytes(r.sample(i)[0]) for i in range(min(count, r.num_samples))]


def steps(size: int):
    """[(name, fn over one input, which input)]: the inputs are "bytes", "scaled" (the DCT-scaled
    decode) or "pixels" (the sample_part output)."""
    from PIL import Image

    s = (size, size)
    pad, flip = default_augmentation(s)
    tf = ImageTransform(
        size=s, channels=3, mean=(0.45,) * 3, std=(0.25,) * 3, train=True, pad=pad, flip=flip, normalize=False
    )
    from dstore.codec.resize import resize

    def centred(a):
        top, left, bh, bw = box(a.shape[:2], s)
        return resize(a[top : top + bh, left : left + bw], s)

    chw = np.empty((3, size, size), np.uint8)

    def copy(a):
        chw[...] = a.transpose(2, 0, 1)

    return [
        ("simplejpeg full decode", simplejpeg.decode_jpeg, "bytes"),
        (
            "simplejpeg DCT-scaled decode (the loader's)",
            lambda b: simplejpeg.decode_jpeg(b, min_height=size, min_width=size),
            "bytes",
        ),
        (
            "Pillow bilinear resize, with its conversions (before)",
            lambda a: np.array(Image.fromarray(a).resize((size, size), Image.Resampling.BILINEAR)),
            "scaled",
        ),
        ("dstore.codec.resize of the centred part (now)", centred, "scaled"),
        (
            "sample_part: that resize and the crop with padding",
            lambda a: tf.sample_part(a, np.random.default_rng(1)),
            "scaled",
        ),
        (
            "sample_part(defer_resize=True): the worker's part with the resize on the device",
            lambda a: tf.sample_part(a, np.random.default_rng(1), defer_resize=True),
            "scaled",
        ),
        ("the seeded generator", lambda a: np.random.default_rng([0, 1, 2]), "scaled"),
        ("CHW copy into the batch buffer", copy, "pixels"),
        (
            "simplejpeg at the loader's scale now (1/2, 1/4, 1/8 or full: dstore.codec.decode.dct_scale)",
            lambda b: simplejpeg.decode_jpeg(b, "RGB", False, False, *dct_scale(b, s)),
            "bytes",
        ),
        (
            "numpy Generator and the trainer's draws (before)",
            lambda a: tf.draw(np.random.default_rng([0, 1, 2])),
            "loader",
        ),
        ("KeyedDraws and the trainer's draws (now)", lambda a: tf.draw(KeyedDraws(0, 1, 2)), "loader"),
        (
            "dstore.codec.kernels: resize, crop, flip and CHW copy in one pass (now)",
            lambda a: kernels.resize_chw(a, box(a.shape[:2], s), s, chw, shift=(2, -3), flip=True),
            "loader",
        ),
        (
            "a worker's whole path now: decode, draws, sample_into the batch",
            lambda b: tf.sample_into(decode_image(b, min_size=s), KeyedDraws(0, 1, 2), chw, finish=True),
            "bytes",
        ),
    ]


def measure(args) -> dict:
    blobs = _samples(args.container, args.count)
    scaled = [simplejpeg.decode_jpeg(b, min_height=args.size, min_width=args.size) for b in blobs]
    loader = [decode_image(b, min_size=(args.size, args.size)) for b in blobs]
    todo = steps(args.size)
    pixels = [todo[4][1](a)[0] for a in scaled]
    inputs = {"bytes": blobs, "scaled": scaled, "pixels": pixels, "loader": loader}
    if not kernels.available():
        print("dstore.codec.kernels: numba is not installed or DSTORE_NATIVE=0: its rows time the numpy path")
    times = {name: [] for name, _, _ in todo}
    for _ in range(args.rounds):
        for name, fn, which in todo:
            xs = inputs[which]
            c0 = time.process_time()
            for x in xs:
                fn(x)
            times[name].append(1e6 * (time.process_time() - c0) / len(xs))
    shapes = [a.shape[:2] for a in scaled]
    return {
        "args": vars(args),
        "samples": len(blobs),
        "load": os.getloadavg(),
        "scaled_mean_hw": [float(np.mean([s[0] for s in shapes])), float(np.mean([s[1] for s in shapes]))],
        "us_per_sample": {k: {"median": statistics.median(v), "rounds": v} for k, v in times.items()},
    }


def markdown(res: dict) -> str:
    a = res["args"]
    lines = [
        f"{os.path.basename(a['container'])}: {res['samples']} samples, {a['size']}x{a['size']}, the DCT-scaled "
        f"decode {res['scaled_mean_hw'][0]:.0f}x{res['scaled_mean_hw'][1]:.0f} on average; CPU us per sample, "
        f"median of {a['rounds']} alternated rounds; load average after {res['load'][0]:.1f}",
        "",
        "| step | us/sample (median) | rounds |",
        "|---|---:|---|",
    ]
    for k, v in res["us_per_sample"].items():
        lines.append(f"| {k} | {v['median']:,.0f} | {' '.join(f'{x:.0f}' for x in v['rounds'])} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m dstore.tools.measure.sample_cost",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("container", help="a container of JPEGs (e.g. `dstore ingest synthetic x.h5 --count 480`)")
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--count", type=int, default=200, help="samples timed (the first ones)")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--out", default=None, help="JSON output")
    args = p.parse_args(argv)
    res = measure(args)
    text = markdown(res)
    print(text)
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(res, fh, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
