"""A run directory belongs to one job at a time, and only to dstore: the claim `dstore train` takes.

Two jobs given one `--run-dir` both ran to the end, interleaving their metrics.jsonl and
overwriting each other's config.json and checkpoint; `--run-dir` at a user's folder overwrote its
config.json. So before anything is written, rank 0 claims the directory:

- a path that is a file, or a directory that cannot be created or written, is a one-line error;
- an existing, non-empty directory without our marker (`.dstore-run`) is refused, never taken over;
- the marker is created (in a new or empty directory) and held under an exclusive `flock` for the
  job's lifetime: a second job in the same directory is refused at once, naming it. The lock goes
  with the process (also on kill -9), so a crashed job never blocks the next.

The marker's contents never change after it is made, so a refused start leaves the directory as it
was; a directory this claim created and left holding nothing but the marker is removed again.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os

from dstore.collective import on_root
from dstore.errors import ConfigError

MARKER = ".dstore-run"
"""The file that marks a directory as a dstore run directory (and whose flock is the job's hold)."""

_MARKER_TEXT = b"a dstore training run directory: held (flock) by the job that writes it\n"


class RunDirClaim:
    """Rank 0's hold on one run directory: `acquire()` takes it, `release()` (safe twice) ends it.

    Attributes:
        path: the run directory (absolute).
        created: whether acquire() made the directory.
    """

    def __init__(self, path: str, flag: str = "--run-dir"):
        self.path = os.path.abspath(os.fspath(path))
        self.flag = flag
        self.created = False
        self._fd: int | None = None

    def acquire(self) -> None:
        """Claims the directory (see the module docstring).

        Raises:
            ConfigError: one line naming the directory and why it cannot be this run's.
        """
        p, flag = self.path, self.flag
        if os.path.lexists(p) and not os.path.isdir(p):
            raise ConfigError(f"{flag} {p} is a file, not a directory; give a directory (new or empty, or a run "
                              f"directory of dstore)")
        if os.path.isdir(p):
            try:
                entries = os.listdir(p)
            except OSError as exc:
                raise ConfigError(f"{flag} {p}: cannot list it: {exc.strerror}") from None
            if entries and MARKER not in entries:
                raise ConfigError(
                    f"{flag} {p} is not empty and was not made by dstore train (no {MARKER} in it); dstore does "
                    f"not take over a folder of yours: give a new or empty directory (to adopt a run directory "
                    f"of an older dstore, create the empty file {os.path.join(p, MARKER)})")
        else:
            try:
                os.makedirs(p)
            except OSError as exc:
                raise ConfigError(f"{flag} {p}: cannot create it: {exc.strerror}") from None
            self.created = True
        self._lock(os.path.join(p, MARKER))

    def _lock(self, marker: str) -> None:
        try:
            fd = os.open(marker, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            self._undo()
            what = "is a symbolic link" if exc.errno == errno.ELOOP else exc.strerror
            raise ConfigError(f"{self.flag} {self.path} is not writable: {marker}: {what}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise ConfigError(f"{self.flag} {self.path} is in use by another job now (it holds {marker}); "
                                  f"wait for it to end or give another {self.flag}") from None
            fd = None  # no flock on this file system (ENOLCK, EOPNOTSUPP): the run goes on unlocked
        if fd is not None:
            self._fd = fd
            if os.fstat(fd).st_size == 0:
                self._write(fd, marker)

    def _write(self, fd: int, marker: str) -> None:
        try:
            os.write(fd, _MARKER_TEXT)
        except OSError as exc:
            self.release()
            raise ConfigError(f"{self.flag} {self.path} is not writable: {marker}: {exc.strerror}") from None

    def _undo(self) -> None:
        """Removes the directory again if this claim made it and it holds nothing but the marker."""
        if not self.created:
            return
        self.created = False
        with contextlib.suppress(OSError):
            if set(os.listdir(self.path)) <= {MARKER}:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(os.path.join(self.path, MARKER))
                os.rmdir(self.path)

    def release(self) -> None:
        """Ends the hold (the marker stays: it marks the directory as ours). Safe to call twice."""
        fd, self._fd = self._fd, None
        self._undo()
        if fd is not None:
            os.close(fd)


@contextlib.contextmanager
def claimed_run_dir(comm, run_dir: str, flag: str = "--run-dir"):
    """Collective over `comm`: rank 0 claims `run_dir` for the `with` block (RunDirClaim); if it
    cannot, every rank raises rank 0's ConfigError."""
    claim = RunDirClaim(run_dir, flag)
    try:
        on_root(comm, claim.acquire)
        yield claim
    finally:
        claim.release()
