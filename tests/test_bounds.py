"""Bounds on every size a user types, checked against memory before work starts, and numbers that
must be finite and in range (issue 19: failure 7 and the "partly held" values)."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image
from support.formats import one_line_error

from dstore.errors import ConfigError, MemoryBudgetError
from dstore.ingest.bounds import ingest_need
from dstore.training.bounds import memory_bound_error
from dstore.training.config import TrainConfig

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _dstore(*args, cwd):
    return subprocess.run(
        [sys.executable, "-m", "dstore.tools", *map(str, args)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": ROOT},
    )


def test_a_resize_past_the_nodes_memory_is_refused_before_anything_is_read(tmp_path):
    """`--resize 100000x100000` grew to 23 GB until the OOM killer ended it (leaving a temporary and a lock)."""
    (tmp_path / "imgs" / "a").mkdir(parents=True)
    Image.new("RGB", (8, 8)).save(tmp_path / "imgs" / "a" / "x.png")
    res = _dstore("ingest", "imgs", "r.h5", "--resize", "1000000x1000000", "--no-progress", cwd=tmp_path)
    one_line_error(res, "MemoryBudgetError", "--resize 1000000x1000000", "3.00 TB per sample", "available memory")
    assert sorted(os.listdir(tmp_path)) == ["imgs"]  # no temporary, no lock file


def test_ingest_need_counts_a_writers_rounds_and_the_other_ranks():
    # 1 GB samples, 100 of them, 4 ranks, 1 shard: chunks of 7 samples (every member gets about four);
    # the one writer holds 2 x 4 + 3 chunks, the three others 3 each.
    need, held = ingest_need(sample_bytes=10**9, positions=100, ranks=4, shards=1, ranks_on_node=4)
    assert held == 11 * 7 and need == (11 + 3 * 3) * 7 * 10**9
    # small samples: chunks of about 8 MB, so the node's need stays small whatever the sample count
    need, _ = ingest_need(sample_bytes=150_528, positions=10**7, ranks=4, shards=4, ranks_on_node=4)
    assert need < 4 * 11 * 9 * 2**20


@pytest.mark.parametrize(
    "cfg, flag",
    [
        (TrainConfig(memory_budget=10**15), "--memory-budget"),
        (TrainConfig(batch_size=4096, image_size=(4096, 4096)), "--image-size"),
    ],
)
def test_train_sizes_past_the_nodes_memory_are_refused(cfg, flag):
    reserve = 4096 * 4096 * 4096 * 3 if flag == "--image-size" else 0
    exc = memory_bound_error(cfg, reserve=reserve, ranks_on_node=2, available=(64 * 10**9, "MemAvailable 64 GB"))
    assert isinstance(exc, MemoryBudgetError) and flag in str(exc) and "MemAvailable 64 GB" in str(exc)
    assert memory_bound_error(TrainConfig(), reserve=10**6, ranks_on_node=2, available=(64 * 10**9, "")) is None


def test_an_image_size_past_memory_is_refused_before_the_model_is_built(tmp_path):
    """In-process on COMM_SELF: the refusal comes before the model (whose size follows the input) exists."""
    from mpi4py import MPI

    from dstore.formats import create_writer
    from dstore.training.run import train

    path = str(tmp_path / "d.h5")
    with create_writer(path, encoding="raw", class_names=["a", "b"], raw_dtype="uint8", raw_shape=(4, 4, 1)) as w:
        for i in range(16):
            w.append(np.full(16, i, np.uint8).tobytes(), i % 2, f"s{i}", i)
    cfg = TrainConfig(
        data=path,
        epochs=1,
        batch_size=64,
        image_size=(1_000_000, 1_000_000),
        progress=False,
        run_dir=str(tmp_path / "run"),
    )
    with pytest.raises(MemoryBudgetError, match="--image-size 1000000x1000000"):
        train(cfg, MPI.COMM_SELF, say=lambda line: None)


@pytest.mark.parametrize(
    "kw, words",
    [
        (dict(lr=float("nan")), "--lr nan"),
        (dict(lr=float("inf")), "--lr inf"),
        (dict(seed=-1), "--seed -1"),
        (dict(seed=2**40), "--seed 1099511627776"),
        (dict(mean=(5.0,)), "--mean 5: every value must be in [0, 1]"),
        (dict(std=(0.0, 0.5, 0.5)), "--std 0,0.5,0.5"),
        (dict(holdout=1.5), "--holdout 1.5"),
        (dict(decode_threads=100_000), "--decode-threads 100000"),
        (dict(prefetch=10**6), "--prefetch 1000000"),
        (dict(momentum=float("nan")), "--momentum nan"),
    ],
)
def test_numbers_out_of_range_are_refused_naming_the_flag(kw, words):
    with pytest.raises(ConfigError) as err:
        TrainConfig(**kw).check()
    assert words in str(err.value)


def test_a_synthetic_side_past_the_bound_is_refused():
    from dstore.ingest.synthetic import MAX_SIDE, SyntheticSource

    with pytest.raises(ConfigError, match=f"max_side=100000 \\(--max-side\\) is more than {MAX_SIDE}"):
        SyntheticSource(count=1, min_side=99_000, max_side=100_000, mean_bytes=10**10)


def test_shards_past_the_names_five_digits_are_refused(tmp_path):
    from mpi4py import MPI

    from dstore.ingest import ingest

    with pytest.raises(ConfigError, match=r"shards=1000000 \(--shards\) must be an integer in \[1, 99999\]"):
        ingest("synthetic", str(tmp_path / "out"), comm=MPI.COMM_SELF, shards=1_000_000, count=4, progress=False)
    assert os.listdir(tmp_path) == []
