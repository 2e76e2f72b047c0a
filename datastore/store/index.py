"""The served samples' index (offsets, labels, checksums) once per node, in node shared memory,
read from storage by one rank of the node.

A store needs each served sample's byte offsets (who owns it, where it lies in the owner's
window, how long it is) and its label (the batch's labels). Held by every rank that is 16 bytes
per sample per rank, read from the parallel file system by every rank at open. `NodeIndex` keeps
one copy per node: the node's first rank reads the container's index (checked as at any open),
copies the served slice into a shared-memory window (dstore.store.window.Arena with shared=True) and
drops its reader's copy; the node's other ranks map that window read-only and never read the
index (they open the container with ``index=False``: attributes only, then byte ranges). The
checksums are kept too (4 bytes per sample): every byte read from storage is checked against them
(dstore.formats.integrity). Labels are held in the smallest integer type that holds the served labels
(`label_dtype`: uint8 for up to 256 classes, so 8 + 4 + 1 = 13 bytes per sample); the batch
widens its labels to int64. Names and source indices are neither held nor read at open (the
reader reads offsets, labels and checksums: 20 bytes per sample): what needs them (verify, error
messages) reads them from the container.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import DTypeLike

from dstore.errors import ConfigError
from dstore.formats.backends import checked
from dstore.runtime.collective import agree, node_comm
from dstore.store.window import Arena

BYTES_PER_SAMPLE = 13
"""Bytes per served sample of one node's index: int64 offsets, uint32 checksums, uint8 labels
(labels of more than 256 classes, or negative ones, take 2, 4 or 8: `label_dtype`)."""

LABEL_DTYPES = (np.uint8, np.int16, np.int32, np.int64)
"""The label types a node index holds, smallest first (the first that holds every served label)."""


def label_dtype(lo: int, hi: int) -> np.dtype:
    """The smallest of LABEL_DTYPES holding every integer in [lo, hi]."""
    for t in LABEL_DTYPES:
        info = np.iinfo(t)
        if info.min <= lo and hi <= info.max:
            return np.dtype(t)
    return np.dtype(np.int64)


def index_bytes(n: int, labels: DTypeLike) -> int:
    """Bytes of a node index of n samples whose labels are of type `labels`."""
    return _labels_at(n, labels) + np.dtype(labels).itemsize * n


def _labels_at(n: int, labels: DTypeLike) -> int:
    """Where the labels start in a node index: after the offsets and checksums, aligned to their type."""
    k = np.dtype(labels).itemsize
    return -(-(8 * (n + 1) + 4 * n) // k) * k


class NodeIndex:
    """Offsets (int64[n+1], from 0), checksums (uint32[n]) and labels (`label_dtype` of the served
    labels: uint8 for up to 256 classes; widen to int64 where delivered) of container samples
    [start, stop), one read-only copy per node (collective over `comm`; `free()` is collective too, safe twice).

    Args:
        comm: the store's communicator.
        reader: the store's ContainerReader (opened with or without its index).
        start, stop: the served samples.
        check_labels: refuse labels outside the class names (as dstore.formats.open_container).

    Raises:
        FormatError (on every rank, agreed): the node reader's index is malformed.
    """

    def __init__(self, comm, reader, start: int, stop: int, *, check_labels: bool = True):
        self._node = node_comm(comm)
        self._arena = None
        self.bytes_read = 0  # index bytes this rank read from storage
        self.base_byte = 0  # the data byte of sample `start`
        n = int(stop) - int(start)
        leader = self._node.Get_rank() == 0
        exc, code = None, 0
        try:  # the node reader reads (and checks) the index first: the labels' type sizes the window
            if leader:
                code = self._prepare(reader, int(start), int(stop), check_labels)
        except Exception as e:  # noqa: BLE001 - every rank must learn of it, or they would wait forever
            exc = e
        try:
            size = index_bytes(n, LABEL_DTYPES[code]) if leader and exc is None else 0
            self._arena = Arena(self._node, size, shared=True)  # collective: every rank of the node comes here
            if leader and exc is None:
                self._fill(reader, int(start), int(stop), LABEL_DTYPES[code])
        except Exception as e:  # noqa: BLE001 - as above
            exc = exc or e
        try:
            agree(comm, exc)
        except BaseException:
            self.free()  # agreed: every rank is here
            raise
        arena = self._shared()  # agreed: every rank's Arena() succeeded
        arena.publish()
        seg = arena.segment(0)
        self.base_byte, code = self._node.bcast((self.base_byte, code), root=0)
        self.base_byte = int(self.base_byte)
        lab = np.dtype(LABEL_DTYPES[code])
        self.offsets = _readonly(seg[: 8 * (n + 1)].view(np.int64))
        a = 8 * (n + 1)
        self.checksums = _readonly(seg[a : a + 4 * n].view(np.uint32))
        a = _labels_at(n, lab)
        self.labels = _readonly(seg[a : a + lab.itemsize * n].view(lab))

    @property
    def nbytes(self) -> int:
        """Bytes of the node's copy (offsets, checksums, labels)."""
        offsets, checksums, labels = self.offsets, self.checksums, self.labels
        if offsets is None or checksums is None or labels is None:  # freed: all three are None
            return 0
        return offsets.nbytes + checksums.nbytes + labels.nbytes

    @property
    def node_size(self) -> int:
        """Ranks sharing this copy."""
        return self._node.Get_size() if self._node is not None else 0

    def _shared(self) -> Arena:
        """The node's window; ValueError once freed (or before it is allocated)."""
        if self._arena is None:
            raise ValueError("this NodeIndex is freed: its shared window is gone")
        return self._arena

    def _prepare(self, reader, start: int, stop: int, check_labels: bool) -> int:
        """The node reader's index read (and its labels checked); the index into LABEL_DTYPES of the
        smallest type holding the served labels."""
        self._had = reader.index_loaded
        if not self._had:
            self.bytes_read = 20 * reader.num_samples + 8  # offsets, labels, checksums (never source_index)
        if check_labels:
            checked(reader, True)
        labels = reader.labels[start:stop]
        lo, hi = (int(labels.min()), int(labels.max())) if labels.size else (0, 0)
        return LABEL_DTYPES.index(label_dtype(lo, hi).type)

    def _fill(self, reader, start: int, stop: int, labels) -> None:
        n = stop - start
        seg = self._shared().local
        off = seg[: 8 * (n + 1)].view(np.int64)
        full = reader.offsets
        self.base_byte = int(full[start])
        np.subtract(full[start : stop + 1], full[start], out=off)
        a = 8 * (n + 1)
        seg[a : a + 4 * n].view(np.uint32)[:] = reader.checksums[start:stop]
        a = _labels_at(n, labels)
        seg[a : a + np.dtype(labels).itemsize * n].view(labels)[:] = reader.labels[start:stop]
        if not self._had:  # this reader read them for the node: the shared copy replaces its own
            reader.drop_index()

    def free(self) -> None:
        """Collective over the node: unmaps and frees the shared copy. Safe twice."""
        arena, self._arena = self._arena, None
        node, self._node = self._node, None
        self.offsets = self.labels = self.checksums = None
        if arena is not None:
            arena.free()
        if node is not None:
            node.Free()

    def abandon(self) -> None:
        """Local-only: drops the references (after an error another rank may not share)."""
        self._arena = self._node = None
        self.offsets = self.labels = self.checksums = None


def served_range(container, sample_range) -> tuple[int, int]:
    """(start, stop) of the samples a store serves: all, or `sample_range` checked (ConfigError)."""
    total = container.num_samples
    if sample_range is None:
        start, stop = 0, total
    else:
        try:
            start, stop = (int(x) for x in sample_range)
        except (TypeError, ValueError):
            raise ConfigError(f"sample_range={sample_range!r} must be (start, stop)") from None
        if not 0 <= start < stop <= total:
            raise ConfigError(f"sample_range={sample_range!r} must satisfy 0 <= start < stop <= {total}")
    if stop <= start:
        raise ConfigError(f"the container {container.path} holds no samples")
    return start, stop


def _readonly(a: np.ndarray) -> np.ndarray:
    a.flags.writeable = False
    return a
