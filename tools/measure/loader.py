"""Where a training job's input time goes, per loader configuration: decode threads or decode
workers. For each, the loader's samples/s, the rank process's CPU time per delivered sample
(getrusage RUSAGE_SELF: its threads included, its worker processes not), the time per sample the
rank's process holds the GIL (py-spy --gil, sampled in a second pass over the same batches) and so
the per-rank ceiling (1 / GIL time per sample), and the decode workers' own CPU time per sample
(/proc/PID/stat); also the decoder alone on as many cores just before each row: simplejpeg's full
decode (the baseline: loader / decoder is against it) and its DCT-scaled decode to at least the
input size (what the loader decodes), both in threads, and per core: samples per CPU-second of the
loader (rank and workers) against simplejpeg's full decode in one thread, a figure that other
processes on a shared machine lower far less than wall-clock rates; optionally the model alone. One rank;
batches are drained as fast as they come. Prints a Markdown table, writes it (--md) and JSON (--out).

    python -m dstore.tools.measure.loader syn480.h5 --threads 1 2 --workers 1 2 --size 224 --batch-size 64
    python -m dstore.tools.measure.loader syn480.h5 --threads --workers 1 2 --resize-on worker device
    python -m dstore.tools.measure.loader set-4096-s0.h5 --threads 1 4 14 --workers 1 4 14 --batch-size 256 \\
        --device cuda --model resnet_small
    python -m dstore.tools.measure.loader syn480.h5 --recipe plain --threads --workers 1 2 --dali 1 2 --device cpu

With --dali, NVIDIA DALI's CPU pipeline (its own venv: tools/setup_dali.sh; tools/bench/dali.py) runs
the same recipe on the same JPEGs with 1, 2, ... threads, every row of the run pinned to as many
cores as it has threads or workers (taskset / sched_setaffinity), so a row is "N cores' worth";
its CPU column is DALI's whole process, dstore's is the rank's plus its workers'. `--recipe`
names the work: `plain` (decode, resize to --size; dstore's loader with no transform) or
`imagenet` (random-resized crop, area 0.08-1, aspect 3/4-4/3, resize, flip; dstore's side needs
the trainer's `--augment imagenet`, refused with the reason where this version lacks it).

Every row reads the same container through a fresh DataStore on COMM_SELF (population and the
workers' start excluded); a row's figures cover `--epochs` epochs after a warm-up (epochs until the
compiled kernels are loaded, `drain`). The
augmentation is the trainer's (`dstore train`'s training transform: resize, crop with padding,
flip; uint8 out, normalised on the device), or none with --transform none (--recipe plain); with
--transform imagenet (--recipe imagenet) the trainer's `--augment imagenet` (JPEGs decoded only as
far as the crop needs, dstore.codec.decode.decode_crop).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any, cast

import torch
from mpi4py import MPI

from dstore.codec import kernels
from dstore.codec.decode import dct_scale
from dstore.errors import ConfigError
from dstore.loader.store_loader import StoreLoader
from dstore.loader.workers import available_cores
from dstore.store.data_store import DataStore
from dstore.tools.measure import decoder_alone
from dstore.training.augment import ImageTransform, default_augmentation
from dstore.training.models import build_model

SPY_RATE = 250  # py-spy samples per second


def _cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def _cpu_of(pids) -> float:
    """CPU seconds (user + system) the processes `pids` have used, from /proc/PID/stat."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for pid in pids:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        total += (int(fields[11]) + int(fields[12])) / tick
    return total


WARM_SECONDS = 60.0
"""The longest warm-up before a row's timed epochs (see `drain`)."""


def imagenet_transform(size: int):
    """The trainer's `--augment imagenet` training transform at `size` (uint8 out), or ConfigError
    where this version of the trainer has none. The hook for the ImageNet recipe: it asks the
    trainer's own transform builder (training.run.build_transforms) for it, as `dstore train` would."""
    from types import SimpleNamespace

    from dstore.training import config, run

    if "imagenet" not in config.AUGMENTS:
        raise ConfigError(
            f"--recipe imagenet: dstore's loader needs the trainer's `--augment imagenet` transform "
            f"(random-resized crop + flip), which this version does not have (--augment is one of "
            f"{', '.join(config.AUGMENTS)}); use --recipe plain"
        )
    spec = SimpleNamespace(channels=3, mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225))
    try:
        train_tf, _ = run.build_transforms(
            cast(Any, SimpleNamespace(augment="imagenet", resize="fast")), spec, (size, size)
        )
    except (AttributeError, TypeError) as exc:
        raise ConfigError(
            f"--recipe imagenet: the trainer's transform builder (training.run.build_transforms) changed; "
            f"update tools/measure/loader.imagenet_transform ({type(exc).__name__}: {exc})"
        ) from None
    return train_tf


def dstore_transform(args):
    """dstore's per-sample transform for `args.transform` (trainer, none, imagenet)."""
    if args.transform == "none":
        return None
    if args.transform == "imagenet":
        return imagenet_transform(args.size)
    pad, flip = default_augmentation((args.size, args.size))
    return ImageTransform(
        size=(args.size, args.size),
        channels=3,
        mean=(0.45,) * 3,
        std=(0.25,) * 3,
        train=True,
        pad=pad,
        flip=flip,
        normalize=False,
    )


def pinned(count: int | None):
    """A context: this process (and the workers it starts meanwhile) on its first `count` allowed
    cores; None: unchanged."""
    import contextlib

    @contextlib.contextmanager
    def pin():
        if count is None:
            yield None
            return
        before = os.sched_getaffinity(0)
        cores = sorted(before)[:count]
        os.sched_setaffinity(0, cores)
        try:
            yield cores
        finally:
            os.sched_setaffinity(0, before)

    return pin()


def drain(path: str, args, loader_kw: dict, warm=None) -> tuple[int, float, float, float]:
    """(samples, seconds, rank CPU seconds, workers' CPU seconds) over args.epochs whole epochs after
    the warm-up: epochs until the compiled kernels are loaded (at least one: workers started, pages
    touched; at most WARM_SECONDS); `warm()`, if given, runs after the warm-up and its returned
    callable at the end."""
    with (
        DataStore(MPI.COMM_SELF, path, batch_size=args.batch_size, seed=0) as st,
        StoreLoader(st, size=(args.size, args.size), channels=3, **loader_kw) as ld,
    ):
        epoch, deadline = 0, time.monotonic() + WARM_SECONDS
        while True:
            for x, _ in ld.epoch(epoch):
                if x.is_cuda:
                    torch.cuda.synchronize()
            epoch += 1
            if _native(ld) or time.monotonic() > deadline:
                break
        done = warm() if warm is not None else None
        pids = list(ld.workers.pids) if ld.workers is not None else []
        n, t0, c0, w0 = 0, time.perf_counter(), _cpu(), _cpu_of(pids)
        for e in range(epoch, epoch + args.epochs):
            for x, _ in ld.epoch(e):
                if x.is_cuda:
                    torch.cuda.synchronize()
                n += int((~ld.last_pad).sum())
        secs, cpu, wcpu = time.perf_counter() - t0, _cpu() - c0, _cpu_of(pids) - w0
        if done is not None:
            done()
        return n, secs, cpu, wcpu


def _native(loader) -> bool:
    """Whether the loader's per-sample kernels are loaded where it uses them (dstore.codec.kernels): the
    workers' (their last answers), else this process's (waited for)."""
    if loader.workers is not None:
        return loader.workers.native or not kernels.available()
    kernels.available()
    return True


def gil_seconds(path: str, args, loader_kw: dict) -> float | None:
    """GIL-held seconds of this process over the same drain after the warm-up, sampled by
    py-spy --gil (None without py-spy). py-spy is started after the warm-up and given a
    second to attach while the process idles (holding no GIL), then stopped after the last batch."""
    spy = shutil.which("py-spy")
    if spy is None:
        return None
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "gil.txt")

        def start():
            proc = subprocess.Popen(
                [
                    spy,
                    "record",
                    "--gil",
                    "--nonblocking",
                    "--rate",
                    str(SPY_RATE),
                    "--format",
                    "raw",
                    "-o",
                    out,
                    "--pid",
                    str(os.getpid()),
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            time.sleep(1.5)

            def stop():
                proc.send_signal(signal.SIGINT)
                proc.wait(60)

            return stop

        drain(path, args, loader_kw, warm=start)
        if not os.path.exists(out):
            return None
        with open(out) as fh:
            samples = sum(int(line.rsplit(" ", 1)[1]) for line in fh if line.strip())
    return samples / SPY_RATE


def _blobs(path: str, args, count: int) -> list[bytes]:
    """The first `count` samples of epoch 0, as bytes."""
    with DataStore(MPI.COMM_SELF, path, batch_size=args.batch_size, seed=0) as st:
        blobs, it = [], st.epoch(0)
        for b in it:
            blobs += [bytes(s) for s in b.samples]
            if len(blobs) >= count:
                break
        it.close()
    return blobs


def decoder_rate(path: str, args, threads: int, count: int, scaled: bool) -> float:
    """Samples/s of simplejpeg alone in `threads` threads over the first `count` samples
    (decoder_alone.rate: no output kept, the best of two passes): its full decode, or (`scaled`) at
    the DCT scale the loader decodes at (dstore.codec.decode.dct_scale: 1/2, 1/4 or 1/8 where that still
    covers args.size, else full). An earlier version kept every decoded image, so each decode wrote
    fresh pages, which cost it about a fifth of its rate and flattered the loader against it."""
    blobs = _blobs(path, args, count)
    size = (args.size, args.size)
    return decoder_alone.rate(blobs, threads, [dct_scale(b, size) for b in blobs] if scaled else None)


def model_rate(args) -> float:
    """Samples/s of the model's forward, backward and SGD step alone on random input."""
    m = build_model(args.model, 3, 10, (args.size, args.size)).to(args.device)
    opt = torch.optim.SGD(m.parameters(), lr=0.01)
    x = torch.randn(args.batch_size, 3, args.size, args.size, device=args.device)
    if args.channels_last:  # as dstore train --channels-last
        m, x = m.to(memory_format=torch.channels_last), x.contiguous(memory_format=torch.channels_last)  # pyright: ignore[reportCallIssue] - nn.Module.to takes memory_format (torch's stub omits it)
    amp = torch.autocast(
        args.device, dtype=torch.bfloat16 if args.amp == "bf16" else torch.float16, enabled=args.amp != "off"
    )
    y = torch.randint(0, 10, (args.batch_size,), device=args.device)
    sync = torch.cuda.synchronize if args.device == "cuda" else (lambda: None)
    t0 = time.perf_counter()
    for i in range(13):
        if i == 3:
            sync()
            t0 = time.perf_counter()
        opt.zero_grad()
        with amp:
            loss = torch.nn.functional.cross_entropy(m(x), y)
        loss.backward()
        opt.step()
    sync()
    return 10 * args.batch_size / (time.perf_counter() - t0)


def measure(args) -> dict:
    tf = dstore_transform(args) if args.threads or args.workers else None
    gpu = dict(pin_memory=True, device="cuda") if args.device == "cuda" else {}
    one = [("threads", t, None, dict(decode_threads=t)) for t in args.threads]
    one += [("workers", w, r, dict(workers=w, resize_on=r)) for w in args.workers for r in args.resize_on]
    configs = one * args.repeat  # rounds of every row: load drift moves all rows alike
    pin = bool(args.dali) or args.pin
    rows = []
    for kind, count, resize_on, kw in configs:
        kw = dict(kw, transform=tf, **gpu)
        with pinned(count if pin else None):
            # the decoder alone on as many cores, just before the row: on a loaded machine the pair
            # sees about the same share of it
            decoder = decoder_rate(args.container, args, count, args.decoder_samples, scaled=False)
            scaled = decoder_rate(args.container, args, count, args.decoder_samples, scaled=True)
            per_core = decoder_alone.cpu_rate(_blobs(args.container, args, args.decoder_samples))
            n, secs, cpu, wcpu = drain(args.container, args, kw)
            gil = gil_seconds(args.container, args, kw) if args.gil else None
        rows.append(
            {
                "kind": kind,
                "count": count,
                "resize_on": resize_on,
                "samples": n,
                "samples_per_s": n / secs,
                "cpu_us_per_sample": 1e6 * cpu / n,
                "worker_cpu_us_per_sample": 1e6 * wcpu / n,
                "gil_us_per_sample": None if gil is None else 1e6 * gil / n,
                "ceiling_samples_per_s": None if not gil else n / gil,
                "decoder_alone_same_cores": decoder,
                "decoder_dct_scaled_same_cores": scaled,
                # per core: samples per CPU-second, the loader's (rank + workers) and the decoder's
                "loader_per_core": n / (cpu + wcpu),
                "decoder_alone_per_core": per_core,
                "load": os.getloadavg()[0],
            }
        )
        print(rows[-1], flush=True)
    out = {
        "args": vars(args),
        "cores_available": available_cores(),
        "load_before": args.load_before,
        "load_after": os.getloadavg(),
        "rows": rows,
        "pinned": pin,
    }
    if args.dali:
        out["dali"] = dali_rows(args)
    if args.model:
        out["model_alone"] = {
            "model": args.model,
            "device": args.device,
            "amp": args.amp,
            "channels_last": args.channels_last,
            "samples_per_s": model_rate(args),
        }
    return out


def dali_rows(args) -> list[dict]:
    """DALI's rows (tools/bench/dali.py): the recipe with each of args.dali threads, pinned to as many
    cores, over the container's JPEGs; one row with the skip reason where DALI cannot run."""
    from dstore.formats import open_container
    from dstore.tools.bench import dali

    why = dali.missing(args.dali_python)
    if why is not None:
        return [{"error": why}]
    with open_container(args.container) as r, tempfile.TemporaryDirectory() as tmp:
        blob = dali.export([bytes(r.sample(i)[0]) for i in range(r.num_samples)], tmp)
        py = dali.find_python(args.dali_python)
        if py is None:  # dali.missing said it exists
            return [{"error": "DALI's interpreter is gone"}]
        rows = []
        for t in args.dali:
            cores = sorted(os.sched_getaffinity(0))[:t]
            row = dali.run(
                py,
                blob,
                recipe=args.recipe,
                threads=t,
                batch_size=args.batch_size,
                size=args.size,
                epochs=args.epochs,
                dtype=args.dali_dtype,
                cores=cores,
            )
            rows.append({"threads": t, "cores": len(cores), "load": os.getloadavg()[0], **row})
            print(rows[-1], flush=True)
    return rows


def markdown(res: dict) -> str:
    a = res["args"]
    lines = [
        f"{os.path.basename(a['container'])}: batch {a['batch_size']}, {a['size']}x{a['size']}, transform "
        f"{a['transform']}, {a['device']}; load average before {res['load_before'][0]:.1f}, after "
        f"{res['load_after'][0]:.1f}; {res['cores_available']} core(s) available",
        "",
        "| loader | samples/s | rank CPU us/sample | workers' CPU us/sample | rank GIL-held us/sample "
        "| per-rank ceiling samples/s | decoder alone (full), same cores | loader / decoder "
        "| decoder alone (DCT-scaled) | loader / scaled decoder | per core: loader / decoder (CPU time) | load |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in res["rows"]:
        gil = "n/a" if r["gil_us_per_sample"] is None else f"{r['gil_us_per_sample']:,.0f}"
        ceil = "n/a" if not r["ceiling_samples_per_s"] else f"{r['ceiling_samples_per_s']:,.0f}"
        where = f", resize on {r['resize_on']}" if r.get("resize_on") else ""
        lines.append(
            f"| {r['count']} decode {r['kind']}{where} | {r['samples_per_s']:,.0f} | "
            f"{r['cpu_us_per_sample']:,.0f} | {r['worker_cpu_us_per_sample']:,.0f} | "
            f"{gil} | {ceil} | {r['decoder_alone_same_cores']:,.0f} | "
            f"{r['samples_per_s'] / r['decoder_alone_same_cores']:.2f} | "
            f"{r['decoder_dct_scaled_same_cores']:,.0f} | "
            f"{r['samples_per_s'] / r['decoder_dct_scaled_same_cores']:.2f} | "
            f"{r['loader_per_core']:,.0f} / {r['decoder_alone_per_core']:,.0f} = "
            f"{r['loader_per_core'] / r['decoder_alone_per_core']:.2f} | {r['load']:.1f} |"
        )
    lines.append("")
    if res.get("dali"):
        lines += dali_markdown(res)
    if "model_alone" in res:
        m = res["model_alone"]
        lines.append(
            f"the model alone ({m['model']}, forward + backward + step, {m['device']}, amp "
            f"{m.get('amp', 'off')}, channels-last {m.get('channels_last', False)}): "
            f"{m['samples_per_s']:,.0f} samples/s"
        )
    return "\n".join(lines) + "\n"


def dali_markdown(res: dict) -> list[str]:
    """The per-core comparison: dstore's rows beside DALI's, samples/s and all CPU per sample."""
    a = res["args"]
    lines = [
        f"recipe {a['recipe']} ({a['size']}x{a['size']}, batch {a['batch_size']}, DALI output {a['dali_dtype']}); "
        f"every row pinned to as many cores as it has threads or workers",
        "",
        "| loader | cores | samples/s | samples/s per core | all CPU us/sample | load |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for r in res["rows"]:
        cpu = r["cpu_us_per_sample"] + r["worker_cpu_us_per_sample"]
        lines.append(
            f"| dstore, {r['count']} decode {r['kind']} | {r['count']} | {r['samples_per_s']:,.0f} | "
            f"{r['samples_per_s'] / r['count']:,.0f} | {cpu:,.0f} | {r['load']:.1f} |"
        )
    for r in res["dali"]:
        if "error" in r:
            lines.append(f"| DALI: skipped: {r['error']} | | | | | |")
            continue
        lines.append(
            f"| DALI {r['dali']} CPU pipeline, num_threads={r['threads']} | {r['cores']} | "
            f"{r['samples_per_s']:,.0f} | {r['samples_per_s'] / r['cores']:,.0f} | "
            f"{r['cpu_us_per_sample']:,.0f} | {r['load']:.1f} |"
        )
    return lines + [""]


def main(argv=None) -> int:
    try:
        return _main(argv)
    except ConfigError as exc:  # one line, as the dstore CLI's errors
        print(f"measure.loader: error: ConfigError: {exc}", file=sys.stderr)
        return 2


def _main(argv=None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m dstore.tools.measure.loader",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("container", help="a container of JPEGs (e.g. `dstore ingest synthetic x.h5 --count 480`)")
    p.add_argument("--threads", type=int, nargs="*", default=[1, 2], help="decode thread counts")
    p.add_argument("--workers", type=int, nargs="*", default=[1, 2], help="decode worker counts")
    p.add_argument(
        "--resize-on",
        nargs="*",
        default=["worker"],
        choices=("worker", "device", "auto"),
        help="with workers: where the resize and crop run (StoreLoader(resize_on=)); a row each",
    )
    p.add_argument("--repeat", type=int, default=1, help="rounds of every row, alternated")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--epochs", type=int, default=3, help="epochs per row (after the warm-up)")
    p.add_argument("--size", type=int, default=224, help="edge of the resized images")
    p.add_argument(
        "--transform",
        choices=("trainer", "none", "imagenet"),
        default="trainer",
        help="dstore's per-sample transform: the trainer's (--augment auto), none, or --augment imagenet",
    )
    p.add_argument(
        "--recipe",
        choices=("plain", "imagenet"),
        default=None,
        help="the work both sides do (sets --transform: plain = none); needed with --dali",
    )
    p.add_argument(
        "--dali",
        type=int,
        nargs="*",
        default=None,
        metavar="THREADS",
        help="also NVIDIA DALI's CPU pipeline with these num_threads (default 1 2), from its own venv",
    )
    p.add_argument(
        "--dali-python",
        default=None,
        help="DALI's venv python (default $DSTORE_DALI_PYTHON or .cache/venv-dali; tools/setup_dali.sh)",
    )
    p.add_argument(
        "--dali-dtype",
        choices=("uint8", "float"),
        default="uint8",
        help="DALI's crop_mirror_normalize output (dstore's loader hands over uint8)",
    )
    p.add_argument(
        "--pin",
        action="store_true",
        help="pin each row to as many cores as it has threads or workers (always with --dali)",
    )
    p.add_argument("--device", choices=("cpu", "cuda"), default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--model", default=None, help="also time this model alone (e.g. resnet_small)")
    p.add_argument("--amp", choices=("off", "bf16", "fp16"), default="off", help="the model alone under autocast")
    p.add_argument("--channels-last", action="store_true", help="the model alone in channels-last memory format")
    p.add_argument("--no-gil", dest="gil", action="store_false", help="skip the py-spy pass")
    p.add_argument("--decoder-samples", type=int, default=400)
    # under bench-out/ (ignored by git, as `dstore bench --out`'s default): a run's output is never committed
    p.add_argument("--out", default="bench-out/measure-loader.json")
    p.add_argument("--md", default="bench-out/measure-loader.md")
    args = p.parse_args(argv)
    if args.dali is not None and not args.dali:
        args.dali = [1, 2]
    if args.recipe is not None:
        args.transform = "none" if args.recipe == "plain" else "imagenet"
    elif args.dali:
        raise ConfigError(
            "--dali needs --recipe plain or --recipe imagenet: DALI has no pipeline for the trainer's "
            "own transform (crop with padding + flip)"
        )
    args.load_before = os.getloadavg()
    if args.transform == "imagenet" and (args.threads or args.workers):
        imagenet_transform(args.size)  # refused before any row is measured (no dstore rows: DALI's alone)
    res = measure(args)
    text = markdown(res)
    print(text)
    for path in (args.out, args.md):
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(args.out, "w") as fh:
        json.dump(res, fh, indent=1)
    with open(args.md, "w") as fh:
        fh.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
