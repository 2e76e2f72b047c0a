"""The ImageNet recipe's two resize filters against torchvision v2, on the JPEGs of a container: per
filter (`fast`, `torchvision`) and transform (training: random resized crop + flip; evaluation:
Resize(size*256/224) + CenterCrop(size)), the absolute difference in levels from torchvision's
pixels (mean over the images of each image's mean, the largest image mean, the largest single
value), and the CPU microseconds per sample of the whole per-sample path (plan, decode_crop,
resize/flip into the batch; thread CPU time, tight loops, median of rounds, the four rows taking
turns). torchvision's pixels are computed with torch (its tensor path, `interpolate(mode="bilinear",
antialias=True)` on the uint8 image, the crop and resize placed as torchvision places them) and
with Pillow (its PIL path, `resize(BILINEAR)`). Where torchvision itself imports (not beside this
project's CPU torch; on the GPU machine it does), also against torchvision v2's own functions
(`resized_crop` + `horizontal_flip`; `resize` + `center_crop`) on the uint8 tensor, on the CPU and,
with CUDA, on the GPU: the reference the torch path stands in for. Prints a Markdown table.

    python -m dstore.tools.measure.resize_fidelity photos.h5 --size 224 --rounds 5
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import numpy as np

from dstore.codec import antialias, decode, kernels
from dstore.loader.draws import KeyedDraws
from dstore.tools.measure.crop_decode import _blobs
from dstore.training.augment import ImageTransform


def _torch(img: np.ndarray, size) -> np.ndarray:
    import torch

    x = torch.from_numpy(np.ascontiguousarray(img)).permute(2, 0, 1)[None]
    y = torch.nn.functional.interpolate(x, size=tuple(size), mode="bilinear", antialias=True, align_corners=False)
    return y[0].permute(1, 2, 0).numpy()


def _pil(img: np.ndarray, size) -> np.ndarray:
    from PIL import Image

    return np.asarray(Image.fromarray(np.ascontiguousarray(img)).resize((size[1], size[0]), Image.Resampling.BILINEAR))


def torchvision_v2():
    """torchvision.transforms.v2.functional, or None where torchvision does not import."""
    try:
        from torchvision.transforms.v2 import functional  # pyright: ignore[reportMissingImports]: not a dependency
    except (ImportError, RuntimeError, AttributeError, OSError):  # absent, or built for another torch
        return None
    return functional


def _torchvision(img: np.ndarray, train: bool, box, flip: bool, size: int, device: str) -> np.ndarray:
    """torchvision v2's own pixels (uint8 tensor path, on `device`): what the torch path stands in for."""
    import torch

    f = torchvision_v2()
    assert f is not None
    x = torch.from_numpy(np.ascontiguousarray(img)).permute(2, 0, 1).to(device)
    if train:
        t, left, h, w = box
        y = f.resized_crop(x, t, left, h, w, [size, size], antialias=True)
        y = f.horizontal_flip(y) if flip else y
    else:
        y = f.center_crop(f.resize(x, [int(size * 256 / 224)], antialias=True), [size, size])
    return y.permute(1, 2, 0).cpu().numpy()


def reference(img: np.ndarray, train: bool, box, flip: bool, size: int, resize) -> np.ndarray:
    """torchvision's pixels of the full decode `img`: resized_crop of `box` (+ flip), or Resize +
    CenterCrop, each resize by `resize` (_torch or _pil)."""
    if train:
        t, left, h, w = box
        out = resize(img[t : t + h, left : left + w], (size, size))
        return out[:, ::-1] if flip else out
    (rh, rw), (t, left) = antialias.centre_window(img.shape[:2], (size, size))
    out = resize(img, (rh, rw)) if (rh, rw) != img.shape[:2] else img
    return out[t : t + size, left : left + size]


def measure(args) -> list[tuple[str, str, float, float, int, float, float, list[str]]]:
    blobs, info = _blobs(args.container, args.count)
    common: dict[str, Any] = dict(
        size=(args.size, args.size), channels=3, mean=(0.45,) * 3, std=(0.25,) * 3, normalize=False, recipe="imagenet"
    )
    kernels.available()
    out = np.empty((3, args.size, args.size), np.uint8)
    cases = [
        (f, t, ImageTransform(train=t, flip=t, resize=f, **common))
        for f in ("fast", "torchvision")
        for t in (True, False)
    ]
    import torch

    devices = (["cpu"] + (["cuda"] if torch.cuda.is_available() else [])) if torchvision_v2() else []
    diffs = {(f, t): ([], [], 0, []) for f, t, _ in cases}
    own: dict[tuple[str, bool, str], tuple[list[float], list[int]]] = {
        (f, t, d): ([], []) for f, t, _ in cases for d in devices
    }
    for i, b in enumerate(blobs):
        full = decode.decode_image(b)
        for f, t, tf in cases:

            def plan(s, tf=tf, i=i):
                return tf.plan(s, KeyedDraws(0, 0, i))

            arr, where, params = decode.decode_crop(b, info, plan, decode.crop_size(tf))
            got = tf.pixels(arr, plan=(where, params)).astype(int)
            box, drawn = plan(full.shape[:2])
            means, maxes, _, pil = diffs[(f, t)]
            d = np.abs(got - reference(full, t, box, bool(drawn[0]), args.size, _torch))
            means.append(d.mean())
            maxes.append(int(d.max()))
            pil.append(np.abs(got - reference(full, t, box, bool(drawn[0]), args.size, _pil)).mean())
            for d in devices:
                d_own = np.abs(got - _torchvision(full, t, box, bool(drawn[0]), args.size, d).astype(int))
                own[(f, t, d)][0].append(float(d_own.mean()))
                own[(f, t, d)][1].append(int(d_own.max()))

    def path(tf):
        def fn(i, b):
            rng = KeyedDraws(0, 0, i)
            img, where, params = decode.decode_crop(
                b, info, lambda s: tf.plan(s, rng), decode.crop_size(tf), scratch=True
            )
            tf.sample_into(img, None, out, finish=True, plan=(where, params))

        return fn

    per: list[list[float]] = [[] for _ in cases]
    for _ in range(args.rounds):
        for k, (_, _, tf) in enumerate(cases):
            fn = path(tf)
            t0 = time.thread_time()
            for i, b in enumerate(blobs):
                fn(i, b)
            per[k].append(1e6 * (time.thread_time() - t0) / len(blobs))
    rows = []
    for k, (f, t, _) in enumerate(cases):
        means, maxes, _, pil = diffs[(f, t)]
        vs_own = []
        for d in devices:
            own_means, own_maxes = own[(f, t, d)]
            vs_own.append(f"{np.mean(own_means):.2f} / {max(own_maxes)}")
        rows.append(
            (
                f,
                "training" if t else "evaluation",
                float(np.mean(means)),
                float(np.max(means)),
                max(maxes),
                float(np.mean(pil)),
                statistics.median(per[k]),
                vs_own,
            )
        )
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m dstore.tools.measure.resize_fidelity",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("container", help="a container of JPEG photos")
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--count", type=int, default=100)
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args(argv)
    rows = measure(args)
    own = ["torchvision's own (CPU)", "torchvision's own (CUDA)"][: len(rows[0][-1])]
    print(
        "| resize | transform | vs torch: mean of image means | largest image mean | largest value | vs Pillow: mean | "
        + "".join(f"vs {o}: mean / largest | " for o in own)
        + "CPU us/sample | samples/s per core |\n|---|---|---:|---:|---:|---:|"
        + "---:|" * len(own)
        + "---:|---:|"
    )
    for f, t, mean, worst, top, pil, us, vs_own in rows:
        print(
            f"| {f} | {t} | {mean:.2f} | {worst:.2f} | {top} | {pil:.2f} | "
            + "".join(f"{v} | " for v in vs_own)
            + f"{us:,.0f} | {1e6 / us:,.0f} |"
        )
    if not own:
        print("(torchvision does not import here: no column against torchvision's own functions)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
