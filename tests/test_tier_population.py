"""The tiered preload (dstore.store.preload.preload_resident) reads only the resident samples' runs:
the bytes it reads, counted by the storage tier's reader, lie between the resident bytes and those
plus the gaps it may cross; the window holds exactly the resident samples' bytes; a failed read
names the bad sample."""

import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from store_scenarios import scenarios

from dstore.order import tiers
from dstore.store import preload

GAP = 3000  # bytes: below the larger samples of the container (up to 8,000), so some gaps are skipped


@pytest.fixture(scope="module")
def container(tmp_path_factory):
    # 1201 samples of 0..8,000 bytes (some empty), HDF5 unfiltered: byte-addressable
    return scenarios.make_container(
        str(tmp_path_factory.mktemp("tierpop") / "c.h5"), n=1201, seed=1, large=8000, small=8000
    )


def _skippable_gaps(resident, sizes, gap):
    """Bytes of the runs of non-resident samples between two resident non-empty ones that are at
    most `gap` long: what the preload may read besides the resident bytes."""
    keep = np.nonzero(resident & (sizes > 0))[0]
    if keep.size < 2:
        return 0
    cum = np.concatenate([[0], np.cumsum(sizes)])
    between = cum[keep[1:]] - cum[keep[:-1] + 1]
    return int(between[between <= gap].sum())


def _tiered(comm, path, fraction, **kw):
    from dstore.store.data_store import DataStore

    probe = DataStore(comm, path, **kw)
    budget = probe.tier_overhead() + int(fraction * int(probe.layout.nbytes.max()))
    probe.close()
    return DataStore(comm, path, memory_budget=budget, **kw)


@pytest.mark.parametrize("fraction", [0.25, 0.5, 0.75])
def test_the_tiered_preload_reads_the_resident_bytes_and_small_gaps_only(container, monkeypatch, fraction):
    from mpi4py import MPI

    from dstore.formats import open_container

    monkeypatch.setattr(preload, "GAP_BYTES", GAP)
    kw = dict(batch_size=12, seed=4, population_threads=3, storage_threads=3)
    with open_container(container) as ref, _tiered(MPI.COMM_SELF, container, fraction, **kw) as st:
        assert ref.byte_addressable
        w = st.windows
        assert w is not None and w.resident is not None and w.storage is not None  # populated, tiered
        res = w.resident
        sizes = st.sizes
        resident_bytes = int(sizes[res].sum())
        assert 0.8 * fraction < resident_bytes / int(sizes.sum()) < 1.2 * fraction
        got = w.population["population_bytes"]  # (stats has it once an epoch ran)
        counted = w.storage.bytes  # the storage tier's threads did the reading, and counted it
        assert counted == got
        assert resident_bytes <= got <= resident_bytes + _skippable_gaps(res, sizes, GAP)
        assert got < int(sizes.sum()) - 0.5 * (int(sizes.sum()) - resident_bytes)  # most gaps skipped
        window, disp = w.arena.local, st.layout.disp
        for i in np.nonzero(res)[0].tolist():
            a = int(disp[i])
            assert np.array_equal(window[a : a + int(sizes[i])], ref.sample(i)[0]), i
        # delivered data: the same as a fully resident store's
        from dstore.store.data_store import DataStore

        with DataStore(MPI.COMM_SELF, container, **kw) as full:
            for x, y in zip(scenarios.run_epoch(st, 0), scenarios.run_epoch(full, 0)):
                assert np.array_equal(x, y)


def test_the_tiered_preload_names_the_sample_whose_read_fails(container, monkeypatch):
    # A read of a run fails (injected: any read that covers one resident sample's bytes); the
    # error names that sample, each sample of the run having been tried alone.
    from mpi4py import MPI

    from dstore.errors import FormatError
    from dstore.formats.hdf5 import HDF5Reader

    monkeypatch.setattr(preload, "GAP_BYTES", GAP)
    kw = dict(batch_size=12, seed=4, population_threads=3, storage_threads=3)
    with _tiered(MPI.COMM_SELF, container, 0.5, **kw) as st:
        assert st.windows is not None and st.windows.resident is not None  # populated, tiered
        res, off = st.windows.resident, st.offsets
    bad = int(np.nonzero(res & (np.diff(off) > 0))[0][300])
    lo_bad, hi_bad = int(off[bad]), int(off[bad + 1])
    real = HDF5Reader.read_bytes

    def failing(self, lo, hi, out=None):
        if lo < hi_bad and hi > lo_bad:
            raise OSError("injected read failure")
        return real(self, lo, hi, out)

    monkeypatch.setattr(HDF5Reader, "read_bytes", failing)
    with pytest.raises(FormatError) as info:
        with _tiered(MPI.COMM_SELF, container, 0.5, **kw):
            pass
    msg = str(info.value)
    assert container in msg and "injected read failure" in msg, msg
    assert re.findall(r"(\d+) \(s(\d+)\)", msg) == [(str(bad), str(bad))], msg


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, 5000), min_size=1, max_size=60), st.data())
def test_preload_reads_cover_the_ids_once_within_piece_and_gap(sizes, data):
    sizes = np.array(sizes, dtype=np.int64)
    off = np.concatenate([[0], np.cumsum(sizes)])
    ids = np.array(sorted(data.draw(st.sets(st.integers(0, sizes.size - 1)))), dtype=np.int64)
    piece = data.draw(st.integers(1, 20000))
    gap = data.draw(st.sampled_from([0, 1000, 4000, float("inf")]))
    groups = tiers.preload_reads(ids, off, piece, gap)
    bounds = [0] + [m for _, m in groups]
    assert [k for k, _ in groups] == bounds[:-1] and bounds[-1] == ids.size  # in order, each id once
    for k, m in groups:
        assert m > k
        assert m == k + 1 or off[ids[m - 1] + 1] - off[ids[k]] <= piece
        assert all(off[ids[j + 1]] - off[ids[j] + 1] <= gap for j in range(k, m - 1))
    for (k, m), (k2, _) in zip(groups, groups[1:]):  # a group ends only at a gap or at the piece
        assert off[ids[k2]] - off[ids[m - 1] + 1] > gap or off[ids[k2] + 1] - off[ids[k]] > piece


@pytest.mark.parametrize(
    "backend,expect", [("hdf5", True), ("zarr", False), ("sharded-hdf5", True), ("sharded-zarr", False)]
)
def test_the_run_reads_apply_where_a_read_costs_its_bytes(tmp_path, monkeypatch, backend, expect):
    # Unfiltered HDF5 (and shards of it) is read at file offsets: the preload reads the runs. Zarr
    # decodes whole chunks per read: the preload reads pieces of the block. Both fill the window alike.
    from mpi4py import MPI
    from support.formats import build, random_samples

    from dstore.formats import open_container

    monkeypatch.setattr(preload, "GAP_BYTES", 0)
    path = build(tmp_path, backend, random_samples(300, seed=2, max_bytes=3000))
    with open_container(path) as ref, _tiered(MPI.COMM_SELF, path, 0.3, batch_size=8) as st:
        assert ref.byte_addressable == expect
        w = st.windows
        assert w is not None and w.resident is not None  # populated, tiered
        res, sizes = w.resident, st.sizes
        got, resident_bytes = w.population["population_bytes"], int(sizes[res].sum())
        assert (got == resident_bytes) if expect else (got > 2 * resident_bytes)
        window, disp = w.arena.local, st.layout.disp
        for i in np.nonzero(res)[0].tolist():
            assert np.array_equal(window[int(disp[i]) : int(disp[i]) + int(sizes[i])], ref.sample(i)[0]), i
