"""Named extra fields per sample (a caption, a JSON record of boxes, any bytes): how they are
declared, buffered by a writer, and checked and read back (the layout: docs/format.md, "Fields").

Each field `<name>` is stored like the main data, in the container's sample order:
`fields/<name>/data` (uint8, every sample's value back to back), `fields/<name>/offsets`
(int64[N+1]), `fields/<name>/checksums` (uint32[N], CRC32 of each value) and
`fields/<name>/missing` (uint8[N], 1 where the sample has no value: a Parquet null, a WebDataset
sample without that member; its bytes are empty; absent in containers written before it: every
sample has a value, an empty one an empty value). The attribute
`fields` lists them as `"<name>:<kind>"` strings; a container without it has no fields, and an
older reader, which never looks at `fields/`, reads its images and labels as before.
"""

from __future__ import annotations

import array
import json
import re

import numpy as np

from dstore.errors import ChecksumError, ConfigError, FormatError
from dstore.formats.crc import checksum as crc32_of

FIELD_KINDS = ("text", "json", "bytes")
"""`text`: UTF-8 text (read back as str); `json`: a UTF-8 JSON document (read back parsed);
`bytes`: anything (read back as bytes)."""

FIELDS_ATTR = "fields"
"""The attribute listing a container's fields as `name:kind` strings (absent: no fields)."""

FIELD_PARTS = ("data", "offsets", "checksums")
"""The arrays every field has, under `fields/<name>/`."""

MISSING_PART = "missing"
"""The array that tells a missing value from an empty one, under `fields/<name>/` (uint8[N], 1:
missing); containers written before it lack it (no value missing)."""

_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]{0,63}$")


RESERVED = ("image", "label")
"""Names a field cannot be stored under: a batch with fields is {"image", "label", field: ...}."""


def check_field_specs(fields, *, new: bool = False) -> tuple[tuple[str, str], ...]:
    """A writer's `fields` argument ({name: kind}, or (name, kind) pairs; None: none) as checked
    (name, kind) pairs; ConfigError naming the bad name or kind. `new`: fields about to be written,
    where a name of RESERVED is refused too (it could be stored, never served)."""
    if not fields:
        return ()
    pairs = list(fields.items()) if isinstance(fields, dict) else [tuple(p) for p in fields]
    seen: set[str] = set()
    for pair in pairs:
        if len(pair) != 2:
            raise ConfigError(f"fields: {pair!r} is not a (name, kind) pair")
        name, kind = pair
        if not isinstance(name, str) or not _NAME.match(name):
            raise ConfigError(
                f"field name {name!r} must be 1-64 characters of letters, digits, '_', '.', '-' "
                "(not starting with '.' or '-')"
            )
        if kind not in FIELD_KINDS:
            raise ConfigError(f"field {name!r}: kind {kind!r} is not one of {FIELD_KINDS}")
        if name in seen:
            raise ConfigError(f"field {name!r} is declared twice")
        if new and name in RESERVED:
            raise ConfigError(
                f"field {name!r}: a batch with fields is {{'image', 'label', <field>: ...}}, so a field "
                f"named {name!r} could be stored but never served; leave it out (--fields / fields= "
                f"naming the others, or 'none')"
            )
        seen.add(name)
    return tuple((str(n), str(k)) for n, k in pairs)


def fields_attr(specs) -> list[str]:
    """The `fields` attribute value for (name, kind) pairs."""
    return [f"{n}:{k}" for n, k in specs]


def parse_fields_attr(value, path: str) -> tuple[tuple[str, str], ...]:
    """(name, kind) pairs from a stored `fields` attribute; FormatError naming the file if malformed."""
    if value is None:
        return ()
    if isinstance(value, str) or not isinstance(value, (list, tuple)):
        raise FormatError(f"{path}: attribute fields={value!r} is not a list of 'name:kind' strings")
    pairs = []
    for item in value:
        name, sep, kind = str(item).rpartition(":")
        if not sep:
            raise FormatError(f"{path}: attribute fields entry {item!r} is not 'name:kind'")
        pairs.append((name, kind))
    try:
        return check_field_specs(pairs)
    except ConfigError as exc:
        raise FormatError(f"{path}: attribute fields: {exc}") from exc


def check_value(kind: str, field: str, value, sample: str) -> bytes:
    """A field value as the bytes stored: str is UTF-8 encoded; a `json` value that is not bytes
    or str is serialised; `text`/`json` bytes must be UTF-8 (and JSON). ConfigError naming the
    sample and the field otherwise: nothing is stored that would not read back."""
    if isinstance(value, str):
        raw = value.encode("utf-8", "strict")
    elif isinstance(value, (bytes, bytearray, memoryview)):
        raw = bytes(value)
    elif isinstance(value, np.ndarray) and value.dtype == np.uint8:
        raw = value.tobytes()
    elif kind == "json":
        try:
            raw = json.dumps(value).encode("utf-8")
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"{sample}: field {field!r} (json) cannot be serialised: {exc}") from exc
    else:
        raise ConfigError(f"{sample}: field {field!r} ({kind}) is a {type(value).__name__}, not bytes or str")
    if kind in ("text", "json"):
        try:
            text = raw.decode("utf-8")
            if kind == "json":
                json.loads(text)
        except (UnicodeDecodeError, ValueError) as exc:
            raise ConfigError(
                f"{sample}: field {field!r} is not valid {kind} ({exc}); declare it as "
                "kind 'bytes' to store it as it is"
            ) from exc
    return raw


def decode_value(kind: str, raw: bytes | None):
    """A stored value as read back: str for `text`, the parsed document for `json`, else bytes;
    None for a missing value (`raw` None)."""
    if raw is None:
        return None
    if kind == "text":
        return raw.decode("utf-8")
    if kind == "json":
        return json.loads(raw.decode("utf-8")) if raw else None
    return raw


class FieldBuffer:
    """Every field's values of the samples appended so far, in memory (a caption or a record is
    small: 100 bytes per sample is 1 GB for 10M samples), written whole at commit."""

    def __init__(self, specs: tuple[tuple[str, str], ...]):
        self.specs = specs
        self._data = {n: bytearray() for n, _ in specs}
        self._offsets = {n: array.array("q", [0]) for n, _ in specs}
        self._crcs = {n: array.array("I" if array.array("I").itemsize == 4 else "L") for n, _ in specs}
        self._missing = {n: bytearray() for n, _ in specs}

    def check(self, values, sample: str) -> dict[str, bytes | None]:
        """One sample's values ({name: value}; a field it lacks, or whose value is None, is missing:
        None) as bytes, checked before anything is buffered; ConfigError naming an undeclared field."""
        values = values or {}
        unknown = sorted(set(values) - set(self._data))
        if unknown:
            raise ConfigError(
                f"{sample}: field(s) {unknown} were not declared to the writer "
                f"(declared: {[n for n, _ in self.specs] or 'none'})"
            )
        return {n: None if values.get(n) is None else check_value(k, n, values[n], sample) for n, k in self.specs}

    def add(self, checked: dict[str, bytes | None]) -> None:
        """Buffers one sample's checked values (from `check`; None: missing, stored empty)."""
        for n, raw in checked.items():
            self._missing[n].append(raw is None)
            raw = raw or b""
            self._data[n] += raw
            self._offsets[n].append(len(self._data[n]))
            self._crcs[n].append(crc32_of(raw))

    def arrays(self, name: str) -> dict[str, np.ndarray]:
        """The four arrays of field `name` (FIELD_PARTS and MISSING_PART; views, no copy)."""
        crcs, missing = self._crcs[name], self._missing[name]
        return {
            "data": np.frombuffer(self._data[name], dtype=np.uint8) if self._data[name] else np.zeros(0, np.uint8),
            "offsets": np.frombuffer(self._offsets[name], dtype=np.int64),
            "checksums": np.frombuffer(crcs, dtype=np.uint32) if crcs else np.zeros(0, np.uint32),
            MISSING_PART: np.frombuffer(missing, dtype=np.uint8) if missing else np.zeros(0, np.uint8),
        }


def check_field_index(
    path: str,
    name: str,
    n: int,
    data_len: int,
    offsets: np.ndarray,
    checksums: np.ndarray,
    missing: np.ndarray | None = None,
) -> None:
    """FormatError naming the file and the field unless its offsets, checksums and missing flags fit
    N samples and its data (the same rules as the main index; a missing value's bytes are empty)."""
    where = f"{path}: field {name!r}"
    if missing is not None:
        if missing.shape != (n,):
            raise FormatError(f"{where}: {MISSING_PART} has shape {missing.shape}, expected ({n},)")
        if offsets.shape == (n + 1,) and (missing & (offsets[1:] != offsets[:-1])).any():
            first = int(np.flatnonzero(missing & (offsets[1:] != offsets[:-1]))[0])
            raise FormatError(
                f"{where}: sample {first} is marked missing but has a value "
                f"({int(offsets[first + 1] - offsets[first])} bytes)"
            )
    if offsets.ndim != 1 or offsets.shape[0] != n + 1:
        raise FormatError(f"{where}: offsets has shape {offsets.shape}, expected ({n + 1},)")
    if checksums.ndim != 1 or checksums.shape[0] != n:
        raise FormatError(f"{where}: checksums has shape {checksums.shape}, expected ({n},)")
    if int(offsets[0]) != 0 or (np.diff(offsets) < 0).any() or int(offsets[-1]) != data_len:
        raise FormatError(
            f"{where}: offsets are not 0 .. {data_len} non-decreasing "
            f"(first {int(offsets[0])}, last {int(offsets[-1])})"
        )


def block_of(path: str, name: str, parts, lo: int, hi: int, n: int, data: bool = True) -> tuple:
    """(offsets from 0, bytes, checksums) of field `name` for samples [lo, hi) of a container of `n`
    samples, sliced from its arrays `parts` (ContainerReader.field_block); FormatError naming the
    file and the field where the stored arrays do not fit."""
    where = f"{path}: field {name!r}"
    if not 0 <= lo <= hi <= n:
        raise ConfigError(f"{where}: samples [{lo}, {hi}) are outside [0, {n})")
    for part, want in (("offsets", n + 1), ("checksums", n)):
        if tuple(parts[part].shape) != (want,):
            raise FormatError(f"{where}: {part} has shape {tuple(parts[part].shape)}, expected ({want},)")
    off = np.asarray(parts["offsets"][lo : hi + 1], dtype=np.int64)
    crcs = np.asarray(parts["checksums"][lo:hi], dtype=np.uint32)
    size = int(parts["data"].shape[0])
    if (np.diff(off) < 0).any() or int(off[0]) < 0 or int(off[-1]) > size:
        raise FormatError(
            f"{where}: offsets of samples [{lo}, {hi}] are not non-decreasing within its "
            f"{size} data bytes; run `dstore verify` on the container"
        )
    raw = np.zeros(0, np.uint8)
    if data and int(off[-1]) > int(off[0]):
        raw = np.asarray(parts["data"][int(off[0]) : int(off[-1])], dtype=np.uint8)
    return off - off[0], raw, crcs


class FieldIndex:
    """One field of an open container: its offsets, checksums and missing flags in memory, its data
    read on demand through `read(lo, hi)` (a slice of the backend's `data` array).

    Attributes:
        missing: bool[N], True where the sample has no value (all False for a container written
            before the `missing` array: docs/format.md, "Fields")."""

    def __init__(self, path: str, name: str, kind: str, n: int, parts):
        self.path, self.name, self.kind = path, name, kind
        data, offsets, checksums = parts["data"], parts["offsets"], parts["checksums"]
        missing = parts.get(MISSING_PART)
        if getattr(data, "dtype", None) != np.uint8 or len(data.shape) != 1:
            raise FormatError(f"{path}: field {name!r} data must be 1-D uint8")
        for part, arr, want in (("offsets", offsets, n + 1), ("checksums", checksums, n), (MISSING_PART, missing, n)):
            if arr is not None and tuple(arr.shape) != (
                want,
            ):  # before reading it: a damaged file may declare any size
                raise FormatError(f"{path}: field {name!r}: {part} has shape {tuple(arr.shape)}, expected ({want},)")
        self.offsets = np.asarray(offsets[:], dtype=np.int64)
        self.checksums = np.asarray(checksums[:], dtype=np.uint32)
        self.missing = np.zeros(n, bool) if missing is None else np.asarray(missing[:]) != 0
        check_field_index(path, name, n, int(data.shape[0]), self.offsets, self.checksums, self.missing)
        self._data = data

    def raw(self, i: int, sample_name=None) -> bytes:
        """Sample i's value as stored, after its checksum: ChecksumError naming the container, the
        sample and the field where they differ (never a wrong caption served)."""
        lo, hi = int(self.offsets[i]), int(self.offsets[i + 1])
        got = np.asarray(self._data[lo:hi]).tobytes() if hi > lo else b""
        if crc32_of(got) != int(self.checksums[i]):
            who = f" ({sample_name(i)})" if sample_name is not None else ""
            raise ChecksumError(
                f"{self.path}: sample {i}{who}: field {self.name!r} does not match its checksum "
                "(damaged); run `dstore verify` on the container"
            )
        return got

    def bad_samples(self, block_bytes: int = 64 << 20) -> list[int]:
        """Indices of the samples whose value does not match its checksum (read in blocks)."""
        bad, n, i = [], self.checksums.size, 0
        while i < n:
            j = int(np.searchsorted(self.offsets, self.offsets[i] + block_bytes, side="right")) - 1
            j = min(n, max(j, i + 1))
            lo = int(self.offsets[i])
            buf = np.asarray(self._data[lo : int(self.offsets[j])]).tobytes()
            for k in range(i, j):
                a, b = int(self.offsets[k]) - lo, int(self.offsets[k + 1]) - lo
                if crc32_of(buf[a:b]) != int(self.checksums[k]):
                    bad.append(k)
            i = j
        return bad
