"""NVIDIA DALI's CPU pipeline as a peer, run inside DALI's own venv (tools/setup_dali.sh).

It imports nothing from this project (DALI's venv does not have it): it loads the JPEGs' bytes
(BLOB.npy: uint8, every sample back to back; OFFSETS.npy: int64[N+1]) into memory, and feeds them
to a CPU pipeline (`device_id=None`: no GPU used or needed) through `external_source`, batch by
batch, in a new seeded order each epoch. Why from memory and not `fn.readers.file`: dstore's loader
decodes from its windows in memory, so both sides start from encoded bytes already in RAM and
neither pays an open or a read per sample; what is compared is the decode and the augmentation.

Recipes (ImageNet's usual training pipeline, and the plain one dstore's loader runs today):
    imagenet: decoders.image_random_crop (ROI decode; area 0.08-1, aspect 3/4-4/3) -> resize SxS ->
              crop_mirror_normalize (flip p=0.5, CHW, uint8 or float normalised)
    plain:    decoders.image (full decode) -> resize SxS -> crop_mirror_normalize (CHW uint8, no flip)

Prints one JSON object: DALI's version, and per timed epoch the samples, the seconds and this
process's CPU seconds (getrusage: DALI's threads and the feeding thread, all of its work).

Usage: python dali_peer.py --blob B.npy --offsets O.npy --recipe imagenet --threads 2 --batch-size 64
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time

import numpy as np

MEAN = [0.485 * 255, 0.456 * 255, 0.406 * 255]
STD = [0.229 * 255, 0.224 * 255, 0.225 * 255]


def cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


class Feed:
    """The batches of one epoch after another, each epoch a seeded permutation of all samples
    (the last, short batch included), as external_source's batch-mode callable."""

    def __init__(self, samples: list, batch_size: int, seed: int):
        self.samples, self.batch_size, self.seed = samples, batch_size, seed
        self.n = len(samples)
        self.per_epoch = -(-self.n // batch_size)

    def __call__(self, info):
        epoch, step = divmod(info.iteration, self.per_epoch)
        order = np.random.default_rng([self.seed, epoch]).permutation(self.n)
        ids = order[step * self.batch_size : (step + 1) * self.batch_size]
        return [self.samples[i] for i in ids]


def build(args, samples: list):
    from nvidia.dali import fn, pipeline_def, types  # pyright: ignore[reportMissingImports] - DALI's own interpreter

    feed = Feed(samples, args.batch_size, args.seed)

    @pipeline_def(
        batch_size=args.batch_size, num_threads=args.threads, device_id=None, seed=args.seed, prefetch_queue_depth=2
    )
    def pipe():
        jpegs = fn.external_source(source=feed, batch=True, batch_info=True, dtype=types.UINT8, ndim=1)
        if args.recipe == "imagenet":
            images = fn.decoders.image_random_crop(
                jpegs,
                device="cpu",
                output_type=types.RGB,
                random_area=[0.08, 1.0],
                random_aspect_ratio=[3 / 4, 4 / 3],
                num_attempts=100,
            )
            mirror = fn.random.coin_flip(probability=0.5)
        else:
            images = fn.decoders.image(jpegs, device="cpu", output_type=types.RGB)
            mirror = 0
        images = fn.resize(images, resize_x=args.size, resize_y=args.size)
        if args.dtype == "float":
            return fn.crop_mirror_normalize(
                images, dtype=types.FLOAT, output_layout="CHW", mean=MEAN, std=STD, mirror=mirror
            )
        return fn.crop_mirror_normalize(images, dtype=types.UINT8, output_layout="CHW", mirror=mirror)

    p = pipe()
    p.build()
    return p, feed


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--blob", required=True)
    ap.add_argument("--offsets", required=True)
    ap.add_argument("--recipe", choices=("plain", "imagenet"), default="plain")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--dtype", choices=("uint8", "float"), default="uint8")
    ap.add_argument("--epochs", type=int, default=3, help="timed epochs")
    ap.add_argument("--warmup", type=int, default=1, help="untimed epochs first")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    import nvidia.dali  # pyright: ignore[reportMissingImports] - DALI's own interpreter

    data = np.load(args.blob)
    offsets = np.load(args.offsets)
    samples = [data[offsets[i] : offsets[i + 1]] for i in range(offsets.size - 1)]
    p, feed = build(args, samples)
    shape = None
    epochs = []
    for e in range(args.warmup + args.epochs):
        n, t0, c0 = 0, time.perf_counter(), cpu()
        for _ in range(feed.per_epoch):
            (out,) = p.run()
            n += len(out)
            if shape is None:
                shape = list(out.as_array().shape[1:]) if out.is_dense_tensor() else None
        if e >= args.warmup:
            epochs.append({"samples": n, "seconds": time.perf_counter() - t0, "cpu_seconds": cpu() - c0})
    json.dump(
        {
            "dali": nvidia.dali.__version__,
            "recipe": args.recipe,
            "threads": args.threads,
            "dtype": args.dtype,
            "batch_size": args.batch_size,
            "sample_shape": shape,
            "epochs": epochs,
        },
        sys.stdout,
    )
    print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
