"""The interface every ingest source implements (the registry that picks one: dstore.ingest.registry).

A source is N samples addressed by their source index 0..N-1. Its listing (labels, names, class
names, encoding) is known up front; a sample's bytes are produced only by `load(i)`, on whichever
rank processes it. Sources are plain picklable objects, so a source that is expensive to list (an
image folder) is listed once on rank 0 and broadcast.
"""

from __future__ import annotations

import abc
from typing import ClassVar

import numpy as np

from dstore.errors import ConfigError, SampleError

MAX_CLASSES = 1 << 20
"""The most classes a source may imply by its largest label when it names no classes (ImageNet-21k
has 21,841): a stray label of 2**40 would otherwise build 2**40 class names."""


def check_label_count(where: str, max_label: int) -> None:
    """SampleError naming `where` if labels up to `max_label` imply more than MAX_CLASSES classes."""
    if max_label >= MAX_CLASSES:
        raise SampleError(
            f"{where}: label {max_label} would make {max_label + 1} classes, more than the "
            f"{MAX_CLASSES} allowed without class names; the labels are damaged or not class indices"
        )


SOURCE_TYPES = ("auto", "folder", "list", "tar", "parquet", "container", "cifar", "arrays", "digits", "synthetic")
"""Values of `source_type`; `auto` decides from the spec (see `source_type_of`)."""


class Source(abc.ABC):
    """A data set to ingest.

    Attributes:
        kind: registry name (`folder`, `cifar`, ...).
        list_on_root: True if listing is costly (a directory walk): rank 0 builds the source and
            broadcasts it; otherwise every rank builds its own.
        description: provenance text stored as the container's `source` attribute.
        encoding: what `load` returns: `jpeg`, `png`, `image` (encoded files of mixed formats) or
            `raw` (arrays of `raw_dtype` and `raw_shape`).
        class_names: label i's name is class_names[i].
        raw_dtype, raw_shape: for encoding `raw`.
        skipped: (location, reason) for entries dropped while listing (only with on_error="skip").
        ignored: paths that were not taken as samples on purpose (e.g. a `.txt` in a class folder).
        notes: remarks for the ingest summary (e.g. "labels are all 0").
    """

    kind: ClassVar[str] = ""
    list_on_root: ClassVar[bool] = False

    description: str = ""
    encoding: str = "raw"
    class_names: tuple[str, ...] = ()
    raw_dtype: str | None = None
    raw_shape: tuple[int, ...] | None = None

    def __init__(self):
        self.skipped: list[tuple[str, str]] = []
        self.ignored: list[str] = []
        self.notes: list[str] = []

    @abc.abstractmethod
    def __len__(self) -> int:
        """Number of samples."""

    @abc.abstractmethod
    def label(self, i: int) -> int:
        """Sample i's label (known without loading the sample)."""

    @abc.abstractmethod
    def name(self, i: int) -> str:
        """Sample i's name as stored in the container (e.g. its path relative to the source root)."""

    def locate(self, i: int) -> str:
        """Where sample i comes from, for error messages (a full path where there is one)."""
        return self.name(i)

    @abc.abstractmethod
    def load(self, i: int) -> bytes | np.ndarray:
        """Sample i: encoded file bytes, or a raw array of `raw_dtype` and `raw_shape`.

        Raises:
            SampleError: naming `locate(i)` and the reason, if the sample is unreadable or invalid.
        """

    field_specs: tuple[tuple[str, str], ...] = ()
    """The extra fields per sample this source can store, as (name, kind) pairs (kinds:
    dstore.formats.fields.FIELD_KINDS); () for none. `dstore ingest --fields` selects among them."""

    def fields(self, i: int, names) -> dict[str, bytes]:
        """Sample i's values of the fields `names` (a field it lacks is left out: stored as missing,
        never as an empty value; docs/format.md, "Fields").
        Called on the writing rank, in write order.

        Raises:
            SampleError: naming `locate(i)` and the field, if a value cannot be read.
        """
        del i, names
        return {}

    def prefetch(self, indices) -> None:
        """A hint that `load` will be called for these source indices next (a chunk's samples): a
        source in object storage fetches them concurrently. Nothing for a local source."""
        del indices  # a local file is read when loaded: the page cache is its read-ahead

    @property
    def estimated_sample_bytes(self) -> int:
        """A rough size of one sample, used to size the chunks ranks exchange."""
        if self.raw_shape is not None and self.raw_dtype is not None:
            return int(np.prod(self.raw_shape)) * np.dtype(self.raw_dtype).itemsize
        return 110_000


def select_fields(src: Source, fields) -> tuple[tuple[str, str], ...]:
    """The (name, kind) pairs to store of `src.field_specs`: None or "all": every one; "none" or
    []: none; else names (a comma-separated string or a sequence), each `name` or `name:kind` to
    store it as another kind (`txt:bytes` keeps text that is not UTF-8 as it is). ConfigError naming
    a field the source does not have, and the ones it has."""
    from dstore.formats.fields import check_field_specs

    found = dict(src.field_specs)
    if fields is None or fields == "all":
        return check_field_specs(src.field_specs, new=True)
    if isinstance(fields, str):
        fields = [] if fields.strip() == "none" else [f for f in fields.split(",") if f.strip()]
    chosen = []
    for item in fields:
        name, _, kind = str(item).strip().partition(":")
        if name not in found:
            raise ConfigError(
                f"--fields: the source has no field {name!r} (fields found: {', '.join(found) or 'none'})"
            )
        chosen.append((name, kind or found[name]))
    return check_field_specs(chosen, new=True)


class ArraySamples(Source):
    """A raw source whose sample i is `_images[i]` with label `_labels[i]` (arrays in memory or mapped)."""

    _images: np.ndarray
    _labels: np.ndarray

    def __len__(self) -> int:
        return int(self._images.shape[0])

    def label(self, i: int) -> int:
        return int(self._labels[i])

    def load(self, i: int) -> np.ndarray:
        return self._images[i]
