"""Test helpers for the container formats: build real containers of every backend, and damage them
the way real files get damaged (a flipped byte, a lost marker), through h5py/zarr themselves."""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from dstore.formats import ShardedReader, create_writer, detect_format, open_container, write_manifest

if TYPE_CHECKING:
    import h5py
    import zarr

BACKENDS = ("hdf5", "zarr", "sharded-hdf5", "sharded-zarr")
SUFFIX = {"hdf5": ".h5", "zarr": ".zarr"}


def random_samples(n: int, *, seed: int = 0, max_bytes: int = 3000, nclasses: int = 3):
    """n samples (bytes, label, name, source_index) of random sizes, including empty ones."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        size = 0 if i % 7 == 3 else int(rng.integers(1, max_bytes))
        out.append(
            (
                rng.integers(0, 256, size, dtype=np.uint8).tobytes(),
                i % nclasses,
                f"class{i % nclasses}/img_{i}.jpg",
                int(rng.integers(0, 10 * n + 1)),
            )
        )
    return out


def raw_container(path, *, n: int = 40, shape=(4, 4, 1), classes: int = 2, seed: int = 0) -> str:
    """A small HDF5 container of `n` random raw uint8 images of `shape`, labels i % classes."""
    rng = np.random.default_rng(seed)
    names = [chr(ord("a") + k) for k in range(classes)]
    with create_writer(
        str(path), "hdf5", encoding="raw", class_names=names, raw_dtype="uint8", raw_shape=tuple(shape)
    ) as w:
        for i in range(n):
            w.append(rng.integers(0, 256, tuple(shape), dtype=np.uint8), i % classes, f"s{i}", i)
    return str(path)


def write_samples(path, fmt: str, samples, *, class_names=("a", "b", "c"), encoding="jpeg", **kwargs) -> str:
    """One container of backend `fmt` (`hdf5`/`zarr`) holding `samples`; returns its path."""
    with create_writer(path, fmt, encoding=encoding, class_names=class_names, **kwargs) as w:
        for data, label, name, src in samples:
            w.append(data, label, name, src)
    return os.fspath(path)


def build(tmp: Path, backend: str, samples, *, shards: int = 3, **kwargs) -> str:
    """A container of `backend` (one of BACKENDS) in directory `tmp` holding `samples`, in order.

    Sharded ones split the samples into `shards` pieces (some possibly empty), like an ingest where
    rank r writes shard r and rank 0 writes the manifest.
    """
    tmp = Path(tmp)
    if not backend.startswith("sharded-"):
        return write_samples(tmp / f"data{SUFFIX[backend]}", backend, samples, **kwargs)
    fmt = backend.split("-", 1)[1]
    root = tmp / "sharded"
    root.mkdir()
    cuts = np.linspace(0, len(samples), shards + 1).astype(int)
    paths = [
        write_samples(root / f"shard-{k:05d}{SUFFIX[fmt]}", fmt, samples[cuts[k] : cuts[k + 1]], **kwargs)
        for k in range(shards)
    ]
    write_manifest(root, paths)
    return os.fspath(root)


def data_file(path: str, index: int) -> tuple[str, int]:
    """(shard container path, sample index inside it) holding sample `index` of container `path`."""
    with open_container(path) as r:
        if isinstance(r, ShardedReader):
            k, j = r.shard_of(index)
            return r.shards[k].path, j
        return path, index


def flip_byte(path: str, index: int, within: int = 0) -> None:
    """Inverts byte `within` of sample `index` in the stored `data`, through h5py or zarr."""
    path, index = data_file(path, index)
    with open_container(path) as r:
        pos = int(r.offsets[index]) + within
        if pos >= int(r.offsets[index + 1]):
            raise ValueError(f"sample {index} has no byte {within}")
    if detect_format(path) == "hdf5":
        import h5py

        with h5py.File(path, "r+", locking=False) as f:
            data = f["data"]
            assert isinstance(data, h5py.Dataset)
            data[pos] = data[pos] ^ 0xFF
    else:
        import zarr

        arr = zarr.open_array(os.path.join(path, "data"), mode="r+")
        arr[pos] = np.asarray(arr[pos]) ^ 0xFF


def set_attr(path: str, key: str, value=None, *, delete: bool = False) -> None:
    """Sets or deletes an attribute of an HDF5 or Zarr container (the sharded manifest: a key)."""
    fmt = detect_format(path)
    if fmt == "hdf5":
        import h5py

        with h5py.File(path, "r+", locking=False) as f:
            if delete:
                del f.attrs[key]
            else:
                f.attrs[key] = value
    elif fmt == "zarr":
        import zarr

        g = zarr.open_group(path, mode="r+")
        attrs = dict(g.attrs)
        if delete:
            attrs.pop(key)
        else:
            attrs[key] = value
        g.attrs.put(attrs)
    else:
        import json

        from dstore.formats.sharded import manifest_file

        mfile = manifest_file(path)
        with open(mfile) as f:
            manifest = json.load(f)
        if delete:
            manifest.pop(key)
        else:
            manifest[key] = value
        with open(mfile, "w") as f:
            json.dump(manifest, f)


def replace_array(path: str, key: str, values: np.ndarray | None) -> None:
    """Replaces (or with None deletes) an array of an HDF5 or Zarr container."""
    if detect_format(path) == "hdf5":
        import h5py

        with h5py.File(path, "r+", locking=False) as f:
            del f[key]
            if values is not None:
                f.create_dataset(key, data=values)
    else:
        import shutil

        import zarr

        shutil.rmtree(os.path.join(path, key))
        if values is not None:
            g = zarr.open_group(path, mode="r+")
            g.create_array(key, data=values)


def plain_array(group: h5py.Group | zarr.Group, name: str) -> h5py.Dataset | zarr.Array:
    """Array `name` of a container opened with h5py or zarr themselves (an h5py File or Group, a zarr
    Group), as the array it must be: AssertionError naming what is there instead."""
    import h5py
    import zarr

    found = group[name]
    assert isinstance(found, (h5py.Dataset, zarr.Array)), f"{name} is a {type(found).__name__}, not an array"
    return found


def plain_values(group: h5py.Group | zarr.Group, name: str, sel: int | slice | tuple = slice(None)) -> np.ndarray:
    """`plain_array(group, name)[sel]`, read by h5py or zarr, as a numpy array."""
    return np.asarray(plain_array(group, name)[sel])


def image_bytes(kind: str, seed: int = 0, size=(12, 10)) -> bytes:
    """A real small PNG or JPEG file's bytes."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    im = Image.fromarray(rng.integers(0, 256, size + (3,), dtype=np.uint8))
    buf = io.BytesIO()
    im.save(buf, format={"png": "PNG", "jpeg": "JPEG"}[kind])
    return buf.getvalue()


def one_line_error(res, *words) -> None:
    """`res` (a CompletedProcess) failed with one line on stderr, no traceback, holding each of `words`."""
    assert res.returncode != 0, res
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in res.stderr, res.stderr
    for w in words:
        assert w in lines[0], (w, lines[0])
