"""The data every reader reads: a generated ImageNet-like image folder ingested into HDF5 and Zarr (kept
in a data directory and reused), or a given container; and larger containers for the growth sweep."""

from __future__ import annotations

import dataclasses
import os

import numpy as np

from dstore.formats import create_writer, detect_format, open_container
from dstore.ingest import ingest
from dstore.ingest.synthetic import generate_image_folder


@dataclasses.dataclass
class DataSet:
    """The samples every reader reads, in each form that exists.

    Attributes:
        container: what the store reads (any container format).
        hdf5: the same container if it is one HDF5 file (the h5py baseline and the sequential
            read need one file), else None.
        zarr: the Zarr container, or None.
        files: each sample's source file in container order, or None if they are not on disk.
        offsets, labels: the container's index arrays.
        h5py_contiguous: the same samples in an HDF5 file with a contiguous `data` (the fair h5py
            per-sample baseline; tools/bench/layouts.py), once written.
        zarr_per_sample: the same samples in a Zarr array chunked in about one sample, once written.
    """

    container: str
    hdf5: str | None
    zarr: str | None
    files: list[str] | None
    offsets: np.ndarray
    labels: np.ndarray
    h5py_contiguous: str | None = None
    zarr_per_sample: str | None = None

    @property
    def num_samples(self) -> int:
        return len(self.labels)

    @property
    def total_bytes(self) -> int:
        return int(self.offsets[-1])


def _openable(path: str) -> bool:
    try:
        with open_container(path):
            return True
    except Exception:  # noqa: BLE001 - absent, incomplete or stale: build it again
        return False


DEFAULT_MEAN_BYTES = 110_000
DEFAULT_SIDES = (333, 500)


def data_tag(count: int, seed: int, mean_bytes: int = DEFAULT_MEAN_BYTES, sides=DEFAULT_SIDES) -> str:
    """The name part that identifies a generated data set in the data directory (the defaults keep
    the short form, so data generated before these options existed is still found)."""
    tag = f"{count}-s{seed}"
    if int(mean_bytes) != DEFAULT_MEAN_BYTES or tuple(sides) != DEFAULT_SIDES:
        tag += f"-m{int(mean_bytes)}-{int(sides[0])}x{int(sides[1])}"
    return tag


def prepare_data(
    comm,
    count: int,
    data_dir: str,
    *,
    seed: int,
    mean_bytes: int = DEFAULT_MEAN_BYTES,
    sides=DEFAULT_SIDES,
    formats=("hdf5", "zarr"),
    progress=None,
) -> str:
    """Generates an ImageNet-like image folder of `count` JPEGs (all ranks write a share) and ingests it
    into each of `formats` (all ranks), reusing what a previous run left in `data_dir`. Returns the
    folder.

    Args:
        mean_bytes: the mean JPEG file size aimed at (dstore.ingest.synthetic).
        sides: (min, max) of the image sides, each drawn uniformly in between.
    """
    tag = data_tag(count, seed, mean_bytes, sides)
    folder = os.path.join(data_dir, f"images-{tag}")
    marker = os.path.join(folder, ".complete")
    if not comm.bcast(os.path.exists(marker) if comm.Get_rank() == 0 else None, root=0):
        if progress:
            progress.note(f"generating {count:,} JPEGs in {folder}")
        generate_image_folder(
            folder,
            count,
            seed=seed,
            mean_bytes=int(mean_bytes),
            min_side=int(sides[0]),
            max_side=int(sides[1]),
            comm=comm,
        )
        if comm.Get_rank() == 0:
            with open(marker, "w") as fh:
                fh.write("ok\n")
    comm.Barrier()
    for fmt in formats:
        path = container_path(data_dir, tag, fmt)
        ok = comm.bcast(_openable(path) if comm.Get_rank() == 0 else None, root=0)
        if not ok:
            if progress:
                progress.note(f"ingesting into {path}")
            ingest(folder, path, comm=comm, fmt=fmt, seed=seed, progress=False, overwrite=True)
        comm.Barrier()
    return folder


def container_path(data_dir: str, tag: str, fmt: str) -> str:
    """Where the generated data set `tag` (data_tag) is kept in format `fmt`."""
    return os.path.join(data_dir, f"set-{tag}" + (".h5" if fmt == "hdf5" else ".zarr"))


def load_dataset(container: str, zarr_path: str | None, folder: str | None) -> DataSet:
    """Index arrays and source files of a container (files only if they exist)."""
    fmt = detect_format(container)
    if fmt == "zarr" and zarr_path is None:
        zarr_path = container
    with open_container(container) as r:
        offsets, labels = np.asarray(r.offsets), np.asarray(r.labels)
        names = [r.name(i) for i in range(r.num_samples)]
        if folder is None and os.path.isdir(r.info.source):
            folder = r.info.source  # names are relative to the source directory ingest recorded
    files = [n if os.path.isabs(n) or folder is None else os.path.join(folder, n) for n in names]
    if not all(os.path.isfile(f) for f in files[:: max(1, len(files) // 64)]):
        files = None
    return DataSet(container, container if fmt == "hdf5" else None, zarr_path, files, offsets, labels)


def repeated_container(comm, src: DataSet, count: int, path: str) -> DataSet:
    """An HDF5 container of `count` samples whose sample i is `src`'s sample i mod N (rank 0 writes it
    once; kept at `path` and reused). The growth sweep uses it: real sample bytes and sizes, without
    generating and encoding more images; the store does not look at the content."""
    if comm.Get_rank() == 0 and not _openable(path):
        with open_container(src.container) as r:
            info = r.info
            with create_writer(
                path,
                "hdf5",
                encoding=info.encoding,
                class_names=info.class_names,
                raw_dtype=info.raw_dtype,
                raw_shape=info.raw_shape,
                source=f"{src.container} repeated to {count} samples",
                overwrite=True,
            ) as w:
                n = r.num_samples
                for i in range(count):
                    data, label = r.sample(i % n)
                    w.append(data, label, r.name(i % n), source_index=i % n)
    comm.Barrier()
    return load_dataset(path, None, None)
