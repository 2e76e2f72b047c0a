"""Where a finished output goes, and what `overwrite` may replace there.

A container is written under a temporary name beside its target and renamed into place when
complete (`temp_path`, `check_target`, `move_into_place`); `overwrite` replaces only something
recognisably one of our containers, never a user's files (an HDF5 file or Zarr group with our
attributes, a manifest, a directory holding only a manifest, its shards and what killed writers of
them left). A writer holding an output's lock removes the temporaries killed writers left beside
it (`remove_stale_temporaries`)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import stat
import uuid

import h5py

from dstore.errors import ConfigError
from dstore.formats.backends import MANIFEST_FORMAT, MANIFEST_NAME, is_hdf5
from dstore.formats.base import ARRAYS, ContainerExistsError

_OUR_ATTRS = ("version", "encoding", "num_samples", "total_bytes")
"""Attributes whose presence (with the arrays) marks an HDF5 file or Zarr group as one of ours."""

_MAX_META_BYTES = 256 << 20
"""A manifest or zarr.json larger than this is not read (it is not one of ours)."""


def _read_json(path: str):
    """The JSON value in the regular file `path`, or None if it is not one (or is absurdly large)."""
    try:
        st = os.stat(path)
        if not stat.S_ISREG(st.st_mode) or st.st_size > _MAX_META_BYTES:
            return None
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, UnicodeDecodeError, ValueError):
        return None


def _is_our_manifest(path: str) -> bool:
    value = _read_json(path)
    return isinstance(value, dict) and value.get("format") == MANIFEST_FORMAT


def _foreign_reason(path: str) -> str | None:
    """None if `path` is one of our containers (an HDF5 file or Zarr group with our attributes and
    arrays, a manifest, or a directory holding only a manifest and the shards it names), else what
    it is instead."""
    try:
        st = os.lstat(path)
    except OSError as exc:
        return f"cannot be examined: {exc.strerror or exc}"
    if stat.S_ISLNK(st.st_mode):
        return "a symbolic link"
    if stat.S_ISREG(st.st_mode):
        if path.endswith(".json"):
            return None if _is_our_manifest(path) else "a file that is not a dstore manifest"
        if not is_hdf5(path):
            return "a file that is not HDF5"
        try:
            with h5py.File(path, "r", locking=False) as f:
                ours = all(k in f.attrs for k in _OUR_ATTRS) and all(a in f for a in ("data", "offsets"))
        except (OSError, KeyError):
            return "an HDF5 file that cannot be read"
        return None if ours else "an HDF5 file without dstore's attributes"
    if not stat.S_ISDIR(st.st_mode):
        return "not a regular file or directory"
    try:
        entries = set(os.listdir(path))
    except OSError as exc:
        return f"a directory that cannot be listed: {exc.strerror or exc}"
    if MANIFEST_NAME in entries:
        manifest = os.path.join(path, MANIFEST_NAME)
        value = _read_json(manifest)
        if not isinstance(value, dict) or not _is_our_manifest(manifest):
            return f"a directory whose {MANIFEST_NAME} is not a dstore manifest"
        shards = {str(e.get("path", "")) for e in value.get("shards", []) if isinstance(e, dict)}
        extra = sorted(e for e in entries - {MANIFEST_NAME} - shards if not is_leftover(e))
        return f"a directory that holds more than a manifest and its shards: {extra[:5]}" if extra else None
    if "zarr.json" in entries:
        meta = _read_json(os.path.join(path, "zarr.json"))
        attrs = meta.get("attributes", {}) if isinstance(meta, dict) else {}
        if not isinstance(attrs, dict) or not all(k in attrs for k in _OUR_ATTRS):
            return "a Zarr store without dstore's attributes"
        extra = sorted(entries - {"zarr.json", "class_names", "fields", *ARRAYS})  # fields: docs/format.md
        return f"a Zarr group that holds more than a dstore container: {extra[:5]}" if extra else None
    return "a directory that is not a container"


def check_replaceable(path: str) -> None:
    """Raises ContainerExistsError, naming `path` and what it is, unless `path` is recognisably one
    of our containers: `overwrite` replaces only those, never a user's files or directories."""
    why = _foreign_reason(os.fspath(path))
    if why is not None:
        raise ContainerExistsError(
            f"{path} exists and is not a dstore container ({why}); --overwrite replaces "
            "only a container; remove it yourself or choose another output"
        )


_LEFTOVER = re.compile(r"\.(?P<name>.+)\.(tmp-[0-9]+-[0-9a-f]{8}(\.old)?|lock)")
"""Names our writers leave beside an output `name` when they are killed: the temporary
(temp_path, `.old` while replacing a directory) and the lock file (dstore.formats.lock)."""


def is_leftover(entry: str) -> bool:
    """Whether directory entry `entry` is a temporary or lock file one of our writers left."""
    return _LEFTOVER.fullmatch(entry) is not None


def remove_stale_temporaries(path: str) -> list[str]:
    """Removes the temporaries of output `path` that killed writers left beside it (SIGKILL, the OOM
    killer: no cleanup ran). Call only while holding the output's lock: then no live writer of
    `path` exists, so every such temporary is stale. Returns what was removed."""
    head, tail = os.path.split(os.path.abspath(path))
    removed = []
    try:
        entries = os.listdir(head)
    except OSError:
        return removed
    for entry in entries:
        m = _LEFTOVER.fullmatch(entry)
        if m and m.group("name") == tail and not entry.endswith(".lock"):
            remove_path(os.path.join(head, entry))
            removed.append(entry)
    return removed


def temp_path(path: str) -> str:
    """A unique temporary name in the same directory as `path` (so the final rename is atomic)."""
    head, tail = os.path.split(os.path.abspath(path))
    return os.path.join(head, f".{tail}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")


def check_target(path: str, overwrite: bool) -> str:
    """The absolute target path; raises ContainerExistsError if it exists and not `overwrite`, or if
    it exists and is not one of our containers (see dstore.formats.replace)."""
    path = os.fspath(path)
    if os.path.lexists(path):
        if not overwrite:
            raise ContainerExistsError(f"{path} already exists (pass overwrite=True / --overwrite to replace it)")
        check_replaceable(path)
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise ConfigError(f"cannot create {path}: directory {parent} does not exist")
    return os.path.abspath(path)


def remove_path(path: str) -> None:
    """Removes a file or directory tree if it exists."""
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    elif os.path.lexists(path):
        os.remove(path)


def move_into_place(tmp: str, final: str, overwrite: bool) -> None:
    """Renames the finished temporary to its final name (replacing an old container if allowed,
    and only if it is one of ours: checked again here, just before it goes)."""
    if os.path.lexists(final):
        if not overwrite:
            raise ContainerExistsError(
                f"{final} appeared while it was being written (by another job?); "
                "it is left as it is and this one is not kept"
            )
        check_replaceable(final)
        if os.path.isdir(final) or os.path.isdir(tmp):  # a rename cannot replace a directory (or by one)
            trash = temp_path(final) + ".old"
            os.rename(final, trash)
            os.rename(tmp, final)
            remove_path(trash)
            return
    os.replace(tmp, final)


@contextlib.contextmanager
def private_like(source):
    """For the `with` block, files and directories this process creates are no more readable by
    the group or others than `source` is (its group/other read bits; nothing changes for a source
    that is not a path): a private (0600/0700) source gave a world-readable container. Otherwise
    the umask decides, as before. The umask is the process's, so the block should be the whole
    write (dstore.ingest.ingest)."""
    try:
        mode = os.stat(os.fspath(source)).st_mode
    except (OSError, TypeError, ValueError):
        mode = 0o777
    deny = (0 if mode & stat.S_IRGRP else 0o070) | (0 if mode & stat.S_IROTH else 0o007)
    old = os.umask(0)
    os.umask(old | deny)
    try:
        yield
    finally:
        os.umask(old)
