"""The Zarr v3 backend: one directory-store group holding the container layout (docs/format.md).

Named `zarr_backend` so that nothing here can shadow the `zarr` package.
"""

from __future__ import annotations

import json
import os
from collections import OrderedDict

import numpy as np
import zarr
from zarr.codecs import BytesCodec
from zarr.core.buffer import default_buffer_prototype
from zarr.storage import FsspecStore, LocalStore

from dstore.errors import ConfigError, FormatError
from dstore.formats.base import ARRAYS, ContainerReader
from dstore.formats.fields import FIELD_PARTS, MISSING_PART
from dstore.formats.layout import (
    COMPLETE_ATTR,
    DATA_CHUNK_BYTES,
    INDEX_CHUNK,
    INDEX_FLOOR_BYTES,
    MAX_COMPRESSION,
    SampleBuffer,
    StreamingWriter,
    check_byte_range,
    check_declared,
    check_index,
    check_out,
    checked_source_index,
    parse_info,
)
from dstore.formats.objects import LocalFile, ObjectFile, bounded_filesystem, is_url, join, list_below, waited

_FAST_READ_BYTES = 1 << 20
"""Reads below this size go straight to the chunk files (see _ChunkFiles); larger ones through zarr."""


class _ChunkFiles:
    """Byte ranges of an uncompressed 1-D uint8 Zarr array, read with os.pread from its chunk files
    in a local directory store, or with one ranged request per chunk piece from its chunk objects
    in a bucket (each pinned to the ETag listed when the container was opened:
    dstore.formats.objects). Zarr itself reads (and copies) a whole chunk for any slice: 8 MiB per
    sample. A small cache of open files keeps warm reads at one system call (one request)."""

    _MAX_OPEN = 32

    def __init__(self, root: str, chunk: int, key_encoding, fill: int, objects: dict | None = None):
        self._root, self._chunk, self._keys, self._fill = root, chunk, key_encoding, fill
        self._objects = objects  # in a bucket: {chunk key: its identity when listed}, else None
        self._fds: OrderedDict[int, LocalFile | ObjectFile] = OrderedDict()

    @classmethod
    def for_array(cls, arr, root: str | None = None, objects: dict | None = None) -> _ChunkFiles | None:
        """The reader for `arr`, or None where its chunks are not plain bytes in local files; with
        `objects` (the listing of `arr`'s chunk objects below the URL `root`), of those objects."""
        store = arr.store_path.store
        codecs = arr.metadata.codecs
        if len(codecs) != 1 or not isinstance(codecs[0], BytesCodec):
            return None
        if objects is not None and root is not None:
            return cls(root, int(arr.chunks[0]), arr.metadata.chunk_key_encoding, int(arr.metadata.fill_value), objects)
        if not isinstance(store, LocalStore):
            return None
        return cls(
            os.path.join(str(store.root), arr.store_path.path),
            int(arr.chunks[0]),
            arr.metadata.chunk_key_encoding,
            int(arr.metadata.fill_value),
        )

    def _fd(self, k: int) -> LocalFile | ObjectFile:
        if k in self._fds:
            self._fds.move_to_end(k)
            return self._fds[k]
        key = self._keys.encode_chunk_key((k,))
        try:
            if self._objects is not None:
                if key not in self._objects:
                    raise FileNotFoundError(key)
                fd: LocalFile | ObjectFile = ObjectFile(join(self._root, key), self._objects[key])
            else:
                fd = LocalFile(os.path.join(self._root, key))
        except FileNotFoundError:
            # zarr would read it as fill values (zeros): samples that are not the ingested ones
            raise FormatError(missing_chunk(self._root, key, k, self._chunk)) from None
        self._fds[k] = fd
        if len(self._fds) > self._MAX_OPEN:
            self._fds.popitem(last=False)[1].close()
        return fd

    @property
    def remote(self) -> bool:
        """True where the chunks are objects in a bucket (every read goes through here, pinned)."""
        return self._objects is not None

    def check_present(self, lo: int, hi: int) -> None:
        """FormatError naming the first chunk file of data bytes [lo, hi) that is missing."""
        for k in range(lo // self._chunk, -(-hi // self._chunk)):
            self._fd(k)

    def read(self, lo: int, hi: int, out: np.ndarray) -> None:
        pos = lo
        while pos < hi:
            k, start = divmod(pos, self._chunk)
            n = min(hi - pos, self._chunk - start)
            view = out[pos - lo : pos - lo + n]
            # .data (a memoryview of the same bytes): numpy's stubs make ndarray a buffer only on Python >= 3.12
            if self._fd(k).pread_into(view.data, start) != n:
                raise FormatError(f"{self._root}: chunk {self._keys.encode_chunk_key((k,))} is truncated")
            pos += n

    def close(self) -> None:
        fds, self._fds = self._fds, OrderedDict()
        for fd in fds.values():
            fd.close()


def missing_chunk(root: str, key: str, k: int, chunk: int) -> str:
    """The message for a missing chunk file of `data` (chunk `k` of `chunk` bytes)."""
    return (
        f"{join(root, key)}: data chunk {k} (bytes [{k * chunk}, {(k + 1) * chunk}) of data) is "
        "missing; dstore stores every chunk, so a missing one is damage, never zeros"
    )


def _array(path: str, group: zarr.Group, key: str) -> zarr.Array:
    """Member `key` of `group`, which must be an array: FormatError naming the store and the member
    if it is a group. KeyError (from zarr) if there is no such member."""
    member = group[key]
    if not isinstance(member, zarr.Array):
        raise FormatError(f"{path}: {key!r} must be a Zarr array, got a {type(member).__name__}")
    return member


def _check_chunks(path: str, data, files: dict[str, int], objects: dict | None = None) -> None:
    """FormatError naming the first missing chunk file of `data` (and the samples it holds, by the
    caller): counted from the scan, so a complete store costs no stat per chunk."""
    chunk, size = int(data.chunks[0]), int(data.shape[0])
    n = -(-size // chunk)
    if max(files.get("data", 0) - 1, 0) >= n:  # one of the files is data/zarr.json
        return
    keys = data.metadata.chunk_key_encoding
    root = join(path, "data")
    for k in range(n):
        key = keys.encode_chunk_key((k,))
        if (key not in objects) if objects is not None else not os.path.isfile(os.path.join(root, key)):
            raise FormatError(missing_chunk(root, key, k, chunk))


def _scan_store(root: str) -> dict[str, int]:
    """The number of files under each top-level entry of a Zarr directory (metadata included).
    Raises FormatError naming the first entry that is neither a file nor a directory (a FIFO would
    block the first read for ever). Uses only the directory entries' types: no stat per chunk."""
    counts: dict[str, int] = {}
    stack: list[tuple[str, str | None]] = [(root, None)]  # (directory, its top-level entry; None: the root)
    seen = set()
    while stack:
        directory, top = stack.pop()
        try:
            st = os.stat(directory)
            if (st.st_dev, st.st_ino) in seen:
                raise FormatError(f"{directory}: a directory link loop inside the Zarr store")
            seen.add((st.st_dev, st.st_ino))
            entries = list(os.scandir(directory))
        except OSError as exc:
            raise FormatError(f"{directory}: cannot list the Zarr store: {exc.strerror or exc}") from exc
        for entry in entries:
            key = top or entry.name
            try:
                is_dir, is_file = entry.is_dir(), entry.is_file()
            except OSError as exc:
                raise FormatError(f"{entry.path}: cannot examine: {exc.strerror or exc}") from exc
            if is_dir:
                stack.append((entry.path, key))
            elif is_file:
                counts[key] = counts.get(key, 0) + 1
            else:
                raise FormatError(
                    f"{entry.path}: not a regular file or directory (a FIFO, socket, device or "
                    "broken link?) inside the Zarr store"
                )
    return counts


def _list_objects(url: str) -> tuple[dict[str, int], dict[str, tuple]]:
    """_scan_store of a Zarr group below the URL `url` (one recursive listing), and the identity of
    each of `data`'s chunk objects as listed ({chunk key: identity}, what its reads are pinned to)."""
    root, found = list_below(url, "cannot list the Zarr store")
    counts: dict[str, int] = {}
    chunks: dict[str, tuple] = {}
    for name, info in found.items():
        if info.get("type") == "directory" or not name.startswith(root + "/"):
            continue
        rel = name[len(root) + 1 :]
        counts[rel.split("/")[0]] = counts.get(rel.split("/")[0], 0) + 1
        if rel.startswith("data/") and rel != "data/zarr.json":
            mtime = info.get("LastModified") or info.get("mtime")
            chunks[rel[len("data/") :]] = (
                join(url, rel),
                "object",
                info.get("ETag") or info.get("etag"),
                int(info.get("size") or 0),
                None if mtime is None else str(mtime),
            )
    return counts, chunks


def _check_declared_sizes(path: str, group: zarr.Group, files: dict[str, int]) -> None:
    """FormatError if an array declares far more bytes than its chunk files can hold (zarr reads a
    missing chunk as fill values, so a few KB of metadata can declare a terabyte). `data` is bounded
    by its chunk count (other writers leave all-fill chunks out, and may compress: at most
    MAX_COMPRESSION times that, plus one chunk); an index array, which zarr stores compressed and
    without all-fill chunks, by the data's size (an index entry per sample is small next to a
    sample) with a floor."""
    data = _array(path, group, "data")
    chunk = int(data.chunks[0])
    data_files = max(files.get("data", 0) - 1, 0)  # one of them is zarr.json
    stored = data_files * chunk
    check_declared(path, "data", int(data.nbytes), stored, ratio=MAX_COMPRESSION, slack=chunk)
    for key in ARRAYS[1:]:
        arr = _array(path, group, key)
        declared = int(np.prod(arr.shape, dtype=np.int64)) * max(int(arr.dtype.itemsize), 8)
        check_declared(
            path, key, declared, max(stored, int(data.nbytes)) if stored else 0, ratio=64, slack=INDEX_FLOOR_BYTES
        )


class ZarrReader(ContainerReader):
    """Reads a container from a Zarr v3 directory (read-only, so many ranks may open it at once)."""

    index_on_demand = True

    def __init__(self, path, *, index: bool = True):
        self.path = os.fspath(path)
        remote = is_url(self.path)
        if remote:
            self.path = self.path.rstrip("/")
        # All None once closed (close()); _live() and _open_group() are the checked ways to them.
        self._group: zarr.Group | None = None
        self._files: _ChunkFiles | None = None
        self._data: zarr.Array | None = None
        self._names: zarr.Array | None = None
        objects = None
        if remote:  # one listing; zarr then reads through its fsspec store (the index arrays, the names)
            files, objects = _list_objects(self.path)
        else:
            files = _scan_store(self.path)  # before zarr opens anything: a FIFO would block it
        try:
            # From object storage through our file system, with its bounded waits and tries
            # (dstore.formats.objects.storage_options), given to Zarr's store as the instance itself: Zarr's
            # own `storage_options` made another (fsspec's cache missed on the order of the arguments), with
            # s3fs's 5 x 5 nested tries around botocore's.
            store = self.path
            if remote:
                fs = bounded_filesystem(self.path.split(":", 1)[0].lower(), asynchronous=True)
                store = FsspecStore(fs, read_only=True, path=fs._strip_protocol(self.path))
            group = zarr.open_group(store, mode="r", zarr_format=3)
            attrs = dict(group.attrs)
        except (OSError, ValueError, KeyError, TypeError, json.JSONDecodeError) as exc:
            raise FormatError(
                f"{self.path}: not a readable Zarr v3 group: {type(exc).__name__}: {exc}{waited(exc)}"
            ) from exc
        self.info = parse_info(attrs, self.path)
        present = set(group.array_keys())
        missing = [a for a in ARRAYS if a not in present]
        if missing:
            raise FormatError(f"{self.path}: missing array(s) {missing}")
        try:
            data = _array(self.path, group, "data")
            if data.dtype != np.uint8 or data.ndim != 1:
                raise FormatError(f"{self.path}: data must be 1-D uint8, got {data.dtype}{data.shape}")
            _check_declared_sizes(self.path, group, files)
            _check_chunks(self.path, data, files, objects)
            names = _array(self.path, group, "names")
        except (OSError, ValueError, KeyError) as exc:
            if isinstance(exc, FormatError):
                raise
            raise FormatError(
                f"{self.path}: cannot read the container's arrays: {type(exc).__name__}: {exc}{waited(exc)}"
            ) from exc
        self._group, self._data, self._names = group, data, names
        self._files = _ChunkFiles.for_array(data, join(self.path, "data"), objects)
        if remote and self._files is None:
            raise FormatError(
                f"{self.path}: data is compressed or filtered; a Zarr container in object storage "
                "is read with ranged requests of its chunk objects, which needs plain bytes "
                "(what dstore ingest writes)"
            )
        self.opened_identity = self.identity()
        if index:
            try:
                self._load_index()
            except BaseException:
                self.close()
                raise

    def _identity_paths(self) -> list[str]:
        """The group's and `data`'s metadata, and the directories of `data`'s chunk files (which
        change when a chunk file is added, removed or replaced; bytes rewritten in place are caught
        by the samples' checksums). The index arrays are read once: they are not watched."""
        if is_url(self.path):  # the objects; the chunk objects' listing (dstore.formats.objects.object_identity)
            return [join(self.path, "zarr.json"), join(self.path, "data", "zarr.json"), join(self.path, "data", "")]
        data = os.path.join(self.path, "data")
        chunks = os.path.join(data, "c")  # the default chunk key encoding's directory
        return [os.path.join(self.path, "zarr.json"), os.path.join(data, "zarr.json"), data] + (
            [chunks] if os.path.isdir(chunks) else []
        )

    def _load_index(self) -> None:
        """Reads and checks the index arrays (at open, or on first use where opened with index=False)."""
        group, data, names = self._open_group(), self._live(), self._live_names()
        try:
            offsets = np.asarray(_array(self.path, group, "offsets")[...], dtype=np.int64)
            labels = np.asarray(_array(self.path, group, "labels")[...], dtype=np.int64)
            checksums = np.asarray(_array(self.path, group, "checksums")[...], dtype=np.uint32)
        except (OSError, ValueError, KeyError, RuntimeError) as exc:  # RuntimeError: a chunk that does not decode
            if isinstance(exc, FormatError):
                raise
            raise FormatError(
                f"{self.path}: cannot read the container's arrays: {type(exc).__name__}: {exc}{waited(exc)}"
            ) from exc
        check_index(
            self.path,
            self.info,
            int(data.shape[0]),
            offsets,
            labels,
            checksums,
            int(names.shape[0]) if names.ndim == 1 else -1,
        )
        self.offsets, self.labels, self.checksums = offsets, labels, checksums

    def _load_source_index(self) -> np.ndarray:
        """Reads and checks `source_index` (on first use only: the store never reads it)."""
        group = self._open_group()
        try:
            source_index = np.asarray(_array(self.path, group, "source_index")[...])
        except (OSError, ValueError, KeyError, RuntimeError) as exc:  # RuntimeError: a chunk that does not decode
            if isinstance(exc, FormatError):
                raise
            raise FormatError(
                f"{self.path}: cannot read source_index: {type(exc).__name__}: {exc}{waited(exc)}"
            ) from exc
        return checked_source_index(self.path, self.info, source_index)

    def _field_parts(self, name: str) -> dict:
        group = self._open_group()
        try:
            parts = {part: _array(self.path, group, f"fields/{name}/{part}") for part in FIELD_PARTS}
            if f"fields/{name}/{MISSING_PART}" in group:  # written since issue 38 (docs/format.md, "Fields")
                parts[MISSING_PART] = _array(self.path, group, f"fields/{name}/{MISSING_PART}")
            return parts
        except (KeyError, OSError, ValueError) as exc:
            if isinstance(exc, FormatError):
                raise
            raise FormatError(
                f"{self.path}: field {name!r} is listed in the fields attribute but its arrays are missing: {exc}"
            ) from exc

    def _open_group(self) -> zarr.Group:
        """The open group; ConfigError once the reader is closed."""
        if self._group is None:
            raise ConfigError(f"{self.path}: the reader is closed")
        return self._group

    def _live(self) -> zarr.Array:
        """The `data` array; ConfigError once the reader is closed."""
        if self._group is None or self._data is None:  # both set at open, both None once closed
            raise ConfigError(f"{self.path}: the reader is closed")
        return self._data

    def _live_names(self) -> zarr.Array:
        """The `names` array; ConfigError once the reader is closed."""
        if self._group is None or self._names is None:  # both set at open, both None once closed
            raise ConfigError(f"{self.path}: the reader is closed")
        return self._names

    def read_bytes(self, lo: int, hi: int, out: np.ndarray | None = None) -> np.ndarray:
        """data[lo:hi] as one slice of the Zarr array (its chunks are fetched concurrently)."""
        lo, hi = check_byte_range(self.path, lo, hi, self.total_bytes)
        data = self._live()
        if out is not None:
            out = check_out(out, hi - lo)
        if hi == lo:
            return out if out is not None else np.empty(0, dtype=np.uint8)
        try:
            if self._files is not None and (hi - lo < _FAST_READ_BYTES or self._files.remote):
                out = check_out(out, hi - lo)
                self._files.read(lo, hi, out)
                return out
            if self._files is not None:  # zarr would fill a missing chunk with zeros
                self._files.check_present(lo, hi)
            if out is None:
                return np.asarray(data[lo:hi])
            # Decode the chunks straight into `out`: a rank's preload needs no second buffer.
            data.get_basic_selection(slice(lo, hi), out=default_buffer_prototype().nd_buffer.from_numpy_array(out))
        except (OSError, ValueError) as exc:
            raise FormatError(f"{self.path}: cannot read bytes [{lo}, {hi}) of data: {exc}") from exc
        return out

    def name(self, i: int) -> str:
        i = self._check_index(i)
        return str(self._live_names()[i])

    def close(self) -> None:
        files, self._files = self._files, None
        self._group = self._data = self._names = None
        if files is not None:
            files.close()


class ZarrWriter(StreamingWriter):
    """Streams samples into a temporary Zarr v3 directory beside `path`, `data` uncompressed in chunks
    of `chunk_bytes`; `commit()` writes the index arrays, the attributes, the marker last, and
    renames the directory to `path`. Arguments: see `dstore.formats.create_writer`."""

    _group: zarr.Group | None = None
    _data: zarr.Array | None = None

    def _open_tmp(self) -> None:
        self._group = zarr.open_group(self._tmp, mode="w-", zarr_format=3)

    def _open_group(self) -> zarr.Group:
        """The temporary group being written; ConfigError once committed or aborted."""
        if self._group is None:
            raise ConfigError(f"cannot write {self.path}: the writer is {self._state}")
        return self._group

    def _write_chunk(self, chunk: np.ndarray, start: int) -> None:
        if self._data is None:
            # write_empty_chunks: store every chunk as it is. By default zarr first compares each
            # chunk with the fill value, which took most of a write's time (an 8 MiB chunk: about
            # 30 of 36 ms here). A runtime setting: the stored metadata is the same.
            self._data = self._open_group().create_array(
                "data",
                shape=(0,),
                dtype=np.uint8,
                chunks=(self._buf.chunk_bytes,),
                compressors=None,
                config={"write_empty_chunks": True},
            )
        stop = start + chunk.size
        self._data.resize((stop,))
        self._data[start:stop] = chunk

    def _finish(self, buf: SampleBuffer, attrs: dict) -> None:
        g = self._open_group()
        tail = buf.tail()
        if self._data is None:  # everything fit in one buffer: one chunk of the exact size
            arr = g.create_array(
                "data",
                shape=(tail.size,),
                dtype=np.uint8,
                chunks=(max(tail.size, 1),),
                compressors=None,
                config={"write_empty_chunks": True},
            )
            if tail.size:
                arr[:] = tail
        elif tail.size:
            self._write_chunk(tail, buf.written)
        for key, values in buf.index_arrays().items():
            arr = g.create_array(
                key, shape=values.shape, dtype=values.dtype, chunks=(max(1, min(values.size, INDEX_CHUNK)),)
            )
            if values.size:
                arr[:] = values
        n = buf.num_samples
        names = g.create_array("names", shape=(n,), dtype=str, chunks=(max(1, min(n, INDEX_CHUNK)),))
        for a, block in buf.name_blocks(max(1, min(n, INDEX_CHUNK))):  # chunk by chunk, not all at once
            names[a : a + len(block)] = np.array(block, dtype=object)

        def create(key: str, values: np.ndarray) -> None:
            arr = g.create_array(
                key,
                shape=values.shape,
                dtype=values.dtype,
                compressors=None,
                chunks=(max(1, min(values.size, DATA_CHUNK_BYTES if values.dtype == np.uint8 else INDEX_CHUNK)),),
                config={"write_empty_chunks": True},
            )
            if values.size:
                arr[:] = values

        self._write_fields(create)
        g.attrs.update(attrs)
        g.attrs[COMPLETE_ATTR] = True  # the marker, last
        self._group = self._data = None

    def _discard(self) -> None:
        self._group = self._data = None
