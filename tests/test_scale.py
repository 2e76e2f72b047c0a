"""Issue 20 under mpiexec: one index per node (dstore.store.index.NodeIndex) read by one rank of the node,
and the epoch's order built per rank from the bijection still delivers every sample once, in the
same global order as on one rank."""

import json

import numpy as np
import pytest
from mpi4py import MPI
from support.formats import build, random_samples, write_samples
from support.mpirun import run_mpi

from dstore.order import plan, shuffle
from dstore.store import budget as budget_mod
from dstore.store import index
from dstore.store.data_store import DataStore

N = 203


@pytest.mark.mpi
@pytest.mark.parametrize("nprocs", [2, 4])
def test_one_rank_per_node_reads_the_index_and_the_order_is_the_global_one(tmp_path, nprocs):
    samples = [(bytes([i % 251]) * (1 + i % 17), i % 3, f"s{i}", i) for i in range(N)]
    path = write_samples(tmp_path / "c.h5", "hdf5", samples)
    run_mpi(nprocs, ["python", "tests/scale_run.py", path, str(tmp_path)], timeout=120)
    rows = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(nprocs)]
    # One machine is one node: rank 0 read the index for all and dropped its own copy; no other did.
    assert [r["bytes_read"] > 0 for r in rows] == [True] + [False] * (nprocs - 1)
    assert not any(r["loaded"] for r in rows) and all(r["node_size"] == nprocs for r in rows)
    assert all(r["same"] and not r["writable"] for r in rows)
    # Every served sample once, and rank r's ids are its slices of the one global order.
    n = N - 3
    got = sorted(i for r in rows for i in r["ids"])
    assert got == list(range(3, N))
    order = shuffle.global_order(n, 5, 1) + 3
    for r, row in enumerate(rows):
        sched = plan.global_schedule(order, 8, nprocs, r, False)
        assert row["ids"] == sched.ids[~sched.pad].tolist()
    assert np.unique(got).size == n


@pytest.mark.parametrize("backend", ["hdf5", "zarr", "sharded-hdf5"])
def test_thread_readers_hold_no_index_and_the_budget_counts_none(tmp_path, backend):
    path = build(tmp_path, backend, random_samples(300, seed=2))
    kw = dict(batch_size=10, seed=1, population_threads=3, storage_threads=2)
    probe = DataStore(MPI.COMM_SELF, path, **kw)
    lazy = not backend.startswith("sharded")
    assert budget_mod.population_readers(probe.plan) == (0 if lazy else 3 * 20 * 300)  # offsets, labels, checksums
    budget = probe.tier_overhead() + int(0.5 * int(probe.offsets[-1]))
    probe.close()
    with DataStore(MPI.COMM_SELF, path, memory_budget=budget, **kw) as st:  # tiered: storage threads read
        got = sorted(int(i) for b in st.epoch(0) for i, p in zip(b.ids, b.pad) if not p)
        assert st.windows is not None and st.windows.storage is not None  # tiered, populated by the epoch
        storage = st.windows.storage
        if getattr(st.container, "concurrent_reads", False):  # HDF5: the threads read with the job's reader
            assert storage._shared is st.container and storage._readers == []
        else:  # a reader per thread, holding no index of its own where the format loads it lazily
            assert storage._readers and all(r.index_loaded != lazy for r in storage._readers)
        assert not st.container.index_loaded or not lazy  # the store's own: the node copy replaced it
    assert got == list(range(300))


def test_label_types_are_the_smallest_that_hold_the_labels():
    assert index.label_dtype(0, 255) == np.uint8 and index.label_dtype(0, 256) == np.int16
    assert index.label_dtype(-1, 5) == np.int16 and index.label_dtype(0, 40000) == np.int32
    assert index.label_dtype(-(2**31), 2**31 - 1) == np.int32 and index.label_dtype(0, 2**31) == np.int64
    assert index.index_bytes(10, np.uint8) == 88 + 40 + 10 and index.index_bytes(3, np.int64) == 32 + 16 + 24


@pytest.mark.parametrize("classes", [3, 300, 70000])
def test_the_node_index_holds_labels_narrow_and_batches_deliver_them_as_int64(tmp_path, classes):
    names = [f"c{i}" for i in range(classes)]
    samples = [(bytes([i % 251]) * (1 + i % 5), (i * 7919) % classes, f"s{i}", i) for i in range(150)]
    path = write_samples(tmp_path / "c.h5", "hdf5", samples, class_names=names)
    want = {3: np.uint8, 300: np.int16, 70000: np.int32}[classes]
    with DataStore(MPI.COMM_SELF, path, batch_size=16, seed=3, sample_range=(5, 150)) as st:
        assert st.labels.dtype == want and not st.labels.flags.writeable
        assert st._index is not None and st._index.nbytes == 8 * 146 + 4 * 145 + np.dtype(want).itemsize * 145
        got = {}
        for b in st.epoch(0):
            assert b.labels.dtype == np.int64
            got.update(zip(b.ids.tolist(), b.labels.tolist()))
    assert got == {i: samples[i][1] for i in range(5, 150)}


def test_a_global_epoch_holds_nothing_per_entry_it_serves(tmp_path):
    samples = [(bytes([i % 251]) * (1 + i % 7), i % 3, f"s{i}", i) for i in range(500)]
    path = write_samples(tmp_path / "c.h5", "hdf5", samples)
    with DataStore(MPI.COMM_SELF, path, batch_size=32, seed=4) as st:
        sched = st.schedule(1)
        assert isinstance(sched.ids, plan.Derived) and isinstance(sched.pad, plan.Derived)
        assert sched.ptr.nbytes == 8 * (st.steps_per_epoch + 1)  # one offset per step: all it holds
        ids = [b.ids for b in st.epoch(1)]
    want = np.asarray(shuffle.global_order(500, 4, 1))
    assert np.array_equal(np.concatenate(ids), want)
