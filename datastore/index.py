"""The served samples' index (offsets, labels, checksums) once per node, in node shared memory,
read from storage by one rank of the node.

A store needs each served sample's byte offsets (who owns it, where it lies in the owner's
window, how long it is) and its label (the batch's labels). Held by every rank that is 16 bytes
per sample per rank, read from the parallel file system by every rank at open. `NodeIndex` keeps
one copy per node: the node's first rank reads the container's index (checked as at any open),
copies the served slice into a shared-memory window (dstore.window.Arena with shared=True) and
drops its reader's copy; the node's other ranks map that window read-only and never read the
index (they open the container with ``index=False``: attributes only, then byte ranges). The
checksums are kept too (4 bytes per sample): every byte read from storage is checked against them
(dstore.integrity). Names and source indices are not held: what needs them (verify, error
messages) reads them from the container.
"""

from __future__ import annotations

import numpy as np

from dstore.collective import agree, node_comm
from dstore.errors import ConfigError
from dstore.formats.backends import checked
from dstore.window import Arena

BYTES_PER_SAMPLE = 20
"""Bytes per served sample of one node's index: int64 offsets, int64 labels, uint32 checksums."""


class NodeIndex:
    """Offsets (int64[n+1], from 0), labels (int64[n]) and checksums (uint32[n]) of container samples
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
        exc = None
        try:
            self._arena = Arena(self._node, BYTES_PER_SAMPLE * n + 8 if leader else 0, shared=True)
            if leader:
                self._fill(reader, int(start), int(stop), check_labels)
        except Exception as e:  # noqa: BLE001 - every rank must learn of it, or they would wait forever
            exc = e
        try:
            agree(comm, exc)
        except BaseException:
            self.free()  # agreed: every rank is here
            raise
        self._arena.publish()
        seg = self._arena.segment(0)
        self.base_byte = int(self._node.bcast(self.base_byte, root=0))
        self.offsets = _readonly(seg[:8 * (n + 1)].view(np.int64))
        self.labels = _readonly(seg[8 * (n + 1):8 * (2 * n + 1)].view(np.int64))
        self.checksums = _readonly(seg[8 * (2 * n + 1):8 * (2 * n + 1) + 4 * n].view(np.uint32))

    @property
    def node_size(self) -> int:
        """Ranks sharing this copy."""
        return self._node.Get_size() if self._node is not None else 0

    def _fill(self, reader, start: int, stop: int, check_labels: bool) -> None:
        had = reader.index_loaded
        if not had:
            self.bytes_read = 28 * reader.num_samples + 8  # offsets, labels, checksums, source_index
        if check_labels:
            checked(reader, True)
        n = stop - start
        seg = self._arena.local
        off = seg[:8 * (n + 1)].view(np.int64)
        full = reader.offsets
        self.base_byte = int(full[start])
        np.subtract(full[start:stop + 1], full[start], out=off)
        seg[8 * (n + 1):8 * (2 * n + 1)].view(np.int64)[:] = reader.labels[start:stop]
        seg[8 * (2 * n + 1):8 * (2 * n + 1) + 4 * n].view(np.uint32)[:] = reader.checksums[start:stop]
        if not had:  # this reader read them for the node: the shared copy replaces its own
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
