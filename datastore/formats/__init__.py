"""Container backends behind one interface: `open_container` detects the format, `create_writer`
picks a backend by name, `write_manifest` joins finished shards into one sharded container."""

from __future__ import annotations

import importlib
import os

import numpy as np

from dstore.errors import ConfigError, FormatError
from dstore.formats.base import (
    ENCODINGS,
    FORMAT_VERSION,
    ContainerInfo,
    ContainerReader,
    ContainerWriter,
    checksum,
)
from dstore.formats.layout import ContainerExistsError, ContainerNotFoundError

FORMATS = {
    "hdf5": ("dstore.formats.hdf5", "HDF5Reader", "HDF5Writer"),
    "zarr": ("dstore.formats.zarr_backend", "ZarrReader", "ZarrWriter"),
}
"""Writable backends: name -> (module, reader class, writer class). Modules load on first use, so
importing this package does not import zarr."""

MANIFEST_NAME = "manifest.json"
"""The file name a sharded container's manifest has when its path is a directory."""

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


def _backend(fmt: str, which: int):
    if fmt not in FORMATS:
        raise ConfigError(f"fmt={fmt!r} is not one of {sorted(FORMATS)}")
    module, *classes = FORMATS[fmt]
    return getattr(importlib.import_module(module), classes[which])


def detect_format(path) -> str:
    """`hdf5`, `zarr` or `sharded` for what is at `path`.

    Raises:
        ContainerNotFoundError: nothing is at `path`.
        FormatError: something is there but it is none of the three.
    """
    path = os.fspath(path)
    if not os.path.exists(path):
        raise ContainerNotFoundError(f"{path}: no such container (file or directory)")
    if not os.path.isdir(path) and not os.path.isfile(path):  # opening a FIFO would wait for a writer
        raise FormatError(f"{path}: not a regular file or directory (a FIFO, socket or device?); "
                          "a container is an HDF5 file, a Zarr directory or a JSON manifest")
    if os.path.isdir(path):
        if os.path.isfile(os.path.join(path, MANIFEST_NAME)):
            return "sharded"
        if os.path.isfile(os.path.join(path, "zarr.json")):
            return "zarr"
        raise FormatError(f"{path}: a directory with neither {MANIFEST_NAME} (sharded) nor zarr.json (Zarr v3)")
    if path.endswith(".json"):
        return "sharded"
    from dstore.formats.hdf5 import SUFFIXES, is_hdf5

    if is_hdf5(path) or path.endswith(SUFFIXES):
        return "hdf5"
    raise FormatError(f"{path}: not an HDF5 file (no HDF5 signature), a Zarr v3 directory or a JSON manifest")


def open_container(path, *, check_labels: bool = True) -> ContainerReader:
    """Opens the container at `path`, whatever its format (see `detect_format`).

    Args:
        check_labels: refuse a container with a label outside its class names (what training
            would index with); `dstore info`/`verify` pass False, to report such samples instead.

    Raises:
        ContainerNotFoundError: nothing is at `path`.
        IncompleteContainerError: it has no completion marker.
        FormatError: it is malformed; the message names the path and what is wrong.
    """
    fmt = detect_format(path)
    if fmt == "sharded":
        from dstore.formats.sharded import ShardedReader

        reader = ShardedReader(path)
    else:
        reader = _backend(fmt, 0)(path)
    if check_labels:
        try:
            _check_labels(reader)
        except BaseException:
            reader.close()
            raise
    return reader


def _check_labels(reader: ContainerReader) -> None:
    """FormatError naming the first sample whose label is not a class index (unlabelled data, with
    no class names, is not checked)."""
    k = reader.info.num_classes
    labels = reader.labels
    if not k or labels.size == 0:
        return
    bad = (labels < 0) | (labels >= k)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise FormatError(f"{reader.path}: sample {i} ({reader.name(i)}) has label {int(labels[i])}, outside the "
                          f"{k} class names [0, {k}); {int(bad.sum())} sample(s) so; `dstore verify {reader.path}` "
                          "lists them")


def create_writer(path, fmt: str = "hdf5", *, encoding: str, class_names, raw_dtype=None, raw_shape=None,
                  source: str = "", extra_attrs: dict | None = None, overwrite: bool = False,
                  **options) -> ContainerWriter:
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
    return _backend(fmt, 1)(path, encoding=encoding, class_names=class_names, raw_dtype=raw_dtype,
                            raw_shape=raw_shape, source=source, extra_attrs=extra_attrs,
                            overwrite=overwrite, **options)


def write_manifest(path, shard_paths, *, extra_attrs: dict | None = None, overwrite: bool = False) -> str:
    """Writes a sharded container's manifest over finished shards; see dstore.formats.sharded."""
    from dstore.formats.sharded import write_manifest as _write

    return _write(path, shard_paths, extra_attrs=extra_attrs, overwrite=overwrite)
