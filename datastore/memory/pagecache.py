"""Dropping a container's clean pages from the operating system's page cache, so that the next
reads of it come from storage (a cold read) rather than from memory. No MPI here.

What it is for: on one machine a container that fits in memory stays in the page cache after its
first read, so every later "read from the file" is a copy from the kernel. Evicting it before each
epoch makes per-sample reads behave as they do for a data set larger than a node's memory, or one
on a parallel file system. Only clean pages are dropped (hence one `os.sync()` first); the kernel
may keep pages that another process has mapped or locked, so eviction is best effort.
"""

from __future__ import annotations

import os
import warnings

from dstore.formats import MANIFEST_NAME
from dstore.formats.base import ContainerNotFoundError
from dstore.formats.sharded import read_manifest


def container_files(path) -> list[str]:
    """Every file that holds part of the container at `path`: the file itself (HDF5, a manifest
    ending in .json), every file under a directory (Zarr, a sharded container's directory), and
    for a sharded container also each shard's files wherever the manifest puts them.

    Raises:
        ContainerNotFoundError: nothing is at `path`.
    """
    path = os.fspath(path)
    if not os.path.exists(path):
        raise ContainerNotFoundError(f"{path}: no such container (file or directory) to evict from the page cache")
    files: list[str] = []
    if os.path.isdir(path):
        for root, dirs, names in os.walk(path):
            dirs.sort()
            files.extend(os.path.join(root, n) for n in sorted(names))
    else:
        files.append(path)
    manifest = path if path.endswith(".json") else os.path.join(path, MANIFEST_NAME)
    if os.path.isfile(manifest):
        for entry in read_manifest(path)["shards"]:
            files.extend(f for f in container_files(entry["path"]) if f not in files)
    return files


def evict(path) -> int:
    """Drops the clean cached pages of the container at `path` (file, Zarr directory or sharded
    container): one `os.sync()`, then `posix_fadvise(POSIX_FADV_DONTNEED)` over each whole file.

    Returns:
        The bytes covered (the files' sizes summed); 0 with a warning where the platform has no
        posix_fadvise (nothing is evicted there).

    Raises:
        ContainerNotFoundError: nothing is at `path`.
        OSError: a file cannot be opened (same type as the underlying error; the message names it).
    """
    return evict_files(container_files(path), label=os.fspath(path))


def evict_files(files, *, label: str | None = None, skip_unopenable: bool = False) -> int:
    """Drops the clean cached pages of each file in `files` (one `os.sync()` first: dirty pages
    cannot be dropped, and one sync costs far less than a per-file fdatasync).

    Args:
        files: file paths.
        label: what to name in the no-posix_fadvise warning (default: the first file).
        skip_unopenable: leave out files that cannot be opened instead of raising.

    Returns:
        The bytes covered (the sizes of the files advised); 0 with a warning where the platform
        has no posix_fadvise.
    """
    files = list(files)
    fadvise = getattr(os, "posix_fadvise", None)
    if fadvise is None:
        what = label or (files[0] if files else "the files")
        warnings.warn(
            f"this platform has no posix_fadvise: {what} stays in the page cache", RuntimeWarning, stacklevel=3
        )
        return 0
    os.sync()
    covered = 0
    for name in files:
        try:
            fd = os.open(name, os.O_RDONLY)
        except OSError as exc:
            if skip_unopenable:
                continue
            raise type(exc)(exc.errno, f"cannot open {name} to drop its cached pages: {exc.strerror}", name) from exc
        try:
            covered += os.fstat(fd).st_size
            fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    return covered
