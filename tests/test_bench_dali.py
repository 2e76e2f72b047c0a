"""NVIDIA DALI as a peer (tools/bench/dali.py, dali_peer.py; `measure.loader --dali`): found by flag,
$DSTORE_DALI_PYTHON or its default venv, skipped with the reason where missing; its feed; the
ImageNet recipe's hook on dstore's side. A real DALI run only where its venv exists."""

import json
import subprocess
import sys
import types

import numpy as np
import pytest
from mpi4py import MPI

from dstore.tools.bench import dali, dali_peer, peers_run
from dstore.tools.measure import loader


@pytest.fixture
def no_dali(monkeypatch, tmp_path):
    monkeypatch.setenv("DSTORE_DALI_PYTHON", str(tmp_path / "nowhere" / "python"))
    monkeypatch.setattr(dali, "DEFAULT_PYTHON", tmp_path / "also-nowhere" / "python")


def test_a_missing_dali_venv_is_named_with_how_to_make_it(no_dali, tmp_path):
    assert dali.find_python() is None
    why = dali.missing()
    assert why is not None and "bash tools/setup_dali.sh" in why and "DSTORE_DALI_PYTHON" in why
    # a python without DALI in it is a reason too, naming it
    why = dali.missing(sys.executable)
    assert why is not None and f"{sys.executable} cannot import nvidia.dali" in why


def test_the_peers_bench_skips_dali_with_the_reason(no_dali, tmp_path):
    cfg = types.SimpleNamespace(dali_python=None, out=str(tmp_path), batch_size=16, decode_size=32)
    res = peers_run.decode_rows(MPI.COMM_SELF, cfg, str(tmp_path / "unused.h5"))
    assert res["note"].startswith("skipped: DALI: no DALI venv") and res["markdown"] == ""


def test_dali_is_fed_every_sample_once_per_epoch_in_a_new_order():
    samples = [np.full(3, i, np.uint8) for i in range(10)]
    feed = dali_peer.Feed(samples, 4, seed=1)
    assert feed.per_epoch == 3  # 4 + 4 + 2: the short last batch is fed, not dropped
    orders = []
    for epoch in range(2):
        batches = [feed(types.SimpleNamespace(iteration=epoch * 3 + s)) for s in range(3)]
        assert [len(b) for b in batches] == [4, 4, 2]
        orders.append([int(x[0]) for b in batches for x in b])
        assert sorted(orders[-1]) == list(range(10))
    assert orders[0] != orders[1]


def test_the_imagenet_recipe_needs_the_trainers_transform():
    from dstore.training import config

    if "imagenet" in config.AUGMENTS:  # landed: the hook builds the trainer's own transform
        tf = loader.imagenet_transform(224)
        assert tuple(tf.size) == (224, 224)
        return
    res = subprocess.run(
        [sys.executable, "-m", "dstore.tools.measure.loader", "unused.h5", "--recipe", "imagenet"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 2
    assert res.stderr.strip().startswith(
        "measure.loader: error: ConfigError: --recipe imagenet: dstore's loader "
        "needs the trainer's `--augment imagenet` transform"
    ), res.stderr


def test_dali_rows_need_a_recipe():
    res = subprocess.run(
        [sys.executable, "-m", "dstore.tools.measure.loader", "unused.h5", "--dali", "1"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 2 and "--dali needs --recipe plain or --recipe imagenet" in res.stderr, res.stderr


@pytest.mark.skipif(dali.missing() is not None, reason="no DALI venv (bash tools/setup_dali.sh)")
@pytest.mark.parametrize("recipe", dali.RECIPES)
def test_a_real_dali_run_decodes_every_sample_to_the_size(tmp_path, recipe):
    from dstore.formats import open_container
    from dstore.ingest import ingest

    path = str(tmp_path / "s.h5")
    ingest("synthetic", path, comm=MPI.COMM_SELF, count=12, progress=False)
    with open_container(path) as r:
        blob = dali.export([bytes(r.sample(i)[0]) for i in range(r.num_samples)], str(tmp_path))
    python = dali.find_python()
    assert python is not None  # the skipif above
    row = dali.run(python, blob, recipe=recipe, threads=1, batch_size=5, size=32, epochs=2)
    assert "error" not in row, row
    assert row["samples"] == 24 and row["sample_shape"] == [3, 32, 32], json.dumps(row)
