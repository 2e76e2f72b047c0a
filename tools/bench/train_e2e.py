"""`python -m dstore.tools.bench.train_e2e CONTAINER`: `mpiexec -n R dstore train` end to end on local disk and
through `dstore pfs` models, with the store and the per-sample baselines: `direct` (samples read from the
container) and `files` (`--loaders store,direct,files`: samples read from the image files the container
was ingested from, as a DataLoader over an image folder does; the folder must lie beside the container,
so that one mount serves both), and the store's peers `webdataset` and `litdata` (`--loaders store
webdataset litdata`: `dstore train --loader webdataset|litdata`, dstore.training.peers, reading
copies of the container that this tool writes in `peers/` beside it before it mounts anything; a peer
that is not installed is skipped with the reason, as `dstore bench --peers` skips it).

For each storage rung and loader it runs a real training job on the container (through a fresh mount
of the container's directory for a pfs rung) and reads the job's metrics.jsonl: steady-state
samples/s is the mean over the epochs after the first, and the store's population (before epoch 0)
is reported apart. Writes OUT/train-e2e.{json,md}. Run it as one process (it launches mpiexec).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time

from dstore.formats import open_container
from dstore.tools.pfs.model import parse_spec
from dstore.tools.pfs.mount import pfs_mount
from dstore.training.config import LOADERS, TrainConfig
from dstore.training.peers import PEER_LOADERS, copies_dir

DEFAULT_RUNGS = ("local", "pfs:latency=2ms,iops=2000", "pfs:latency=8ms,iops=2000")


def _mpiexec() -> str:
    here = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    return here if os.path.exists(here) else "mpiexec"


def run_one(path: str, loader: str, run_dir: str, *, ranks: int, epochs: int, extra: list[str], timeout: float) -> dict:
    cmd = [
        _mpiexec(),
        "-n",
        str(ranks),
        sys.executable,
        "-m",
        "dstore.tools",
        "train",
        path,
        "--loader",
        loader,
        "--epochs",
        str(epochs),
        "--run-dir",
        run_dir,
        "--no-progress",
        *extra,
    ]
    t0 = time.perf_counter()
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    wall = time.perf_counter() - t0
    if res.returncode != 0:
        raise RuntimeError(f"{' '.join(map(shlex.quote, cmd))} failed ({res.returncode}):\n{res.stdout}\n{res.stderr}")
    epochs_rec, io = [], []
    with open(os.path.join(run_dir, "metrics.jsonl")) as fh:
        for line in fh:
            rec = json.loads(line)
            if "epoch" in rec and "train_samples_per_s" in rec:
                epochs_rec.append(rec)
            if rec.get("io_stats"):
                io = rec["io_stats"]
    rates = [r["train_samples_per_s"] for r in epochs_rec]
    steady = rates[1:] or rates
    pop = max((s.get("population_seconds") or 0.0) for s in io) if io else 0.0
    return {
        "loader": loader,
        "command": " ".join(map(shlex.quote, cmd)),
        "job_wall_seconds": wall,
        "epoch_samples_per_s": rates,
        "steady_samples_per_s": sum(steady) / len(steady),
        "data_wait_frac": [r.get("train_data_wait_frac") for r in epochs_rec],
        "population_seconds": pop,
        "log_tail": res.stdout.strip().splitlines()[-4:],
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m dstore.tools.bench.train_e2e", description=__doc__)
    p.add_argument("container", help="an HDF5 container (e.g. the bench's DATA_DIR/set-2048-s0.h5)")
    p.add_argument("--rungs", nargs="+", default=list(DEFAULT_RUNGS), help="storage specs: local or pfs:...")
    p.add_argument(
        "--loaders",
        nargs="+",
        default=["store,direct"],
        help="store, direct, files, webdataset, litdata (space- or comma-separated)",
    )
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--out", default="bench-out/train-e2e", help="directory for the runs and train-e2e.json/.md")
    p.add_argument("--timeout", type=float, default=900)
    p.add_argument("--from-json", action="store_true", help="only rewrite train-e2e.md from OUT/train-e2e.json")
    p.add_argument("extra", nargs="*", help="after --: more `dstore train` options")
    argv = sys.argv[1:] if argv is None else list(argv)
    # argparse binds the empty `extra` together with `container`, so everything after "--" is split off first
    cut = argv.index("--") if "--" in argv else len(argv)
    args = p.parse_args(argv[:cut])
    args.extra = args.extra + argv[cut + 1 :]
    args.loaders = [x for item in args.loaders for x in item.split(",") if x]
    unknown = sorted(set(args.loaders) - set(LOADERS))
    if unknown:
        p.error(f"--loaders {' '.join(unknown)}: each is one of {', '.join(LOADERS)}")
    for spec in args.rungs:
        if spec != "local":
            parse_spec(spec)
    if args.from_json:
        with open(os.path.join(args.out, "train-e2e.json")) as fh:
            md = markdown(json.load(fh)["rows"], args)
        with open(os.path.join(args.out, "train-e2e.md"), "w") as fh:
            fh.write(md)
        print(md)
        return 0
    src_dir, name = os.path.split(os.path.realpath(args.container))
    os.makedirs(args.out, exist_ok=True)
    skipped = _peer_copies(args, os.path.join(src_dir, name))
    rows = []
    for spec in args.rungs:
        for loader in args.loaders:
            if loader in skipped:
                continue
            run_dir = os.path.join(args.out, f"{len(rows):02d}-{loader}")
            stats = None  # the mount's, through pfs
            print(f"== {spec}, --loader {loader}", flush=True)
            if loader in PEER_LOADERS:  # a peer's failure is its row's result, not the comparison's end
                row = _peer_row(args, spec, loader, run_dir, os.path.join(src_dir, name))
            elif spec == "local":
                row = run_one(
                    os.path.join(src_dir, name),
                    loader,
                    run_dir,
                    ranks=args.ranks,
                    epochs=args.epochs,
                    extra=args.extra,
                    timeout=args.timeout,
                )
                stats = None
            else:
                with pfs_mount(src_dir, model=parse_spec(spec)) as mnt:
                    extra = list(args.extra)
                    if loader == "files":  # the image folder through the same mount
                        extra += ["--files-root", mnt.path(_folder_beside(args.container, src_dir))]
                    row = run_one(
                        mnt.path(name),
                        loader,
                        run_dir,
                        ranks=args.ranks,
                        epochs=args.epochs,
                        extra=extra,
                        timeout=args.timeout,
                    )
                stats = mnt.stats
            if loader in PEER_LOADERS:
                rows.append(row)
                if "error" in row:
                    print(f"   failed: {row['error']}", flush=True)
                    continue
            else:
                row.update(spec=spec, mount_stats=stats)
                rows.append(row)
            print(
                f"   steady {row['steady_samples_per_s']:.0f} samples/s (epochs: "
                f"{', '.join(f'{r:.0f}' for r in row['epoch_samples_per_s'])}), population "
                f"{row['population_seconds']:.2f} s",
                flush=True,
            )
    md = markdown(rows, args) + "".join(f"\nSkipped --loader {m}: {why}\n" for m, why in skipped.items())
    with open(os.path.join(args.out, "train-e2e.json"), "w") as fh:
        json.dump({"command": " ".join(map(shlex.quote, sys.argv)), "rows": rows, "skipped": skipped}, fh, indent=1)
    with open(os.path.join(args.out, "train-e2e.md"), "w") as fh:
        fh.write(md)
    print(md)
    return 0


def _peer_row(args, spec: str, loader: str, run_dir: str, container: str) -> dict:
    """One `dstore train --loader webdataset|litdata` run (LitData through a mount: its posix
    path, LITDATA_POSIX_FAST=0, since FUSE refuses its default's mmap); a failure gives the row
    {"error": its last line} instead of ending the comparison."""
    env = {"LITDATA_POSIX_FAST": "0"} if loader == "litdata" and spec != "local" else {}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        if spec == "local":
            row = run_one(
                container, loader, run_dir, ranks=args.ranks, epochs=args.epochs, extra=args.extra, timeout=args.timeout
            )
            stats = None
        else:
            src_dir, name = os.path.split(container)
            with pfs_mount(src_dir, model=parse_spec(spec)) as mnt:
                row = run_one(
                    mnt.path(name),
                    loader,
                    run_dir,
                    ranks=args.ranks,
                    epochs=args.epochs,
                    extra=list(args.extra),
                    timeout=args.timeout,
                )
            stats = mnt.stats
    except (RuntimeError, subprocess.TimeoutExpired) as exc:
        lines = [x for x in str(exc).splitlines() if x.strip() and "Abort(" not in x]
        row = {"loader": loader, "error": lines[-1] if lines else type(exc).__name__, "mount_stats": None}
        stats = None
    finally:
        for k, v in saved.items():
            os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)
    row.update(spec=spec, mount_stats=stats, posix=bool(env))
    return row


def _peer_copies(args, container: str) -> dict:
    """Writes the copies the peer loaders among args.loaders read (peer_data, in `peers/` beside the
    container, before any mount: a mount is read-only); returns {peer: why} for the peers skipped."""
    from dstore.tools.bench import peer_data, peers

    skipped = {m: why for m in PEER_LOADERS if m in args.loaders and (why := peers.missing(m))}
    wanted = [m for m in PEER_LOADERS if m in args.loaders and m not in skipped]
    for m, why in skipped.items():
        print(f"== skipped --loader {m}: {why}", flush=True)
    if wanted:
        seed = _train_seed(args.extra)
        print(f"== the peers' copies of {container} (seed {seed}) in {copies_dir(container)}", flush=True)
        peer_data.write_copies(container, copies_dir(container), seed=seed, litdata_ok="litdata" in wanted)
    return skipped


def _train_seed(extra: list[str]) -> int:
    """The --seed the `dstore train` runs get (the peers' copies are shuffled with it), else its default."""
    for k, a in enumerate(extra):
        if a == "--seed" and k + 1 < len(extra):
            return int(extra[k + 1])
        if a.startswith("--seed="):
            return int(a.split("=", 1)[1])
    return TrainConfig().seed


def _folder_beside(container: str, src_dir: str) -> str:
    """The image folder `container` was ingested from, relative to `src_dir` (the mounted directory);
    raises SystemExit if it is not below it (a mount of src_dir would not serve it)."""
    with open_container(container) as reader:
        folder = os.path.realpath(reader.info.source or "")
    rel = os.path.relpath(folder, src_dir)
    if rel.startswith("..") or not os.path.isdir(folder):
        raise SystemExit(
            f"--loaders files through a pfs mount: {container} was ingested from {folder!r}, which "
            f"is not a folder below {src_dir} (the mounted directory); put the images beside it"
        )
    return rel


def markdown(rows: list[dict], args) -> str:
    """One line per rung in run order (a rung listed twice, to interleave repeats, gets two lines);
    `store vs local` compares with the mean of the store's local-disk runs."""
    loaders = [x for x in args.loaders if x in {r["loader"] for r in rows}]
    local = [r["steady_samples_per_s"] for r in rows if r["spec"] == "local" and r["loader"] == "store"]
    local_store = sum(local) / len(local) if local else None
    lines = [
        f"`mpiexec -n {args.ranks} dstore train` ({args.epochs} epochs; steady state = mean of epochs 1..), "
        "samples/s (data wait: the share of the step time spent waiting for the batch):",
        "",
        "| storage | "
        + " | ".join(f"--loader {x}" for x in loaders)
        + " | store population | store / best other | store vs store on local disk |",
        "|---|" + "---:|" * (len(loaders) + 3),
    ]

    def cell(r):
        if "error" in r:
            return f"failed: {r['error'][:80]}"
        waits = [w for w in r["data_wait_frac"][1:] if w is not None] or [0.0]
        return f"{r['steady_samples_per_s']:,.0f} ({sum(waits) / len(waits):.0%})"

    for i in range(0, len(rows), len(loaders)):
        group = {r["loader"]: r for r in rows[i : i + len(loaders)]}
        spec = rows[i]["spec"]
        cells = [cell(group[x]) if x in group else "-" for x in loaders]
        store = group.get("store")
        others = [
            group[x]["steady_samples_per_s"] for x in loaders if x != "store" and x in group and "error" not in group[x]
        ]
        ratio = f"{store['steady_samples_per_s'] / max(others):.2f}x" if store and others else "-"
        vs = f"{store['steady_samples_per_s'] / local_store - 1:+.0%}" if store and local_store else "-"
        pop = f"{store['population_seconds']:.2f} s" if store else "-"
        lines.append(f"| {spec} | " + " | ".join(cells) + f" | {pop} | {ratio} | {vs} |")
    if any(r.get("posix") for r in rows):
        lines.append(
            "\nLitData through a mount reads with its posix path (LITDATA_POSIX_FAST=0): FUSE refuses "
            "its default's mmap."
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
