"""The one reader/writer interface every container backend (HDF5, Zarr, sharded manifest) implements.

The layout itself is specified in docs/format.md. Backends implement only the primitives marked
abstract; everything a consumer calls (a sample, a contiguous range in one read) is defined here once.
"""

from __future__ import annotations

import abc
import dataclasses
from typing import Any

import numpy as np

from dstore.errors import ConfigError, ContainerChangedError, DStoreError, FormatError
from dstore.errors import ContainerNotFoundError as ContainerNotFoundError  # re-exported: its home before errors.py
from dstore.formats.crc import checksum as checksum  # re-exported: the backends, sharded, integrity, verify
from dstore.formats.crc import crc32 as crc32
from dstore.formats.fields import FieldIndex, block_of, decode_value

FORMAT_VERSION = 1
"""Version of the container layout written by this code (attribute `version`)."""

ARRAYS = ("data", "offsets", "labels", "checksums", "names", "source_index")
"""The arrays every container holds (the sharded manifest holds none: its shards do)."""

ENCODINGS = ("jpeg", "png", "image", "raw")
"""`jpeg`/`png`: every sample is such a file's bytes; `image`: encoded files of mixed formats
(decoders sniff the magic bytes); `raw`: each sample is `raw_shape` elements of `raw_dtype`, C order."""


class ContainerExistsError(DStoreError, FileExistsError):
    """The path a writer would create already exists and `overwrite` was not given."""


def check_batch(nbytes: int, sizes, **per_sample) -> None:
    """Raises ConfigError unless `sizes` are non-negative and sum to `nbytes` and every sequence in
    `per_sample` (None: absent) has one entry per size; the error names the parameter."""
    n = len(sizes)
    for what, seq in per_sample.items():
        if seq is not None and len(seq) != n:
            raise ConfigError(f"{what} has {len(seq)} entries but sizes has {n}")
    total = int(np.sum(sizes, dtype=np.int64)) if n else 0
    if n and int(np.min(sizes)) < 0:
        raise ConfigError(f"sizes must be non-negative, got {int(np.min(sizes))}")
    if total != nbytes:
        raise ConfigError(f"sizes sum to {total} bytes but data has {nbytes}")


def file_identity(path: str, fd: int | None = None) -> tuple:
    """(path, st_dev, st_ino, st_size, st_mtime_ns) of a file or directory (of the open file `fd`
    where given: what was actually opened), or (path, None, None, None, None) where it is gone; of
    an object-store URL, (url, "object", ETag, size, modification time) (dstore.formats.objects)."""
    from dstore.formats.objects import is_url, local_identity, object_identity

    if fd is None and is_url(path):
        return object_identity(path)
    return local_identity(path, fd)


def identity_change(then: tuple, now: tuple) -> str | None:
    """What differs between two `file_identity` values of one path, in words (None: nothing)."""
    if then == now:
        return None
    path, a, b = then[0], list(then[1:]), list(now[1:])
    if b[0] is None:
        return f"{path} is gone"
    what = []
    if a[0] == "object" and a[:2] != b[:2]:
        what.append(f"another object is at its URL (ETag {a[1]} -> {b[1]})")
    elif a[:2] != b[:2]:
        what.append("another file is at its path (device/inode differ)")
    if a[2] != b[2]:
        what.append(f"size {a[2]} -> {b[2]} bytes")
    if a[3] != b[3]:
        what.append("modification time changed")
    return f"{path}: " + ", ".join(what)


def identities_differ(then: tuple, now: tuple) -> str | None:
    """What differs between two containers' identities (tuples of `file_identity`), or None."""
    diffs = [d for d in map(identity_change, then, now) if d]
    if len(then) != len(now):
        diffs.append("another set of files")
    return "; ".join(diffs) or None


@dataclasses.dataclass(frozen=True)
class ContainerInfo:
    """A container's attributes, as written in its metadata."""

    version: int
    encoding: str
    num_samples: int
    total_bytes: int
    class_names: tuple[str, ...]
    raw_dtype: str | None = None
    raw_shape: tuple[int, ...] | None = None
    source: str = ""
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)
    fields: tuple[tuple[str, str], ...] = ()
    """Extra fields per sample as (name, kind) pairs (dstore.formats.fields); () for none."""

    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    def __post_init__(self):
        if self.encoding not in ENCODINGS:
            raise FormatError(f"encoding {self.encoding!r} is not one of {ENCODINGS}")
        if self.encoding == "raw" and (self.raw_dtype is None or self.raw_shape is None):
            raise FormatError("encoding 'raw' needs raw_dtype and raw_shape attributes")


INDEX_ARRAYS = ("offsets", "labels", "checksums")
"""The arrays a reader holds in memory (20 bytes per sample), read at open or on first use."""

LAZY_ARRAYS = ("source_index",)
"""Per-sample arrays read only when first asked for (verify, provenance), never at open: a store
does not use them, and the open of a container of N samples reads 8 N bytes less."""


class ContainerReader(abc.ABC):
    """Read access to one container. Index arrays are held in memory (20 bytes per sample), read
    at open, or on first use where the backend was opened with ``index=False`` (a reader that only
    reads byte ranges, e.g. a store's rank whose node shares one index: dstore.store.index); the source
    indices (LAZY_ARRAYS) and names are read only when asked for; sample bytes on demand.

    Attributes:
        path: what was opened.
        info: the container's attributes.
        offsets: int64[N+1]; sample i is data[offsets[i]:offsets[i+1]].
        labels: int64[N].
        checksums: uint32[N], CRC32 of each sample's bytes.
        source_index: int64[N], each sample's index in the source (before ingest's shuffle),
            read and checked on first use (FormatError naming the file if malformed).
    """

    path: str
    info: ContainerInfo
    index_on_demand: bool = False
    """True where the backend opens with ``index=False`` (HDF5, Zarr): a reader that only reads byte
    ranges then holds no index arrays (the store's storage and population threads)."""
    offsets: np.ndarray
    labels: np.ndarray
    checksums: np.ndarray
    source_index: np.ndarray
    opened_identity: tuple = ()
    """`identity()` when the reader was opened (set by each backend once it has opened the container)."""

    # --- backend primitives -------------------------------------------------------------
    @abc.abstractmethod
    def read_bytes(self, lo: int, hi: int, out: np.ndarray | None = None) -> np.ndarray:
        """Bytes data[lo:hi] as a uint8 array, with as few large reads as the backend allows.

        If `out` is given (a writable uint8 array of length hi - lo) the bytes land there and
        `out` is returned; no other copy is made where the backend can avoid it.
        """

    @abc.abstractmethod
    def name(self, i: int) -> str:
        """Sample i's source name (provenance; used in error messages)."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release file handles. Safe to call twice."""

    @property
    def byte_addressable(self) -> bool:
        """True where `read_bytes(lo, hi)` reads about hi - lo bytes from storage (unfiltered data
        read at its file offsets), so reads that skip bytes read less; False (the default) where a
        read fetches and decodes the whole chunks it touches."""
        return False

    @property
    def concurrent_reads(self) -> bool:
        """True where `read_bytes` may be called from several threads at once on this one reader
        (positioned reads of a descriptor it holds), so a pool of reading threads can share it
        instead of each opening the container again (dstore.store.storage.StorageReader); False (the
        default) where each thread needs its own reader."""
        return False

    def _identity_paths(self) -> list[str]:
        """The files and directories whose identity stands for the container's (default: `path`)."""
        return [self.path]

    def _load_index(self) -> None:
        """Reads the INDEX_ARRAYS into attributes (backends that open without them override this)."""
        raise AttributeError(f"{type(self).__name__} has no index arrays")

    def _load_source_index(self) -> np.ndarray:
        """Reads and checks `source_index` (int64[N]); FormatError naming the file if malformed."""
        raise AttributeError(f"{type(self).__name__} has no source_index")

    def __getattr__(self, name):
        # Only reached when the attribute is missing: an index array not read yet (index=False),
        # or a lazy one (source_index) not asked for before.
        if name in INDEX_ARRAYS:
            self._load_index()
            return self.__dict__[name]
        if name in LAZY_ARRAYS:
            value = self._load_source_index()
            setattr(self, name, value)
            return value
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    @property
    def index_loaded(self) -> bool:
        """True once the index arrays are in memory."""
        return "offsets" in self.__dict__

    def drop_index(self) -> None:
        """Forgets the index arrays (read again on next use): for a reader whose index another
        copy replaces (dstore.store.index)."""
        for name in INDEX_ARRAYS + LAZY_ARRAYS:
            vars(self).pop(name, None)

    # --- defined once for every backend ------------------------------------------------
    def identity(self) -> tuple:
        """The container's files as they are now: a `file_identity` per `_identity_paths()`."""
        return tuple(file_identity(p) for p in self._identity_paths())

    def changes(self, since: tuple | None = None) -> str | None:
        """What changed in the container's files since it was opened (or since the identity
        `since`), in words; None: nothing. One stat per file: cheap enough for every epoch."""
        then = self.opened_identity if since is None else since
        return identities_differ(then, self.identity()) if then else None

    def check_unchanged(self, since: tuple | None = None) -> None:
        """Raises ContainerChangedError naming the file and what changed if the container's files
        are not the ones opened (or `since`): another file at the path, another size or time."""
        change = self.changes(since)
        if change:
            raise ContainerChangedError(
                f"{self.path}: the container changed while this job was reading it "
                f"({change}); a container must not be rewritten while a job reads it"
            )

    def __len__(self) -> int:
        return self.info.num_samples

    @property
    def num_samples(self) -> int:
        return self.info.num_samples

    @property
    def total_bytes(self) -> int:
        # Without the index (index=False), the attribute the node's index reader checked against it.
        return int(self.offsets[-1]) if self.index_loaded else int(self.info.total_bytes)

    def _check_index(self, i: int) -> int:
        i = int(i)
        if not 0 <= i < self.num_samples:
            raise ConfigError(f"sample index {i} is out of range [0, {self.num_samples}) in {self.path}")
        return i

    def sample(self, i: int) -> tuple[np.ndarray, int]:
        """Sample i's bytes (uint8 array) and its label."""
        i = self._check_index(i)
        return self.read_bytes(int(self.offsets[i]), int(self.offsets[i + 1])), int(self.labels[i])

    # --- extra fields per sample (dstore.formats.fields) -----------------------------------
    def _field_parts(self, name: str) -> dict:
        """The arrays `data`, `offsets`, `checksums` of field `name` (sliceable, 1-D)."""
        raise FormatError(f"{self.path}: this reader cannot read fields")

    @property
    def field_names(self) -> tuple[str, ...]:
        """The names of the container's extra fields, in the order declared."""
        return tuple(n for n, _ in self.info.fields)

    def _field_kind(self, name: str) -> str:
        """Field `name`'s kind; ConfigError naming the fields there are if it has none of that name."""
        kinds = dict(self.info.fields)
        if name not in kinds:
            raise ConfigError(f"{self.path} has no field {name!r} (fields: {list(kinds) or 'none'})")
        return kinds[name]

    def field_index(self, name: str):
        """The FieldIndex of field `name` (its offsets and checksums, read and checked on first use)."""
        cache = self.__dict__.get("_field_cache")
        if cache is None:  # per reader, not per class: FieldIndex holds this reader's arrays
            cache = self._field_cache = {}
        if name not in cache:
            kind = self._field_kind(name)
            cache[name] = FieldIndex(self.path, name, kind, self.num_samples, self._field_parts(name))
        return cache[name]

    def field_bad_samples(self, name: str) -> list[int]:
        """The samples whose value of field `name` does not match its checksum (what verify reports)."""
        return self.field_index(name).bad_samples()

    def field_bytes(self, name: str, i: int) -> bytes:
        """Sample i's value of field `name` as stored, checked against its checksum (ChecksumError)."""
        i = self._check_index(i)
        return self.field_index(name).raw(i, self.name)

    def field(self, name: str, i: int):
        """Sample i's value of field `name`: str (`text`), the parsed document (`json`) or bytes;
        None where the sample has none (`field_missing`; an empty value is '' or b'')."""
        raw = self.field_bytes(name, i)
        return decode_value(self._field_kind(name), None if self.field_missing(name, i, i + 1)[0] else raw)

    def field_missing(self, name: str, lo: int, hi: int) -> np.ndarray:
        """bool[hi - lo]: True for the samples of [lo, hi) that have no value of field `name` (a
        Parquet null, a WebDataset sample without that member), False for a value, an empty one
        included (docs/format.md, "Fields": `fields/<name>/missing`)."""
        if not 0 <= lo <= hi <= self.num_samples:
            raise ConfigError(f"{self.path}: field {name!r}: samples [{lo}, {hi}) are outside [0, {self.num_samples})")
        return self.field_index(name).missing[lo:hi]

    def field_block(self, name: str, lo: int, hi: int, *, data: bool = True) -> tuple:
        """Field `name` of samples [lo, hi) as stored, read with one slice of each array (what a
        store holds: dstore.store.fieldstore): (offsets int64[hi-lo+1] from 0, the values' bytes back to
        back as uint8 (empty unless `data`), their checksums uint32[hi-lo]). Nothing is checked
        against the checksums here; FormatError naming the field where the offsets do not fit."""
        self._field_kind(name)
        return block_of(self.path, name, self._field_parts(name), lo, hi, self.num_samples, data)

    def fields_of(self, indices, names=None) -> list[dict]:
        """Per sample of `indices`, {field name: value} for `names` (default: every field)."""
        names = self.field_names if names is None else tuple(names)
        return [{n: self.field(n, i) for n in names} for i in indices]

    def read_range(self, start: int, stop: int, out: np.ndarray | None = None) -> np.ndarray:
        """Samples [start, stop) as one contiguous uint8 array, read with one large read per file.

        This is what the store's preload uses: a rank's block is one byte range.
        """
        if not 0 <= start <= stop <= self.num_samples:
            raise ConfigError(f"sample range [{start}, {stop}) is not within [0, {self.num_samples}] in {self.path}")
        return self.read_bytes(int(self.offsets[start]), int(self.offsets[stop]), out=out)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


class ContainerWriter(abc.ABC):
    """Writes one container under a temporary name; `commit()` writes the index arrays, the
    attributes and, last, the completion marker, then renames it into place.

    Used as a context manager: a clean exit commits, an exception aborts (removes the temporary,
    leaving nothing that looks like a container).
    """

    @abc.abstractmethod
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
        """Appends one sample (bytes-like or uint8 array); returns its index in the container.

        Args:
            checksum: the sample's CRC32 as `checksum(data)` gives it, if the caller already has it
                (ingest computes it on the rank that loaded the sample, in parallel). The caller
                vouches for it: it is stored as given, not recomputed, and a wrong one is what
                `verify_container` reports. None: computed here.
            fields: the sample's extra field values {name: str, bytes or (json) a JSON-able value}
                for fields declared to the writer; a field left out is stored empty.
        """

    def extend(self, data, sizes, labels, names, source_index=None, *, checksums=None, fields=None) -> None:
        """Appends len(sizes) samples whose bytes lie back to back in `data` (one buffer), in order.

        Args:
            data: bytes-like or uint8 array of sum(sizes) bytes.
            sizes: each sample's size in bytes.
            labels, names: per sample, as for `append`.
            source_index: per sample (None: all -1).
            checksums: per sample, as `append`'s `checksum` (the caller vouches for them); None:
                computed here.
            fields: per sample, as `append`'s `fields` (a sequence of dicts, or None).

        Backends may do this faster than one `append` per sample (no per-sample copy).
        """
        sizes = [int(s) for s in sizes]
        n = len(sizes)
        source_index = [-1] * n if source_index is None else source_index
        view, off = memoryview(data).cast("B"), 0
        check_batch(
            view.nbytes,
            sizes,
            labels=labels,
            names=names,
            source_index=source_index,
            checksums=checksums,
            fields=fields,
        )
        for j, size in enumerate(sizes):
            self.append(
                view[off : off + size],
                labels[j],
                names[j],
                source_index[j],
                checksum=None if checksums is None else checksums[j],
                fields=None if fields is None else fields[j],
            )
            off += size

    @property
    @abc.abstractmethod
    def num_samples(self) -> int:
        """Samples appended so far."""

    @abc.abstractmethod
    def commit(self) -> str:
        """Finishes the container; returns its final path. Calling it twice is an error."""

    @abc.abstractmethod
    def abort(self) -> None:
        """Removes the temporary; safe to call twice and after commit (then it does nothing)."""

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            self.commit()
        else:
            self.abort()
        return False
