"""Where a training job's input time goes: the decoder alone, the loader at several thread counts,
with and without the trainer's transform, pinned and delivered on the GPU, and the model alone.
One rank; the loader's batches are drained as fast as they come. Prints a markdown table and
writes JSON (docs/benchmarks.md, "On a GPU node").

    python -m dstore.tools.measure_loader set-4096-s0.h5 --threads 1 4 14 --batch-size 256 --device cuda

Every row reads the same container through a fresh DataStore on COMM_SELF (population excluded);
a row's rate is `--batches` batches after one warm-up batch.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import time

import simplejpeg
import torch
from mpi4py import MPI

from dstore.store import DataStore
from dstore.torch import StoreLoader
from dstore.training.augment import ImageTransform, default_augmentation
from dstore.training.models import build_model


def loader_rate(path: str, args, **kw) -> float:
    """Samples/s of StoreLoader(**kw) over `args.batches` batches (after one), resized to args.size."""
    with DataStore(MPI.COMM_SELF, path, batch_size=args.batch_size, seed=0) as st, \
            StoreLoader(st, size=(args.size, args.size), **kw) as ld:
        it = ld.epoch(0)
        next(it)
        t0, n = time.perf_counter(), 0
        for i, (x, _) in enumerate(it):
            if x.is_cuda:
                torch.cuda.synchronize()
            n += x.shape[0]
            if i + 1 >= args.batches:
                break
        return n / (time.perf_counter() - t0)


def decoder_rate(path: str, args, threads: int, count: int) -> float:
    """Samples/s of simplejpeg alone (DCT-scaled to at least args.size) in `threads` threads."""
    with DataStore(MPI.COMM_SELF, path, batch_size=args.batch_size, seed=0) as st:
        blobs, it = [], st.epoch(0)
        for b in it:
            blobs += [bytes(s) for s in b.samples]
            if len(blobs) >= count:
                break
        it.close()
    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        t0 = time.perf_counter()
        list(pool.map(lambda b: simplejpeg.decode_jpeg(b, min_height=args.size, min_width=args.size), blobs))
        return len(blobs) / (time.perf_counter() - t0)


def model_rate(args) -> float:
    """Samples/s of the model's forward, backward and SGD step alone on random input."""
    m = build_model(args.model, 3, 10, (args.size, args.size)).to(args.device)
    opt = torch.optim.SGD(m.parameters(), lr=0.01)
    x = torch.randn(args.batch_size, 3, args.size, args.size, device=args.device)
    y = torch.randint(0, 10, (args.batch_size,), device=args.device)
    sync = torch.cuda.synchronize if args.device == "cuda" else (lambda: None)
    for i in range(args.batches + 3):
        if i == 3:
            sync()
            t0 = time.perf_counter()
        opt.zero_grad()
        torch.nn.functional.cross_entropy(m(x), y).backward()
        opt.step()
    sync()
    return args.batches * args.batch_size / (time.perf_counter() - t0)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m dstore.tools.measure_loader", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("container", help="a container of JPEGs (e.g. the bench's DATA_DIR/set-4096-s0.h5)")
    p.add_argument("--threads", type=int, nargs="+", default=[1, 4, 14], help="decode thread counts")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--batches", type=int, default=10)
    p.add_argument("--size", type=int, default=224, help="edge of the resized images")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--model", default="resnet_small")
    p.add_argument("--out", default="measure-loader.json")
    args = p.parse_args(argv)
    top = max(args.threads)
    pad, flip = default_augmentation((args.size, args.size))
    common = dict(size=(args.size, args.size), channels=3, mean=(0.45,) * 3, std=(0.25,) * 3, train=True, pad=pad,
                  flip=flip)
    as_float, as_uint8 = ImageTransform(**common), ImageTransform(**common, normalize=False)
    gpu = dict(pin_memory=True, device="cuda") if args.device == "cuda" else {}
    rows = [(f"simplejpeg decode alone, {t} thread(s)", decoder_rate(args.container, args, t, 300 * t))
            for t in sorted({1, top})]
    rows += [(f"StoreLoader, uint8, {t} decode thread(s)", loader_rate(args.container, args, decode_threads=t))
             for t in args.threads]
    rows += [
        (f"StoreLoader + trainer transform, per-sample float32 normalisation, {top} threads"
         + (", pinned, on cuda" if gpu else ""), loader_rate(args.container, args, decode_threads=top,
                                                            transform=as_float, **gpu)),
        (f"StoreLoader + trainer transform, uint8 (normalised on the device), {top} threads"
         + (", pinned, on cuda" if gpu else ""), loader_rate(args.container, args, decode_threads=top,
                                                            transform=as_uint8, **gpu)),
        (f"the model alone ({args.model}, forward + backward + step, {args.device})", model_rate(args)),
    ]
    print(f"batch {args.batch_size}, {args.size}x{args.size}, {args.batches} batches per row\n")
    print("| input pipeline | samples/s |\n|---|---:|")
    for name, rate in rows:
        print(f"| {name} | {rate:,.0f} |")
    with open(args.out, "w") as fh:
        json.dump({"args": vars(args), "rows": [{"name": n, "samples_per_s": r} for n, r in rows]}, fh, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
