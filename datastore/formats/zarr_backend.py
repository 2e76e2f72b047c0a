"""The Zarr v3 backend: one directory-store group holding the container layout (docs/format.md).

Named `zarr_backend` so that nothing here can shadow the `zarr` package.
"""

from __future__ import annotations

import json
import os

import numpy as np
import zarr

from datastore.errors import ConfigError, FormatError
from datastore.formats.base import ContainerReader, ContainerWriter
from datastore.formats.layout import (
    ARRAYS,
    COMPLETE_ATTR,
    DATA_CHUNK_BYTES,
    INDEX_CHUNK,
    SampleBuffer,
    check_index,
    check_out,
    check_target,
    check_writer_args,
    make_attrs,
    move_into_place,
    parse_info,
    remove_path,
    temp_path,
)


class ZarrReader(ContainerReader):
    """Reads a container from a Zarr v3 directory (read-only, so many ranks may open it at once)."""

    def __init__(self, path):
        self.path = os.fspath(path)
        self._group = None
        try:
            group = zarr.open_group(self.path, mode="r", zarr_format=3)
            attrs = dict(group.attrs)
        except (OSError, ValueError, KeyError, TypeError, json.JSONDecodeError) as exc:
            raise FormatError(f"{self.path}: not a readable Zarr v3 group: {type(exc).__name__}: {exc}") from exc
        self.info = parse_info(attrs, self.path)
        present = set(group.array_keys())
        missing = [a for a in ARRAYS if a not in present]
        if missing:
            raise FormatError(f"{self.path}: missing array(s) {missing}")
        try:
            data = group["data"]
            if data.dtype != np.uint8 or data.ndim != 1:
                raise FormatError(f"{self.path}: data must be 1-D uint8, got {data.dtype}{data.shape}")
            self.offsets = np.asarray(group["offsets"][...], dtype=np.int64)
            self.labels = np.asarray(group["labels"][...], dtype=np.int64)
            self.checksums = np.asarray(group["checksums"][...], dtype=np.uint32)
            self.source_index = np.asarray(group["source_index"][...], dtype=np.int64)
            names = group["names"]
        except (OSError, ValueError, KeyError) as exc:
            if isinstance(exc, FormatError):
                raise
            raise FormatError(f"{self.path}: cannot read the container's arrays: {type(exc).__name__}: {exc}") from exc
        check_index(self.path, self.info, int(data.shape[0]), self.offsets, self.labels, self.checksums,
                    self.source_index, int(names.shape[0]) if names.ndim == 1 else -1)
        self._group, self._data, self._names = group, data, names

    def _live(self):
        if self._group is None:
            raise ConfigError(f"{self.path}: the reader is closed")
        return self._data

    def read_bytes(self, lo: int, hi: int, out: np.ndarray | None = None) -> np.ndarray:
        """data[lo:hi] as one slice of the Zarr array (its chunks are fetched concurrently)."""
        lo, hi = int(lo), int(hi)
        if not 0 <= lo <= hi <= self.total_bytes:
            raise ConfigError(f"byte range [{lo}, {hi}) is not within [0, {self.total_bytes}] in {self.path}")
        data = self._live()
        if out is not None:
            out = check_out(out, hi - lo)
        if hi == lo:
            return out if out is not None else np.empty(0, dtype=np.uint8)
        try:
            got = np.asarray(data[lo:hi])
        except (OSError, ValueError) as exc:
            raise FormatError(f"{self.path}: cannot read bytes [{lo}, {hi}) of data: {exc}") from exc
        if out is None:
            return got
        out[:] = got
        return out

    def name(self, i: int) -> str:
        i = self._check_index(i)
        self._live()
        return str(self._names[i])

    def close(self) -> None:
        self._group = self._data = self._names = None


class ZarrWriter(ContainerWriter):
    """Streams samples into a temporary Zarr v3 directory beside `path`, `data` uncompressed in chunks
    of `chunk_bytes`; `commit()` writes the index arrays, the attributes, the marker last, and
    renames the directory to `path`."""

    def __init__(self, path, *, encoding: str, class_names, raw_dtype=None, raw_shape=None, source: str = "",
                 extra_attrs: dict | None = None, overwrite: bool = False, chunk_bytes: int = DATA_CHUNK_BYTES):
        self._class_names = check_writer_args(encoding=encoding, class_names=class_names,
                                              raw_dtype=raw_dtype, raw_shape=raw_shape)
        self._meta = dict(encoding=encoding, class_names=self._class_names, raw_dtype=raw_dtype,
                          raw_shape=raw_shape, source=source, extra_attrs=extra_attrs)
        make_attrs(**self._meta, num_samples=0, total_bytes=0)  # reject bad extra_attrs before any file exists
        self._overwrite = bool(overwrite)
        self.path = check_target(path, self._overwrite)
        self._tmp = temp_path(self.path)
        self._buf = SampleBuffer(self._write_chunk, chunk_bytes)
        self._data = None
        self._state = "open"
        self._group = zarr.open_group(self._tmp, mode="w-", zarr_format=3)

    @property
    def num_samples(self) -> int:
        return self._buf.num_samples

    def _write_chunk(self, chunk: np.ndarray, start: int) -> None:
        if self._data is None:
            self._data = self._group.create_array("data", shape=(0,), dtype=np.uint8,
                                                  chunks=(self._buf.chunk_bytes,), compressors=None)
        stop = start + chunk.size
        self._data.resize((stop,))
        self._data[start:stop] = chunk

    def append(self, data, label: int, name: str, source_index: int = -1) -> int:
        if self._state != "open":
            raise ConfigError(f"cannot append to {self.path}: the writer is {self._state}")
        return self._buf.append(data, label, name, source_index)

    def commit(self) -> str:
        if self._state != "open":
            raise ConfigError(f"cannot commit {self.path}: the writer is {self._state}")
        try:
            g, buf = self._group, self._buf
            tail = buf.tail()
            if self._data is None:  # everything fit in one buffer: one chunk of the exact size
                arr = g.create_array("data", shape=(tail.size,), dtype=np.uint8,
                                     chunks=(max(tail.size, 1),), compressors=None)
                if tail.size:
                    arr[:] = tail
            elif tail.size:
                self._write_chunk(tail, buf.written)
            for key, values in buf.index_arrays().items():
                arr = g.create_array(key, shape=values.shape, dtype=values.dtype,
                                     chunks=(max(1, min(values.size, INDEX_CHUNK)),))
                if values.size:
                    arr[:] = values
            n = buf.num_samples
            names = g.create_array("names", shape=(n,), dtype=str, chunks=(max(1, min(n, INDEX_CHUNK)),))
            if n:
                names[:] = np.array(buf.names, dtype=object)
            g.attrs.update(make_attrs(**self._meta, num_samples=n, total_bytes=buf.total_bytes))
            g.attrs[COMPLETE_ATTR] = True  # the marker, last
            self._group = None
            move_into_place(self._tmp, self.path, self._overwrite)
        except BaseException:
            self.abort()
            raise
        self._state = "committed"
        return self.path

    def abort(self) -> None:
        if self._state == "committed":
            return
        self._state = "aborted"
        self._group = self._data = None
        remove_path(self._tmp)
