"""`dstore pfs SOURCE MOUNTPOINT`: serve a directory through a parallel-file-system model (FUSE), in the foreground."""

from __future__ import annotations

from dstore.errors import ConfigError
from dstore.tools.pfs.fs import add_model_arguments, check_source, model_from_args, serve, stats_path, summary
from dstore.tools.pfs.mount import PfsMountError, check_mountpoint, fuse_available, stale_mounts, unmount_command

HELP = (
    "serve directory SOURCE read-only at MOUNTPOINT through a parallel-file-system model (latency per read "
    "and per open, iops and bandwidth shared by every reader, no page cache) until Ctrl-C/SIGTERM; "
    "see docs/storage.md"
)


def add_arguments(p) -> None:
    p.add_argument("source", metavar="SOURCE", nargs="?", help="the directory to serve")
    p.add_argument(
        "mountpoint", metavar="MOUNTPOINT", nargs="?", help="an existing, empty directory outside SOURCE to mount it at"
    )
    add_model_arguments(p)
    p.add_argument("--stats-json", default=None, help="also write what was served to this JSON file on exit")
    p.add_argument(
        "--find-stale",
        action="store_true",
        help="only list dstore pfs mounts left by killed runs, with the command that removes each",
    )


def run(args) -> int:
    if args.find_stale:
        stale = stale_mounts()
        for mp in stale:
            print(f"stale dstore pfs mount: {mp}  (remove with: {unmount_command(mp)})")
        if not stale:
            print("no stale dstore pfs mounts")
        return 1 if stale else 0
    if args.source is None or args.mountpoint is None:
        raise ConfigError("dstore pfs needs SOURCE and MOUNTPOINT (or --find-stale alone)")
    model = model_from_args(args)
    # Refusals before FUSE is asked for anything: they hold (and are tested) where FUSE is missing.
    check_mountpoint(args.mountpoint, check_source(args.source))
    reason = fuse_available()
    if reason:
        raise PfsMountError(f"cannot mount here: {reason}")
    stats = serve(args.source, args.mountpoint, model, stats_path=stats_path(args.stats_json))
    print(summary(stats), flush=True)
    return 0
