"""The read-only FUSE file system of `dstore pfs`: SOURCE served at MOUNTPOINT through the model.

Every open, stat and readdir pays the open latency, every read request the latency, and each takes
its tokens from the mount's one iops bucket (reads also from its bandwidth bucket). Direct I/O
(`direct_io`) keeps the kernel's page cache from hiding the model: every read of every epoch
reaches it, as does every open; names and attributes are cached for one second (METADATA_CACHE_S).
libfuse runs requests on several threads, so concurrent readers overlap their latencies but share
the caps, as clients of one job share a file system. No MPI here: this runs in its own process
(`python -m dstore.tools.pfs.fs` or `dstore pfs`).
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import sys
import time

from dstore.errors import ConfigError
from dstore.runtime.units import parse_size
from dstore.tools.pfs.model import DEFAULTS, MAX_DELAY_S, Model, PfsModel, parse_bandwidth, parse_rate, parse_time
from dstore.tools.pfs.mount import PfsMountError, check_mountpoint, fusermount

FSNAME = "dstore-pfs"
"""The mount's type in /proc/mounts (`dstore-pfs:SOURCE on /mnt type fuse.dstore-pfs`)."""

METADATA_CACHE_S = 1.0
"""Seconds the kernel keeps a looked-up name and its attributes (FUSE entry/attr timeouts)."""

_STAT_KEYS = (
    "st_mode",
    "st_ino",
    "st_dev",
    "st_nlink",
    "st_uid",
    "st_gid",
    "st_size",
    "st_atime_ns",
    "st_mtime_ns",
    "st_ctime_ns",
    "st_blocks",
    "st_blksize",
)


def _operations_class():
    import mfusepy

    class PfsOperations(mfusepy.Operations):
        """Passthrough of a directory, read-only, with the model's costs."""

        use_ns = True

        def __init__(self, source: str, model: Model):
            self.source = os.path.realpath(source)
            self.model = model

        def _full(self, path: str) -> str:
            return os.path.join(self.source, path.lstrip("/"))

        mounted = False

        def init_with_config(self, conn, config):  # pyright: ignore[reportIncompatibleMethodOverride] - mfusepy's stub types them
            self.mounted = True
            if config is not None:
                config.direct_io = 1  # no kernel page cache: every read of every epoch reaches the model
                config.kernel_cache = 0
                config.auto_cache = 0
                # Names and attributes are cached for METADATA_CACHE_S, as a Lustre client caches them
                # under its locks: a path's directories are not looked up again for every file, but
                # every open reaches the model, and an epoch later every stat does again.
                config.attr_timeout = METADATA_CACHE_S
                config.entry_timeout = METADATA_CACHE_S
                config.negative_timeout = METADATA_CACHE_S
            if conn is not None:
                conn.max_read = self.model.params.max_read
                if hasattr(conn, "max_readahead"):
                    conn.max_readahead = 0

        def getattr(self, path, fh=None):
            self.model.charge_meta("stat")
            st = os.lstat(self._full(path))
            d = {k: getattr(st, k) for k in _STAT_KEYS}
            d["st_atime"], d["st_mtime"], d["st_ctime"] = (
                d.pop("st_atime_ns"),
                d.pop("st_mtime_ns"),
                d.pop("st_ctime_ns"),
            )
            d["st_mode"] &= ~0o222  # read-only
            return d

        def readdir(self, path, fh):
            self.model.charge_meta("readdir")
            return [".", "..", *sorted(os.listdir(self._full(path)))]

        def readlink(self, path):
            self.model.charge_meta("stat")
            return os.readlink(self._full(path))

        def statfs(self, path):
            sv = os.statvfs(self._full(path))
            return {
                k: getattr(sv, k)
                for k in (
                    "f_bsize",
                    "f_frsize",
                    "f_blocks",
                    "f_bfree",
                    "f_bavail",
                    "f_files",
                    "f_ffree",
                    "f_favail",
                    "f_flag",
                    "f_namemax",
                )
            }

        def open(self, path, flags):
            if flags & (os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_TRUNC | os.O_CREAT):
                raise mfusepy.FuseOSError(errno.EROFS)
            self.model.charge_meta("open")
            return os.open(self._full(path), os.O_RDONLY)

        def read(self, path, size, offset, fh):
            t0 = time.monotonic()
            waited = self.model.charge_read(size)
            data = os.pread(fh, size, offset)
            self.model.count_read(len(data), waited, time.monotonic() - t0)
            return data

        def release(self, path, fh):
            os.close(fh)
            return 0

        def opendir(self, path):
            return 0

        def releasedir(self, path, fh):
            return 0

    return PfsOperations


def check_source(source: str) -> str:
    """The source directory's real path, or a ConfigError naming it."""
    if not os.path.isdir(source):
        what = "is not a directory" if os.path.exists(source) else "does not exist"
        raise ConfigError(f"SOURCE {source!r} {what}: dstore pfs serves a directory")
    return os.path.realpath(source)


def _watch_parent(pid: int, mountpoint: str, poll: float = 0.5) -> None:
    """Unmounts (lazily) once process `pid` is gone, which ends the FUSE loop: a mount started by a
    bench or test process that was killed (MPI abort, SIGKILL) does not outlive it."""
    import subprocess
    import threading

    def watch():
        while True:
            time.sleep(poll)
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            except PermissionError:
                continue
        prog = fusermount()
        if prog:
            subprocess.run(
                [prog, "-u", "-z", mountpoint], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False
            )

    threading.Thread(target=watch, daemon=True, name="pfs-watch-parent").start()


def serve(
    source: str,
    mountpoint: str,
    params: PfsModel,
    *,
    stats_path: str | None = None,
    ready_message: bool = True,
    watch_pid: int | None = None,
) -> dict:
    """Mounts SOURCE at MOUNTPOINT with the model and serves in the foreground until SIGINT/SIGTERM
    (libfuse's handlers end the loop and unmount). Returns the counters, also written as JSON to
    `stats_path` if given.

    Raises:
        ConfigError: SOURCE is not a directory.
        PfsMountError: MOUNTPOINT is not an empty directory, is SOURCE or lies inside or above it,
            or a stale mount is there (the message names the command that removes it).
    """
    import mfusepy

    source = check_source(source)
    mountpoint = check_mountpoint(mountpoint, source)
    model = Model(params)
    ops = _operations_class()(source, model)
    if ready_message:
        print(
            f"dstore pfs: serving {source} at {mountpoint} with {params.describe()} (Ctrl-C or SIGTERM unmounts)",
            flush=True,
        )
    if watch_pid:
        _watch_parent(watch_pid, mountpoint)
    t0 = time.monotonic()
    error = None
    try:
        mfusepy.FUSE(
            ops,
            mountpoint,
            foreground=True,
            nothreads=False,
            ro=True,
            fsname=f"{FSNAME}:{source}" if "," not in source else FSNAME,
            subtype=FSNAME,
            default_permissions=True,
            max_read=params.max_read,
        )
    except RuntimeError as exc:
        # libfuse's signal handler stores the signal as the loop's error, so fuse_main returns
        # non-zero after SIGINT/SIGTERM too; only a failure before init is a failed mount.
        if not ops.mounted:
            error = exc
    finally:
        wall = time.monotonic() - t0
        stats = {
            **model.counters.to_dict(),
            "wall_seconds": round(wall, 3),
            "model": params.to_dict(),
            "source": source,
            "mountpoint": mountpoint,
        }
        if stats_path:
            tmp = stats_path + ".tmp"
            with open(tmp, "w") as fh:
                json.dump(stats, fh)
            os.replace(tmp, stats_path)
    if error is not None:
        raise ConfigError(
            f"mounting {source} at {mountpoint} failed (libfuse returned {error}); "
            "is /dev/fuse there and fusermount3 installed?"
        )
    return stats


def summary(stats: dict) -> str:
    """One line: what the mount served."""
    return (
        f"dstore pfs: served {stats['ops']:,} operations ({stats['reads']:,} reads, {stats['opens']:,} opens, "
        f"{stats['stats']:,} stats, {stats['readdirs']:,} readdirs), {stats['read_bytes'] / 1e6:,.1f} MB "
        f"in {stats['wall_seconds']:.1f} s; {stats['delay_seconds']:.1f} s of request time in the model"
    )


def stats_path(path: str | None) -> str | None:
    """--stats-json as an absolute path: a relative one means the caller's directory, whatever
    directory the file system's process serves from."""
    return None if path is None else os.path.abspath(path)


def add_model_arguments(p: argparse.ArgumentParser) -> None:
    """The model's options (shared by `dstore pfs` and `python -m dstore.tools.pfs.fs`)."""
    d = DEFAULTS
    p.add_argument("--latency", default="2ms", help="added to every read request (e.g. 2ms, 500us, 0; at most 10s)")
    p.add_argument(
        "--open-latency",
        default=None,
        help="added to every open, stat and readdir: the metadata server (default: --latency; at most 10s)",
    )
    p.add_argument(
        "--iops",
        default=f"{d.iops:g}/s",
        help="operations per second for the whole mount, shared by every reader (e.g. 800/s, unlimited)",
    )
    p.add_argument(
        "--bandwidth",
        default="1GB/s",
        help="bytes per second for the whole mount, shared by every reader (e.g. 500MB/s, unlimited)",
    )
    p.add_argument("--jitter", type=float, default=0.0, help="each delay uniform in d x [1-J, 1+J]")
    p.add_argument("--seed", type=int, default=0, help="seed of the jitter draws")
    p.add_argument("--burst", default="10ms", help="seconds' worth of tokens an idle bucket holds (at most 10s)")
    p.add_argument(
        "--max-read", type=_size_flag, default=d.max_read, help="largest read request: bytes, or e.g. 1MiB, 128k"
    )


def _size_flag(text: str) -> int:
    """A size flag in dstore.runtime.units' grammar, as argparse wants its error."""
    try:
        return parse_size(text, "--max-read")
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _bounded_time(text: str, flag: str) -> float:
    """A duration flag in seconds, refused (naming the flag) past MAX_DELAY_S."""
    seconds = parse_time(text, flag)
    if seconds > MAX_DELAY_S:
        raise ConfigError(
            f"{flag} {text}: at most {MAX_DELAY_S:g}s (a longer wait per request makes a mount that SIGTERM cannot end)"
        )
    return seconds


def model_from_args(args) -> PfsModel:
    """The PfsModel of the parsed options; every duration bounded by MAX_DELAY_S."""
    latency = _bounded_time(args.latency, "--latency")
    open_latency = latency if args.open_latency is None else _bounded_time(args.open_latency, "--open-latency")
    return PfsModel(
        latency=latency,
        open_latency=open_latency,
        iops=parse_rate(args.iops, "--iops"),
        bandwidth=parse_bandwidth(args.bandwidth, "--bandwidth"),
        jitter=args.jitter,
        seed=args.seed,
        burst=_bounded_time(args.burst, "--burst"),
        max_read=args.max_read,
    )


def main(argv=None) -> int:
    """`python -m dstore.tools.pfs.fs SOURCE MOUNTPOINT [model options] [--stats-json PATH]`: what
    dstore.tools.pfs.mount starts (no MPI imported, so it is safe to start from an MPI rank)."""
    p = argparse.ArgumentParser(prog="python -m dstore.tools.pfs.fs")
    p.add_argument("source")
    p.add_argument("mountpoint")
    p.add_argument("--stats-json", default=None)
    p.add_argument("--watch-pid", type=int, default=None, help="unmount when this process is gone")
    add_model_arguments(p)
    args = p.parse_args(argv)
    try:
        stats = serve(
            args.source,
            args.mountpoint,
            model_from_args(args),
            stats_path=stats_path(args.stats_json),
            watch_pid=args.watch_pid,
        )
    except (ConfigError, PfsMountError) as exc:
        print(f"dstore pfs: error: {exc}", file=sys.stderr, flush=True)
        return 2
    print(summary(stats), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
