"""The registry that picks an ingest source for a spec: `source_type_of` (what `auto` picks) and
`open_source`. Above every source module (each imports only dstore.ingest.source, the interface)."""

from __future__ import annotations

import inspect
import os

from dstore.errors import ConfigError
from dstore.ingest.arrays import ArraySource
from dstore.ingest.cifar import CifarSource, looks_like_cifar_dir, looks_like_cifar_file
from dstore.ingest.digits import DigitsSource
from dstore.ingest.folder import FolderSource
from dstore.ingest.source import SOURCE_TYPES, Source
from dstore.ingest.synthetic import SyntheticSource


def source_type_of(spec: str) -> str:
    """The source type `auto` picks for `spec` (without reading any sample).

    `digits` and `synthetic` are names; a `.npy`/`.npz` path is `arrays`; a CIFAR batch file or a
    directory holding CIFAR batches is `cifar`; any other directory is an image `folder`.

    Raises:
        ConfigError: `spec` is neither a known name nor an existing path.
    """
    if spec in ("digits", "synthetic"):
        return spec
    lower = spec.lower()
    if lower.endswith((".npy", ".npz")):
        return "arrays"
    if os.path.isdir(spec):
        return "cifar" if looks_like_cifar_dir(spec) else "folder"
    if os.path.isfile(spec):
        if looks_like_cifar_file(spec):
            return "cifar"
        raise ConfigError(f"source {spec!r} is a file that is neither .npy/.npz nor a CIFAR python batch "
                          "(a pickle); an image folder source must be a directory")
    raise ConfigError(f"source {spec!r} does not exist and is not one of the names 'digits', 'synthetic'")


def open_source(spec: str, *, source_type: str = "auto", on_error: str = "raise", count: int | None = None,
                **options) -> Source:
    """Builds the source for `spec` on this process (no MPI).

    Args:
        spec: a path (image folder, CIFAR batch dir or file, .npy/.npz) or `digits` / `synthetic`.
        source_type: one of SOURCE_TYPES.
        on_error: `raise` or `skip`, for problems found while listing (e.g. an empty class folder).
        count: for `synthetic`, how many images to generate (default 1,000); other sources ignore
            it here (ingest truncates them).
        **options: passed to the source class (see each module); unknown options are an error.

    Raises:
        ConfigError: an unknown source type or option.
        SampleError: the source cannot be read (missing, empty, malformed), naming the path.
    """
    if source_type not in SOURCE_TYPES:
        raise ConfigError(f"source_type={source_type!r} is not one of {SOURCE_TYPES}")
    kind = source_type_of(spec) if source_type == "auto" else source_type
    cls = _CLASSES[kind]
    allowed = [p for p in inspect.signature(cls.__init__).parameters if p not in ("self", "spec", "count")]
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        raise ConfigError(f"source type {kind!r} takes no option(s) {unknown}; its options are {sorted(allowed)}")
    if kind == "folder":
        return cls(spec, on_error=on_error, **options)
    if kind in ("cifar", "arrays"):
        return cls(spec, **options)
    if kind == "digits":
        return cls(**options)
    return cls(1000 if count is None else count, **options)


_CLASSES: dict[str, type[Source]] = {
    "folder": FolderSource,
    "cifar": CifarSource,
    "arrays": ArraySource,
    "digits": DigitsSource,
    "synthetic": SyntheticSource,
}
"""The class implementing each source type but `auto`."""

