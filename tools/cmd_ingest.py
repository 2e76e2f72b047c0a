"""`dstore ingest`: read a data set once and write it as a container, split over the ranks of the job."""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys

HELP = (
    "Ingest a data set (an image folder root/<class>/<file>, a folder with --labels FILE.csv, WebDataset "
    ".tar shards, Parquet files or a Hugging Face datasets directory, CIFAR python batches, a .npy/.npz "
    "file, 'digits' or 'synthetic') into an HDF5 or Zarr container, in a seeded random order. "
    "Run under mpiexec to split the work over ranks."
)


def _source_option(text: str):
    """`KEY=VALUE` for --source-option; VALUE is parsed as int if it looks like one."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"{text!r} is not KEY=VALUE")
    try:
        return key.replace("-", "_"), int(value)
    except ValueError:
        return key.replace("-", "_"), value


def add_arguments(parser) -> None:
    parser.add_argument(
        "source",
        help="image folder, folder with --labels, .tar shard(s) (a file, directory, glob "
        "or {000..009} pattern), .parquet/.arrow file or directory, a dstore "
        "container (re-ingested), CIFAR batch dir or file, .npy/.npz, 'digits' or "
        "'synthetic'; shards, Parquet, an image folder or a --labels folder may be "
        "in object storage: s3://bucket/prefix (credentials and endpoint from the "
        "AWS_* environment; pip install 'dstore-mpi[object]')",
    )
    parser.add_argument(
        "output",
        nargs="?",
        default=None,
        help="container path (x.h5, x.zarr); with --shards > 1 a directory or x.json (not with "
        "--append-to, which names the container written)",
    )
    parser.add_argument(
        "--format",
        dest="fmt",
        choices=("hdf5", "zarr"),
        default=None,
        help="container backend (default: zarr if OUTPUT ends in .zarr, else hdf5)",
    )
    parser.add_argument(
        "--shards",
        type=int,
        default=1,
        help="number of shard files, written in parallel (best a multiple or divisor of the ranks)",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the write order")
    parser.add_argument("--keep-order", action="store_true", help="write in source order, not a seeded random order")
    parser.add_argument(
        "--stratify",
        action="store_true",
        help="a seeded random order with every class spread evenly: any tail `dstore train` holds "
        "out is then a stratified random choice",
    )
    parser.add_argument(
        "--encoding",
        choices=("jpeg", "png", "image", "raw"),
        default=None,
        help="stored encoding (default: the source's; raw for image files needs --resize)",
    )
    parser.add_argument("--resize", default=None, metavar="HxW", help="store decoded pixels resized to HxW (raw)")
    parser.add_argument(
        "--on-error",
        choices=("raise", "skip"),
        default="raise",
        help="a bad sample stops the job (raise) or is skipped and listed (skip)",
    )
    parser.add_argument(
        "--count",
        type=int,
        default=None,
        help="use the first COUNT source samples (synthetic: how many images to make; default 1000)",
    )
    # No `choices`: the list lives in dstore.ingest.source, which `dstore --help` must not import (it
    # loads h5py and zarr); open_source refuses an unknown type naming the allowed ones.
    parser.add_argument(
        "--source-type",
        default="auto",
        help="how to read SOURCE: auto (default), folder, list, tar, parquet, container, cifar, arrays, "
        "digits or synthetic",
    )
    parser.add_argument(
        "--labels",
        default=None,
        metavar="FILE.csv",
        help="path,label rows naming the files of SOURCE (a flat folder or any files below it); "
        "integer labels are class indices, others class names",
    )
    parser.add_argument(
        "--classes",
        default=None,
        metavar="FILE",
        help="class names in label order, one per line (--labels, tar and Parquet sources)",
    )
    parser.add_argument(
        "--tar-image-key",
        default=None,
        metavar="EXT[;EXT]",
        help="WebDataset: the image member's extension(s) (default jpg;png;jpeg)",
    )
    parser.add_argument(
        "--tar-label-key", default=None, metavar="EXT", help="WebDataset: the label member's extension (default cls)"
    )
    parser.add_argument(
        "--fields",
        default=None,
        metavar="NAME[,NAME...]",
        help="extra fields per sample to store (WebDataset member extensions, Parquet "
        "columns): default all found; 'none': only image and label; NAME:bytes stores a "
        "field as it is (e.g. txt:bytes for captions that are not UTF-8)",
    )
    parser.add_argument("--image-column", default=None, help="Parquet/datasets: the image-bytes column (default image)")
    parser.add_argument("--label-column", default=None, help="Parquet/datasets: the label column (default label)")
    parser.add_argument(
        "--validate",
        choices=("header", "full", "none"),
        default=None,
        help="image folder check per file: header (default; cheap, catches truncation), full decode, or none",
    )
    parser.add_argument(
        "--split",
        default=None,
        metavar="NAME",
        help="the split to ingest: Parquet/datasets directories (train, validation, test...: needed "
        "where the directory holds several; the error lists them), CIFAR (train, test or all; "
        "default train)",
    )
    parser.add_argument(
        "--max-side",
        type=int,
        default=None,
        metavar="S",
        help="re-encode image files whose longer side is over S px as JPEG with the longer side S "
        "(smaller ones are kept as they are; cheaper decode, smaller container)",
    )
    parser.add_argument(
        "--quality",
        type=int,
        default=None,
        metavar="Q",
        help="JPEG quality of the images --max-side re-encodes (default 90)",
    )
    for flag, what in (
        ("--num-classes", "number of classes"),
        ("--mean-bytes", "target mean JPEG size (bytes)"),
        ("--min-side", "smallest image side (px)"),
    ):
        parser.add_argument(
            flag,
            type=_size if flag == "--mean-bytes" else int,
            default=None,
            help=f"synthetic: {what}" + (" (e.g. 110000, 110k)" if flag == "--mean-bytes" else ""),
        )
    parser.add_argument(
        "--source-option",
        "-O",
        action="append",
        type=_source_option,
        default=[],
        metavar="KEY=VALUE",
        help="more source options, e.g. -O num_classes=100 -O mean_bytes=50000 -O max_side=500 "
        "-O quality=90 (synthetic: the generated images' largest side and quality), "
        "-O labels=coarse (CIFAR-100), -O images_key=x (npz)",
    )
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="replace an existing dstore container at OUTPUT (anything else there is refused)",
    )
    parser.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="a progress bar on rank 0's stderr (default: only when stderr is a terminal, so "
        "a redirected log gets no \\r frames; under mpiexec stderr is a pipe: pass --progress)",
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON instead of text")
    resume = parser.add_mutually_exclusive_group()
    resume.add_argument(
        "--resume",
        dest="resume",
        action="store_const",
        const=True,
        default=None,
        help="continue the interrupted ingest of OUTPUT (refused if there is none; without this "
        "flag one is continued anyway where its journal .OUTPUT.ingest is beside OUTPUT)",
    )
    resume.add_argument(
        "--restart",
        dest="resume",
        action="store_const",
        const=False,
        help="discard what an interrupted ingest of OUTPUT wrote and start over",
    )
    parser.add_argument(
        "--append-to",
        default=None,
        metavar="CONTAINER",
        help="add the source's samples to this existing container (an HDF5 file or Zarr group is "
        "written again and renamed over the old; a sharded one gets new shards and a new "
        "manifest); new classes are added after the old ones, never renumbered",
    )
    parser.add_argument(
        "--duplicates",
        choices=("raise", "skip"),
        default="raise",
        help="with --append-to: a sample already stored (the same name, or the same bytes) stops "
        "the append (raise) or is left out and listed (skip)",
    )
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="list, count and size the source and say what the container would hold (classes, "
        "fields, bytes, shards, split), writing nothing",
    )


class Terminated(KeyboardInterrupt):
    """SIGTERM during an ingest: it unwinds as Ctrl-C does, so every temporary and lock is removed
    (the default action ended the process where it stood, leaving them). Exit code 128 + 15."""

    exit_code = 143


@contextlib.contextmanager
def _sigterm_unwinds():
    """For the `with` block, SIGTERM raises Terminated in the main thread (as SIGINT raises
    KeyboardInterrupt); the previous handler is put back after."""

    def on_term(signum, frame):
        raise Terminated(
            "terminated (SIGTERM); what was not written durably was removed (what was is kept "
            "beside the output for a resume: run the same command again)"
        )

    old = signal.signal(signal.SIGTERM, on_term)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


def _size(text: str) -> int:
    """--mean-bytes in dstore.runtime.units' size grammar."""
    from dstore.runtime.units import parse_size

    try:
        return parse_size(text, "--mean-bytes")
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _progress(asked: bool | None) -> bool:
    """--progress / --no-progress, else a bar only where stderr is a terminal."""
    if asked is not None:
        return asked
    try:
        return os.isatty(sys.stderr.fileno())
    except (AttributeError, OSError, ValueError):
        return False


def run(args) -> int:
    with _sigterm_unwinds():
        return _run(args)


def _run(args) -> int:
    import json

    from mpi4py import MPI

    # here, not at the top (as in every cmd module): it loads h5py and zarr, which `dstore --help` must not
    from dstore.errors import ConfigError
    from dstore.ingest import ingest
    from dstore.ingest.config import format_for

    fmt = format_for(args.fmt, args.output)
    options = dict(args.source_option)
    if args.validate is not None:
        options["validate"] = args.validate
    for key in ("split", "num_classes", "mean_bytes", "min_side", "labels", "classes", "image_column", "label_column"):
        if getattr(args, key) is not None:
            options[key] = getattr(args, key)
    for key, option in (("tar_image_key", "image_key"), ("tar_label_key", "label_key")):
        if getattr(args, key) is not None:
            options[option] = getattr(args, key)
    comm = MPI.COMM_WORLD
    if args.output is None and args.append_to is None:
        raise ConfigError("dstore ingest: give OUTPUT (the container to write) or --append-to CONTAINER")
    kwargs = dict(
        fmt=fmt,
        shards=args.shards,
        seed=args.seed,
        keep_order=args.keep_order,
        stratify=args.stratify,
        encoding=args.encoding,
        resize=args.resize,
        on_error=args.on_error,
        count=args.count,
        overwrite=args.overwrite,
        reencode_max_side=args.max_side,
        reencode_quality=args.quality,
        fields=args.fields,
        resume=args.resume,
        append_to=args.append_to,
        duplicates=args.duplicates,
    )
    if args.dry_run:
        from dstore.ingest.dryrun import dry_run

        if comm.Get_rank() == 0:  # rank 0 alone: a dry run reads no sample and writes nothing
            plan = dry_run(args.source, args.output, source_type=args.source_type, **kwargs, **options)
            print(json.dumps(plan.as_dict()) if args.json else plan.summary(), flush=True)
        return 0
    report = ingest(
        args.source,
        args.output,
        comm=comm,
        progress=_progress(args.progress),
        source_type=args.source_type,
        **kwargs,
        **options,
    )
    if comm.Get_rank() == 0:
        if args.json:
            print(
                json.dumps(
                    {
                        "output": report.output,
                        "samples": report.samples,
                        "bytes": report.bytes,
                        "seconds": report.seconds,
                        "mb_per_s": report.mb_per_s,
                        "files_per_s": report.files_per_s,
                        "ranks": report.ranks,
                        "shards": report.shards,
                        "encoding": report.encoding,
                        "skipped": [list(s) for s in report.skipped],
                        "ignored": report.ignored,
                        "notes": report.notes,
                    }
                ),
                flush=True,
            )
        else:
            print(report.summary(max_listed=1000), flush=True)
    return 0
