"""A MixedStore scenario that runs unchanged on any communicator: COMM_SELF inside pytest, or
COMM_WORLD under `mpiexec -n N python -m mpi4py mix_scenario.py A B MODE OUT`.

Two sources of different encodings (raw uint8 arrays in HDF5, JPEG files in Zarr) mixed 0.7/0.3.
Every rank checks each delivered sample's bytes against its own container; rank 0 writes the
mix's global sequence (epoch, step, source, id, CRC32), in position order, as JSON to OUT:
MODE full: epochs 0 and 1; save: epoch 0's first SAVE_AT steps and the state_dict; load: that
state_dict resumed (from OUT), the rest of epoch 0 and epoch 1 written to OUT + ".rest".
$MIX_WEIGHTS (e.g. `0.9,0.1`) replaces the weights; the stores' budget is $DSTORE_MEMORY_BUDGET's.
"""

from __future__ import annotations

import io
import json
import os
import sys
import zlib
from pathlib import Path

import numpy as np

from dstore.formats import create_writer, open_container
from dstore.store.mixed import MixedStore

WEIGHTS = (0.7, 0.3)
BATCH = 8
SAVE_AT = 4


def make_sources(tmp) -> list[str]:
    """[a raw HDF5 container of 40 samples, a JPEG Zarr container of 25 (3 classes each)]."""
    from PIL import Image

    tmp = Path(tmp)
    rng = np.random.default_rng(1)
    a, b = str(tmp / "a.h5"), str(tmp / "b.zarr")
    with create_writer(
        a, "hdf5", encoding="raw", class_names=["x", "y", "z"], raw_dtype="uint8", raw_shape=(8, 8, 3)
    ) as w:
        for i in range(40):
            w.append(rng.integers(0, 256, (8, 8, 3), dtype=np.uint8), i % 3, f"a{i}", i)
    with create_writer(b, "zarr", encoding="jpeg", class_names=["x", "y", "z"]) as w:
        for i in range(25):
            buf = io.BytesIO()
            Image.fromarray(rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)).save(buf, format="JPEG")
            w.append(buf.getvalue(), i % 3, f"b{i}.jpg", i)
    return [a, b]


def _crc(a) -> int:
    return zlib.crc32(memoryview(a).cast("B")) & 0xFFFFFFFF


def _epoch(store, readers, e, steps=None) -> list:
    """The epoch's (or its first `steps` steps') entries in global order, bytes checked on every rank."""
    out = []
    for k, batch in enumerate(store.epoch(e)):
        mine = []
        for x, src, i, pad in zip(batch.samples, batch.sources.tolist(), batch.ids.tolist(), batch.pad.tolist()):
            want = readers[src].sample(i)[0]
            if _crc(x) != _crc(want):
                raise AssertionError(
                    f"rank {store.rank}: epoch {e} step {batch.step}: source {src} sample {i}: wrong bytes"
                )
            if not pad:
                mine.append([e, batch.step, src, i, _crc(x)])
        for part in store.comm.allgather(mine):  # rank r holds the r-th contiguous part of the global batch
            out.extend(part)
        if steps is not None and k + 1 == steps:
            break
    return out


def run(comm, sources, mode: str, out: str, weights=WEIGHTS) -> dict:
    readers = [open_container(p) for p in sources]
    try:
        with MixedStore(comm, list(zip(sources, weights)), batch_size=BATCH, seed=5) as store:
            if mode == "full":
                entries = _epoch(store, readers, 0) + _epoch(store, readers, 1)
            elif mode == "save":
                entries = _epoch(store, readers, 0, SAVE_AT)
            elif mode == "load":
                store.load_state_dict(json.loads(Path(out).read_text())["state"])
                entries = _epoch(store, readers, 0) + _epoch(store, readers, 1)
                out = out + ".rest"
            else:
                raise ValueError(f"mode {mode!r}")
            result = {
                "entries": entries,
                "state": store.state_dict(),
                "counts": store.counts.tolist(),
                "stats": store.gather_stats(),
            }
    finally:
        for r in readers:
            r.close()
    if comm.Get_rank() == 0:
        Path(out).write_text(json.dumps(result))
    return result


def check_counts(result: dict, sources, weights=WEIGHTS) -> None:
    """Each epoch's entries per source equal the store's counts (the largest-remainder shares)."""
    from dstore.order import mix

    sizes = [open_container(p).num_samples for p in sources]
    counts = mix.mix_counts(sum(sizes), weights).tolist()
    assert result["counts"] == counts
    for e in (0, 1):
        got = np.bincount([s for ep, _, s, _, _ in result["entries"] if ep == e], minlength=len(sources)).tolist()
        assert got == counts, (e, got, counts)


if __name__ == "__main__":
    from mpi4py import MPI

    *paths, mode_arg, out_arg = sys.argv[1:]
    w = tuple(float(x) for x in os.environ["MIX_WEIGHTS"].split(",")) if os.environ.get("MIX_WEIGHTS") else WEIGHTS
    res = run(MPI.COMM_WORLD, paths, mode_arg, out_arg, w)
    if mode_arg == "full":
        check_counts(res, paths, w)
