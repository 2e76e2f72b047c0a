"""What every backend shares: attribute names, validation of a container's index, streaming sample
buffers, and the temporary-name/rename protocol (the layout itself is specified in docs/format.md)."""

from __future__ import annotations

import array
import contextlib
import json
import os
from collections.abc import Callable
from typing import Any

import numpy as np

from dstore.errors import ConfigError, DStoreError, FormatError, IncompleteContainerError, OutputError
from dstore.formats.base import (
    ENCODINGS,
    FORMAT_VERSION,
    ContainerInfo,
    ContainerWriter,
    check_batch,
)
from dstore.formats.base import checksum as crc32_of
from dstore.formats.fields import FIELDS_ATTR, FieldBuffer, check_field_specs, fields_attr, parse_fields_attr
from dstore.formats.lock import OutputLock
from dstore.formats.replace import check_target, move_into_place, remove_path, remove_stale_temporaries, temp_path

COMPLETE_ATTR = "complete"
"""The completion marker: an attribute set to True, written after everything else."""

REQUIRED_ATTRS = ("version", "encoding", "class_names", "num_samples", "total_bytes")

DATA_CHUNK_BYTES = 8 << 20
"""Chunk size of `data` (uncompressed), and how much a writer buffers before writing: large, so a
contiguous range read is a few large I/Os."""

INDEX_CHUNK = 1 << 18
"""Chunk length (elements) of the per-sample arrays."""


def make_attrs(
    *,
    encoding: str,
    class_names,
    raw_dtype=None,
    raw_shape=None,
    source: str = "",
    extra_attrs: dict | None = None,
    num_samples: int,
    total_bytes: int,
    fields=(),
) -> dict[str, Any]:
    """The attribute dict a writer stores (without the completion marker), JSON-compatible; the
    `fields` attribute only where there are fields (a container without them is as before)."""
    attrs: dict[str, Any] = dict(extra_attrs or {})
    clash = sorted(
        set(attrs) & (set(REQUIRED_ATTRS) | {"raw_dtype", "raw_shape", "source", COMPLETE_ATTR, FIELDS_ATTR})
    )
    if clash:
        raise ConfigError(f"extra_attrs may not set the reserved attributes {clash}")
    attrs.update(
        version=FORMAT_VERSION,
        encoding=encoding,
        class_names=list(class_names),
        num_samples=int(num_samples),
        total_bytes=int(total_bytes),
        source=str(source),
    )
    if raw_dtype is not None:
        attrs["raw_dtype"] = str(np.dtype(raw_dtype))
    if raw_shape is not None:
        attrs["raw_shape"] = [int(s) for s in raw_shape]
    if fields:
        attrs[FIELDS_ATTR] = fields_attr(fields)
    try:
        json.dumps(attrs)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"extra_attrs must be JSON-compatible: {exc}") from exc
    return attrs


def check_writer_args(*, encoding: str, class_names, raw_dtype, raw_shape) -> tuple[str, ...]:
    """Validates a writer's arguments up front (before any file exists); returns the class names."""
    if encoding not in ENCODINGS:
        raise ConfigError(f"encoding={encoding!r} is not one of {ENCODINGS}")
    if encoding == "raw" and (raw_dtype is None or raw_shape is None):
        raise ConfigError("encoding='raw' needs raw_dtype and raw_shape")
    if isinstance(class_names, str):
        raise ConfigError(f"class_names must be a sequence of strings, not the string {class_names!r}")
    names = tuple(_stored_name(c, "class name") for c in class_names)
    if raw_dtype is not None:
        try:
            np.dtype(raw_dtype)
        except TypeError as exc:
            raise ConfigError(f"raw_dtype={raw_dtype!r} is not a numpy dtype") from exc
    return names


def _int_attr(attrs: dict, key: str, path: str) -> int:
    """Attribute `key` as a non-negative int, else a FormatError naming it and its value."""
    value = attrs[key]
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) or int(value) < 0:
        raise FormatError(f"{path}: attribute {key}={value!r} is not a non-negative integer")
    return int(value)


def _raw_attrs(attrs: dict, path: str) -> tuple[str | None, tuple[int, ...] | None]:
    """(raw_dtype, raw_shape) from the attributes, checked: a numeric numpy dtype, positive ints."""
    dtype, shape = attrs.get("raw_dtype"), attrs.get("raw_shape")
    if dtype is not None:
        try:
            kind = np.dtype(str(dtype)).kind
        except (TypeError, ValueError):
            kind = None
        if kind is None or kind not in "biufc":
            raise FormatError(f"{path}: attribute raw_dtype={dtype!r} is not a numeric numpy dtype")
        dtype = str(np.dtype(str(dtype)))
    if shape is not None:
        if not isinstance(shape, (list, tuple)) or any(
            isinstance(s, (bool, np.bool_)) or not isinstance(s, (int, np.integer)) or s < 1 for s in shape
        ):
            raise FormatError(f"{path}: attribute raw_shape={shape!r} is not a list of positive integers")
        shape = tuple(int(s) for s in shape)
    return dtype, shape


def parse_info(attrs: dict, path: str) -> ContainerInfo:
    """ContainerInfo from stored attributes; raises IncompleteContainerError without the marker and
    FormatError for a missing attribute, an unknown version or a value of the wrong kind (naming it)."""
    if not attrs.get(COMPLETE_ATTR, False):
        raise IncompleteContainerError(
            f"{path}: no completion marker (attribute {COMPLETE_ATTR!r} is missing): the container was "
            "never finished or is still being written"
        )
    missing = [k for k in REQUIRED_ATTRS if k not in attrs]
    if missing:
        raise FormatError(f"{path}: missing attribute(s) {missing}")
    version = _int_attr(attrs, "version", path)
    if version != FORMAT_VERSION:
        raise FormatError(f"{path}: unknown format version {version} (this code reads version {FORMAT_VERSION})")
    num_samples, total_bytes = _int_attr(attrs, "num_samples", path), _int_attr(attrs, "total_bytes", path)
    raw_dtype, raw_shape = _raw_attrs(attrs, path)
    names = attrs["class_names"]
    if isinstance(names, str) or not isinstance(names, (list, tuple)):
        raise FormatError(f"{path}: attribute class_names is not a list of strings (got {type(names).__name__})")
    if not isinstance(attrs["encoding"], str):
        raise FormatError(f"{path}: attribute encoding={attrs['encoding']!r} is not a string")
    reserved = set(REQUIRED_ATTRS) | {"raw_dtype", "raw_shape", "source", COMPLETE_ATTR, FIELDS_ATTR}
    fields = parse_fields_attr(attrs.get(FIELDS_ATTR), path)
    try:
        return ContainerInfo(
            version=version,
            encoding=attrs["encoding"],
            num_samples=num_samples,
            total_bytes=total_bytes,
            class_names=tuple(str(c) for c in names),
            raw_dtype=raw_dtype,
            raw_shape=raw_shape,
            source=str(attrs.get("source", "")),
            extra={k: v for k, v in attrs.items() if k not in reserved},
            fields=fields,
        )
    except FormatError as exc:
        raise FormatError(f"{path}: {exc}") from exc


MAX_COMPRESSION = 50_000
"""The largest ratio of declared to stored bytes believed for a compressed array (zstd reaches about
25,000:1 on runs of zeros, gzip about 1,000:1); more is a hostile or damaged file."""

INDEX_FLOOR_BYTES = 64 << 20
"""Declared bytes of one index array accepted whatever the stored size (zarr leaves out chunks that
hold only the fill value, so an all-zero `labels` array may store nothing at all)."""


def check_declared(path: str, what: str, declared: int, stored: int, *, ratio: int = 1, slack: int = 0) -> None:
    """Raises FormatError if array `what` declares more bytes than `stored` bytes on disk can hold
    (times `ratio` for compressed data, plus `slack`): checked before anything of that size is
    allocated, so a small file declaring a terabyte costs nothing."""
    if declared > stored * ratio + slack:
        raise FormatError(
            f"{path}: array {what!r} declares {declared} bytes but the file stores only {stored} "
            "bytes of it (damaged, truncated or not written by dstore); refusing to read it"
        )


def check_index(
    path: str,
    info: ContainerInfo,
    data_len: int,
    offsets: np.ndarray,
    labels: np.ndarray,
    checksums: np.ndarray,
    names_len: int,
) -> None:
    """Raises FormatError naming what is inconsistent among the index arrays, `data` and the attributes."""
    n = info.num_samples
    if offsets.ndim != 1 or offsets.shape[0] != n + 1:
        raise FormatError(f"{path}: offsets has shape {offsets.shape}, expected ({n + 1},) for num_samples={n}")
    for arr_name, arr in (("labels", labels), ("checksums", checksums)):
        check_per_sample(path, info, arr_name, arr)
    if names_len != n:
        raise FormatError(f"{path}: names has length {names_len}, expected {n}")
    if offsets[0] != 0:
        raise FormatError(f"{path}: offsets[0] is {int(offsets[0])}, expected 0")
    steps = np.diff(offsets)
    if (steps < 0).any():
        bad = int(np.flatnonzero(steps < 0)[0])
        raise FormatError(
            f"{path}: offsets are not monotonic: offsets[{bad}]={int(offsets[bad])} > "
            f"offsets[{bad + 1}]={int(offsets[bad + 1])}"
        )
    if int(offsets[-1]) != data_len:
        raise FormatError(f"{path}: offsets[-1]={int(offsets[-1])} but data has {data_len} bytes")
    if info.total_bytes != data_len:
        raise FormatError(f"{path}: attribute total_bytes={info.total_bytes} but data has {data_len} bytes")


def check_per_sample(path: str, info: ContainerInfo, arr_name: str, arr: np.ndarray) -> None:
    """Raises FormatError naming the file unless `arr` is 1-D with one entry per sample."""
    n = info.num_samples
    if arr.ndim != 1 or arr.shape[0] != n:
        raise FormatError(f"{path}: {arr_name} has shape {arr.shape}, expected ({n},)")


def checked_source_index(path: str, info: ContainerInfo, source_index: np.ndarray) -> np.ndarray:
    """`source_index` as int64[N], after a FormatError naming the file unless it is integers, one per sample."""
    if source_index.dtype.kind not in "iu":
        raise FormatError(f"{path}: source_index has dtype {source_index.dtype}, expected an integer type")
    check_per_sample(path, info, "source_index", source_index)
    return source_index.astype(np.int64, copy=False)


def as_u8(data, what: str = "sample") -> np.ndarray:
    """A flat uint8 view of bytes-like or array data (no copy where possible)."""
    if isinstance(data, np.ndarray):
        if data.dtype != np.uint8:
            data = np.ascontiguousarray(data).view(np.uint8)
        return np.ascontiguousarray(data).reshape(-1)
    try:
        return np.frombuffer(memoryview(data).cast("B"), dtype=np.uint8)
    except TypeError as exc:
        raise ConfigError(f"{what} must be bytes-like or a numpy array, not {type(data).__name__}") from exc


def check_byte_range(path: str, lo: int, hi: int, total: int) -> tuple[int, int]:
    """(lo, hi) as ints if 0 <= lo <= hi <= total, else a ConfigError naming the range."""
    lo, hi = int(lo), int(hi)
    if not 0 <= lo <= hi <= total:
        raise ConfigError(f"byte range [{lo}, {hi}) is not within [0, {total}] in {path}")
    return lo, hi


def check_out(out: np.ndarray | None, n: int) -> np.ndarray:
    """`out` if it is a writable contiguous uint8 array of length n, else a new one."""
    if out is None:
        return np.empty(n, dtype=np.uint8)
    if not isinstance(out, np.ndarray) or out.dtype != np.uint8 or out.ndim != 1 or out.shape[0] != n:
        raise ConfigError(
            f"out must be a 1-D uint8 array of length {n}, got "
            f"{getattr(out, 'dtype', type(out).__name__)}{getattr(out, 'shape', '')}"
        )
    if not out.flags.c_contiguous or not out.flags.writeable:
        raise ConfigError("out must be C-contiguous and writable")
    return out


class SampleBuffer:
    """Collects appended samples; hands `data` to `flush(array, start)` in whole chunks, so a writer
    never holds more than about one chunk of sample bytes. Index arrays stay in memory as packed
    machine arrays (28 bytes per sample, plus each name's UTF-8 bytes and 8 for its end): a
    10M-sample ingest holds about 0.5 GB, where lists of Python ints and strings held ~200 bytes
    per sample. Names are handed to the writer in blocks (`name_blocks`).

    `flush` gets either the buffer's own chunk or, where a whole aligned chunk lies inside the
    bytes being appended, a view of the caller's bytes (no copy); it must not keep the array.
    """

    def __init__(self, flush: Callable[[np.ndarray, int], None], chunk_bytes: int = DATA_CHUNK_BYTES):
        if chunk_bytes <= 0:
            raise ConfigError(f"chunk_bytes={chunk_bytes} must be positive")
        self._flush = flush
        self.chunk_bytes = int(chunk_bytes)
        self._buf = np.empty(self.chunk_bytes, dtype=np.uint8)
        self._fill = 0  # bytes in _buf
        self.written = 0  # bytes already handed to flush (always whole chunks)
        self.offsets = array.array("q", [0])
        self.labels = array.array("q")
        self.checksums = array.array("I" if array.array("I").itemsize == 4 else "L")
        self.source_index = array.array("q")
        self._names = bytearray()  # every name's UTF-8 bytes, back to back
        self._name_ends = array.array("q")

    @property
    def num_samples(self) -> int:
        return len(self.labels)

    @property
    def total_bytes(self) -> int:
        return self.offsets[-1]

    def _add_names(self, names) -> None:
        for name in names:
            self._names += name.encode("utf-8")
            self._name_ends.append(len(self._names))

    def name_blocks(self, size: int = 1 << 16):
        """Yields (start, list of the names of samples [start, start + len)), `size` at a time."""
        ends = np.frombuffer(self._name_ends, dtype=np.int64) if len(self._name_ends) else np.zeros(0, np.int64)
        raw = self._names  # sliced in place: no second copy of all names
        for a in range(0, ends.size, size):
            e = ends[a : a + size].tolist()
            s = [int(ends[a - 1]) if a else 0] + e[:-1]
            yield a, [raw[x:y].decode("utf-8") for x, y in zip(s, e)]

    def append(self, data, label: int, name: str, source_index: int, checksum: int | None = None) -> int:
        """Buffers one sample; returns its index. `checksum`: its CRC32 if the caller vouches for
        one (see ContainerWriter.append), else None to compute it."""
        name = _stored_name(name)
        arr = as_u8(data)
        crc = crc32_of(arr) if checksum is None else _check_crc(checksum)
        label, source_index = int(label), int(source_index)
        self._put(arr)
        self.offsets.append(self.offsets[-1] + arr.size)
        self.labels.append(label)
        self.checksums.append(crc)
        self._add_names((name,))
        self.source_index.append(source_index)
        return len(self.labels) - 1

    def extend(self, data, sizes, labels, names, source_index=None, checksums=None) -> None:
        """Buffers len(sizes) samples whose bytes lie back to back in `data`: one copy per chunk
        boundary rather than per sample, index arrays extended at once. Everything is checked
        before anything is buffered."""
        arr = as_u8(data, "data")
        sizes = np.asarray(sizes, dtype=np.int64).reshape(-1)
        check_batch(arr.size, sizes, labels=labels, names=names, source_index=source_index, checksums=checksums)
        n = sizes.size
        names = [_stored_name(x) for x in names]
        labels = np.asarray(labels, dtype=np.int64).reshape(-1).tolist()
        source_index = (
            [-1] * n if source_index is None else np.asarray(source_index, dtype=np.int64).reshape(-1).tolist()
        )
        ends = np.cumsum(sizes)
        if checksums is None:
            starts = (ends - sizes).tolist()
            crcs = [crc32_of(arr[a:b]) for a, b in zip(starts, ends.tolist())]
        else:
            crcs = _check_crcs(checksums)
        self._put(arr)
        self.offsets.extend((ends + self.offsets[-1]).tolist())
        self.labels.extend(labels)
        self.checksums.extend(crcs)
        self._add_names(names)
        self.source_index.extend(source_index)

    def _put(self, arr: np.ndarray) -> None:
        """Adds bytes to `data`, flushing each chunk as it fills."""
        pos, size, chunk = 0, arr.size, self.chunk_bytes
        while pos < size:
            if self._fill == 0 and size - pos >= chunk:
                self._flush(arr[pos : pos + chunk], self.written)  # a whole chunk in place: no copy
                take = chunk
            else:
                take = min(size - pos, chunk - self._fill)
                self._buf[self._fill : self._fill + take] = arr[pos : pos + take]
                self._fill += take
                if self._fill < chunk:
                    break
                self._flush(self._buf, self.written)
                self._fill = 0
            self.written += chunk
            pos += take

    def tail(self) -> np.ndarray:
        """The bytes not yet flushed (the last, partial chunk)."""
        return self._buf[: self._fill]

    def index_arrays(self) -> dict[str, np.ndarray]:
        return {  # views of the packed arrays (no copy)
            "offsets": np.frombuffer(self.offsets, dtype=np.int64),
            "labels": np.frombuffer(self.labels, dtype=np.int64) if self.labels else np.zeros(0, np.int64),
            "checksums": (np.frombuffer(self.checksums, dtype=np.uint32) if self.checksums else np.zeros(0, np.uint32)),
            "source_index": (
                np.frombuffer(self.source_index, dtype=np.int64) if self.source_index else np.zeros(0, np.int64)
            ),
        }


def _stored_name(name, what: str = "sample name") -> str:
    """A sample (or class) name as stored: refused with a NUL (HDF5 stores C strings, it would be
    cut short), backslash-escaped where it is not valid Unicode (e.g. a non-UTF-8 file or directory
    name decoded with surrogateescape)."""
    name = str(name)
    if "\x00" in name:
        raise ConfigError(f"{what} {name!r} contains a NUL character")
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        name = name.encode("utf-8", "backslashreplace").decode("utf-8")
    return name


def _check_crc(value) -> int:
    """A caller-supplied checksum as an int, if it is one a uint32 can hold."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise ConfigError(f"checksum={value!r} must be an int (a CRC32) or None")
    if not 0 <= int(value) <= 0xFFFFFFFF:
        raise ConfigError(f"checksum={int(value)} is not a CRC32 (an unsigned 32-bit value)")
    return int(value)


def _check_crcs(values) -> list[int]:
    """Caller-supplied checksums as ints, if each is one a uint32 can hold."""
    arr = np.asarray(values)
    if arr.size and arr.dtype.kind not in "iu":
        raise ConfigError(f"checksums must be integers (CRC32s), got dtype {arr.dtype}")
    arr = arr.reshape(-1).astype(np.int64, copy=False)
    if arr.size and (arr.min() < 0 or arr.max() > 0xFFFFFFFF):
        bad = int(arr[(arr < 0) | (arr > 0xFFFFFFFF)][0])
        raise ConfigError(f"checksums: {bad} is not a CRC32 (an unsigned 32-bit value)")
    return arr.tolist()


class StreamingWriter(ContainerWriter):
    """The writer protocol every backend shares: validate the arguments before any file exists,
    buffer samples and hand `data` over in whole chunks, and on commit finish the temporary and
    rename it into place (on any failure, abort: remove the temporary).

    A backend implements `_open_tmp()` (create the temporary at `self._tmp`),
    `_write_chunk(chunk, start)` (store `data[start:start+len(chunk)]`), `_finish(buf, attrs)`
    (the last partial chunk, the index arrays, the attributes, then the marker; close) and
    `_discard()` (close handles before the temporary is removed).
    """

    def __init__(
        self,
        path,
        *,
        encoding: str,
        class_names,
        raw_dtype=None,
        raw_shape=None,
        source: str = "",
        extra_attrs: dict | None = None,
        overwrite: bool = False,
        chunk_bytes: int = DATA_CHUNK_BYTES,
        fields=None,
        tmp: str | None = None,
    ):
        self._fields = FieldBuffer(check_field_specs(fields, new=True))
        class_names = check_writer_args(
            encoding=encoding, class_names=class_names, raw_dtype=raw_dtype, raw_shape=raw_shape
        )
        self._meta: dict[str, Any] = dict(
            encoding=encoding,
            class_names=class_names,
            raw_dtype=raw_dtype,
            raw_shape=raw_shape,
            source=source,
            extra_attrs=extra_attrs,
        )
        self._meta["fields"] = self._fields.specs
        make_attrs(**self._meta, num_samples=0, total_bytes=0)  # reject bad extra_attrs before any file exists
        self._overwrite = bool(overwrite)
        self.path = check_target(path, self._overwrite)
        self._lock = OutputLock(self.path)  # one writer of a path at a time (released at commit/abort)
        if self._lock.held:  # no other writer of this path lives: its temporaries are a killed job's
            remove_stale_temporaries(self.path)
        # `tmp`: a resumable ingest's temporary, named by its journal (dstore.ingest.journal) so that a
        # killed writer's durable chunks survive the next writer's clean-up of stale temporaries.
        self._tmp = temp_path(self.path) if tmp is None else os.path.abspath(tmp)
        self._buf = SampleBuffer(self._write_chunk, chunk_bytes)
        self._synced_chunks = 0  # data chunks made durable by `durable()` so far
        self._state = "open"
        try:
            self._open_tmp()
        except BaseException as exc:
            remove_path(self._tmp)
            self._lock.release()
            if isinstance(exc, OSError) and not isinstance(exc, DStoreError):
                raise OutputError(
                    f"{self.path}: cannot create the container (its temporary {self._tmp}): {exc.strerror or exc}"
                ) from exc
            raise

    @property
    def num_samples(self) -> int:
        """Samples appended so far."""
        return self._buf.num_samples

    @property
    def buffer(self) -> SampleBuffer:
        """The samples appended so far (offsets, checksums: what a journal records of them)."""
        return self._buf

    @property
    def tmp(self) -> str:
        """The temporary the container is written to until `commit()`."""
        return self._tmp

    def durable(self) -> tuple[int, list]:
        """Makes the data chunks handed to storage so far durable (flushed; HDF5: fsync'd) and
        returns (the bytes of `data` they hold, a locator per chunk made durable since the last
        call: what `read_durable` needs to read them back from the temporary after a kill)."""
        self._check_open()
        with self._storage_errors():
            self._sync()
            k1 = self._buf.written // self._buf.chunk_bytes
            found = [self._chunk_locator(k) for k in range(self._synced_chunks, k1)]
        self._synced_chunks = k1
        return self._buf.written, found

    def _sync(self) -> None:
        """Pushes what was written to the temporary to storage (default: nothing to push)."""

    def _chunk_locator(self, k: int) -> int | None:
        """Where data chunk k lies in the temporary (default: None: found by name)."""
        del k
        return None

    def release(self) -> None:
        """Ends the writer but keeps its temporary (a resumable ingest's durable part) and releases
        the lock. Safe twice and after commit/abort."""
        if self._state != "open":
            return
        self._state = "released"
        try:
            self._discard()
        finally:
            self._lock.release()

    def _open_tmp(self) -> None:
        raise NotImplementedError

    def _write_chunk(self, chunk: np.ndarray, start: int) -> None:
        raise NotImplementedError

    def _finish(self, buf: SampleBuffer, attrs: dict[str, Any]) -> None:
        raise NotImplementedError

    def _discard(self) -> None:
        raise NotImplementedError

    def append(
        self,
        data,
        label: int,
        name: str,
        source_index: int = -1,
        *,
        checksum: int | None = None,
        fields: dict | None = None,
    ) -> int:
        self._check_open()
        values = self._fields.check(fields, str(name)) if fields or self._fields.specs else None
        with self._storage_errors():
            i = self._buf.append(data, label, name, source_index, checksum)
        if values is not None:
            self._fields.add(values)
        return i

    def extend(self, data, sizes, labels, names, source_index=None, *, checksums=None, fields=None) -> None:
        self._check_open()
        if fields is not None and len(fields) != len(sizes):
            raise ConfigError(f"fields has {len(fields)} entries but sizes has {len(sizes)}")
        values = None
        if fields is not None or self._fields.specs:  # every value checked before anything is buffered
            values = [
                self._fields.check(None if fields is None else fields[j], str(names[j])) for j in range(len(sizes))
            ]
        with self._storage_errors():
            self._buf.extend(data, sizes, labels, names, source_index, checksums)
        for v in values or ():
            self._fields.add(v)

    def _write_fields(self, create) -> None:
        """Writes every field's arrays with `create(key, array)` (key: `fields/<name>/<part>`)."""
        for name, _ in self._fields.specs:
            for part, arr in self._fields.arrays(name).items():
                create(f"fields/{name}/{part}", arr)

    @contextlib.contextmanager
    def _storage_errors(self):
        """A failed write (disk full, I/O error; h5py reports some as RuntimeError) becomes an
        OutputError naming the container and the system's reason."""
        try:
            yield
        except DStoreError:
            raise
        except (OSError, RuntimeError) as exc:
            text = str(exc)
            reason = (
                exc.strerror
                if isinstance(exc, OSError) and exc.strerror
                else ("No space left on device" if "No space left" in text or "errno = 28" in text else text)
            )
            raise OutputError(f"{self.path}: cannot write the container (its temporary {self._tmp}): {reason}") from exc

    def _check_open(self) -> None:
        if self._state != "open":
            raise ConfigError(f"cannot append to {self.path}: the writer is {self._state}")

    def commit(self) -> str:
        if self._state != "open":
            raise ConfigError(f"cannot commit {self.path}: the writer is {self._state}")
        try:
            buf = self._buf
            with self._storage_errors():
                self._finish(buf, make_attrs(**self._meta, num_samples=buf.num_samples, total_bytes=buf.total_bytes))
                move_into_place(self._tmp, self.path, self._overwrite)
        except BaseException:
            self.abort()
            raise
        self._state = "committed"
        self._lock.release()
        return self.path

    def abort(self) -> None:
        if self._state == "committed":
            return
        self._state = "aborted"
        try:
            self._discard()
        finally:
            remove_path(self._tmp)
            self._lock.release()


def read_durable(fmt: str, tmp: str, chunk_bytes: int, locators: list, lo: int, hi: int) -> np.ndarray:
    """Bytes [lo, hi) of `data` in the temporary `tmp` of a writer that was killed, read from its
    durable chunks (`StreamingWriter.durable`): HDF5 chunks at the file offsets `locators` gives
    (the file's own metadata may be half-written: it is not read), Zarr chunks from their files.
    OutputError naming the temporary where a chunk cannot be read whole."""
    out = np.empty(hi - lo, dtype=np.uint8)
    pos = lo
    fd = None
    try:
        if fmt == "hdf5":
            fd = os.open(tmp, os.O_RDONLY)
        while pos < hi:
            k, within = divmod(pos, chunk_bytes)
            n = min(hi - pos, chunk_bytes - within)
            if fd is not None:  # HDF5
                got = os.pread(fd, n, int(locators[k]) + within)
            else:
                with open(os.path.join(tmp, "data", "c", str(k)), "rb") as f:
                    f.seek(within)
                    got = f.read(n)
            if len(got) != n:
                raise OutputError(f"{tmp}: data chunk {k} is short ({len(got)} of {n} bytes): not durable")
            out[pos - lo : pos - lo + n] = np.frombuffer(got, dtype=np.uint8)
            pos += n
    except (OSError, IndexError) as exc:
        raise OutputError(f"{tmp}: cannot read back data chunk {pos // chunk_bytes}: {exc}") from exc
    finally:
        if fd is not None:
            os.close(fd)
    return out
