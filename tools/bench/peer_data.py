"""The same samples in the peers' formats (`dstore bench --peers`): tar shards as WebDataset reads
them, a LitData dataset, and a class-sorted copy of the container, each in a class-sorted and a
shuffled order. Rank 0 writes each copy once (a `.done` file beside it records the container's key,
tools/bench/layouts.source_key) and later runs reuse it; the other ranks wait."""

from __future__ import annotations

import dataclasses
import importlib
import io
import os
import shutil
import tarfile

import numpy as np

from dstore.formats import create_writer, open_container
from dstore.tools.bench.layouts import source_key
from dstore.training.peers import LITDATA_KEY  # the copies `dstore train --loader webdataset|litdata` reads

SHARD_SAMPLES = 125
"""Samples per tar shard at most (2,000 samples: 16 shards, 8 per rank on 2 ranks, 4 per worker with
2); smaller sets are cut into SHARDS shards, so every rank and worker still gets some."""
SHARDS = 16
ORDERS = ("sorted", "shuffled")
"""The archives' sample orders: by class (what a folder of class directories gives when packed as
it lies) and shuffled once with the seed (what a careful user packs)."""


def archive_order(labels: np.ndarray, kind: str, seed: int) -> np.ndarray:
    """The container indices in the order an archive of `kind` (ORDERS) holds them."""
    if kind == "sorted":
        return np.argsort(labels, kind="stable")
    if kind == "shuffled":
        return np.random.default_rng([seed, 24]).permutation(labels.size)
    raise ValueError(f"archive order {kind!r} is not one of {ORDERS}")


@dataclasses.dataclass
class PeerData:
    """Where each copy of one container lies (None: that peer is not installed)."""

    container: str
    sorted_container: str
    tars: dict  # kind -> list of shard paths
    litdata: dict  # kind -> directory, or None per kind


def done(path: str, key: str) -> bool:
    """Whether `path` was written for `key` (its `.done` marker holds the key): inputs reused between runs."""
    try:
        with open(path + ".done") as fh:
            return fh.read() == key
    except OSError:
        return False


def mark(path: str, key: str) -> None:
    """Marks `path` as written for `key` (see `done`)."""
    with open(path + ".done", "w") as fh:
        fh.write(key)


def write_tars(container: str, order: np.ndarray, out_dir: str, per_shard: int | None = None) -> list[str]:
    """Tar shards of the samples in `order`: members `<index>.jpg` (the sample's bytes as stored)
    and `<index>.cls` (its label in decimal), as WebDataset's writers lay them out."""
    per_shard = per_shard or min(SHARD_SAMPLES, -(-order.size // SHARDS))
    tmp = out_dir + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    names = []
    with open_container(container) as r:
        for s, lo in enumerate(range(0, order.size, per_shard)):
            name = f"shard-{s:05d}.tar"
            with tarfile.open(os.path.join(tmp, name), "w", format=tarfile.USTAR_FORMAT) as tar:
                for i in order[lo : lo + per_shard].tolist():
                    data, label = r.sample(i)
                    for ext, payload in (("jpg", data.tobytes()), ("cls", str(int(label)).encode())):
                        info = tarfile.TarInfo(f"{i:08d}.{ext}")
                        info.size = len(payload)
                        tar.addfile(info, io.BytesIO(payload))
            names.append(name)
    shutil.rmtree(out_dir, ignore_errors=True)
    os.replace(tmp, out_dir)
    return [os.path.join(out_dir, n) for n in names]


def _litdata_item(pair):
    """One LitData sample: the stored bytes and the label (a top-level function: optimize pickles it)."""
    container, i = pair
    with open_container(container) as r:
        data, label = r.sample(int(i))
    return {"data": data.tobytes(), "label": int(label), "index": int(i)}


def write_litdata(container: str, order: np.ndarray, out_dir: str) -> str:
    """A LitData dataset of the samples in `order` (`litdata.optimize`, 64 MB chunks, one worker:
    the order within the chunks is the input order)."""
    # by name: an optional peer (tools/setup_peers.sh) that the type check's environment lacks
    litdata = importlib.import_module("litdata")

    shutil.rmtree(out_dir, ignore_errors=True)
    litdata.optimize(
        fn=_litdata_item,
        inputs=[(container, int(i)) for i in order.tolist()],
        output_dir=out_dir,
        chunk_bytes="64MB",
        num_workers=1,
        mode="overwrite",
        verbose=False,
    )
    return out_dir


def write_sorted_container(container: str, path: str) -> str:
    """A copy of `container` whose samples are in class order (HDF5): the store over a class-sorted archive."""
    with open_container(container) as r:
        info = r.info
        order = np.argsort(np.asarray(r.labels), kind="stable")
        with create_writer(
            path,
            "hdf5",
            encoding=info.encoding,
            class_names=info.class_names,
            raw_dtype=info.raw_dtype,
            raw_shape=info.raw_shape,
            overwrite=True,
            source=f"{container} sorted by class",
        ) as w:
            for i in order.tolist():
                data, label = r.sample(i)
                w.append(data, label, r.name(i), source_index=i)
    return path


def prepare(comm, container: str, out_dir: str, *, seed: int, litdata_ok: bool) -> PeerData:
    """Every copy (rank 0 writes what is missing or stale); the same PeerData on every rank."""
    from dstore.runtime.collective import on_root

    return on_root(comm, write_copies, container, out_dir, seed=seed, litdata_ok=litdata_ok)


def _key(container: str, offsets: np.ndarray, seed: int) -> str:
    """What the copies of `container` were made from (checked before they are reused or read)."""
    return source_key(container, offsets) + f"#seed{seed}#{SHARD_SAMPLES}"


def _stem(container: str, out_dir: str) -> str:
    return os.path.join(out_dir, os.path.splitext(os.path.basename(os.path.normpath(container)))[0])


def write_copies(container: str, out_dir: str, *, seed: int, litdata_ok: bool) -> PeerData:
    """Writes the copies of `container` under `out_dir` that are missing or stale (one process, no MPI)."""
    with open_container(container) as r:
        labels, offsets = np.asarray(r.labels), np.asarray(r.offsets)
    key, stem = _key(container, offsets, seed), _stem(container, out_dir)
    os.makedirs(out_dir, exist_ok=True)
    sorted_c = stem + ".class-sorted.h5"
    if not done(sorted_c, key):
        mark(write_sorted_container(container, sorted_c), key)
    tars, lits = {}, {}
    for kind in ORDERS:
        order = archive_order(labels, kind, seed)
        d = f"{stem}.wds-{kind}"
        if not done(d, key):
            write_tars(container, order, d)
            mark(d, key)
        tars[kind] = sorted(os.path.join(d, n) for n in os.listdir(d) if n.endswith(".tar"))
        d = f"{stem}.litdata-{kind}"
        if litdata_ok and not done(d, key + LITDATA_KEY):
            mark(write_litdata(container, order, d), key + LITDATA_KEY)
        lits[kind] = d if litdata_ok else None
    return PeerData(container, sorted_c, tars, lits)
