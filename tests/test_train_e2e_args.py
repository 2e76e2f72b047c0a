"""The end-to-end training comparison passes the options after `--` on to every `dstore train` it runs
(argparse alone bound them to nothing: the positional `extra` was consumed, empty, with `container`)."""

import os
from unittest import mock

import pytest

from dstore.tools.bench import train_e2e


def _extra_passed(argv):
    seen = []

    def fake_run_one(*args, **kwargs):
        seen.append(kwargs["extra"])
        raise SystemExit(0)

    with mock.patch.object(train_e2e, "run_one", side_effect=fake_run_one), pytest.raises(SystemExit):
        train_e2e.main(argv)
    return seen[0]


def test_options_after_the_separator_reach_dstore_train(tmp_path):
    argv = [
        str(tmp_path / "x.h5"),
        "--rungs",
        "local",
        "--out",
        str(tmp_path),
        "--",
        "--device",
        "cuda",
        "--batch-size",
        "256",
    ]
    assert _extra_passed(argv) == ["--device", "cuda", "--batch-size", "256"]


def test_no_separator_passes_nothing(tmp_path):
    assert _extra_passed([str(tmp_path / "x.h5"), "--rungs", "local", "--out", str(tmp_path)]) == []


def test_unknown_loaders_are_refused_naming_them(tmp_path, capsys):
    with pytest.raises(SystemExit):
        train_e2e.main([str(tmp_path / "x.h5"), "--loaders", "store", "webdatasets", "--out", str(tmp_path)])
    assert "webdatasets" in capsys.readouterr().err


def test_peer_loaders_run_over_copies_written_beside_the_container(tmp_path):
    # `--loaders store webdataset` (spaces or commas): the tar shards are written in peers/ beside
    # the container before any run, and the peer's run is a `dstore train --loader webdataset`
    from support.formats import random_samples, write_samples

    from dstore.tools.bench import peers

    why = peers.missing("webdataset")
    if why:
        pytest.skip(why)
    path = write_samples(tmp_path / "c.h5", "hdf5", random_samples(30, seed=2))
    seen = []

    def fake_run_one(container, loader, *args, **kwargs):
        seen.append(loader)
        if loader == "webdataset":
            raise SystemExit(0)
        return {
            "loader": loader,
            "steady_samples_per_s": 1.0,
            "epoch_samples_per_s": [1.0],
            "data_wait_frac": [0.0],
            "population_seconds": 0.0,
        }

    with mock.patch.object(train_e2e, "run_one", side_effect=fake_run_one), pytest.raises(SystemExit):
        train_e2e.main([path, "--rungs", "local", "--out", str(tmp_path / "out"), "--loaders", "store", "webdataset"])
    assert seen == ["store", "webdataset"]
    assert any(n.endswith(".tar") for n in os.listdir(tmp_path / "peers" / "c.wds-shuffled"))
