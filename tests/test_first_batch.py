"""What a store's first batch costs a parallel file system (issue 24): every operation is a round
trip and part of a job's budget of operations per second, so the container's open and the first
step's reads are counted through a real `dstore pfs` mount (its counters; no timings asserted).

Skipped, with the reason, where FUSE is not available.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from formats_helpers import random_samples, write_samples

from dstore.formats import open_container
from dstore.tools.pfs import PfsModel, fuse_available, pfs_mount

REASON = fuse_available()
pytestmark = pytest.mark.skipif(REASON is not None, reason=f"needs FUSE: {REASON}")


@pytest.fixture(scope="module")
def container(tmp_path_factory):
    # ~3 MB of data between the file's head and its index: metadata in two places, as in a real container
    samples = random_samples(60, seed=5, max_bytes=100_000)
    path = write_samples(tmp_path_factory.mktemp("fb") / "c.h5", "hdf5", samples, chunk_bytes=1 << 20)
    return path, samples


def test_opening_an_hdf5_container_costs_a_few_requests(container):
    path, samples = container
    src, name = os.path.split(path)
    with pfs_mount(src, model=PfsModel()) as mnt:
        with open_container(mnt.path(name), index=False) as r:
            offsets = r.offsets  # the index, read on first use
            got = r.read_bytes(int(offsets[1]), int(offsets[2]))
    s = mnt.stats
    # HDF5 reads its metadata item by item (about 25 requests for this file); read in blocks, the
    # head and the tail (index, names, attributes) are one request each, plus the sample's
    assert s["reads"] <= 4, s
    assert s["opens"] <= 2, s
    assert got.tobytes() == samples[1][0]
    assert np.array_equal(np.diff(offsets), [len(x[0]) for x in samples])
