"""`dstore train --loader webdataset|litdata` (training.peers.PeerSource) over the copies the bench's
writer leaves beside a container: the peer's batches are the container's training samples (bytes
checked against its checksums, labels its own), the held-out tail never among them, the same number
of steps on every rank; a stale or missing copy is refused naming it. Each peer's tests run where it
is installed (bash tools/setup_peers.sh) and are skipped with the reason where not."""

from __future__ import annotations

import os

import numpy as np
import pytest
from mpi4py import MPI
from support.formats import random_samples, write_samples

from dstore.errors import ConfigError
from dstore.formats import open_container
from dstore.tools.bench import peer_data, peers
from dstore.training.peers import PeerSource, copies_dir


def _container(tmp_path, n=90):
    samples = random_samples(n, seed=11, max_bytes=4000)
    samples = [(d or b"x", lab, name, src) for d, lab, name, src in samples]  # no empty sample: as images
    return write_samples(tmp_path / "c.h5", "hdf5", samples)


@pytest.mark.parametrize("loader", ["webdataset", "litdata"])
def test_a_peer_feeds_the_training_range_checked(tmp_path, loader):
    why = peers.missing(loader)
    if why:
        pytest.skip(why)
    path = _container(tmp_path)
    peer_data.write_copies(path, copies_dir(path), seed=4, litdata_ok=loader == "litdata")
    with (
        open_container(path) as r,
        PeerSource(MPI.COMM_SELF, r, loader=loader, batch_size=8, seed=4, sample_range=(0, 72)) as src,
    ):
        assert src.steps_per_epoch == 9
        seen = []
        for e in range(3):
            batches = list(src.epoch(e))
            assert len(batches) == 9 and all(len(b.samples) == 8 for b in batches)
            for b in batches:
                assert (b.ids < 72).all() and np.array_equal(b.labels, r.labels[b.ids])
                for i, x in zip(b.ids.tolist(), b.samples):
                    assert x.tobytes() == r.sample(i)[0].tobytes()
                seen += b.ids.tolist()
        assert set(seen) == set(range(72))  # 216 samples: the peer's passes cover the training range
        assert src.state_dict() == {"seed": 4, "epoch": 3, "step": 0}


def test_a_missing_or_stale_copy_is_refused_naming_it(tmp_path):
    why = peers.missing("webdataset")
    if why:
        pytest.skip(why)
    path = _container(tmp_path)
    with open_container(path) as r:
        with pytest.raises(ConfigError, match="no current copy of .*c.h5"):
            PeerSource(MPI.COMM_SELF, r, loader="webdataset", batch_size=8, seed=4)
    peer_data.write_copies(path, copies_dir(path), seed=4, litdata_ok=False)
    os.makedirs(tmp_path / "x")
    os.replace(_container(tmp_path / "x", n=91), path)  # the container changed: the copies are not of it
    with open_container(path) as r:
        with pytest.raises(ConfigError, match="no current copy"):
            PeerSource(MPI.COMM_SELF, r, loader="webdataset", batch_size=8, seed=4)
