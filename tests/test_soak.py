"""Soak (issue 11, "Also"): 4 ranks with prefetch serve many epochs and build and free many stores;
every epoch delivers each sample once, and no rank's memory, threads or descriptors grow."""

from __future__ import annotations

import json

import pytest
from support.formats import random_samples, write_samples
from support.mpirun import run_mpi


@pytest.mark.mpi
def test_four_ranks_many_epochs_and_stores_leak_nothing(tmp_path):
    path = write_samples(tmp_path / "c.h5", "hdf5", random_samples(800, max_bytes=2000))
    res = run_mpi(
        4,
        ["python", "-m", "dstore.tools.measure.soak", path, "--epochs", "120", "--stores", "10", "--batch-size", "32"],
        timeout=240,
    )
    report = json.loads(res.stdout.strip().splitlines()[-1])
    assert report["each_sample_once_every_epoch"], report
    for rank in report["per_rank"]:
        points = rank["long_run"] + rank["lifetimes"]
        assert len({p["threads"] for p in points}) == 1, rank
        assert len({p["fds"] for p in rank["long_run"]}) == 1 and len({p["fds"] for p in rank["lifetimes"]}) == 1, rank
        # Loose: measured +0.3 MiB over 400 epochs and 40 stores; a leaked receive buffer or window
        # per epoch or per store would add megabytes.
        assert points[-1]["rss_mib"] - points[0]["rss_mib"] < 8, rank
