"""What is at a path and which backend reads it: the format names, `detect_format`, and opening one
HDF5 or Zarr container (`open_backend`). Below sharded.py and replace.py, which both need to tell
the formats apart; `dstore.formats.open_container` (the public entry) adds the sharded manifest."""

from __future__ import annotations

import importlib
import os

import numpy as np

from dstore.errors import ConfigError, FormatError, IncompleteContainerError
from dstore.formats.base import ContainerNotFoundError, ContainerReader
from dstore.formats.objects import ObjectFile, is_url, join, stat

FORMATS = {
    "hdf5": ("dstore.formats.hdf5", "HDF5Reader", "HDF5Writer"),
    "zarr": ("dstore.formats.zarr_backend", "ZarrReader", "ZarrWriter"),
}
"""Writable backends: name -> (module, reader class, writer class). Modules load on first use, so
importing dstore.formats does not import zarr."""

MANIFEST_NAME = "manifest.json"
"""The file name a sharded container's manifest has when its path is a directory."""

MANIFEST_FORMAT = "dstore-sharded"
"""Value of a sharded container's manifest's `format` key."""

HDF5_MAGIC = b"\x89HDF\r\n\x1a\n"
"""The signature an HDF5 file starts with."""

SUFFIXES = (".h5", ".hdf5")
"""File name endings taken as HDF5."""


def is_hdf5(path: str) -> bool:
    """True if `path` is a file that starts with the HDF5 signature."""
    try:
        with open(path, "rb") as f:
            return f.read(len(HDF5_MAGIC)) == HDF5_MAGIC
    except OSError:
        return False


def backend(fmt: str, which: int):
    """The reader (`which` 0) or writer (1) class of backend `fmt` (a key of FORMATS)."""
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
    if is_url(path):
        return _detect_object(path)
    if not os.path.exists(path):
        raise ContainerNotFoundError(f"{path}: no such container" + (_interrupted(path) or " (file or directory)"))
    if not os.path.isdir(path) and not os.path.isfile(path):  # opening a FIFO would wait for a writer
        raise FormatError(
            f"{path}: not a regular file or directory (a FIFO, socket or device?); "
            "a container is an HDF5 file, a Zarr directory or a JSON manifest"
        )
    if os.path.isdir(path):
        if os.path.isfile(os.path.join(path, MANIFEST_NAME)):
            return "sharded"
        if os.path.isfile(os.path.join(path, "zarr.json")):
            return "zarr"
        if _interrupted(path):
            raise IncompleteContainerError(f"{path}: not a container yet{_interrupted(path)}")
        raise FormatError(f"{path}: a directory with neither {MANIFEST_NAME} (sharded) nor zarr.json (Zarr v3)")
    if path.endswith(".json"):
        return "sharded"
    if path.endswith(SUFFIXES) or is_hdf5(path):  # the name first: the signature costs a storage request
        return "hdf5"
    raise FormatError(f"{path}: not an HDF5 file (no HDF5 signature), a Zarr v3 directory or a JSON manifest")


def _interrupted(path: str) -> str:
    """`: its ingest was interrupted ...` where the journal of an unfinished ingest of `path` lies
    beside it (dstore.ingest.journal.journal_dir), else ""."""
    head, tail = os.path.split(os.path.abspath(path).rstrip("/"))
    journal = os.path.join(head, f".{tail}.ingest")
    if not os.path.isdir(journal):
        return ""
    return (
        f": its ingest was interrupted (what it wrote is journaled in {journal}); run the same `dstore ingest` "
        "again to finish it"
    )


def _detect_object(url: str) -> str:
    """detect_format of an object-store URL: an object is HDF5 (`.h5`/`.hdf5` or its signature) or
    a manifest (`.json`); a prefix holding `manifest.json` is sharded, one holding `zarr.json` Zarr.
    One or two HEAD requests."""
    url = url.rstrip("/")
    if stat(url) is not None:
        if url.endswith(".json"):
            return "sharded"
        if url.endswith(SUFFIXES):
            return "hdf5"
        file = ObjectFile(url)
        try:
            head = bytearray(len(HDF5_MAGIC))
            if file.pread_into(memoryview(head), 0) == len(HDF5_MAGIC) and bytes(head) == HDF5_MAGIC:
                return "hdf5"
        finally:
            file.close()
        raise FormatError(f"{url}: not an HDF5 object (no HDF5 signature) or a JSON manifest")
    if stat(join(url, MANIFEST_NAME)) is not None:
        return "sharded"
    if stat(join(url, "zarr.json")) is not None:
        return "zarr"
    raise ContainerNotFoundError(
        f"{url}: no such container (no object at this URL, and no {MANIFEST_NAME} or "
        "zarr.json below it; check the bucket and the key)"
    )


def open_backend(path, fmt: str, *, check_labels: bool = True) -> ContainerReader:
    """Opens the HDF5 or Zarr container at `path` (`fmt` from detect_format), checking its labels
    (see `checked`)."""
    return checked(backend(fmt, 0)(path), check_labels)


def checked(reader: ContainerReader, check_labels: bool) -> ContainerReader:
    """`reader`, after refusing (and closing) it if `check_labels` and a label is not a class index:
    FormatError naming the first such sample (unlabelled data, with no class names, is not checked)."""
    if not check_labels:
        return reader
    try:
        _check_labels(reader)
    except BaseException:
        reader.close()
        raise
    return reader


def _check_labels(reader: ContainerReader) -> None:
    k = reader.info.num_classes
    labels = reader.labels
    if not k or labels.size == 0:
        return
    bad = (labels < 0) | (labels >= k)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise FormatError(
            f"{reader.path}: sample {i} ({reader.name(i)}) has label {int(labels[i])}, outside the "
            f"{k} class names [0, {k}); {int(bad.sum())} sample(s) so; `dstore verify {reader.path}` "
            "lists them"
        )
