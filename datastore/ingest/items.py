"""Ingest from any iterable of (bytes, label, name): the Python API for data no other source reads.

    from dstore.ingest import ingest_items
    report = ingest_items(((open(p, "rb").read(), lab, p) for p, lab in pairs), "train.h5", comm=comm)

An iterable can be walked only once and only where it lives, so rank 0 walks it and spools the
bytes to one temporary file beside the output (`spool_dir`; on a cluster a file system every rank
sees, as the output's is); the ranks then process, check and write the spooled samples in parallel
and in the seeded order, as `dstore ingest` does, and rank 0 removes the spool. Only rank 0's
`items` is read (the other ranks may pass None). Labels are ints or class names
(dstore.ingest.labels); the encoding is `jpeg`/`png` if every item is one, else `image`. An item
may carry a fourth element, a dict of extra fields ({name: value}: str is a `text` field, bytes a
`bytes` field, a dict/list/number a `json` field; a field mixing str and bytes is `bytes`), spooled
with the image bytes and stored per sample (docs/format.md, "Fields"). An item
that is not a (bytes-like, label, name) triple, or whose bytes are not a valid image, is a bad
sample (`on_error`), named by its name (or its position).
"""

from __future__ import annotations

import json
import os
import tempfile

import numpy as np

from dstore.codec.decode import sniff
from dstore.errors import ConfigError, SampleError
from dstore.ingest.folder import VALIDATE, validate_image
from dstore.ingest.labels import class_names_option, resolve_labels
from dstore.ingest.report import IngestError, IngestReport
from dstore.ingest.source import Source
from dstore.runtime import collective


class SpoolSource(Source):
    """Samples spooled in one file (sample i's bytes at `ranges[i]`, its fields' after them), with
    their labels and names."""

    kind = "items"

    def __init__(
        self,
        path: str,
        ranges: np.ndarray,
        labels: list[int],
        names: list[str],
        *,
        class_names: tuple[str, ...],
        encoding: str,
        validate: str,
        description: str,
        field_specs=(),
        field_ranges=None,
    ):
        super().__init__()
        self.field_specs = tuple(field_specs)
        # field name -> int64[N, 2]: the value's [start, stop) in the spool ([-1, -1]: the item had none)
        self._field_ranges = field_ranges or {}
        self.path, self._ranges, self._labels, self._names = path, ranges, labels, names
        self.class_names, self.encoding, self.validate = class_names, encoding, validate
        self.description = description

    def __len__(self) -> int:
        return len(self._labels)

    def label(self, i: int) -> int:
        return self._labels[i]

    def name(self, i: int) -> str:
        return self._names[i]

    def fields(self, i: int, names) -> dict[str, bytes]:
        got = {}
        for name in names:
            lo, hi = (int(v) for v in self._field_ranges[name][i])
            if lo >= 0:
                got[name] = self._read(i, lo, hi)
        return got

    def _read(self, i: int, lo: int, hi: int) -> bytes:
        try:
            with open(self.path, "rb") as f:
                return os.pread(f.fileno(), hi - lo, lo)
        except OSError as exc:
            raise SampleError(
                f"{self._names[i]}: cannot read it back from the spool {self.path}: {exc.strerror or exc}"
            ) from exc

    def load(self, i: int) -> bytes:
        lo, hi = (int(v) for v in self._ranges[i])
        try:
            with open(self.path, "rb") as f:
                data = os.pread(f.fileno(), hi - lo, lo)
        except OSError as exc:
            raise SampleError(
                f"{self._names[i]}: cannot read it back from the spool {self.path}: {exc.strerror or exc}"
            ) from exc
        validate_image(data, self._names[i], self.validate)
        return data


def spool(items, path: str, *, class_names=None, on_error: str = "raise", validate: str = "header") -> SpoolSource:
    """Writes every item's bytes to `path` and returns the source over them (no MPI).

    Raises:
        SampleError: with on_error="raise", the first malformed item (by name or position).
    """
    if validate not in VALIDATE:
        raise ConfigError(f"validate={validate!r} is not one of {VALIDATE}")
    spans, values, names, kinds, skipped, pos = [], [], [], set(), [], 0
    ranges: dict[str, dict[int, tuple[int, int]]] = {}  # field -> {sample: spool range}
    field_kinds: dict[str, set[str]] = {}
    with open(path, "wb") as f:
        for k, item in enumerate(items):
            try:
                data, label, name, extra = _check_item(k, item)
            except SampleError as exc:
                if on_error == "raise":
                    raise
                skipped.append((f"item {k}", str(exc)))
                continue
            f.write(data)
            spans.append((pos, pos + len(data)))
            pos += len(data)
            for field, (kind, raw) in extra.items():  # after the image, before the next one
                f.write(raw)
                ranges.setdefault(field, {})[len(names)] = (pos, pos + len(raw))
                field_kinds.setdefault(field, set()).add(kind)
                pos += len(raw)
            values.append(label)
            names.append(name)
            kinds.add(sniff(data))
    if not names:
        raise SampleError(
            "ingest_items: the iterable gave no samples" + (f" ({len(skipped)} skipped)" if skipped else "")
        )
    notes: list[str] = []
    labels, classes = resolve_labels(values, "ingest_items", class_names_option(class_names), notes=notes)
    encoding = kinds.pop() if len(kinds) == 1 and kinds <= {"jpeg", "png"} else "image"
    specs, field_ranges = [], {}
    for field in sorted(ranges):
        found = field_kinds[field]
        if "json" in found and len(found) > 1:
            raise SampleError(
                f"ingest_items: field {field!r} holds both JSON values (dict, list, number) and "
                "text or bytes; give every item's value of one field one kind"
            )
        specs.append((field, found.pop() if len(found) == 1 else "bytes"))
        table = np.full((len(names), 2), -1, dtype=np.int64)
        for j, span in ranges[field].items():
            table[j] = span
        field_ranges[field] = table
    src = SpoolSource(
        path,
        np.asarray(spans, np.int64).reshape(-1, 2),
        labels,
        names,
        class_names=classes,
        encoding=encoding,
        validate=validate,
        description=f"ingest_items ({len(names)} items)",
        field_specs=specs,
        field_ranges=field_ranges,
    )
    src.skipped.extend(skipped)
    src.notes.extend(notes)
    return src


def _check_item(k: int, item) -> tuple[bytes, object, str, dict[str, tuple[str, bytes]]]:
    """(bytes, label, name, {field: (kind, value as bytes)}) of item k; SampleError naming it if malformed."""
    try:
        data, label, name, *rest = item
        if len(rest) > 1:
            raise ValueError
    except (TypeError, ValueError):
        raise SampleError(
            f"item {k}: not a (bytes, label, name) triple or (bytes, label, name, fields) tuple: {type(item).__name__}"
        ) from None
    name = str(name) if name is not None else f"item {k}"
    if not isinstance(data, (bytes, bytearray, memoryview, np.ndarray)):
        raise SampleError(f"{name}: its data is {type(data).__name__}, not bytes")
    if isinstance(data, np.ndarray):
        data = data.data  # its memoryview (numpy's stubs give ndarray __buffer__ on Python 3.12+ only)
    data = bytes(memoryview(data).cast("B")) if not isinstance(data, bytes) else data
    if not isinstance(label, (int, np.integer, str)) or isinstance(label, bool):
        raise SampleError(f"{name}: label {label!r} is neither an int nor a class name")
    extra = _item_fields(name, rest[0]) if rest and rest[0] is not None else {}
    return data, int(label) if isinstance(label, (int, np.integer)) else label, name, extra


def _item_fields(name: str, fields) -> dict[str, tuple[str, bytes]]:
    """An item's fields dict as {field: (kind, bytes)}: str is text, bytes-like is bytes, anything
    else JSON; SampleError naming the item and the field if a value is none of those."""
    if not isinstance(fields, dict):
        raise SampleError(f"{name}: its fields are a {type(fields).__name__}, not a dict of name -> value")
    out = {}
    for field, value in fields.items():
        if isinstance(value, str):
            try:
                out[str(field)] = ("text", value.encode("utf-8"))
            except UnicodeEncodeError as exc:
                raise SampleError(
                    f"{name}: field {field!r} is not valid Unicode text ({exc}); pass it as bytes to store it as it is"
                ) from exc
        elif isinstance(value, (bytes, bytearray, memoryview)):
            out[str(field)] = ("bytes", bytes(value))
        else:
            try:
                out[str(field)] = ("json", json.dumps(value).encode("utf-8"))
            except (TypeError, ValueError) as exc:
                raise SampleError(f"{name}: field {field!r} is neither str, bytes nor JSON-able: {exc}") from exc
    return out


def ingest_items(
    items,
    output: str,
    *,
    comm=None,
    class_names=None,
    validate: str = "header",
    spool_dir: str | None = None,
    on_error: str = "raise",
    **options,
) -> IngestReport:
    """Ingests the (bytes, label, name) items of rank 0's iterable `items` into a container at
    `output`, processed by every rank of `comm` in the seeded order. Collective.

    Args:
        items: any iterable of (bytes-like, int label or class name, name); read on rank 0 only.
        output: the container path, as for `ingest`.
        comm: an mpi4py communicator (default MPI.COMM_WORLD).
        class_names: class names in label order (a file, one per line, or a sequence); None: from
            the labels (dstore.ingest.labels).
        validate: per-sample image check (as for an image folder).
        spool_dir: where the temporary spool goes (default: the output's directory).
        on_error: `raise` or `skip` (malformed items and invalid images).
        **options: passed to `dstore.ingest.ingest` (fmt, shards, seed, keep_order, encoding,
            reencode_max_side, overwrite, progress, ...).

    Returns:
        The IngestReport, on every rank.
    """
    from dstore.ingest.run import ingest

    if comm is None:
        from mpi4py import MPI

        comm = MPI.COMM_WORLD
    where = spool_dir or os.path.dirname(os.path.abspath(os.fspath(output)))

    def make_spool() -> SpoolSource:
        fd, path = tempfile.mkstemp(prefix=".dstore-spool-", suffix=".bin", dir=where)
        os.close(fd)
        try:
            return spool(items, path, class_names=class_names, on_error=on_error, validate=validate)
        except BaseException:
            os.remove(path)
            raise

    src = collective.on_root(comm, make_spool, types={}, fallback=IngestError)
    try:
        collective.seen_everywhere(comm, src.path, "the spool (spool_dir)")  # every rank reads it
        # resume=False: the spool is written anew each time, so a journal of an earlier run never matches.
        return ingest(src, output, comm=comm, on_error=on_error, **{"resume": False, **options})
    finally:
        comm.Barrier()  # every rank has read what it needed from the spool
        if comm.Get_rank() == 0:
            os.remove(src.path)
