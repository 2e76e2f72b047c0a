"""The HDF5 backend: one `.h5` file holding the container layout (docs/format.md), read with h5py."""

from __future__ import annotations

import collections
import io
import json
import os

import h5py
import numpy as np

from dstore.errors import ConfigError, FormatError
from dstore.formats.base import ARRAYS, ContainerNotFoundError, ContainerReader
from dstore.formats.fields import FIELD_PARTS, MISSING_PART
from dstore.formats.layout import (
    COMPLETE_ATTR,
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
from dstore.formats.objects import LocalFile, ObjectFile, open_file

CLASS_NAMES = "class_names"
"""The dataset holding the class names (an attribute in files written before it)."""

_DIRECT_READ_BYTES = 1 << 20
"""Through h5py (filtered data): from this size on, a read with `out` goes straight into it."""
_MAX_PREAD = 1 << 30
"""Bytes asked of one preadv call (Linux returns at most about 2 GiB per call anyway)."""
META_BLOCK = 256 << 10
"""Bytes per read of the file's metadata (_BlockFile): HDF5 reads its superblock, object headers,
attributes and B-tree nodes in requests of 8 bytes to a few KiB, about 25 of them to open a
container, each a storage round trip and an operation of a parallel file system's budget; ours
lie in two places (the file's head, and the index and names written after the data), which one
aligned block each holds."""
META_BLOCKS_KEPT = 4
"""Blocks a reader keeps while it reads metadata (1 MiB); none once its index is read
(`_BlockFile.forget`): a sharded container holds a reader per shard."""


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


def _dataset(path: str, f: h5py.File, key: str) -> h5py.Dataset:
    """Member `key` of `f`, which must be a dataset: FormatError naming the file and the member if
    it is a group or a named datatype. KeyError (from h5py) if there is no such member."""
    member = f[key]
    if not isinstance(member, h5py.Dataset):
        raise FormatError(f"{path}: {key!r} must be an HDF5 dataset, got a {type(member).__name__}")
    return member


def _check_stored(path: str, key: str, dset: h5py.Dataset) -> None:
    """FormatError if `dset` declares far more bytes than the file stores of it. HDF5 reads chunks
    never written as fill values, so a small file can declare any size. `data` may leave all-fill
    chunks out (and be compressed): at most MAX_COMPRESSION times what is stored, plus one chunk.
    An index array must be stored (compressed: up to MAX_COMPRESSION times), but for a floor."""
    declared = int(np.prod(dset.shape, dtype=np.int64)) * dset.dtype.itemsize
    stored = int(dset.id.get_storage_size())
    if key == "data":
        check_declared(
            path, key, declared, stored, ratio=MAX_COMPRESSION, slack=int(dset.chunks[0]) if dset.chunks else 0
        )
        return
    filtered = dset.id.get_create_plist().get_nfilters() > 0
    check_declared(path, key, declared, stored, ratio=MAX_COMPRESSION if filtered else 1, slack=INDEX_FLOOR_BYTES)


class _DirectData:
    """Byte ranges of an unfiltered `data` dataset read with positioned reads from the file itself
    (os.preadv; of an object in a bucket, one ranged request: dstore.formats.objects).

    Chunks of unfiltered data are stored as they are, each at a file offset HDF5 reports; h5py reads
    (and copies) a whole chunk for any slice, which with 8 MiB chunks and its 1 MiB chunk cache is
    8 MiB of I/O per sample. Here a sample costs one system call, straight into the caller's array.
    """

    def __init__(self, path: str, file: LocalFile | ObjectFile, chunk: int, starts: np.ndarray):
        self._path, self._file, self._chunk = path, file, chunk
        self._starts = starts  # file offset of each chunk

    @classmethod
    def for_dataset(
        cls, path: str, f: h5py.File, dset: h5py.Dataset, file: LocalFile | ObjectFile
    ) -> _DirectData | None:
        """The reader for `dset` in `f`, read with (a duplicate of) `file`, the file `f` reads (its
        _BlockFile's), or None where its bytes are not stored as they are in that file (filters,
        external or virtual storage)."""
        dcpl = dset.id.get_create_plist()
        if dcpl.get_nfilters() != 0 or dset.compression is not None:
            return None
        size = int(dset.shape[0])
        layout = dcpl.get_layout()
        if layout == h5py.h5d.CONTIGUOUS:
            if dcpl.get_external_count() != 0:
                return None
            offset = dset.id.get_offset()  # None: no storage allocated (nothing written)
            chunk, starts = max(size, 1), np.array([-1 if offset is None else offset], dtype=np.int64)
        elif layout == h5py.h5d.CHUNKED and dset.chunks is not None:  # h5py: a chunked layout has chunks
            chunk = int(dset.chunks[0])
            starts = np.full(-(-size // chunk), -1, dtype=np.int64)
            infos = []
            try:  # one pass over the chunk index (HDF5 >= 1.14); get_chunk_info(i) may walk it each time
                dset.id.chunk_iter(infos.append)
            except (AttributeError, NotImplementedError):
                infos = [dset.id.get_chunk_info(i) for i in range(dset.id.get_num_chunks())]
            for info in infos:
                k = int(info.chunk_offset[0]) // chunk
                if info.filter_mask != 0 or not 0 <= k < starts.size:
                    return None
                # Unfiltered chunks are stored whole (HDF5 stores the last one whole too); a smaller
                # stored size is something else, except a last chunk holding all the bytes it covers.
                if int(info.size) != chunk and (k != starts.size - 1 or int(info.size) < size - k * chunk):
                    return None
                starts[k] = int(info.byte_offset)
        else:  # compact (bytes inside the object header) or virtual
            return None
        missing = np.flatnonzero(starts < 0)
        if size and missing.size:  # HDF5 would read it as fill values: samples that are not the ingested ones
            k = int(missing[0])
            raise FormatError(
                f"{path}: data chunk {k} (bytes [{k * chunk}, {min(size, (k + 1) * chunk)}) of data) "
                f"was never written ({missing.size} such chunk(s)); dstore writes every chunk, so "
                "a missing one is damage, never zeros"
            )
        # A duplicate of the descriptor h5py reads through: the very file it opened, even if
        # `path` has been replaced since; preadv does not move the shared file position.
        return cls(path, file.dup(), chunk, starts)

    def read(self, lo: int, hi: int, out: np.ndarray) -> None:
        """Bytes [lo, hi) of the dataset into `out` (length hi - lo); chunks that lie one after the
        other in the file are read together."""
        chunk, starts = self._chunk, self._starts
        pos = lo
        while pos < hi:
            k, within = divmod(pos, chunk)
            base = int(starts[k])
            stop = min(hi, (k + 1) * chunk)
            while stop < hi and int(starts[k + 1]) == base + (k + 1 - pos // chunk) * chunk:
                k += 1
                stop = min(hi, (k + 1) * chunk)
            self._pread(out[pos - lo : stop - lo], base + within, pos)
            pos = stop

    def _pread(self, view: np.ndarray, at: int, pos: int) -> None:
        file = self._file
        if file is None:
            raise ValueError(f"{self._path}: the direct data reader is closed")
        done, n = 0, view.size
        while done < n:
            # .data (a memoryview of the same bytes): numpy's stubs make ndarray a buffer only on Python >= 3.12
            got = file.pread_into(view[done : done + _MAX_PREAD].data, at + done)
            if got <= 0:
                raise FormatError(
                    f"{self._path}: data bytes [{pos + done}, {pos + n}) lie past the end of "
                    f"the file (file bytes from {at + done}): truncated?"
                )
            done += got

    @property
    def file(self) -> LocalFile | ObjectFile | None:
        """The file the reads use (None once closed)."""
        return self._file

    def close(self) -> None:
        file, self._file = self._file, None
        if file is not None:
            file.close()


def _pread_all(file: LocalFile | ObjectFile, view: memoryview, at: int) -> int:
    """Reads into `view` from file offset `at` until it is full or the file ends; the bytes read."""
    done = 0
    while done < len(view):
        got = file.pread_into(view[done : done + _MAX_PREAD], at + done)
        if got <= 0:
            break
        done += got
    return done


class _BlockFile(io.RawIOBase):
    """The container file as h5py's file object (its `fileobj` driver): reads smaller than
    META_BLOCK are served from aligned blocks of META_BLOCK bytes read whole (the last
    META_BLOCKS_KEPT kept), larger ones go to the file as they are. Read-only; h5py calls it under
    its own lock, one call at a time. `file` (a local file, or an object in a bucket:
    dstore.formats.objects) is also what _DirectData reads the data with."""

    def __init__(self, path: str):
        super().__init__()
        self.file: LocalFile | ObjectFile | None = open_file(path)
        self.size = self.file.size
        self._pos = 0
        self._blocks: collections.OrderedDict[int, bytes] = collections.OrderedDict()

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        base = {os.SEEK_SET: 0, os.SEEK_CUR: self._pos, os.SEEK_END: self.size}[whence]
        self._pos = max(0, base + int(offset))
        return self._pos

    def tell(self) -> int:
        return self._pos

    def _block(self, k: int) -> bytes:
        got = self._blocks.pop(k, None)
        if got is None:
            buf = bytearray(max(0, min(META_BLOCK, self.size - k * META_BLOCK)))  # not past the end: a request more
            got = bytes(buf[: _pread_all(self._live(), memoryview(buf), k * META_BLOCK)])
            while len(self._blocks) >= META_BLOCKS_KEPT:
                self._blocks.popitem(last=False)
        self._blocks[k] = got  # most recently used last
        return got

    def readinto(self, b) -> int:
        out = memoryview(b).cast("B")
        n = max(0, min(len(out), self.size - self._pos))
        if n >= META_BLOCK:
            n = _pread_all(self._live(), out[:n], self._pos)
        else:
            done = 0
            while done < n:
                k, within = divmod(self._pos + done, META_BLOCK)
                piece = self._block(k)[within : within + n - done]
                if not piece:
                    break  # the file shrank under us: a short read, as os.pread gives
                out[done : done + len(piece)] = piece
                done += len(piece)
            n = done
        self._pos += n
        return n

    def _live(self) -> LocalFile | ObjectFile:
        if self.file is None:
            raise ValueError("the HDF5 file object is closed")
        return self.file

    def forget(self) -> None:
        """Drops the blocks kept (read again if asked for)."""
        self._blocks.clear()

    def close(self) -> None:
        file, self.file = self.file, None
        self._blocks.clear()
        if file is not None:
            file.close()
        super().close()


class HDF5Reader(ContainerReader):
    """Reads a container from one HDF5 file. The file is opened read-only without HDF5 file locking,
    so any number of MPI ranks may open it at once; the `data` dataset handle is kept open.
    Unfiltered `data` (what HDF5Writer writes) is read with os.preadv at its chunks' file offsets,
    found once at open time (_DirectData); anything else goes through h5py. h5py reads the file
    through a _BlockFile (a few block reads to open it, not a storage request per metadata item)."""

    index_on_demand = True

    def __init__(self, path, *, index: bool = True):
        self.path = os.fspath(path)
        # All None once closed (close()); _live() and _open_file() are the checked ways to them.
        self._file: h5py.File | None = None
        self._direct: _DirectData | None = None
        self._fileobj: _BlockFile | None = None
        self._data: h5py.Dataset | None = None
        self._names = None
        try:
            self._fileobj = fileobj = _BlockFile(self.path)
            f = h5py.File(fileobj, "r", locking=False)
        except OSError as exc:
            if isinstance(exc, ContainerNotFoundError):  # no object at the URL
                self.close()
                raise
            self.close()
            raise FormatError(f"{self.path}: not a readable HDF5 file (truncated or corrupt?): {exc}") from exc
        self._file = f
        try:
            self._load(f, fileobj._live())
            if index:
                self._load_index()
        except BaseException:
            self.close()
            raise
        # The file actually opened (its descriptor; an object's version), so a file replaced since is
        # seen as another.
        self.opened_identity = (fileobj._live().identity(),)

    def _load(self, f: h5py.File, file: LocalFile | ObjectFile) -> None:
        """Reads the attributes and checks the arrays of `f`, the file h5py reads through `file`."""
        try:
            attrs = {k: _py(v) for k, v in f.attrs.items()}
            if CLASS_NAMES in f:  # since the class-names dataset; older files hold an attribute
                class_names = _dataset(self.path, f, CLASS_NAMES)
                _check_stored(self.path, CLASS_NAMES, class_names)
                attrs[CLASS_NAMES] = [str(c) for c in class_names.asstr()[()]]
            self.info = parse_info(attrs, self.path)
            missing = [a for a in ARRAYS if a not in f]
            if missing:
                raise FormatError(f"{self.path}: missing array(s) {missing}")
            data = _dataset(self.path, f, "data")
            if data.dtype != np.uint8 or data.ndim != 1:
                raise FormatError(f"{self.path}: data must be 1-D uint8, got {data.dtype}{data.shape}")
            for key in ARRAYS:  # before anything of a declared size is read or allocated
                _check_stored(self.path, key, _dataset(self.path, f, key))
            names = _dataset(self.path, f, "names")
        except OSError as exc:  # h5py reports damaged metadata as OSError/KeyError
            raise FormatError(f"{self.path}: cannot read the container (truncated or corrupt?): {exc}") from exc
        except KeyError as exc:
            raise FormatError(f"{self.path}: damaged HDF5 structure: {exc}") from exc
        self._data = data
        self._direct = _DirectData.for_dataset(self.path, f, data, file)
        self._names_len = int(names.shape[0]) if names.ndim == 1 else -1
        self._names = names.asstr() if h5py.check_string_dtype(names.dtype) else names

    def _load_index(self) -> None:
        """Reads and checks the index arrays (at open, or on first use where opened with index=False)."""
        f, fileobj = self._open_file(), self._fileobj
        try:
            offsets = _dataset(self.path, f, "offsets")[()].astype(np.int64, copy=False)
            labels = _dataset(self.path, f, "labels")[()].astype(np.int64, copy=False)
            checksums = _dataset(self.path, f, "checksums")[()].astype(np.uint32, copy=False)
        except OSError as exc:  # h5py reports damaged metadata as OSError/KeyError
            raise FormatError(f"{self.path}: cannot read the container (truncated or corrupt?): {exc}") from exc
        except KeyError as exc:
            raise FormatError(f"{self.path}: damaged HDF5 structure: {exc}") from exc
        check_index(self.path, self.info, int(self._live().shape[0]), offsets, labels, checksums, self._names_len)
        self.offsets, self.labels, self.checksums = offsets, labels, checksums
        if fileobj is not None:  # set with _file (__init__)
            fileobj.forget()  # the open's metadata reads are over (a reader opened without its index keeps 2)

    def _load_source_index(self) -> np.ndarray:
        """Reads and checks `source_index` (on first use only: the store never reads it)."""
        f = self._open_file()
        try:
            source_index = _dataset(self.path, f, "source_index")[()]
        except OSError as exc:
            raise FormatError(f"{self.path}: cannot read source_index (truncated or corrupt?): {exc}") from exc
        except KeyError as exc:
            raise FormatError(f"{self.path}: damaged HDF5 structure: {exc}") from exc
        return checked_source_index(self.path, self.info, source_index)

    def _field_parts(self, name: str) -> dict:
        f = self._open_file()
        try:
            parts = {part: _dataset(self.path, f, f"fields/{name}/{part}") for part in FIELD_PARTS}
            if f"fields/{name}/{MISSING_PART}" in f:  # written since issue 38 (docs/format.md, "Fields")
                parts[MISSING_PART] = _dataset(self.path, f, f"fields/{name}/{MISSING_PART}")
            for part, dset in parts.items():  # before anything of a declared size is read
                _check_stored(self.path, f"fields/{name}/{part}", dset)
            return parts
        except KeyError as exc:
            raise FormatError(
                f"{self.path}: field {name!r} is listed in the fields attribute but its arrays are missing: {exc}"
            ) from exc

    def _open_file(self) -> h5py.File:
        """The open file; ConfigError once the reader is closed."""
        if self._file is None:
            raise ConfigError(f"{self.path}: the reader is closed")
        return self._file

    def _live(self) -> h5py.Dataset:
        """The `data` dataset; ConfigError once the reader is closed."""
        if self._file is None or self._data is None:  # both set at open (_load), both None once closed
            raise ConfigError(f"{self.path}: the reader is closed")
        return self._data

    @property
    def byte_addressable(self) -> bool:
        """Unfiltered data is read with preadv at its file offsets; filtered data chunk by chunk."""
        return self._direct is not None

    @property
    def concurrent_reads(self) -> bool:
        """The direct path reads with os.preadv only: threads may share this reader."""
        return self._direct is not None

    def read_bytes(self, lo: int, hi: int, out: np.ndarray | None = None) -> np.ndarray:
        """data[lo:hi] straight into `out` (no intermediate copy): preadv at the chunks' file offsets,
        or one HDF5 read where the data is filtered."""
        lo, hi = check_byte_range(self.path, lo, hi, self.total_bytes)
        data = self._live()
        n = hi - lo
        try:
            if self._direct is not None:
                out = check_out(out, n)
                self._direct.read(lo, hi, out)
                return out
            if out is None or n < _DIRECT_READ_BYTES:
                # h5py's fast path for a plain slice beats any explicit selection by several times
                # (about 7 us per sample warm); for small reads the copy into `out` costs less.
                got = data[lo:hi]
                if out is None:
                    return got
                out = check_out(out, n)
                out[:] = got
                return out
            out = check_out(out, n)
            # Large range with `out`: one HDF5 read straight into it, no second buffer of this size.
            dset = data.id
            fspace = dset.get_space()
            fspace.select_hyperslab((lo,), (n,))
            dset.read(h5py.h5s.create_simple((n,)), fspace, out)
        except OSError as exc:
            raise FormatError(f"{self.path}: cannot read bytes [{lo}, {hi}) of data: {exc}") from exc
        return out

    def name(self, i: int) -> str:
        i = self._check_index(i)
        names = self._names
        if self._file is None or names is None:  # set at open (_load), None once closed
            raise ConfigError(f"{self.path}: the reader is closed")
        value = names[i]
        return value.decode("utf-8") if isinstance(value, bytes) else str(value)

    def close(self) -> None:
        f, self._file = self._file, None
        direct, self._direct = self._direct, None
        fileobj, self._fileobj = self._fileobj, None
        self._data = self._names = None
        if direct is not None:
            direct.close()
        if f is not None:
            f.close()
        if fileobj is not None:
            fileobj.close()


class HDF5Writer(StreamingWriter):
    """Streams samples into a temporary `.h5` beside `path` in chunks of `chunk_bytes`; `commit()`
    writes the index arrays, the attributes, the completion marker last, and renames it to `path`.
    Arguments: see `dstore.formats.create_writer`."""

    _file: h5py.File | None = None
    _data: h5py.Dataset | None = None

    def _open_tmp(self) -> None:
        self._file = h5py.File(self._tmp, "w", locking=False)

    def _open_file(self) -> h5py.File:
        """The temporary file being written; ConfigError once committed or aborted."""
        if self._file is None:
            raise ConfigError(f"cannot write {self.path}: the writer is {self._state}")
        return self._file

    def _write_chunk(self, chunk: np.ndarray, start: int) -> None:
        if self._data is None:
            self._data = self._open_file().create_dataset(
                "data", shape=(0,), maxshape=(None,), dtype=np.uint8, chunks=(self._buf.chunk_bytes,)
            )
        stop = start + chunk.size
        self._data.resize((stop,))
        size = self._buf.chunk_bytes
        if chunk.size == size and start % size == 0:
            # A whole chunk (no filters) goes to the file as it is: about twice as fast as a
            # selection write, which goes through HDF5's type conversion and chunk machinery.
            self._data.id.write_direct_chunk((start,), np.ascontiguousarray(chunk))
        else:
            self._data.write_direct(np.ascontiguousarray(chunk), dest_sel=np.s_[start:stop])

    def _sync(self) -> None:
        f = self._open_file()
        f.flush()
        os.fsync(f.id.get_vfd_handle())

    def _chunk_locator(self, k: int) -> int | None:
        """The file offset of data chunk k (a whole chunk, stored unfiltered as it was written)."""
        assert self._data is not None  # a chunk was written (durable: k < chunks written)
        return int(self._data.id.get_chunk_info_by_coord((k * self._buf.chunk_bytes,)).byte_offset)

    def _finish(self, buf: SampleBuffer, attrs: dict) -> None:
        f = self._open_file()
        tail = buf.tail()
        if self._data is None:  # everything fit in one buffer: a contiguous dataset of the exact size
            f.create_dataset("data", data=tail, dtype=np.uint8)
        elif tail.size:
            self._write_chunk(tail, buf.written)
        for key, arr in buf.index_arrays().items():
            f.create_dataset(key, data=arr)
        names = f.create_dataset("names", dtype=h5py.string_dtype("utf-8"), shape=(buf.num_samples,))
        for a, block in buf.name_blocks():  # in blocks: never all names as Python objects at once
            names[a : a + len(block)] = np.array(block, dtype=object)
        self._write_fields(lambda key, arr: f.create_dataset(key, data=arr))
        attrs = dict(attrs)
        # A dataset, not an attribute: an object header holds at most 64 KiB of attributes, about
        # 4,000 class names; ImageNet-21k has 21,841.
        f.create_dataset(
            CLASS_NAMES, data=np.array(list(attrs.pop(CLASS_NAMES)), dtype=object), dtype=h5py.string_dtype("utf-8")
        )
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
