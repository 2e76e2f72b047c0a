"""Copies of a container laid out as a user who reads one sample at a time would lay them out, for the
h5py and zarr baselines: an HDF5 file with a contiguous `data` dataset, and a Zarr array in chunks of
about one sample.

Why: the container's `data` is chunked in 8 MiB chunks (good for the store's large block reads). With
h5py's default 1 MiB chunk cache, and in zarr (which reads whole chunks), every per-sample slice of it
reads and copies a whole 8 MiB chunk, so a per-sample baseline over the container measures that layout,
not h5py or zarr. The bench measures both: the fair copy for the goal, the container as written beside it.

Each copy is written once by rank 0 into the data directory (`<container stem>.contiguous.h5`,
`<container stem>.per-sample.zarr`), recorded with a key of the container it mirrors, and reused while
that key matches.
"""

from __future__ import annotations

import os
import shutil
import zlib

import numpy as np

from dstore.errors import ConfigError
from dstore.formats import open_container

CONTIGUOUS_SUFFIX = ".contiguous.h5"
PER_SAMPLE_ZARR_SUFFIX = ".per-sample.zarr"
ZARR_CHUNK_BYTES = 128 * 1024
"""Chunk of the per-sample Zarr copy: about one sample (the generated set's mean is 110 KB), so a sample
read touches one or two chunk files. 1 MiB chunks read at the same rate here (zarr's per-call cost
dominates, about 0.8 ms); sharding (8 MiB shards of 128 KiB chunks) was slower (about 1.1 ms)."""
COPY_PIECE_BYTES = 32 << 20
"""Bytes per read from the container while copying (a multiple of ZARR_CHUNK_BYTES)."""


def copy_path(data_dir: str, container: str, suffix: str) -> str:
    """Where the copy of `container` with this suffix lives in `data_dir`."""
    stem = os.path.splitext(os.path.basename(os.path.normpath(container)))[0]
    return os.path.join(data_dir, stem + suffix)


def source_key(container: str, offsets: np.ndarray) -> str:
    """What a copy records of its container: the absolute path and a CRC32 of the offsets."""
    crc = zlib.crc32(np.ascontiguousarray(offsets, dtype=np.int64).tobytes())
    return f"{os.path.abspath(container)}#{int(offsets[-1])}#{crc:08x}"


def _pieces(total: int):
    for lo in range(0, total, COPY_PIECE_BYTES):
        yield lo, min(total, lo + COPY_PIECE_BYTES)


def _h5_current(path: str, key: str) -> bool:
    import h5py

    try:
        with h5py.File(path, "r", locking=False) as f:
            data = f["data"]
            return f.attrs.get("source_key") == key and isinstance(data, h5py.Dataset) and data.chunks is None
    except (OSError, KeyError):
        return False


def _write_h5(path: str, container: str, offsets, labels, key: str) -> None:
    import h5py

    tmp = path + ".tmp"
    with h5py.File(tmp, "w", locking=False) as f, open_container(container) as r:
        data = f.create_dataset("data", shape=(int(offsets[-1]),), dtype=np.uint8)  # no chunks=: contiguous
        f.create_dataset("offsets", data=np.asarray(offsets, dtype=np.int64))
        f.create_dataset("labels", data=np.asarray(labels, dtype=np.int64))
        for lo, hi in _pieces(int(offsets[-1])):
            data.write_direct(r.read_bytes(lo, hi), dest_sel=np.s_[lo:hi])
        f.attrs["source_key"] = key
    os.replace(tmp, path)


def _zarr_current(path: str, key: str) -> bool:
    import zarr

    try:
        g = zarr.open_group(path, mode="r")
        data = g["data"]
        return (
            g.attrs.get("source_key") == key
            and isinstance(data, zarr.Array)
            and tuple(data.chunks) == (ZARR_CHUNK_BYTES,)
        )
    except Exception:  # noqa: BLE001 - zarr raises its own types for a missing or partial group
        return False


def _write_zarr(path: str, container: str, offsets, labels, key: str) -> None:
    import zarr

    tmp = path + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    g = zarr.open_group(tmp, mode="w")
    # write_empty_chunks: zarr's per-chunk fill-value comparison would otherwise dominate the write.
    data = g.create_array(
        "data",
        shape=(int(offsets[-1]),),
        dtype="uint8",
        chunks=(ZARR_CHUNK_BYTES,),
        compressors=None,
        fill_value=0,
        config={"write_empty_chunks": True},
    )
    g.create_array("offsets", data=np.asarray(offsets, dtype=np.int64))
    g.create_array("labels", data=np.asarray(labels, dtype=np.int64))
    with open_container(container) as r:
        for lo, hi in _pieces(int(offsets[-1])):
            data[lo:hi] = r.read_bytes(lo, hi)
    g.attrs["source_key"] = key
    shutil.rmtree(path, ignore_errors=True)
    os.replace(tmp, path)


def _ensure(comm, path: str, container: str, offsets, labels, current, write) -> str:
    """Rank 0 writes the copy unless a current one exists; every rank gets its path or rank 0's error."""
    err = None
    if comm.Get_rank() == 0:
        key = source_key(container, offsets)
        try:
            if not current(path, key):
                os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
                write(path, container, offsets, labels, key)
        except Exception as exc:  # noqa: BLE001 - re-raised on every rank below
            err = f"{type(exc).__name__}: {exc}"
    err = comm.bcast(err, root=0)
    if err is not None:
        raise ConfigError(f"could not write {path} from {container}: {err}")
    return path


def contiguous_hdf5(comm, container: str, offsets, labels, data_dir: str) -> str:
    """The path of an HDF5 file with `data` (contiguous), `offsets` and `labels` holding `container`'s
    samples; written once into `data_dir` and reused."""
    path = copy_path(data_dir, container, CONTIGUOUS_SUFFIX)
    return _ensure(comm, path, container, offsets, labels, _h5_current, _write_h5)


def per_sample_zarr(comm, container: str, offsets, labels, data_dir: str) -> str:
    """The path of a Zarr v3 group whose `data` is chunked in ZARR_CHUNK_BYTES chunks, with `offsets`
    and `labels`, holding `container`'s samples; written once into `data_dir` and reused."""
    path = copy_path(data_dir, container, PER_SAMPLE_ZARR_SUFFIX)
    return _ensure(comm, path, container, offsets, labels, _zarr_current, _write_zarr)


def chunk_bytes(path: str, backend: str) -> int | None:
    """The chunk length of `data` in an HDF5 file or Zarr group (None: contiguous)."""
    if backend == "h5py":
        import h5py

        with h5py.File(path, "r", locking=False) as f:
            data = f["data"]
            if not isinstance(data, h5py.Dataset):
                raise ConfigError(f"{path}: its 'data' is a {type(data).__name__}, not an array")
            c = data.chunks
    else:
        import zarr

        data = zarr.open_group(path, mode="r")["data"]
        if not isinstance(data, zarr.Array):
            raise ConfigError(f"{path}: its 'data' is a {type(data).__name__}, not an array")
        c = data.chunks
    return None if c is None else int(c[0])
