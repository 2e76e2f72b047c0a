"""A sharded container: several complete shard containers (HDF5 or Zarr) joined by a JSON manifest
into one logical container whose samples are the shards' samples in manifest order."""

from __future__ import annotations

import dataclasses
import json
import os
import posixpath

import numpy as np

from dstore.errors import ConfigError, FormatError, IncompleteContainerError
from dstore.formats.backends import MANIFEST_FORMAT, MANIFEST_NAME, detect_format, open_backend
from dstore.formats.base import ContainerNotFoundError, ContainerReader, crc32
from dstore.formats.layout import COMPLETE_ATTR, check_byte_range, check_out, make_attrs, parse_info
from dstore.formats.objects import is_url, join, read_object, stat
from dstore.formats.replace import check_target, move_into_place, remove_path, temp_path

_SHARED_KEYS = ("encoding", "class_names", "raw_dtype", "raw_shape", "fields")
"""Attributes every shard of one container must agree on."""

MANIFEST_VERSION = 2
"""Version of the manifest written here: 2 records each shard's identity (`IDENTITY_KEYS`)."""
READ_VERSIONS = (1, 2)
"""Manifest versions read: 1 (no shard identity: nothing to compare a shard with) and 2."""
IDENTITY_KEYS = ("sample_start", "ingest_id", "checksums_crc32")
"""What a version-2 manifest records of each shard, and a reader checks: its first sample in the
joined view, the `ingest_id` attribute of the ingest that wrote it (None if it has none), and the
CRC32 of its `checksums` array (little-endian uint32): a shard of another ingest, even of the same
source, has other checksums in another order."""


def checksums_crc32(checksums: np.ndarray) -> int:
    """The CRC32 of a shard's `checksums` array as little-endian uint32 (its fingerprint)."""
    return crc32(np.ascontiguousarray(checksums, dtype="<u4").tobytes()) & 0xFFFFFFFF


def shard_identity(reader: ContainerReader, sample_start: int) -> dict:
    """The IDENTITY_KEYS of an open shard that starts at `sample_start` of the joined view."""
    ingest_id = reader.info.extra.get("ingest_id")
    return {
        "sample_start": int(sample_start),
        "ingest_id": None if ingest_id is None else str(ingest_id),
        "checksums_crc32": checksums_crc32(reader.checksums),
    }


def manifest_file(path) -> str:
    """The manifest file for `path`: `path` itself if it ends in .json, else `path/manifest.json`."""
    path = os.fspath(path)
    return path if path.endswith(".json") else join(path.rstrip("/") if is_url(path) else path, MANIFEST_NAME)


def write_manifest(path, shard_paths, *, extra_attrs: dict | None = None, overwrite: bool = False) -> str:
    """Writes the manifest of a sharded container over finished shards (under a temporary name,
    renamed into place, so a manifest that exists is complete).

    Args:
        path: `x.json`, or a directory (created if missing) that gets `manifest.json`.
        shard_paths: the shards, in order; each must be a complete HDF5 or Zarr container, and all
            must agree on encoding, class names and raw dtype/shape. Stored relative to the
            manifest's directory when they lie below it, so the directory can be moved whole.
        extra_attrs: more attributes for the merged view (default: the first shard's).
        overwrite: replace an existing manifest.

    Returns:
        The manifest file's path.

    Raises:
        ConfigError: no shards, or shards that disagree (the message names both).
        IncompleteContainerError, FormatError: a shard that is not a finished container.
    """
    shard_paths = [os.fspath(p) for p in shard_paths]
    if not shard_paths:
        raise ConfigError("write_manifest needs at least one shard (shard_paths is empty)")
    target = manifest_file(path)
    if not target.endswith(".json"):
        os.makedirs(os.path.dirname(target) or ".", exist_ok=True)
    target = check_target(target, overwrite)
    entries, first_info = _shard_entries(shard_paths, os.path.dirname(target))
    merged = make_attrs(
        encoding=first_info.encoding,
        class_names=first_info.class_names,
        raw_dtype=first_info.raw_dtype,
        raw_shape=first_info.raw_shape,
        source=first_info.source,
        extra_attrs=first_info.extra if extra_attrs is None else extra_attrs,
        num_samples=sum(e["num_samples"] for e in entries),
        total_bytes=sum(e["total_bytes"] for e in entries),
        fields=first_info.fields,
    )
    manifest = {
        "format": MANIFEST_FORMAT,
        "version": MANIFEST_VERSION,
        "shards": entries,
        "attrs": merged,
        COMPLETE_ATTR: True,
    }  # the marker, last key
    _write_json_into_place(manifest, target, overwrite)
    return target


def _shard_entries(shard_paths: list[str], base: str):
    """(the manifest's shard entries, the first shard's ContainerInfo): each shard opened and checked
    to be an HDF5 or Zarr container agreeing with the first; paths relative to `base` below it."""
    entries, first = [], None
    first_path, first_info = "", None
    start = 0
    for p in shard_paths:
        fmt = detect_format(p)
        if fmt == "sharded":
            raise ConfigError(f"shard {p} is itself a manifest; shards must be HDF5 or Zarr containers")
        with open_backend(p, fmt) as r:
            info = r.info
            identity = shard_identity(r, start)
        start += info.num_samples
        attrs = {k: getattr(info, k) for k in _SHARED_KEYS}
        if first is None:
            first, first_path, first_info = attrs, p, info
        else:
            diff = [k for k in _SHARED_KEYS if attrs[k] != first[k] and k != "class_names"]
            if not diff and not _prefix(first["class_names"], attrs["class_names"]):
                diff = ["class_names"]
            if diff:
                raise ConfigError(
                    f"shard {p} disagrees with shard {first_path} on {diff}: "
                    f"{[attrs[k] for k in diff]} vs {[first[k] for k in diff]}"
                )
            if len(attrs["class_names"]) > len(first["class_names"]):  # an appended shard added classes
                first = dict(first, class_names=attrs["class_names"])
                first_info = dataclasses.replace(
                    info if first_info is None else first_info, class_names=attrs["class_names"]
                )
        rel = os.path.relpath(os.path.abspath(p), base)
        entries.append(
            {
                "path": rel if not rel.startswith("..") else os.path.abspath(p),
                "num_samples": info.num_samples,
                "total_bytes": info.total_bytes,
                **identity,
            }
        )
    if first_info is None:
        raise ConfigError("a sharded container needs at least one shard (none given)")
    return entries, first_info


def _prefix(a, b) -> bool:
    """Whether one of the class-name lists `a`, `b` begins the other: an append adds classes after
    the old ones (dstore.ingest.append), so an old shard's class names begin the container's."""
    n = min(len(a), len(b))
    return tuple(a[:n]) == tuple(b[:n])


def _write_json_into_place(value, target: str, overwrite: bool) -> None:
    """`value` as JSON at `target`: written and synced under a temporary name, then renamed."""
    tmp = temp_path(target)
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(value, f, indent=1)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        move_into_place(tmp, target, overwrite)
    except BaseException:
        remove_path(tmp)
        raise


def read_manifest(path) -> dict:
    """The manifest at `path` (file or directory), validated; shard paths made absolute."""
    mfile = manifest_file(path)
    remote = is_url(mfile)
    if not (stat(mfile) is not None if remote else os.path.isfile(mfile)):
        raise ContainerNotFoundError(f"{path}: no manifest file {mfile}")
    try:
        if remote:
            manifest = json.loads(read_object(mfile).decode("utf-8"))
        else:
            with open(mfile, encoding="utf-8") as f:
                manifest = json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise FormatError(f"{mfile}: not a readable JSON manifest: {exc}") from exc
    if not isinstance(manifest, dict) or manifest.get("format") != MANIFEST_FORMAT:
        raise FormatError(f"{mfile}: not a dstore manifest (key 'format' is not {MANIFEST_FORMAT!r})")
    if not manifest.get(COMPLETE_ATTR, False):
        raise IncompleteContainerError(f"{mfile}: no completion marker (key {COMPLETE_ATTR!r} is missing)")
    if manifest.get("version") not in READ_VERSIONS:
        raise FormatError(
            f"{mfile}: unknown manifest version {manifest.get('version')!r} (this code reads versions {READ_VERSIONS})"
        )
    missing = [k for k in ("shards", "attrs") if k not in manifest]
    if missing or not isinstance(manifest["shards"], list) or not manifest["shards"]:
        raise FormatError(f"{mfile}: missing or empty key(s) {missing or ['shards']}")
    base = posixpath.dirname(mfile) if remote else os.path.dirname(os.path.abspath(mfile))
    for i, entry in enumerate(manifest["shards"]):
        keys = ("path", "num_samples", "total_bytes") + (IDENTITY_KEYS if manifest["version"] >= 2 else ())
        lacking = [k for k in keys if not isinstance(entry, dict) or k not in entry]
        if lacking:
            raise FormatError(f"{mfile}: shard entry {i} lacks {lacking}")
        if remote and (is_url(entry["path"]) or entry["path"].startswith(("/", ".."))):
            raise FormatError(
                f"{mfile}: shard entry {i} has path {entry['path']!r}; a manifest in object storage "
                "names its shards relative to itself, below its prefix"
            )
        entry["path"] = join(base, entry["path"])
    manifest["file"] = mfile
    return manifest


def _check_identity(mfile: str, i: int, entry: dict, shard: ContainerReader, start: int) -> None:
    """FormatError naming shard `i` if it is not the shard the manifest recorded (IDENTITY_KEYS)."""
    have = shard_identity(shard, start)
    diff = [k for k in IDENTITY_KEYS if entry[k] != have[k]]
    if diff:
        raise FormatError(
            f"{mfile}: shard {i} ({entry['path']}) is not the shard this manifest was written over: "
            + ", ".join(f"{k} {have[k]!r}, the manifest says {entry[k]!r}" for k in diff)
            + " (a shard of another ingest, or replaced?)"
        )


class ShardedReader(ContainerReader):
    """One logical container over a manifest's shards: index arrays concatenated (offsets shifted),
    and a byte range that spans shards read as one large read per shard into the same `out`."""

    def __init__(self, path):
        self.path = os.fspath(path)
        manifest = read_manifest(self.path)
        mfile = manifest["file"]
        attrs = dict(manifest["attrs"], **{COMPLETE_ATTR: True})
        self.info = parse_info(attrs, mfile)
        self._shards: list[ContainerReader] = []
        try:
            for i, entry in enumerate(manifest["shards"]):
                fmt = detect_format(entry["path"])
                if fmt == "sharded":  # itself, or another: no recursion
                    raise FormatError(
                        f"{mfile}: shard {i} ({entry['path']}) is itself a manifest; shards "
                        "must be HDF5 or Zarr containers"
                    )
                shard = open_backend(entry["path"], fmt, check_labels=False)
                self._shards.append(shard)
                if (shard.num_samples, shard.total_bytes) != (entry["num_samples"], entry["total_bytes"]):
                    raise FormatError(
                        f"{mfile}: shard {i} ({entry['path']}) has {shard.num_samples} samples / "
                        f"{shard.total_bytes} bytes, the manifest says {entry['num_samples']} / {entry['total_bytes']}"
                    )
                if (shard.info.encoding, shard.info.fields) != (self.info.encoding, self.info.fields) or (
                    tuple(self.info.class_names[: shard.info.num_classes]) != tuple(shard.info.class_names)
                ):
                    raise FormatError(
                        f"{mfile}: shard {i} ({entry['path']}) disagrees with the manifest "
                        "on encoding, class names (a shard's must begin the manifest's) or fields"
                    )
                if manifest["version"] >= 2:
                    _check_identity(mfile, i, entry, shard, sum(s.num_samples for s in self._shards[:-1]))
            self._load()
        except BaseException:
            self.close()
            raise
        self._mfile = mfile
        self.opened_identity = self.identity()

    def _identity_paths(self) -> list[str]:
        """The manifest and every shard's files."""
        return [self._mfile] + [p for s in self._shards for p in s._identity_paths()]

    def _load(self) -> None:
        counts = np.array([s.num_samples for s in self._shards], dtype=np.int64)
        sizes = np.array([s.total_bytes for s in self._shards], dtype=np.int64)
        # sample_starts[k] / byte_starts[k]: first sample / byte of shard k in the joined view.
        self._sample_starts = np.concatenate([[0], np.cumsum(counts)])
        self._byte_starts = np.concatenate([[0], np.cumsum(sizes)])
        self.offsets = np.concatenate(
            [[0]] + [s.offsets[1:] + b for s, b in zip(self._shards, self._byte_starts)]
        ).astype(np.int64)
        self.labels = np.concatenate([s.labels for s in self._shards]).astype(np.int64)
        self.checksums = np.concatenate([s.checksums for s in self._shards]).astype(np.uint32)
        for s in self._shards:  # the joined arrays replace the shards' own (read again where asked for)
            if s.index_on_demand:
                s.drop_index()
        if self.info.num_samples != int(counts.sum()) or self.info.total_bytes != int(sizes.sum()):
            raise FormatError(
                f"{self.path}: manifest attributes say {self.info.num_samples} samples / "
                f"{self.info.total_bytes} bytes, the shards hold {int(counts.sum())} / {int(sizes.sum())}"
            )

    def _load_source_index(self) -> np.ndarray:
        """The shards' source indices joined (each read and checked by its shard on first use here)."""
        if not self._shards:
            raise ConfigError(f"{self.path}: the reader is closed")
        joined = np.concatenate([s.source_index for s in self._shards]).astype(np.int64, copy=False)
        for s in self._shards:  # the joined copy replaces the shards' own
            vars(s).pop("source_index", None)
        return joined

    @property
    def shards(self) -> tuple[ContainerReader, ...]:
        """The open shard readers, in order."""
        return tuple(self._shards)

    def shard_of(self, i: int) -> tuple[int, int]:
        """(shard number, index within that shard) of sample i."""
        i = self._check_index(i)
        k = int(np.searchsorted(self._sample_starts, i, side="right")) - 1
        return k, i - int(self._sample_starts[k])

    @property
    def byte_addressable(self) -> bool:
        return bool(self._shards) and all(s.byte_addressable for s in self._shards)

    def read_bytes(self, lo: int, hi: int, out: np.ndarray | None = None) -> np.ndarray:
        """data[lo:hi] of the joined view: one range read per shard it touches, into one `out`."""
        lo, hi = check_byte_range(self.path, lo, hi, self.total_bytes)
        if not self._shards:
            raise ConfigError(f"{self.path}: the reader is closed")
        starts = self._byte_starts
        first = int(np.searchsorted(starts, lo, side="right")) - 1
        last = int(np.searchsorted(starts, hi, side="left"))
        if first == last - 1 and out is None:  # within one shard: that shard's read, no copy
            return self._shards[first].read_bytes(lo - int(starts[first]), hi - int(starts[first]))
        out = check_out(out, hi - lo)
        for k in range(max(first, 0), min(last, len(self._shards))):
            a, b = max(lo, int(starts[k])), min(hi, int(starts[k + 1]))
            if b > a:
                self._shards[k].read_bytes(a - int(starts[k]), b - int(starts[k]), out=out[a - lo : b - lo])
        return out

    def name(self, i: int) -> str:
        k, j = self.shard_of(i)
        return self._shards[k].name(j)

    def field_bytes(self, name: str, i: int) -> bytes:
        """Sample i's value of field `name`, read from its shard (checked against its checksum)."""
        self._field_kind(name)
        k, j = self.shard_of(i)
        return self._shards[k].field_bytes(name, j)

    def field_missing(self, name: str, lo: int, hi: int) -> np.ndarray:
        """ContainerReader.field_missing over the shards that hold samples [lo, hi), joined."""
        self._field_kind(name)
        if not 0 <= lo <= hi <= self.num_samples:
            raise ConfigError(f"{self.path}: field {name!r}: samples [{lo}, {hi}) are outside [0, {self.num_samples})")
        starts, parts = self._sample_starts, [np.zeros(0, bool)]
        for k in range(len(self._shards)):
            a, b = max(lo, int(starts[k])), min(hi, int(starts[k + 1]))
            if b > a:
                parts.append(self._shards[k].field_missing(name, a - int(starts[k]), b - int(starts[k])))
        return np.concatenate(parts)

    def field_block(self, name: str, lo: int, hi: int, *, data: bool = True) -> tuple:
        """ContainerReader.field_block over the shards that hold samples [lo, hi), joined."""
        self._field_kind(name)
        if not self._shards:
            raise ConfigError(f"{self.path}: the reader is closed")
        starts = self._sample_starts
        offs, datas, crcs, at = [np.zeros(1, np.int64)], [], [], 0
        for k in range(max(0, int(np.searchsorted(starts, lo, side="right")) - 1), len(self._shards)):
            a, b = max(lo, int(starts[k])), min(hi, int(starts[k + 1]))
            if a >= hi:
                break
            if b <= a:
                continue
            o, d, c = self._shards[k].field_block(name, a - int(starts[k]), b - int(starts[k]), data=data)
            offs.append(o[1:] + at)
            at += int(o[-1])
            datas.append(d)
            crcs.append(c)
        return (
            np.concatenate(offs),
            np.concatenate(datas) if datas else np.zeros(0, np.uint8),
            np.concatenate(crcs) if crcs else np.zeros(0, np.uint32),
        )

    def field_bad_samples(self, name: str) -> list[int]:
        """Every shard's bad values of field `name`, as indices of the joined view."""
        self._field_kind(name)
        return [int(self._sample_starts[k]) + j for k, s in enumerate(self._shards) for j in s.field_bad_samples(name)]

    def close(self) -> None:
        shards, self._shards = self._shards, []
        for s in shards:
            s.close()
