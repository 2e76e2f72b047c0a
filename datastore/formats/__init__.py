"""Container backends behind one interface: `open_container` detects the format, `create_writer`
picks a backend by name, `write_manifest` joins finished shards into one sharded container."""

from __future__ import annotations

from dstore.formats.backends import (
    FORMATS,
    MANIFEST_NAME,
    backend,
    checked,
    detect_format,
)
from dstore.formats.base import (
    ENCODINGS,
    FORMAT_VERSION,
    ContainerExistsError,
    ContainerInfo,
    ContainerNotFoundError,
    ContainerReader,
    ContainerWriter,
    checksum,
)
from dstore.formats.sharded import ShardedReader, write_manifest

__all__ = [
    "ENCODINGS",
    "FORMATS",
    "FORMAT_VERSION",
    "MANIFEST_NAME",
    "ContainerExistsError",
    "ContainerInfo",
    "ContainerNotFoundError",
    "ContainerReader",
    "ContainerWriter",
    "checksum",
    "create_writer",
    "detect_format",
    "open_container",
    "write_manifest",
]


def open_container(path, *, check_labels: bool = True, index: bool = True) -> ContainerReader:
    """Opens the container at `path`, whatever its format (see `detect_format`).

    Args:
        check_labels: refuse a container with a label outside its class names (what training
            would index with); `dstore info`/`verify` pass False, to report such samples instead.
        index: read and check the index arrays now. False: only the attributes (a reader of byte
            ranges whose index another reader checked, e.g. a node peer's: dstore.store.index); the
            arrays are read on first use, and labels are not checked. A sharded container reads
            its shards' indexes at open either way.

    Raises:
        ContainerNotFoundError: nothing is at `path`.
        IncompleteContainerError: it has no completion marker.
        FormatError: it is malformed; the message names the path and what is wrong.
    """
    fmt = detect_format(path)
    reader = ShardedReader(path) if fmt == "sharded" else backend(fmt, 0)(path, index=index)
    return checked(reader, check_labels and index)


def create_writer(
    path,
    fmt: str = "hdf5",
    *,
    encoding: str,
    class_names,
    raw_dtype=None,
    raw_shape=None,
    source: str = "",
    extra_attrs: dict | None = None,
    overwrite: bool = False,
    **options,
) -> ContainerWriter:
    """A writer for a new container at `path` in backend `fmt` (`hdf5` or `zarr`).

    Args:
        path: the final path (`x.h5` for HDF5, a directory `x.zarr` for Zarr); the writer works
            under a temporary name beside it and renames on commit.
        fmt: a key of FORMATS.
        encoding: one of ENCODINGS.
        class_names: label i's name is class_names[i].
        raw_dtype, raw_shape: required for encoding `raw`.
        source: provenance text (e.g. the source directory).
        extra_attrs: more JSON-compatible attributes; may not reuse reserved names.
        overwrite: replace an existing container at `path` on commit.
        **options: backend options (`chunk_bytes`).

    Raises:
        ConfigError: a bad argument (named in the message).
        ContainerExistsError: `path` exists and not `overwrite`.
    """
    return backend(fmt, 1)(
        path,
        encoding=encoding,
        class_names=class_names,
        raw_dtype=raw_dtype,
        raw_shape=raw_shape,
        source=source,
        extra_attrs=extra_attrs,
        overwrite=overwrite,
        **options,
    )
