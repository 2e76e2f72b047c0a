"""The HDF5 backend: one `.h5` file holding the container layout (docs/format.md), read with h5py."""

from __future__ import annotations

import json
import os

import h5py
import numpy as np

from datastore.errors import ConfigError, FormatError
from datastore.formats.base import ContainerReader
from datastore.formats.layout import (
    ARRAYS,
    COMPLETE_ATTR,
    SampleBuffer,
    StreamingWriter,
    check_byte_range,
    check_index,
    check_out,
    parse_info,
)

HDF5_MAGIC = b"\x89HDF\r\n\x1a\n"
SUFFIXES = (".h5", ".hdf5")
_DIRECT_READ_BYTES = 1 << 20
"""From this size on, a read with `out` goes straight into it (below, slice-and-copy is faster)."""


def is_hdf5(path: str) -> bool:
    """True if `path` is a file that starts with the HDF5 signature."""
    try:
        with open(path, "rb") as f:
            return f.read(len(HDF5_MAGIC)) == HDF5_MAGIC
    except OSError:
        return False


def _py(value):
    """An attribute value as plain Python (str, int, float, bool, lists of those)."""
    if isinstance(value, bytes):
        return value.decode("utf-8")
    if isinstance(value, np.ndarray):
        return [_py(v) for v in value.tolist()]
    if isinstance(value, np.generic):
        return value.item()
    return value


def _attr_value(key: str, value):
    """A Python attribute value in a form h5py stores and plain h5py users read naturally."""
    if isinstance(value, (list, tuple)):
        if all(isinstance(v, str) for v in value):
            return np.array(list(value), dtype=h5py.string_dtype("utf-8"))
        return np.asarray(value)
    if isinstance(value, dict):
        return json.dumps(value)  # HDF5 has no mapping type; stored as JSON text
    if value is None:
        raise ConfigError(f"attribute {key!r} is None; HDF5 cannot store it")
    return value


class HDF5Reader(ContainerReader):
    """Reads a container from one HDF5 file. The file is opened read-only without HDF5 file locking,
    so any number of MPI ranks may open it at once; the `data` dataset handle is kept open."""

    def __init__(self, path):
        self.path = os.fspath(path)
        self._file = None
        try:
            f = h5py.File(self.path, "r", locking=False)
        except OSError as exc:
            raise FormatError(f"{self.path}: not a readable HDF5 file (truncated or corrupt?): {exc}") from exc
        self._file = f
        try:
            self._load(f)
        except BaseException:
            self.close()
            raise

    def _load(self, f: h5py.File) -> None:
        try:
            attrs = {k: _py(v) for k, v in f.attrs.items()}
            self.info = parse_info(attrs, self.path)
            missing = [a for a in ARRAYS if a not in f]
            if missing:
                raise FormatError(f"{self.path}: missing array(s) {missing}")
            data = f["data"]
            if data.dtype != np.uint8 or data.ndim != 1:
                raise FormatError(f"{self.path}: data must be 1-D uint8, got {data.dtype}{data.shape}")
            self.offsets = f["offsets"][()].astype(np.int64, copy=False)
            self.labels = f["labels"][()].astype(np.int64, copy=False)
            self.checksums = f["checksums"][()].astype(np.uint32, copy=False)
            self.source_index = f["source_index"][()].astype(np.int64, copy=False)
            names = f["names"]
        except OSError as exc:  # h5py reports damaged metadata as OSError/KeyError
            raise FormatError(f"{self.path}: cannot read the container (truncated or corrupt?): {exc}") from exc
        except KeyError as exc:
            raise FormatError(f"{self.path}: damaged HDF5 structure: {exc}") from exc
        check_index(self.path, self.info, int(data.shape[0]), self.offsets, self.labels, self.checksums,
                    self.source_index, int(names.shape[0]) if names.ndim == 1 else -1)
        self._data = data
        self._data_id = data.id
        self._names = names.asstr() if h5py.check_string_dtype(names.dtype) else names

    def _live(self):
        if self._file is None:
            raise ConfigError(f"{self.path}: the reader is closed")
        return self._data_id

    def read_bytes(self, lo: int, hi: int, out: np.ndarray | None = None) -> np.ndarray:
        """data[lo:hi] in one HDF5 read straight into `out` (no intermediate copy)."""
        lo, hi = check_byte_range(self.path, lo, hi, self.total_bytes)
        dset = self._live()
        n = hi - lo
        try:
            if out is None or n < _DIRECT_READ_BYTES:
                # h5py's fast path for a plain slice beats any explicit selection by several times
                # (about 7 us per sample warm); for small reads the copy into `out` costs less.
                got = self._data[lo:hi]
                if out is None:
                    return got
                out = check_out(out, n)
                out[:] = got
                return out
            out = check_out(out, n)
            # Large range with `out`: one HDF5 read straight into it, no second buffer of this size.
            fspace = dset.get_space()
            fspace.select_hyperslab((lo,), (n,))
            dset.read(h5py.h5s.create_simple((n,)), fspace, out)
        except OSError as exc:
            raise FormatError(f"{self.path}: cannot read bytes [{lo}, {hi}) of data: {exc}") from exc
        return out

    def name(self, i: int) -> str:
        i = self._check_index(i)
        self._live()
        value = self._names[i]
        return value.decode("utf-8") if isinstance(value, bytes) else str(value)

    def close(self) -> None:
        f, self._file = self._file, None
        self._data = self._data_id = self._names = None
        if f is not None:
            f.close()


class HDF5Writer(StreamingWriter):
    """Streams samples into a temporary `.h5` beside `path` in chunks of `chunk_bytes`; `commit()`
    writes the index arrays, the attributes, the completion marker last, and renames it to `path`.
    Arguments: see `datastore.formats.create_writer`."""

    _file = None
    _data = None

    def _open_tmp(self) -> None:
        self._file = h5py.File(self._tmp, "w", locking=False)

    def _write_chunk(self, chunk: np.ndarray, start: int) -> None:
        if self._data is None:
            self._data = self._file.create_dataset("data", shape=(0,), maxshape=(None,), dtype=np.uint8,
                                                   chunks=(self._buf.chunk_bytes,))
        stop = start + chunk.size
        self._data.resize((stop,))
        size = self._buf.chunk_bytes
        if chunk.size == size and start % size == 0:
            # A whole chunk (no filters) goes to the file as it is: about twice as fast as a
            # selection write, which goes through HDF5's type conversion and chunk machinery.
            self._data.id.write_direct_chunk((start,), np.ascontiguousarray(chunk))
        else:
            self._data.write_direct(np.ascontiguousarray(chunk), dest_sel=np.s_[start:stop])

    def _finish(self, buf: SampleBuffer, attrs: dict) -> None:
        f = self._file
        tail = buf.tail()
        if self._data is None:  # everything fit in one buffer: a contiguous dataset of the exact size
            f.create_dataset("data", data=tail, dtype=np.uint8)
        elif tail.size:
            self._write_chunk(tail, buf.written)
        for key, arr in buf.index_arrays().items():
            f.create_dataset(key, data=arr)
        f.create_dataset("names", data=np.array(buf.names, dtype=object),
                         dtype=h5py.string_dtype("utf-8"), shape=(buf.num_samples,))
        for key, value in attrs.items():
            f.attrs[key] = _attr_value(key, value)
        f.flush()
        f.attrs[COMPLETE_ATTR] = True  # the marker, last
        self._file = None
        f.close()

    def _discard(self) -> None:
        f, self._file = self._file, None
        if f is not None:
            try:
                f.close()
            except Exception:  # noqa: BLE001 - the file is being thrown away; removing it is what matters
                pass
