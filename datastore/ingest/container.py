"""A dstore container as an ingest source: re-ingest it (in a seeded or stratified order, another
format, sharded, re-encoded) without its original files.

    dstore ingest written-by-hand.h5 shuffled.h5 --stratify

The use that matters: a container written in class order (a hand-written `create_writer` loop, a
`--keep-order` ingest) holds out a one-class tail in `dstore train`, which refuses it and names this
remedy. Samples keep their names and labels and the class names; each sample's bytes are checked
against the container's stored CRC32 as they are read, so a damaged sample is a bad sample
(`on_error`) rather than copied.
"""

from __future__ import annotations

import numpy as np

from dstore.errors import ChecksumError, SampleError
from dstore.formats import detect_format, open_container
from dstore.formats.base import checksum
from dstore.ingest.source import Source


def looks_like_container(spec: str) -> bool:
    """True if `spec` is something dstore.formats opens (HDF5 file, Zarr group, sharded manifest)."""
    try:
        detect_format(spec)
    except Exception:  # noqa: BLE001 - any refusal means "not a container"
        return False
    return True


class ContainerSource(Source):
    """The samples of the container at `spec`, each checked against its stored checksum."""

    kind = "container"

    def __init__(self, spec: str):
        super().__init__()
        self.path = spec
        self._reader = open_container(spec)
        info = self._reader.info
        self.class_names = tuple(info.class_names)
        self.encoding, self.raw_dtype = info.encoding, info.raw_dtype
        self.raw_shape = None if info.raw_shape is None else tuple(info.raw_shape)
        self.description = f"container {spec}" + (f" (from {info.source})" if info.source else "")
        self._labels = np.asarray(self._reader.labels, dtype=np.int64)
        self.field_specs = tuple(info.fields)  # carried over, each value checked against its checksum
        order = info.extra.get("ingest_order")
        if order is not None:
            self.notes.append(f"{spec} was written in {order} order; this ingest writes its own")

    def __getstate__(self):
        raise TypeError("a ContainerSource is opened on every rank, not sent")  # list_on_root is False

    @property
    def estimated_sample_bytes(self) -> int:
        return max(1, self._reader.total_bytes // max(1, self._reader.num_samples))

    def __len__(self) -> int:
        return self._reader.num_samples

    def label(self, i: int) -> int:
        return int(self._labels[i])

    def name(self, i: int) -> str:
        return self._reader.name(i)

    def locate(self, i: int) -> str:
        return f"{self.path}[{i}] ({self._reader.name(i)})"

    def fields(self, i: int, names) -> dict[str, bytes]:
        try:  # a missing value stays missing (left out), an empty one empty
            return {n: self._reader.field_bytes(n, i) for n in names if not self._reader.field_missing(n, i, i + 1)[0]}
        except ChecksumError as exc:
            raise SampleError(f"{self.locate(i)}: {exc}") from exc

    def load(self, i: int):
        data, _ = self._reader.sample(i)
        if checksum(data) != int(self._reader.checksums[i]):
            raise SampleError(f"{self.locate(i)}: checksum mismatch: the stored bytes are damaged")
        if self.encoding == "raw":
            assert self.raw_dtype is not None  # written with it (dstore.formats.layout.check_writer_args)
            return np.frombuffer(data, dtype=np.uint8).view(self.raw_dtype).reshape(self.raw_shape)
        return bytes(data)

    def close(self) -> None:
        """Closes the container (ingest calls it when done). Safe twice."""
        self._reader.close()
