"""Bytes read from storage checked against the container's per-sample CRC32s, in the thread that
read them, and the one error a mismatch becomes.

Every path that brings sample bytes from storage into the store (the preload's pieces, the tiered
preload's runs, the dynamic population, the storage tier's reads) hands its buffer to a
`SampleChecks` right after the read, in the same thread: CRC32 (zlib-ng's, else zlib's) releases
the GIL for buffers over 5 KiB, so checking overlaps the other reads, decoding and the training
step, as the reads do.
A mismatch raises `ChecksumError` with the served indices; `read_error` (the error any failed read
becomes) then names the container, the samples, and whether the container's files changed since
the job opened them (`ContainerChangedError`), since a file rewritten under a running job is the
usual cause of both.
"""

from __future__ import annotations

import numpy as np

from dstore.errors import ChecksumError, ContainerChangedError, FormatError, shown
from dstore.formats.crc import crc32


class SampleChecks:
    """The CRC32s of served samples [0, N), checked against bytes read from storage.

    Args:
        offsets: int64[N+1], sample i is bytes [offsets[i], offsets[i+1]) of the served data.
        checksums: uint32[N], each sample's stored CRC32.
    """

    def __init__(self, offsets: np.ndarray, checksums: np.ndarray):
        self.offsets = np.asarray(offsets, dtype=np.int64)
        self.checksums = np.asarray(checksums, dtype=np.uint32)

    def run(self, buf: np.ndarray, lo: int, hi: int) -> None:
        """Checks samples [lo, hi), which lie back to back in `buf` from its first byte.

        Raises:
            ChecksumError: with the served indices of the samples that do not match.
        """
        if hi > lo:
            self._check(buf, np.arange(lo, hi, dtype=np.int64), int(self.offsets[lo]))

    def ids(self, buf: np.ndarray, ids, at: int) -> None:
        """Checks samples `ids`, sample i lying in `buf` at ``offsets[i] - at`` (``at``: the served
        data byte that `buf` starts with). Raises ChecksumError as `run`."""
        self._check(buf, np.asarray(ids, dtype=np.int64), int(at))

    def _check(self, buf: np.ndarray, ids: np.ndarray, at: int) -> None:
        view = buf.data.cast("B")  # memoryview(buf): numpy's stubs give ndarray __buffer__ on Python 3.12+ only
        starts, ends = (self.offsets[ids] - at).tolist(), (self.offsets[ids + 1] - at).tolist()
        want = self.checksums[ids].tolist()
        bad = [i for i, a, b, c in zip(ids.tolist(), starts, ends, want) if crc32(view[a:b]) != c]
        if bad:
            raise ChecksumError(f"{len(bad)} sample(s) read from storage do not match their checksums", bad)


def read_error(container, start: int, exc: BaseException, lo: int, hi: int, ids=None) -> FormatError:
    """A FormatError naming the container and the samples among served [lo, hi) (or `ids`) that
    cannot be read (each tried alone, on this failure path only), or the range if none fails alone.

    Args:
        container: the store's ContainerReader (used from the calling thread only).
        start: the container index of served sample 0.
    """
    if isinstance(exc, ChecksumError) and exc.samples:  # the check names its samples: no re-reading
        return mismatch_error(container, start, exc)
    if isinstance(exc, ContainerChangedError):  # names the container and what changed
        return exc
    path = getattr(container, "path", "the container")
    change = container.changes() if hasattr(container, "changes") else None
    if change:  # a file rewritten under the job (a read past a truncated end, a chunk gone, ...)
        return ContainerChangedError(
            f"{path}: the container changed while this job was reading it ({change}); "
            f"a read failed: {type(exc).__name__}: {exc}"
        )
    bad = []
    tried = range(lo, min(hi, lo + 4096)) if ids is None else np.unique(ids)[:4096].tolist()
    if ids is not None:
        lo, hi = (int(min(tried)), int(max(tried)) + 1) if len(tried) else (0, 1)
    for i in tried:
        try:
            container.read_range(start + i, start + i + 1)
        except Exception:  # noqa: BLE001 - we are narrowing an error down to its samples
            bad.append(i)
    ids = [start + i for i in (bad or [lo, hi - 1])]

    if bad:
        which = ("sample " if len(ids) == 1 else f"{len(ids)} samples: ") + ", ".join(
            named(container, i) for i in ids[:5]
        )
        which += " ..." if len(ids) > 5 else ""
    else:
        which = f"samples {named(container, ids[0])} .. {named(container, ids[-1])}"
    return FormatError(f"{path}: cannot read {which}: {type(exc).__name__}: {exc}")


def mismatch_error(container, start: int, exc: ChecksumError) -> FormatError:
    """The error for samples whose bytes did not match their checksums (served indices in
    `exc.samples`, served sample 0 being container sample `start`): a ContainerChangedError where the
    container's files changed since it was opened, else a ChecksumError; both name the container
    and the samples (index and name)."""
    path = getattr(container, "path", "the container")
    ids = [start + i for i in exc.samples]
    which = ", ".join(named(container, i) for i in ids[:5]) + (" ..." if len(ids) > 5 else "")
    what = f"{len(ids)} sample(s) read from storage do not match their checksums: {which}"
    change = container.changes() if hasattr(container, "changes") else None
    if change:
        return ContainerChangedError(
            f"{path}: the container changed while this job was reading it ({change}); "
            f"{what}. A container must not be rewritten while a job reads it"
        )
    return ChecksumError(
        f"{path}: {what} (its files are the ones opened: damaged storage or a rewrite that "
        "kept size and time?); `dstore verify` checks the whole container",
        ids,
    )


def named(container, i: int) -> str:
    """``"i (name)"`` for container sample i, the name `shown`; the index alone if it has none."""
    try:
        return f"{i} ({shown(container.name(i))})"
    except Exception:  # noqa: BLE001 - the name is a courtesy; the index is the fact
        return str(i)
