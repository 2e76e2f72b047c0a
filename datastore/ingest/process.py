"""What a rank does to the samples it is given: load, validate, convert to the stored form,
checksum, and pack a chunk into one byte buffer (no MPI here)."""

from __future__ import annotations

import dataclasses

import numpy as np

from dstore.codec.decode import decode_image, sniff
from dstore.errors import ConfigError, SampleError
from dstore.formats.base import checksum
from dstore.ingest.reencode import DEFAULT_QUALITY, check_reencode, shrink
from dstore.ingest.source import Source

ON_ERROR = ("raise", "skip")
STORED_ENCODINGS = ("jpeg", "png", "image", "raw")


@dataclasses.dataclass(frozen=True)
class Target:
    """How samples are stored.

    Attributes:
        encoding: the container's encoding.
        resize: (H, W) to resize to (raw only), or None.
        raw_dtype, raw_shape: for `raw`.
        expect: `jpeg`/`png` if every stored file must be of that kind, else None.
        convert: True if samples are decoded/resized rather than stored as loaded.
        max_side, quality: encoded images whose longer side is over `max_side` are re-encoded
            as JPEG at `quality` with that longer side (dstore.ingest.reencode); None: stored as loaded.
    """

    encoding: str
    resize: tuple[int, int] | None = None
    raw_dtype: str | None = None
    raw_shape: tuple[int, ...] | None = None
    expect: str | None = None
    convert: bool = False
    max_side: int | None = None
    quality: int = DEFAULT_QUALITY


def resolve_target(
    source: Source,
    encoding: str | None,
    resize: tuple[int, int] | None,
    max_side: int | None = None,
    quality: int | None = None,
) -> Target:
    """The storage plan for `source` given the requested `encoding` and `resize`.

    Encoded sources (folder, synthetic) keep their file bytes unless `encoding="raw"`, which needs
    `resize` (decoded images differ in size) and stores RGB uint8 (H, W, 3). `resize` alone implies
    `raw`. Raw sources (CIFAR, arrays, digits) stay raw; `resize` works on their uint8 images with 1
    or 3 channels. `max_side` (encoded sources only, not with `raw`) re-encodes the larger images as
    JPEG: a JPEG source stays `jpeg`, any other becomes `image` (its small files are kept as they are).

    Raises:
        ConfigError: the combination is not possible, naming the parameters and what is allowed.
    """
    if encoding is not None and encoding not in STORED_ENCODINGS:
        raise ConfigError(f"encoding={encoding!r} is not one of {STORED_ENCODINGS} (or None: keep the source's)")
    check_reencode(max_side, quality)
    if max_side is not None:
        return _reencode_target(source, encoding, resize, max_side, quality)
    if source.encoding == "raw":
        if encoding not in (None, "raw"):
            raise ConfigError(
                f"encoding={encoding!r}: a {source.kind} source is stored raw; re-encoding "
                "arrays into image files is not supported"
            )
        if resize is None:
            return Target("raw", None, source.raw_dtype, source.raw_shape)
        shape = source.raw_shape or ()
        if source.raw_dtype != "uint8" or len(shape) != 3 or shape[2] not in (1, 3):
            raise ConfigError(
                f"resize={resize}: only uint8 (H, W, 1|3) images can be resized; this source "
                f"holds {source.raw_dtype}{shape}"
            )
        return Target("raw", resize, "uint8", (resize[0], resize[1], shape[2]), convert=True)
    if encoding == "raw" or (encoding is None and resize is not None):
        if resize is None:
            raise ConfigError("encoding='raw' for image files needs resize=HxW (decoded images differ in size)")
        return Target("raw", resize, "uint8", (resize[0], resize[1], 3), convert=True)
    if resize is not None:
        raise ConfigError(
            f"resize={resize} needs encoding='raw' (encoded files are stored as they are); got encoding={encoding!r}"
        )
    stored = encoding or source.encoding
    if stored in ("jpeg", "png"):
        return Target(stored, expect=stored)
    return Target("image")


def _reencode_target(source: Source, encoding, resize, max_side: int, quality: int | None) -> Target:
    """The Target of an ingest with `max_side` (see resolve_target)."""
    if source.encoding == "raw" or encoding == "raw" or resize is not None:
        raise ConfigError(
            f"max_side={max_side} re-encodes image files; it cannot be combined with "
            f"{'a ' + source.kind + ' source (stored raw)' if source.encoding == 'raw' else 'raw/resize'}"
        )
    stored = encoding or ("jpeg" if source.encoding == "jpeg" else "image")
    q = DEFAULT_QUALITY if quality is None else int(quality)
    return Target(stored, expect=stored if stored in ("jpeg", "png") else None, max_side=int(max_side), quality=q)


def convert(data, source: Source, target: Target, where: str) -> np.ndarray:
    """Decodes (if encoded) and resizes one sample to `target.raw_shape`, as uint8."""
    from PIL import Image

    if source.encoding == "raw":
        arr = np.asarray(data)
        im = Image.fromarray(arr[:, :, 0] if arr.shape[2] == 1 else arr)
    else:
        im = Image.fromarray(decode_image(data, channels=3, name=where))
    assert target.resize is not None  # only a resizing target converts (resolve_target)
    h, w = target.resize
    out = np.asarray(im.resize((w, h), Image.Resampling.BILINEAR))
    return out.reshape(target.raw_shape)


def check_fields(source: Source, i: int, fields) -> None:
    """Sample i's values of `fields` ((name, kind) pairs) as the writer will check them: a `text`
    value that is not UTF-8 or a `json` one that does not parse (an empty member included) makes the
    sample bad, so that it follows `on_error` like a bad image (the writer, on another rank and
    later, could only stop the whole ingest).

    Raises:
        SampleError: `where: field 'txt' is not valid text (...)`.
    """
    from dstore.formats.fields import check_value

    values = source.fields(i, [n for n, _ in fields])
    for name, kind in fields:
        if values.get(name) is not None:
            try:
                check_value(kind, name, values[name], source.locate(i))
            except ConfigError as exc:
                raise SampleError(f"{exc} (dstore ingest --fields {name}:bytes)") from exc


def process_sample(source: Source, i: int, target: Target, fields=()) -> np.ndarray:
    """Sample i in its stored form, as a flat uint8 array; its `fields` ((name, kind) pairs) checked.

    Raises:
        SampleError: `where: reason` if it cannot be loaded, validated or converted, or a field's
            value would not read back as its kind.
    """
    data = source.load(i)
    where = source.locate(i)
    if fields:
        check_fields(source, i, fields)
    if target.convert:
        data = convert(data, source, target, where)
    elif target.max_side is not None:
        data = shrink(data, target.max_side, target.quality, where=where) or data
    elif target.expect is not None and sniff(data) != target.expect:
        found = sniff(data)
        raise SampleError(
            f"{where}: is {'not a JPEG or PNG' if found == 'other' else 'a ' + found.upper()} "
            f"file but the container's encoding is {target.expect!r} (use encoding 'image' "
            "for mixed formats)"
        )
    if isinstance(data, (bytes, bytearray, memoryview)):
        return np.frombuffer(data, dtype=np.uint8)
    arr = np.ascontiguousarray(data)
    shape = target.raw_shape  # set for raw (resolve_target)
    if target.encoding == "raw" and shape is not None and arr.shape != tuple(shape):
        raise SampleError(f"{where}: shape {arr.shape} differs from the container's {tuple(shape)}")
    return arr.reshape(-1).view(np.uint8)


@dataclasses.dataclass
class Block:
    """A processed chunk: the kept samples' bytes and checksums, and per-sample sizes (-1: skipped).

    Attributes:
        parts: one flat uint8 array per kept sample, in order.
        sizes: int64 per sample of the chunk, -1 where skipped.
        skipped: (location, reason) for each skipped sample.
        checksums: uint32 CRC32 per kept sample (as `parts`), so that the ranks share that work
            and the one writer rank need not; None if not asked for.
    """

    parts: list[np.ndarray]
    sizes: np.ndarray
    skipped: list[tuple[str, str]]
    checksums: np.ndarray | None = None

    @classmethod
    def empty(cls) -> Block:
        return cls([], np.zeros(0, np.int64), [], np.zeros(0, np.uint32))

    @property
    def nbytes(self) -> int:
        return int(sum(p.size for p in self.parts))

    def packed(self, out: np.ndarray | None = None) -> np.ndarray:
        """All kept samples' bytes back to back (one buffer to send), in `out` if given (a uint8
        array of `nbytes`)."""
        if not self.parts:
            return np.zeros(0, dtype=np.uint8) if out is None else out
        return np.concatenate(self.parts, out=out)


def process_block(
    source: Source, indices, target: Target, on_error: str = "raise", *, checksums: bool = True, fields=()
) -> Block:
    """Processes the samples `indices` (source indices) in order, checking their `fields` ((name,
    kind) pairs stored); with `checksums`, also computes each kept sample's CRC32.

    Raises:
        SampleError: with on_error="raise", the first bad sample's location and reason.
    """
    if on_error not in ON_ERROR:
        raise ConfigError(f"on_error={on_error!r} is not one of {ON_ERROR}")
    parts, sizes, skipped, crcs = [], np.empty(len(indices), dtype=np.int64), [], []
    source.prefetch([int(i) for i in indices])
    for k, i in enumerate(indices):
        try:
            arr = process_sample(source, int(i), target, fields)
        except SampleError as exc:
            if on_error == "raise":
                raise
            sizes[k] = -1
            skipped.append((source.locate(int(i)), _reason(exc, source.locate(int(i)))))
            continue
        parts.append(arr)
        if checksums:
            crcs.append(checksum(arr))
        sizes[k] = arr.size
    return Block(parts, sizes, skipped, np.array(crcs, dtype=np.uint32) if checksums else None)


def _reason(exc: Exception, where: str) -> str:
    """The message without its leading `where: `."""
    msg = str(exc)
    return msg[len(where) + 2 :] if msg.startswith(where + ": ") else msg
