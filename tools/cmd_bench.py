"""`dstore bench`: I/O throughput of the store side by side with the machine's limits and with the readers users use today."""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys

from dstore.errors import ConfigError
from dstore.tools.pfs.model import parse_spec
from dstore.tools.pfs.mount import fuse_available

HELP = (
    "benchmark the store against memcpy/raw RMA/sequential-read limits and against DataLoader-over-files, "
    "h5py, zarr and Mosaic Streaming; writes JSON, Markdown and PNG plots"
)

QUICK = {"count": 192, "growth": "64,192", "batch_size": 32, "train_samples": 96, "cold_repeat": 1}
"""What --quick sets (a smoke test that finishes in seconds; the figures mean little)."""


def _ints(text: str) -> tuple[int, ...]:
    try:
        vals = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of integers") from None
    if any(v < 1 for v in vals):
        raise argparse.ArgumentTypeError(f"{text!r}: every value must be >= 1")
    return vals


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--quick",
        action="store_true",
        help=f"smoke-test size ({QUICK['count']} samples, growth {QUICK['growth']}); for CI",
    )
    p.add_argument("--count", type=int, default=None, help="samples to generate (default 4096; --quick 192)")
    p.add_argument(
        "--mean-kb",
        type=float,
        default=110.0,
        help="mean size of the generated JPEGs in KB (10^3 bytes; default 110, ImageNet-like)",
    )
    p.add_argument(
        "--sides",
        type=_ints,
        default=(333, 500),
        metavar="MIN,MAX",
        help="generated image sides: height and width each uniform in [MIN, MAX] (default 333,500)",
    )
    p.add_argument("--out", default="bench-out", help="directory for results.json, results.md and the plots")
    p.add_argument(
        "--data-dir",
        default=None,
        help="where generated data (image folder, HDF5, Zarr, MDS) is kept and reused (default OUT/data)",
    )
    p.add_argument("--container", default=None, help="benchmark this existing container instead of generating data")
    cache = p.add_argument_group("page cache (default: both)")
    cache.add_argument("--cold", action="store_true", help="only cold runs (files' pages evicted first)")
    cache.add_argument("--warm", action="store_true", help="only warm runs")
    p.add_argument("--batch-size", type=int, default=None, help="GLOBAL batch size (default 64; --quick 32)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workers", type=int, default=2, help="DataLoader worker processes per rank (baselines)")
    p.add_argument("--decode-threads", type=int, default=2, help="StoreLoader decode threads per rank")
    p.add_argument(
        "--decode-size",
        type=int,
        default=224,
        help="edge every decoded image is resized to (StoreLoader `size`; the baselines do the same)",
    )
    p.add_argument(
        "--growth",
        type=_ints,
        default=None,
        help="data-set sizes of the cost-per-sample sweep (default 2048,8192,32768); '' to skip",
    )
    p.add_argument(
        "--compute-factor",
        type=float,
        default=1.25,
        help="training view: compute sleep per step = this x the store's fetch+decode time per step (>= 1)",
    )
    p.add_argument(
        "--train-samples",
        type=int,
        default=None,
        help="samples of the decode pass and the training view, each loader decoding them all "
        "(default: all, 4,096 at the default size; --quick 96; 0: all)",
    )
    p.add_argument(
        "--cold-repeat",
        type=int,
        default=None,
        help="cold sequential reads and cold preload populations, taken alternately, this many times "
        "each; the median pass of each is kept (default 3; --quick 1)",
    )
    p.add_argument("--zarr-limit", type=int, default=None, help="read at most this many samples per rank with zarr")
    p.add_argument("--no-mosaic", action="store_true", help="skip the Mosaic Streaming baseline")
    p.add_argument(
        "--mosaic-venv",
        default=None,
        help="the Mosaic venv (default $DSTORE_MOSAIC_VENV or .cache/venv-mosaic; see tools/setup_mosaic.sh)",
    )
    p.add_argument("--no-plots", action="store_true", help="write JSON and Markdown only")
    p.add_argument(
        "--scaling",
        type=_ints,
        default=None,
        help="run under mpiexec -n K for each K listed (e.g. 1,2,4) into OUT/nK, then --collect them into OUT",
    )
    p.add_argument(
        "--storage",
        default=None,
        metavar="pfs:KEY=VALUE,...",
        help="every reader reads through a temporary `dstore pfs` mount of the data with this model, "
        "e.g. pfs:latency=2ms,iops=2000,bandwidth=1GB/s (any subset; keys latency, open_latency, "
        "iops, bandwidth, jitter; see docs/storage.md)",
    )
    p.add_argument(
        "--storage-sweep",
        nargs="*",
        default=None,
        metavar="SPEC",
        help="instead of the whole bench, the training view on each storage model listed ('local' "
        "or pfs:...; none listed: local, the file system alone, and 0.5/2/8 ms at 2000 ops/s); "
        "writes OUT/storage-sweep.{json,md,png}",
    )
    p.add_argument(
        "--peers",
        nargs="*",
        default=None,
        metavar="SPEC",
        help="instead of the whole bench, the store beside WebDataset and LitData (installed by "
        "bash tools/setup_peers.sh; skipped with the reason otherwise) on each storage model listed "
        "('local' or pfs:...; none listed: local and pfs:latency=2ms,iops=300): first batch, epoch 0, "
        "steady epoch, storage bytes and operations, AU at each --consume rate, shuffle quality; "
        "writes OUT/peers.{json,md}",
    )
    p.add_argument(
        "--no-dali",
        action="store_true",
        help="--peers: skip the decode comparison with NVIDIA DALI's CPU pipeline (its own venv: "
        "bash tools/setup_dali.sh; skipped with the reason where it is missing)",
    )
    p.add_argument(
        "--dali-python",
        default=None,
        help="--peers: DALI's venv python (default $DSTORE_DALI_PYTHON or .cache/venv-dali/bin/python)",
    )
    p.add_argument(
        "--consume",
        type=_ints,
        default=(1500, 3000, 6000),
        metavar="RATE,...",
        help="--peers: consumption rates in samples/s per rank, DLIO style (a sleep of batch/rate per "
        "batch stands for the step, decode skipped: the loaders hand over the stored bytes); "
        "AU = compute / wall per loader at each (default 1500,3000,6000)",
    )
    p.add_argument(
        "--collect",
        nargs="+",
        default=None,
        metavar="RESULTS",
        help="merge results.json files (or their directories) of runs on different rank counts into "
        "OUT/scaling.{json,md,png}, and measure nothing",
    )


def _config(args):
    # here, not at the top (as in every cmd module): it loads torch and MPI, which `dstore --help` must not
    from dstore.tools.bench.runner import BenchConfig

    count = _or_default(args, "count", 4096)
    batch = _or_default(args, "batch_size", 64)
    growth = _growth_or_default(args, (2048, 8192, 32768))
    train = _or_default(args, "train_samples", 0)
    cold_repeat = _or_default(args, "cold_repeat", 3)
    if cold_repeat < 1:
        raise ConfigError(f"--cold-repeat={cold_repeat} must be >= 1")
    _check_image_options(args)
    if count < 2:
        raise ConfigError(f"--count={count} must be >= 2")
    if batch < 1:
        raise ConfigError(f"--batch-size={batch} must be >= 1")
    if args.compute_factor < 1.0:
        raise ConfigError(
            f"--compute-factor={args.compute_factor} must be >= 1 (DLIO: compute at least the loader's time)"
        )
    if args.container and not os.path.exists(args.container):
        raise ConfigError(f"--container={args.container}: no such file or directory")
    storage, sweep = _storage_options(args)
    caches = ("cold", "warm")
    if args.cold != args.warm:
        caches = ("cold",) if args.cold else ("warm",)
    return BenchConfig(
        out=args.out,
        count=count,
        mean_bytes=int(round(args.mean_kb * 1000)),
        sides=(int(args.sides[0]), int(args.sides[1])),
        data_dir=args.data_dir,
        container=args.container,
        batch_size=batch,
        seed=args.seed,
        caches=caches,
        num_workers=args.workers,
        decode_threads=args.decode_threads,
        decode_size=args.decode_size,
        growth=growth,
        compute_factor=args.compute_factor,
        train_samples=train or None,
        cold_repeat=cold_repeat,
        zarr_limit=args.zarr_limit,
        mosaic=not args.no_mosaic,
        mosaic_venv=args.mosaic_venv,
        plots=not args.no_plots,
        storage=storage,
        storage_sweep=sweep,
        peers=None if args.peers is None else tuple(args.peers),
        consume=tuple(args.consume),
        dali=not args.no_dali,
        dali_python=args.dali_python,
        command="dstore bench " + " ".join(shlex.quote(a) for a in sys.argv[1:] if a != "bench"),
    )


def _or_default(args, name: str, full: int) -> int:
    """Option `name` as given; else what --quick sets (QUICK); else `full`, the whole run's default."""
    given = getattr(args, name)
    if given is not None:
        return given
    if not args.quick:
        return full
    return int(QUICK[name])


def _growth_or_default(args, full: tuple[int, ...]) -> tuple[int, ...]:
    """--growth as given; else what --quick sets (QUICK); else `full`."""
    if args.growth is not None:
        return args.growth
    if not args.quick:
        return full
    return _ints(str(QUICK["growth"]))


def _check_image_options(args) -> None:
    """--sides and --mean-kb, and (data to generate) whether JPEGs of these sides can average this size."""
    if len(args.sides) != 2 or not 8 <= args.sides[0] <= args.sides[1]:
        raise ConfigError(f"--sides={','.join(map(str, args.sides))} must be MIN,MAX with 8 <= MIN <= MAX")
    if args.mean_kb <= 0:
        raise ConfigError(f"--mean-kb={args.mean_kb} must be > 0")
    if not args.container:
        # here, not at the top (as in every cmd module): it loads h5py and zarr, which `dstore --help` must not
        from dstore.ingest.synthetic import noise_amplitude

        try:  # before anything is generated: can JPEGs of these sides average this size?
            noise_amplitude(args.mean_kb * 1000, args.sides[0], args.sides[1])
        except ConfigError as exc:
            raise ConfigError(
                f"--mean-kb={args.mean_kb:g} with --sides={args.sides[0]},{args.sides[1]}: {exc}"
            ) from None


def _storage_options(args):
    """(--storage's model or None, --storage-sweep's specs or None), every spec checked, FUSE too if needed."""
    if args.peers is not None:
        for spec in args.peers:
            parse_spec(spec)
        reason = fuse_available() if any(s != "local" for s in (args.peers or ("pfs:",))) else None
        if reason:
            raise ConfigError(f"--peers through pfs needs FUSE: {reason} (list only 'local' to run without it)")
    if args.storage is None and args.storage_sweep is None:
        return None, None
    # here, not at the top (as in every cmd module): it loads torch and MPI, which `dstore --help` must not
    from dstore.tools.bench.storage import DEFAULT_LADDER

    if args.storage is not None and args.storage_sweep is not None:
        raise ConfigError("--storage and --storage-sweep: give one (the sweep sets the storage of each rung)")
    storage = sweep = None
    if args.storage is not None:
        storage = parse_spec(args.storage)
        if storage.is_local and args.storage.strip() == "local":
            storage = None
    else:
        sweep = tuple(args.storage_sweep or ()) or DEFAULT_LADDER  # (not None here: returned above)
        for spec in sweep:
            parse_spec(spec)  # every rung checked before anything runs
    needs_fuse = storage is not None or any(s != "local" for s in (sweep or ()))
    reason = fuse_available() if needs_fuse else None
    if reason:
        raise ConfigError(f"--storage/--storage-sweep need FUSE: {reason}")
    return storage, sweep


def _scaling(args, argv: list[str]) -> int:
    """Runs this command under mpiexec for each rank count, then merges the results."""
    # here, not at the top (as in every cmd module): it loads h5py and matplotlib, which `dstore --help` must not
    from dstore.tools.bench.report import collect

    here = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    mpiexec = here if os.path.exists(here) else "mpiexec"
    data_dir = args.data_dir or os.path.join(args.out, "data")
    rest, skip = [], False
    for a in argv:  # drop --scaling, --out and --data-dir (set per run below)
        if skip:
            skip = False
            continue
        if a in ("--scaling", "--out", "--data-dir"):
            skip = True
            continue
        if a.startswith(("--scaling=", "--out=", "--data-dir=")) or a == "bench":
            continue
        rest.append(a)
    outs = []
    for k in args.scaling:
        out = os.path.join(args.out, f"n{k}")
        cmd = [
            mpiexec,
            "-n",
            str(k),
            sys.executable,
            "-m",
            "dstore.tools",
            "bench",
            *rest,
            "--out",
            out,
            "--data-dir",
            data_dir,
        ]
        print(f"== {' '.join(shlex.quote(c) for c in cmd)}", flush=True)
        code = subprocess.call(cmd)
        if code != 0:
            raise ConfigError(f"the run on {k} rank(s) failed with exit code {code}: {' '.join(cmd)}")
        outs.append(out)
    for p in collect(outs, args.out, plots=not args.no_plots):
        print(f"wrote {p}")
    return 0


def run(args) -> int:
    from mpi4py import MPI

    # here, not at the top (as in every cmd module): it loads torch and MPI, which `dstore --help` must not
    from dstore.tools.bench import report, runner

    comm = MPI.COMM_WORLD
    if args.collect:
        if comm.Get_rank() == 0:
            for p in report.collect(args.collect, args.out, plots=not args.no_plots):
                print(f"wrote {p}")
        return 0
    if args.scaling:
        if comm.Get_size() != 1:
            raise ConfigError("--scaling launches its own mpiexec runs: start it as one process, not under mpiexec")
        return _scaling(args, sys.argv[1:])
    cfg = _config(args)
    if cfg.peers is not None:
        from dstore.tools.bench import peers_run  # here: it loads the peers' libraries where installed

        peers_run.run(comm, cfg)
    elif cfg.storage_sweep is not None:
        runner.run_storage_sweep(comm, cfg)
    else:
        runner.run(comm, cfg)
    return 0
