"""Starting and stopping a `dstore pfs` mount from Python, and finding mounts a killed run left behind.

    from dstore.tools.pfs import pfs_mount, parse_spec

    with pfs_mount("data/", model=parse_spec("pfs:latency=2ms,iops=2000")) as mnt:
        read_everything(mnt.path("x.h5"))
    print(mnt.stats)   # what the mount served

The file system runs in its own process (`python -m dstore.tools.pfs.fs`, no MPI in it); the context
manager returns once the mount is live, and on exit always unmounts and reaps that process, also
after an error in the body or a file system that died.
"""

from __future__ import annotations

import errno
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from dstore.errors import ConfigError, DStoreError
from dstore.tools.pfs.model import DEFAULTS, PfsModel

FSNAME = "dstore-pfs"


class PfsMountError(DStoreError, OSError):
    """The file system could not be mounted, or a mount is in the way; the message says what to run."""


class StaleMountError(PfsMountError):
    """A FUSE mount whose process is gone (left by a killed run): the message names the command that removes it."""


def fusermount() -> str | None:
    """The fusermount program (fusermount3 from Debian's fuse3), or None."""
    return shutil.which("fusermount3") or shutil.which("fusermount")


def fuse_available() -> str | None:
    """None if FUSE mounts can be made here, else the reason why not (for skips and errors)."""
    if not os.path.exists("/dev/fuse"):
        return "/dev/fuse is missing (no FUSE in this kernel or container)"
    if fusermount() is None:
        return "fusermount3 is not installed (Debian: apt-get install fuse3)"
    try:
        import mfusepy  # noqa: F401
    except (ImportError, OSError) as exc:  # OSError: libfuse3.so not found by ctypes
        return f"the mfusepy binding cannot load: {exc}"
    return None


def unmount_command(mountpoint: str) -> str:
    prog = os.path.basename(fusermount() or "fusermount3")
    return f"{prog} -u {shlex.quote(mountpoint)}"


def _unescape(field: str) -> str:
    return field.replace("\\040", " ").replace("\\011", "\t").replace("\\012", "\n").replace("\\134", "\\")


def fuse_mounts() -> list[tuple[str, str, str]]:
    """(mountpoint, file system type, source) of every FUSE mount this process can see; a `dstore pfs`
    mount's source reads `dstore-pfs:SOURCE`."""
    out = []
    try:
        with open("/proc/self/mountinfo") as fh:
            for line in fh:
                left, _, right = line.partition(" - ")
                fields = right.split()
                fstype = fields[0] if fields else ""
                if fstype.startswith("fuse"):
                    out.append((_unescape(left.split()[4]), fstype, _unescape(fields[1]) if len(fields) > 1 else ""))
    except OSError:
        pass
    return out


def is_mounted(mountpoint: str) -> bool:
    mp = os.path.abspath(mountpoint)
    return any(m == mp for m, _, _ in fuse_mounts())


STATFS_TIMEOUT = 2.0
"""Seconds a statfs of a mount may take before the mount counts as unresponsive (alive, not stale)."""

_STATFS = "import os, sys\ntry:\n    os.statvfs(sys.argv[1])\nexcept OSError as e:\n    print(e.errno)\n"


def statfs_errors(mountpoints: list[str], timeout: float = STATFS_TIMEOUT) -> dict[str, int | None]:
    """{mountpoint: the errno its statfs failed with, 0 if it answered, None if it did not answer
    within `timeout`}. Each statfs runs in a child process of its own, all at once: a file system
    whose process is alive but stopped or wedged holds its caller in uninterruptible sleep, so this
    process never calls statfs itself. A child that does not answer is killed and not waited for
    (it ends when the statfs returns)."""
    procs = {
        mp: subprocess.Popen(
            [sys.executable, "-I", "-S", "-c", _STATFS, mp],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        for mp in mountpoints
    }
    deadline = time.monotonic() + timeout
    out: dict[str, int | None] = {}
    for mp, proc in procs.items():
        try:
            text, _ = proc.communicate(timeout=max(0.0, deadline - time.monotonic()))
            out[mp] = int(text.strip() or 0)
        except subprocess.TimeoutExpired:
            proc.kill()
            out[mp] = None
    return out


def _gone(err: int | None) -> bool:
    return err in (errno.ENOTCONN, errno.ECONNABORTED)


def is_stale(mountpoint: str) -> bool:
    """A FUSE mount at `mountpoint` whose file system process is gone (statfs fails with ENOTCONN;
    statfs, unlike stat, is never answered from the kernel's attribute cache). Never blocks: see
    `statfs_errors` (an unresponsive mount is alive, so not stale)."""
    mp = os.path.abspath(mountpoint)
    return is_mounted(mp) and _gone(statfs_errors([mp])[mp])


def stale_mounts(fstype: str = "fuse." + FSNAME) -> list[str]:
    """Mountpoints of `dstore pfs` mounts whose process is gone (a killed run's leftovers), found
    from /proc/self/mountinfo and one statfs per mount in a child process (never blocks on an
    unresponsive mount)."""
    mps = [m for m, t, _ in fuse_mounts() if t == fstype]
    errs = statfs_errors(mps)
    return [m for m in mps if _gone(errs[m])]


def pfs_mountpoints(source=None) -> list[str]:
    """Mountpoints of every `dstore pfs` mount this process can see (of `source` only, if given)."""
    want = None if source is None else f"{FSNAME}:{os.path.realpath(os.fspath(source))}"
    return [m for m, t, src in fuse_mounts() if t == "fuse." + FSNAME and (want is None or src == want)]


def under_pfs_mount(path, mountpoints: list[str] | None = None) -> bool:
    """Whether `path` lies in a `dstore pfs` mount (checked by path, without touching the mount)."""
    p = os.path.abspath(os.fspath(path))
    mps = pfs_mountpoints() if mountpoints is None else mountpoints
    return any(p == m or p.startswith(m.rstrip("/") + "/") for m in mps)


def check_mountpoint(mountpoint: str, source=None) -> str:
    """The mountpoint's absolute path, if a mount of `source` (if given) can be made there.

    A mount at, inside or above its own source would list itself: the file system then looks up
    its own mountpoint, waits on itself in uninterruptible sleep, and neither SIGTERM nor SIGKILL
    ends it. A mount over a non-empty directory would hide what is there.

    Raises:
        StaleMountError: a mount left by a killed run is there (the message says how to remove it).
        PfsMountError: it is not an empty directory, it is SOURCE or lies inside or above it, or
            something is mounted there already.
    """
    mp = os.path.abspath(mountpoint)
    if is_stale(mp):
        raise StaleMountError(
            f"MOUNTPOINT {mp} holds a stale FUSE mount (its file system process is gone, "
            f"probably a killed run); remove it with: {unmount_command(mp)}"
        )
    if is_mounted(mp):
        raise PfsMountError(f"MOUNTPOINT {mp} is already a live FUSE mount; unmount it first: {unmount_command(mp)}")
    if not os.path.isdir(mp):
        raise PfsMountError(f"MOUNTPOINT {mp} " + ("is not a directory" if os.path.exists(mp) else "does not exist"))
    if source is not None:
        _check_apart(mp, os.path.realpath(os.fspath(source)))
    if os.listdir(mp):
        raise PfsMountError(f"MOUNTPOINT {mp} is not empty: a mount would hide what is in it; give an empty directory")
    return mp


def _within(path: str, root: str) -> bool:
    """Whether real path `path` is `root` or lies under it."""
    return path == root or path.startswith(root.rstrip("/") + "/")


def _check_apart(mp: str, src: str) -> None:
    """Refuses a mountpoint `mp` that is the source directory `src` (a real path), or inside or above it."""
    real = os.path.realpath(mp)
    if real == src:
        where = "is SOURCE itself"
    elif _within(real, src):
        where = f"is inside SOURCE {src}"
    elif _within(src, real):
        where = f"holds SOURCE {src}"
    else:
        return
    raise PfsMountError(
        f"MOUNTPOINT {mp} {where}: the mount would serve itself (and wedge in the kernel); give a "
        f"directory outside the source"
    )


def force_unmount(mountpoint: str) -> bool:
    """Unmounts `mountpoint` with fusermount -u, then lazily (-uz) if busy. True if it is gone."""
    prog = fusermount()
    if prog is None:
        return not is_mounted(mountpoint)
    for flags in (["-u"], ["-u", "-z"]):
        if not is_mounted(mountpoint):
            return True
        subprocess.run(
            [prog, *flags, mountpoint], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False, timeout=30
        )
    return not is_mounted(mountpoint)


def _temp_parent(source: str) -> str | None:
    """Where a mount's own directory is made: the temporary directory, unless it lies inside
    `source` (a mount there would serve itself); then beside the source, or /dev/shm."""
    if not _within(os.path.realpath(tempfile.gettempdir()), source):
        return None
    for d in (os.path.dirname(source), "/dev/shm"):
        if os.path.isdir(d) and os.access(d, os.W_OK) and not _within(os.path.realpath(d), source):
            return d
    return None  # nowhere else: check_mountpoint refuses, naming it


def _child_env() -> dict:
    """Our environment without the MPI process manager's variables: the file system process must
    never be taken for an MPI rank."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PMI_", "PMIX_", "HYDRA_", "MPI_LOCALRANKID", "MPI_LOCALNRANKS", "OMPI_"))
    }
    return env


class PfsMount:
    """A `dstore pfs` mount of `source` for the lifetime of a `with` block.

    Args:
        source: the directory to serve.
        mountpoint: where to mount (an existing directory); default: a new temporary directory,
            removed again on exit.
        model: the PfsModel (default: DEFAULTS).
        timeout: seconds to wait for the mount to come up.

    Attributes:
        mountpoint: the absolute mountpoint.
        stats: after exit, what the mount served (dstore.tools.pfs.model.Counters fields, wall_seconds).
    """

    def __init__(self, source, mountpoint=None, model: PfsModel = DEFAULTS, *, timeout: float = 30.0):
        self.source = os.path.realpath(os.fspath(source))
        self.model = model
        self.timeout = timeout
        self._own_dir = mountpoint is None
        self.mountpoint = None if mountpoint is None else os.path.abspath(os.fspath(mountpoint))
        self.stats: dict | None = None
        self.log = ""
        self._proc = None
        self._tmp = None

    def path(self, *parts) -> str:
        """A path inside the mount (`mnt.path("x.h5")`)."""
        return os.path.join(self._where(), *parts)

    def translate(self, path) -> str:
        """The path under the mount of `path`, a path under `source`."""
        rel = os.path.relpath(os.path.realpath(os.fspath(path)), self.source)
        if rel.startswith(".."):
            raise ConfigError(f"{path} is not under the mounted directory {self.source}")
        return self._where() if rel == "." else os.path.join(self._where(), rel)

    def _where(self) -> str:
        """The mount point: given to the constructor, or made on entry (mountpoint=None)."""
        if self.mountpoint is None:
            raise PfsMountError(f"the pfs model of {self.source} is not mounted yet: enter the PfsMount first")
        return self.mountpoint

    def __enter__(self) -> PfsMount:
        reason = fuse_available()
        if reason:
            raise PfsMountError(f"cannot mount a pfs model here: {reason}")
        if not os.path.isdir(self.source):
            raise ConfigError(f"SOURCE {self.source!r} is not a directory: dstore pfs serves a directory")
        self._tmp = tempfile.mkdtemp(prefix="dstore-pfs-", dir=_temp_parent(self.source))
        if self._own_dir:
            self.mountpoint = os.path.join(self._tmp, "mnt")
            os.mkdir(self.mountpoint)
        mountpoint = self._where()
        check_mountpoint(mountpoint, self.source)
        self._stats_path = os.path.join(self._tmp, "stats.json")
        self._log_path = os.path.join(self._tmp, "log.txt")
        cmd = [
            sys.executable,
            "-m",
            "dstore.tools.pfs.fs",
            self.source,
            mountpoint,
            *self.model.to_args(),
            "--stats-json",
            self._stats_path,
            "--watch-pid",
            str(os.getpid()),
        ]
        with open(self._log_path, "w") as log:
            self._proc = proc = subprocess.Popen(
                cmd,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=_child_env(),
                start_new_session=True,
            )
        try:
            self._wait_live(proc, mountpoint)
        except BaseException:
            self.close()
            raise
        return self

    def _wait_live(self, proc: subprocess.Popen, mountpoint: str) -> None:
        deadline = time.monotonic() + self.timeout
        while True:
            if proc.poll() is not None:
                raise PfsMountError(
                    f"the pfs file system exited with code {proc.returncode} before "
                    f"mounting {self.source} at {mountpoint}: {self._read_log().strip()}"
                )
            if is_mounted(mountpoint):
                try:
                    os.stat(mountpoint)
                    return
                except OSError:
                    pass
            if time.monotonic() > deadline:
                raise PfsMountError(
                    f"the pfs mount at {mountpoint} did not come up within {self.timeout:g} s: "
                    f"{self._read_log().strip()}"
                )
            time.sleep(0.02)

    def _read_log(self) -> str:
        try:
            with open(self._log_path) as fh:
                return fh.read()
        except OSError:
            return ""

    def close(self) -> None:
        """Unmounts and reaps the file system process; safe to call twice."""
        proc, self._proc = self._proc, None
        if proc is not None:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)  # libfuse ends its loop and unmounts
                try:
                    proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    pass
            if self.mountpoint and is_mounted(self.mountpoint):
                force_unmount(self.mountpoint)
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=15)
            self.log = self._read_log()
            try:
                with open(self._stats_path) as fh:
                    self.stats = json.load(fh)
            except (OSError, ValueError):
                self.stats = None
        if self._tmp is not None:
            if self.mountpoint and is_mounted(self.mountpoint):
                force_unmount(self.mountpoint)
            if not (self.mountpoint and is_mounted(self.mountpoint)):
                shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None

    def __exit__(self, *exc) -> None:
        self.close()


def pfs_mount(source, mountpoint=None, model: PfsModel = DEFAULTS, **kw) -> PfsMount:
    """`with pfs_mount(source, mountpoint, model) as mnt:` (see PfsMount)."""
    return PfsMount(source, mountpoint, model, **kw)
