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

A run directory belongs to one run too. A new run (no checkpoint resumed) in a directory that
holds a run's files (`run_files`: its checkpoint, metrics, config) would overwrite that run's
checkpoint and append to its metrics: it is refused, naming the directory and what it holds, with
`--resume auto` to continue it and `--overwrite` to start again. With `--overwrite` (or
`--resume auto` finding no checkpoint: a run killed before its first one, started again) those
files are removed once the directory is held, and named (`replaced`).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import shutil

from dstore.errors import ConfigError
from dstore.runtime.collective import on_root, seen_everywhere

MARKER = ".dstore-run"
"""The file that marks a directory as a dstore run directory (and whose flock is the job's hold)."""

_MARKER_TEXT = b"a dstore training run directory: held (flock) by the job that writes it\n"

# What a run (or an LTFB job) writes into its directory; `dstore plot`'s default curves.png too.
_RUN_FILE = re.compile(
    r"(config\.json|metrics\.jsonl|metrics\.csv|resumes\.jsonl|tournament\.jsonl|curves\.png"
    r"|tensorboard|checkpoint\.pt|batches\.rank\d+\.jsonl|trainer\d+)(\.tmp(\.\d+)?)?"
)


def run_files(entries) -> list[str]:
    """The names among a directory's `entries` that a run wrote (sorted; the marker is not one)."""
    return sorted(e for e in entries if _RUN_FILE.fullmatch(e))


class RunDirClaim:
    """Rank 0's hold on one run directory: `acquire()` takes it, `release()` (safe twice) ends it.

    Args:
        path: the run directory.
        flag: the option that named it, for the messages.
        fresh: this job starts a new run (it resumes no checkpoint): a run already there is refused,
            or replaced with `replace`.
        replace: remove a run already there (--overwrite, or --resume auto that found no checkpoint).

    Attributes:
        path: the run directory (absolute).
        created: whether acquire() made the directory.
        replaced: the names of the earlier run's files acquire() removed (fresh with replace).
    """

    def __init__(self, path: str, flag: str = "--run-dir", *, fresh: bool = False, replace: bool = False):
        self.path = os.path.abspath(os.fspath(path))
        self.flag = flag
        self.fresh = fresh
        self.replace = replace
        self.created = False
        self.replaced: list[str] = []
        self._fd: int | None = None

    def acquire(self) -> None:
        """Claims the directory (see the module docstring).

        Raises:
            ConfigError: one line naming the directory and why it cannot be this run's.
        """
        p, flag = self.path, self.flag
        if os.path.lexists(p) and not os.path.isdir(p):
            raise ConfigError(
                f"{flag} {p} is a file, not a directory; give a directory (new or empty, or a run directory of dstore)"
            )
        if os.path.isdir(p):
            try:
                entries = os.listdir(p)
            except OSError as exc:
                raise ConfigError(f"{flag} {p}: cannot list it: {exc.strerror}") from None
            if entries and MARKER not in entries:
                raise ConfigError(
                    f"{flag} {p} is not empty and was not made by dstore train (no {MARKER} in it); dstore does "
                    f"not take over a folder of yours: give a new or empty directory (to adopt a run directory "
                    f"of an older dstore, create the empty file {os.path.join(p, MARKER)})"
                )
            if self.fresh and run_files(entries) and not self.replace:
                raise ConfigError(
                    f"{flag} {p} already holds a run ({', '.join(run_files(entries))}); a new run there would "
                    f"overwrite its checkpoint and append to its metrics: give --resume auto to continue it, "
                    f"--overwrite to start again there (its files are removed), or another {flag}"
                )
        else:
            try:
                os.makedirs(p)
            except OSError as exc:
                raise ConfigError(f"{flag} {p}: cannot create it: {exc.strerror}") from None
            self.created = True
        self._lock(os.path.join(p, MARKER))
        if self.fresh and self.replace:
            self._remove_run()

    def _remove_run(self) -> None:
        """Removes the earlier run's files (held: no other job writes them now), naming them in `replaced`."""
        for name in run_files(os.listdir(self.path)):
            target = os.path.join(self.path, name)
            try:
                if os.path.isdir(target) and not os.path.islink(target):
                    shutil.rmtree(target)
                else:
                    os.unlink(target)
            except OSError as exc:
                self.release()
                raise ConfigError(
                    f"{self.flag} {self.path}: cannot remove the earlier run's {name} to start "
                    f"again: {exc.strerror or exc}"
                ) from None
            self.replaced.append(name)

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
                raise ConfigError(
                    f"{self.flag} {self.path} is in use by another job now (it holds {marker}); "
                    f"wait for it to end or give another {self.flag}"
                ) from None
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
def claimed_run_dir(
    comm, run_dir: str, flag: str = "--run-dir", *, fresh: bool = False, replace: bool = False, say=None
):
    """Collective over `comm`: rank 0 claims `run_dir` for the `with` block (RunDirClaim, with
    `fresh` and `replace`) and says (`say`) which earlier run files it removed; if it cannot claim
    it, every rank raises rank 0's ConfigError."""
    claim = RunDirClaim(run_dir, flag, fresh=fresh, replace=replace)
    try:
        on_root(comm, claim.acquire)
        seen_everywhere(comm, claim.path, flag)  # every rank may write there (batch logs) and reads checkpoints
        if claim.replaced and say is not None:
            say(f"{flag} {claim.path}: started again, the earlier run's {', '.join(claim.replaced)} removed")
        yield claim
    finally:
        claim.release()
