"""The registry that picks an ingest source for a spec: `source_type_of` (what `auto` picks) and
`open_source`. Above every source module (each imports only dstore.ingest.source, the interface)."""

from __future__ import annotations

import glob
import inspect
import os
import re
from collections.abc import Callable

from dstore.errors import ConfigError, SampleError
from dstore.ingest.arrays import ArraySource
from dstore.ingest.cifar import CifarSource, looks_like_cifar_dir, looks_like_cifar_file
from dstore.ingest.container import ContainerSource, looks_like_container
from dstore.ingest.digits import DigitsSource
from dstore.ingest.folder import FolderSource
from dstore.ingest.listed import ListedSource
from dstore.ingest.remote import Remote, is_url
from dstore.ingest.source import SOURCE_TYPES, Source
from dstore.ingest.synthetic import SyntheticSource
from dstore.ingest.table import TABLE_SUFFIXES, TableSource
from dstore.ingest.tar import TarSource


def source_type_of(spec: str) -> str:
    """The source type `auto` picks for `spec` (without reading any sample).

    `digits` and `synthetic` are names; a `.npy`/`.npz` path is `arrays`; a `.tar` file, a glob or
    `{a..b}` pattern of them, or a directory holding `*.tar` files (or `train/*.tar`...) is `tar`
    (WebDataset shards); a
    `.parquet`/`.arrow` file or a directory with a `datasets` `state.json`/`dataset_info.json`/
    `dataset_dict.json` or `*.parquet` files (at its top or one level down: `data/`, `train/`) is
    `parquet`; a CIFAR batch file or a directory holding CIFAR batches is `cifar`; a dstore
    container (HDF5, Zarr, manifest) is `container` (re-ingested); any other directory is an image
    `folder` (with a `labels` CSV: `list`, see open_source). An object-store URL (`s3://bucket/prefix`,
    dstore.ingest.remote) is `tar`, `parquet` or `folder` by the same rules, a prefix being a directory.

    Raises:
        ConfigError: `spec` is neither a known name nor an existing path.
    """
    if spec in ("digits", "synthetic"):
        return spec
    if is_url(spec):
        return _remote_type(spec)
    lower = spec.lower()
    if lower.endswith((".npy", ".npz")):
        return "arrays"
    if lower.endswith(TABLE_SUFFIXES):
        return "parquet"
    if looks_like_container(spec):
        return "container"
    if lower.endswith((".tar", ".tar.gz", ".tgz")) and (os.path.isfile(spec) or any(c in spec for c in "*?[{")):
        return "tar"
    if any(c in spec for c in "*?[{") and not os.path.exists(spec):
        return _pattern_type(spec)
    if os.path.isdir(spec):
        if looks_like_cifar_dir(spec):
            return "cifar"
        if glob.glob(os.path.join(spec, "*.tar")) or glob.glob(os.path.join(spec, "*", "*.tar")):
            return "tar"
        if (
            any(os.path.isfile(os.path.join(spec, n)) for n in ("state.json", "dataset_info.json", "dataset_dict.json"))
            or glob.glob(os.path.join(spec, "*.parquet"))
            or glob.glob(os.path.join(spec, "*", "*.parquet"))
        ):
            return "parquet"
        return "folder"
    if os.path.isfile(spec):
        if looks_like_cifar_file(spec):
            return "cifar"
        raise ConfigError(
            f"source {spec!r} is a file that is neither .npy/.npz nor a CIFAR python batch "
            "(a pickle); an image folder source must be a directory"
        )
    raise ConfigError(f"source {spec!r} does not exist and is not one of the names 'digits', 'synthetic'")


def _pattern_type(spec: str) -> str:
    """`tar` for a local glob or `{a..b}` pattern that does not end in `.tar` but matches only .tar
    shards (`shards/*`); else ConfigError saying what it matches and how to name shards."""
    braces = re.search(r"\{\d+\.\.\d+\}", spec) is not None  # names its files itself: they must be .tar
    matches = sorted(glob.glob(re.sub(r"\{\d+\.\.\d+\}", "*", spec)))
    if matches and all(m.lower().endswith(".tar") for m in matches) and not braces:
        return "tar"
    if braces:
        raise ConfigError(
            f"source {spec!r} is a {{a..b}} pattern of names that do not end in .tar; a pattern "
            f"names WebDataset shards by their whole names ({spec}.tar?)"
        )
    where = os.path.dirname(spec) or "."
    found = (
        f"matches {len(matches)} path(s), not all .tar shards (first that is not: "
        f"{next(m for m in matches if not m.lower().endswith('.tar'))})"
        if matches
        else "matches no file"
    )
    raise ConfigError(
        f"source {spec!r} is a pattern and {found}; a pattern names WebDataset shards: end it in "
        f".tar ({os.path.join(where, '*.tar')}), or give a folder or file itself"
    )


def _remote_type(url: str) -> str:
    """`source_type_of` for an object-store URL: by its suffix, else by one listing of the prefix,
    with the rules for a local directory (`tar` shards, a `parquet` data set, else an image `folder`).

    Raises:
        SampleError: naming `url` if the prefix cannot be listed or holds no object.
    """
    lower = url.lower()
    if lower.endswith(TABLE_SUFFIXES):
        return "parquet"
    if lower.endswith(".tar") or any(c in url for c in "*?[{"):
        return "tar"
    listing = Remote(url).listing(url)
    if not listing:
        raise SampleError(f"{url}: no objects below this prefix (check the bucket and the prefix)")
    shallow = [p for p in listing if p.count("/") <= 1]
    if any(p.endswith(".tar") for p in shallow):
        return "tar"
    if any(p in ("state.json", "dataset_info.json", "dataset_dict.json") or p.endswith(".parquet") for p in shallow):
        return "parquet"
    return "folder"


def open_source(
    spec: str, *, source_type: str = "auto", on_error: str = "raise", count: int | None = None, **options
) -> Source:
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
    if source_type == "auto" and options.get("labels") is not None:
        source_type = "list"  # a labels CSV names the files: a flat folder or any list of files
    kind = source_type_of(spec) if source_type == "auto" else source_type
    cls = _CLASSES[kind]
    allowed = [p for p in inspect.signature(cls).parameters if p not in ("self", "spec", "count")]
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        raise ConfigError(f"source type {kind!r} takes no option(s) {unknown}; its options are {sorted(allowed)}")
    if kind in ("folder", "tar"):
        return cls(spec, on_error=on_error, **options)
    if kind == "list" and options.get("labels") is None:
        raise ConfigError("source type 'list' needs labels=FILE.csv (--labels)")
    if kind in ("cifar", "arrays", "list", "parquet", "container"):
        return cls(spec, **options)
    if kind == "digits":
        return cls(**options)
    return cls(1000 if count is None else count, **options)


_CLASSES: dict[str, Callable[..., Source]] = {  # each type's own constructor arguments
    "folder": FolderSource,
    "list": ListedSource,
    "tar": TarSource,
    "parquet": TableSource,
    "container": ContainerSource,
    "cifar": CifarSource,
    "arrays": ArraySource,
    "digits": DigitsSource,
    "synthetic": SyntheticSource,
}
"""The class implementing each source type but `auto`."""
