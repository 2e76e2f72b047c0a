"""An incremental ingest: a source's samples added to an existing container (`append_to`; no MPI here).

    dstore ingest new-photos/ --append-to train.h5

What an append does (docs/format.md, "Appending"):
- The new samples come after the old ones, in their own seeded order (`seed`); the old samples keep
  their positions, bytes, labels and names.
- Class map: the old classes keep their labels; a class the container does not have is added after
  them, in the source's order. Nothing is renumbered.
- Duplicates: a new sample whose name (its path relative to the source root) a stored sample has, or
  whose bytes equal a stored sample's (CRC32 equal, then the bytes compared), is refused
  (`duplicates="raise"`, naming both) or left out and listed (`"skip"`).
- One HDF5 file or Zarr group: the container is written again under a temporary name (the old
  samples copied, each checked against its stored CRC32, then the new) and renamed over the old:
  a reader sees the old container or the new, never a part. A sharded container: the new samples
  go to new shard files, then a new manifest over old and new shards replaces the old one (one
  rename); the old shards are not touched.
"""

from __future__ import annotations

import dataclasses
import json
import os

import numpy as np

from dstore.errors import ConfigError, SampleError
from dstore.formats import detect_format, open_container
from dstore.formats.base import checksum
from dstore.ingest.source import Source


@dataclasses.dataclass
class OldContainer:
    """What an append needs of the container it adds to."""

    path: str
    kind: str  # hdf5, zarr or sharded
    shard_fmt: str  # the backend of its (new) files
    num_samples: int
    total_bytes: int
    class_names: tuple[str, ...]
    encoding: str
    raw_dtype: str | None
    raw_shape: tuple[int, ...] | None
    fields: tuple[tuple[str, str], ...]
    extra: dict
    source: str
    shard_paths: list[str]

    @classmethod
    def open(cls, path: str) -> OldContainer:
        from dstore.formats.sharded import read_manifest

        kind = detect_format(path)
        with open_container(path) as r:
            info = r.info
            shards = [s.path for s in getattr(r, "shards", ())]
            shard_fmt = detect_format(shards[0]) if shards else kind
            if kind == "sharded":
                shards = [e["path"] for e in read_manifest(path)["shards"]]
            return cls(
                os.path.abspath(path),
                kind,
                shard_fmt,
                r.num_samples,
                r.total_bytes,
                tuple(info.class_names),
                info.encoding,
                info.raw_dtype,
                None if info.raw_shape is None else tuple(info.raw_shape),
                tuple(info.fields),
                dict(info.extra),
                info.source,
                shards,
            )


def merge_classes(old: tuple[str, ...], new: tuple[str, ...]) -> tuple[tuple[str, ...], np.ndarray]:
    """(the merged class names: the old ones, then the new ones not among them, in order; the new
    source's label -> merged label)."""
    merged = list(old)
    index = {c: i for i, c in enumerate(merged)}
    mapping = []
    for c in new:
        if c not in index:
            index[c] = len(merged)
            merged.append(c)
        mapping.append(index[c])
    return tuple(merged), np.asarray(mapping, dtype=np.int64)


class AppendSource(Source):
    """The samples `keep` of `inner` (a subset: those not stored already), labelled in the merged
    class map (`mapping`: inner label -> merged label; None: labels kept, a source without class names)."""

    kind = "appended"

    def __init__(self, inner: Source, keep: np.ndarray, class_names, mapping: np.ndarray | None, description: str):
        super().__init__()
        self.inner, self._keep, self._mapping = inner, np.asarray(keep, dtype=np.int64), mapping
        self.class_names = tuple(class_names)
        self.encoding, self.raw_dtype, self.raw_shape = inner.encoding, inner.raw_dtype, inner.raw_shape
        self.field_specs = inner.field_specs
        self.description = description
        self.skipped, self.ignored, self.notes = list(inner.skipped), list(inner.ignored), list(inner.notes)

    @property
    def estimated_sample_bytes(self) -> int:
        return self.inner.estimated_sample_bytes

    def __len__(self) -> int:
        return int(self._keep.size)

    def label(self, i: int) -> int:
        label = self.inner.label(int(self._keep[i]))
        return label if self._mapping is None else int(self._mapping[label])

    def name(self, i: int) -> str:
        return self.inner.name(int(self._keep[i]))

    def locate(self, i: int) -> str:
        return self.inner.locate(int(self._keep[i]))

    def load(self, i: int):
        return self.inner.load(int(self._keep[i]))

    def fields(self, i: int, names) -> dict[str, bytes]:
        return self.inner.fields(int(self._keep[i]), names)

    def prefetch(self, indices) -> None:
        self.inner.prefetch([int(self._keep[i]) for i in indices])

    def close(self) -> None:
        close = getattr(self.inner, "close", None)
        if close is not None:
            close()


def check_compatible(old: OldContainer, src: Source, target, fields) -> None:
    """ConfigError naming what differs if the source's samples cannot join the container: another
    stored encoding, raw dtype or shape, or other extra fields."""
    if target.encoding != old.encoding:
        raise ConfigError(
            f"append_to={old.path!r}: the container's encoding is {old.encoding!r}, this source's "
            f"samples would be stored as {target.encoding!r} (pass --encoding {old.encoding} or "
            "--resize to match)"
        )
    if target.encoding == "raw" and (str(target.raw_dtype), tuple(target.raw_shape or ())) != (
        str(old.raw_dtype),
        tuple(old.raw_shape or ()),
    ):
        raise ConfigError(
            f"append_to={old.path!r}: the container holds {old.raw_dtype}{old.raw_shape} samples, this "
            f"source gives {target.raw_dtype}{tuple(target.raw_shape or ())}"
        )
    if tuple(fields) != tuple(old.fields):
        raise ConfigError(
            f"append_to={old.path!r}: the container's fields are {list(old.fields) or 'none'}, this "
            f"source's stored fields would be {list(fields) or 'none'} (choose them with --fields)"
        )
    if not old.class_names and src.class_names:
        raise ConfigError(
            f"append_to={old.path!r}: the container has no class names (unlabelled), this source has "
            f"{len(src.class_names)}"
        )


def name_duplicates(old_path: str, src: Source, n: int) -> tuple[np.ndarray, list]:
    """(the source indices < n whose names no stored sample has, [(source index, stored index)] of
    those it has)."""
    with open_container(old_path, check_labels=False) as r:
        stored = {r.name(j): j for j in range(r.num_samples)}
    keep, dup = [], []
    for i in range(n):
        j = stored.get(src.name(i))
        if j is None:
            keep.append(i)
        else:
            dup.append((i, j))
    return np.asarray(keep, dtype=np.int64), dup


class Duplicates:
    """A group writer's round filter (dstore.ingest.writer.BackgroundWriter `filter`): a sample whose
    bytes equal a stored sample's is refused (`policy` raise) or left out (skip; listed in `dropped`)."""

    def __init__(self, old_path: str, src: Source, policy: str):
        self._path, self._src, self._policy = old_path, src, policy
        self._reader = None
        self.dropped: list = []

    def _open(self):
        if self._reader is None:
            self._reader = open_container(self._path, check_labels=False)
            crcs = np.asarray(self._reader.checksums, dtype=np.uint32)
            self._order = np.argsort(crcs, kind="stable")
            self._sorted = crcs[self._order]
        return self._reader

    def _match(self, crc: int, data) -> int | None:
        r = self._open()
        a = int(np.searchsorted(self._sorted, crc, side="left"))
        b = int(np.searchsorted(self._sorted, crc, side="right"))
        for j in self._order[a:b].tolist():  # CRC32s collide among millions: the bytes decide
            if np.array_equal(r.sample(j)[0], data):
                return j
        return None

    def __call__(self, indices, sizes, data, checksums):
        """(sizes, data, checksums, skipped) of a round without the samples already stored."""
        sizes = np.array(sizes, dtype=np.int64)
        data = np.asarray(data, dtype=np.uint8)
        kept = np.flatnonzero(sizes >= 0)
        ends = np.cumsum(sizes[kept])
        starts = ends - sizes[kept]
        crcs = (
            list(checksums)
            if checksums is not None
            else [checksum(data[a:b]) for a, b in zip(starts.tolist(), ends.tolist())]
        )
        drop, skipped = [], []
        for x, p in enumerate(kept.tolist()):
            piece = data[int(starts[x]) : int(ends[x])]
            j = self._match(int(crcs[x]), piece)
            if j is None:
                continue
            i = int(indices[p])
            where = self._src.locate(i)
            what = f"the same bytes as stored sample {j} ({self._open().name(j)}) of {self._path}"
            if self._policy == "raise":
                raise SampleError(
                    f"{where}: a duplicate: {what}; pass duplicates='skip' (--duplicates skip) to "
                    "leave such samples out"
                )
            drop.append(x)
            skipped.append((where, f"duplicate: {what}"))
        if not drop:
            return sizes, data, checksums, []
        self.dropped.extend(skipped)
        mask = np.ones(kept.size, dtype=bool)
        mask[drop] = False
        pieces = [data[int(starts[x]) : int(ends[x])] for x in np.flatnonzero(mask).tolist()]
        sizes[kept[~mask]] = -1
        new_crcs = None if checksums is None else [int(c) for c, m in zip(crcs, mask) if m]
        return sizes, (np.concatenate(pieces) if pieces else np.zeros(0, np.uint8)), new_crcs, skipped


class CopyOld:
    """An append's prologue to one file: the old container's samples, written first into the new
    one (`writer.extend` in blocks of about `batch_bytes`), each checked against its stored CRC32."""

    def __init__(self, path: str, field_names, batch_bytes: int = 64 << 20):
        self.path, self.field_names, self.batch_bytes = path, tuple(field_names), batch_bytes

    def __call__(self, writer) -> None:
        with open_container(self.path, check_labels=False) as r:
            offsets = np.asarray(r.offsets, dtype=np.int64)
            n = r.num_samples
            a = 0
            while a < n:
                b = max(a + 1, int(np.searchsorted(offsets, offsets[a] + self.batch_bytes, side="right")) - 1)
                b = min(b, n)
                data = r.read_range(a, b)
                sizes = np.diff(offsets[a : b + 1])
                crcs = np.asarray(r.checksums[a:b], dtype=np.uint32)
                ends = np.cumsum(sizes)
                for x, (s, e) in enumerate(zip((ends - sizes).tolist(), ends.tolist())):
                    if checksum(data[s:e]) != int(crcs[x]):
                        raise SampleError(
                            f"{self.path}: stored sample {a + x} ({r.name(a + x)}) does not match its "
                            "checksum; the append copies nothing damaged (`dstore verify` lists them)"
                        )
                fields = (
                    [{f: r.field_bytes(f, i) for f in self.field_names} for i in range(a, b)]
                    if self.field_names
                    else None
                )
                writer.extend(
                    data,
                    sizes,
                    r.labels[a:b],
                    [r.name(i) for i in range(a, b)],
                    np.asarray(r.source_index[a:b]),
                    checksums=crcs,
                    fields=fields,
                )
                a = b


def history(old: OldContainer, description: str, seed: int, added: int, classes_added) -> dict:
    """The attributes an append writes: the old container's (its ingest seed, a re-encode), `ingest_order`
    `appended` (the whole is no longer one seeded mix: `dstore train` then checks its held-out tail,
    which is the new samples, and refuses one far from the whole's classes) and `ingest_appends`, a
    JSON list with one record per append (the first also keeps the order before: `order_before`)."""
    extra = {k: v for k, v in old.extra.items() if k != "ingest_id"}
    try:
        past = json.loads(extra.get("ingest_appends", "[]"))
    except (TypeError, ValueError):
        past = []
    record = {
        "source": description,
        "seed": int(seed),
        "first_sample": int(old.num_samples),
        "samples": int(added),
        "classes_added": list(classes_added),
    }
    if not past:
        record["order_before"] = old.extra.get("ingest_order")
    past.append(record)
    extra["ingest_appends"] = json.dumps(past)
    extra["ingest_order"] = "appended"
    return extra


def new_shard_paths(old: OldContainer, shards: int) -> list[str]:
    """Paths for an append's new shards beside the old ones: `<stem>-append<k>-00000-of-0000S<suffix>`,
    k the first number no file uses."""
    suffix = ".h5" if old.shard_fmt == "hdf5" else ".zarr"
    base = os.path.dirname(old.shard_paths[0])
    stem = "shard" if old.kind == "sharded" and not old.path.endswith(".json") else os.path.basename(old.path)[:-5]
    k = 1
    while any(e.startswith(f"{stem}-append{k}-") for e in os.listdir(base)):
        k += 1
    return [os.path.join(base, f"{stem}-append{k}-{s:05d}-of-{shards:05d}{suffix}") for s in range(shards)]


def write_appended_manifest(old: OldContainer, new_paths: list[str], extra: dict) -> None:
    """Replaces the old manifest by one over the old shards and the new (one rename)."""
    from dstore.formats import write_manifest

    write_manifest(old.path, list(old.shard_paths) + list(new_paths), extra_attrs=extra, overwrite=True)
