"""One writer per output at a time: an exclusive lock beside the path a container is written to.

Two jobs writing the same output at once each wrote their own temporary and renamed it into place,
so with `overwrite` (or between one job's existence check and its rename) the later rename replaced
the earlier silently, and a sharded output could end as a manifest over shards of both jobs. The
writer of a path therefore holds `flock` on `.<name>.lock` in the same directory while it writes;
a second writer of that path is refused at once, naming it. The lock goes with the process (also on
kill -9), so a crashed job never blocks the next; the file is removed by a writer that ends.
"""

from __future__ import annotations

import errno
import fcntl
import os

from dstore.formats.base import ContainerExistsError


def lock_path(path: str) -> str:
    """The lock file of output `path`: `.<name>.lock` beside it."""
    head, tail = os.path.split(os.path.abspath(os.fspath(path)))
    return os.path.join(head, f".{tail}.lock")


class OutputLock:
    """An exclusive lock on output `path`, taken at construction; `release()` (safe twice) ends it.

    Raises:
        ContainerExistsError: another writer (another job, or this one) holds the lock.

    Where the lock cannot be taken for any other reason (a read-only or unwritable directory, a
    file system without `flock`), the writer goes on without it and meets that directory's own
    error where it creates its temporary.
    """

    def __init__(self, path):
        self.path = lock_path(path)
        self._fd: int | None = None
        for _ in range(8):  # the file may be removed by the holder that ends between open and flock
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            except OSError:
                return
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                os.close(fd)
                if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    raise ContainerExistsError(
                        f"{os.fspath(path)} is being written by another job now (it holds {self.path}); "
                        "wait for it to end or choose another output"
                    ) from None
                return  # no flock here (ENOLCK, ENOSYS, EOPNOTSUPP): no lock
            try:
                same = os.stat(self.path).st_ino == os.fstat(fd).st_ino
            except OSError:
                same = False
            if same:
                self._fd = fd
                return
            os.close(fd)  # we locked a file its last holder had just removed: take the new one

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        """Removes the lock file and releases the lock. Safe to call twice."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            os.unlink(self.path)  # while still locked: nobody else can hold this file now
        except OSError:
            pass
        os.close(fd)

    def __del__(self):
        self.release()
