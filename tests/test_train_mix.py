"""`dstore train a.h5:0.7 b.zarr:0.3`: training on a mix (dstore.MixedStore) from the command line,
its refusals, and resume tied to the mix."""

import json

import numpy as np
import pytest
from store_scenarios import mix_scenario
from support.mpirun import run_mpi

from dstore.errors import ConfigError
from dstore.formats import create_writer, open_container
from dstore.training.config import TrainConfig
from dstore.training.data import check_mix_flags, check_mix_readers, parse_sources


def _raw(path, classes, n=12, seed=2):
    rng = np.random.default_rng(seed)
    with create_writer(
        str(path), "hdf5", encoding="raw", class_names=classes, raw_dtype="uint8", raw_shape=(8, 8, 3)
    ) as w:
        for i in range(n):
            w.append(rng.integers(0, 256, (8, 8, 3), dtype=np.uint8), i % len(classes), f"v{i}", i)
    return str(path)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("trainmix")
    a, b = mix_scenario.make_sources(tmp)  # raw HDF5 (40 samples) and JPEG Zarr (25), classes x y z
    return a, b, _raw(tmp / "val.h5", ["x", "y", "z"])


def test_parse_sources_one_container_as_before_and_a_mix():
    assert parse_sources(None) is None and parse_sources("a.h5") is None
    # the CLI's list (nargs="*"), which TrainConfig.__post_init__ folds into the field's type
    assert TrainConfig(data=["a.h5"]).data == "a.h5" and TrainConfig(data=[]).data is None  # pyright: ignore[reportArgumentType]
    assert parse_sources(TrainConfig(data=["a.h5:0.7", "dir/b:c.zarr:0.3"]).data) == [  # pyright: ignore[reportArgumentType]
        ("a.h5", 0.7),
        ("dir/b:c.zarr", 0.3),
    ]
    with pytest.raises(ConfigError, match=r"'b.zarr'.*CONTAINER:WEIGHT"):
        parse_sources(("a.h5:0.7", "b.zarr"))


@pytest.mark.parametrize(
    "change, flag",
    [
        ({"trainers": 2}, "--trainers 2"),
        ({"loader": "direct"}, "--loader direct"),
        ({"loader": "files"}, "--loader files"),
        ({"val": None}, "--val"),
    ],
)
def test_a_mix_refuses_unsupported_flags(change, flag):
    cfg = TrainConfig(**{"data": ["a:1", "b:1"], "val": "v.h5", **change})
    with pytest.raises(ConfigError, match=flag):
        check_mix_flags(cfg)


def test_sources_with_other_classes_are_refused_naming_both(data, tmp_path):
    a, b, val = data
    other = _raw(tmp_path / "other.h5", ["x", "y", "w"], seed=5)
    mix = [(a, 0.5), (other, 0.5)]
    with (
        open_container(a) as ra,
        open_container(other) as ro,
        open_container(val) as rv,
        open_container(b) as rb,
        open_container(a) as again,
    ):
        with pytest.raises(ConfigError, match=rf"{other} has classes.*but {a} has"):
            check_mix_readers(mix, [ra, ro], val, rv)
        with pytest.raises(ConfigError, match=rf"--val {a} holds the same samples as the mix's source {a}"):
            check_mix_readers([(a, 0.5), (b, 0.5)], [ra, rb], a, again)
        check_mix_readers([(a, 0.5), (b, 0.5)], [ra, rb], val, rv)  # same classes, another --val: accepted


@pytest.mark.mpi
def test_train_on_a_mix_of_two_encodings_then_resume_refuses_another_mix(data, tmp_path):
    a, b, val = data
    run = tmp_path / "run"
    args = ["--val", val, "--epochs", "1", "--batch-size", "16", "--no-progress", "--run-dir", str(run)]
    run_mpi(2, ["dstore", "train", f"{a}:0.7", f"{b}:0.3"] + args, timeout=150)
    meta = json.loads((run / "config.json").read_text())
    # 65 samples at 0.7/0.3: shares 45.5 and 19.5 -> 46 and 19 (dstore.order.mix's largest remainder)
    assert meta["mix"] == {"sources": [a, b], "weights": [0.7, 0.3], "counts": [46, 19]}
    final = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if '"io_stats"' in line][-1]
    assert len(final["io_stats"]) == 2 and all(len(st["sources"]) == 2 for st in final["io_stats"])
    refused = run_mpi(
        1,
        ["dstore", "train", f"{a}:0.5", f"{b}:0.5", "--resume", "auto"]
        + args[:-2]
        + ["--epochs", "2", "--run-dir", str(run)],
        timeout=120,
        check=False,
    )
    assert refused.returncode != 0
    assert f"trains on {a}:0.5 {b}:0.5" in refused.stdout + refused.stderr
    # the same mix resumes: one more epoch, on another rank count
    run_mpi(
        1,
        [
            "dstore",
            "train",
            f"{a}:0.7",
            f"{b}:0.3",
            "--resume",
            "auto",
            "--val",
            val,
            "--epochs",
            "2",
            "--batch-size",
            "16",
            "--no-progress",
            "--run-dir",
            str(run),
        ],
        timeout=120,
    )
    epochs = [
        json.loads(line)["epoch"] for line in (run / "metrics.jsonl").read_text().splitlines() if '"train_loss"' in line
    ]
    assert epochs == [0, 1], epochs


@pytest.mark.mpi
def test_the_budget_is_shared_by_each_source_store_and_a_too_small_one_refused(data, tmp_path):
    a, b, val = data
    res = run_mpi(
        1,
        [
            "dstore",
            "train",
            f"{a}:1",
            f"{b}:1",
            "--val",
            val,
            "--memory-budget",
            "1000",
            "--no-progress",
            "--run-dir",
            str(tmp_path / "run"),
        ],
        timeout=120,
        check=False,
    )
    assert res.returncode != 0
    # the two sources' stores and --val's: three stores share the one budget
    assert "the trainer's 3 store(s) need" in res.stdout + res.stderr


def _flat(path, value, n=8):
    with create_writer(
        str(path), "hdf5", encoding="raw", class_names=["x", "y"], raw_dtype="uint8", raw_shape=(4, 4, 1)
    ) as w:
        for i in range(n):
            w.append(np.full((4, 4, 1), value, np.uint8), i % 2, f"f{i}", i)
    return str(path)


def test_a_mix_is_normalised_over_every_source_by_weight(tmp_path):
    """A dark and a bright source mixed 3:1: the mean is their weighted mean, not the first's."""
    from mpi4py import MPI

    from dstore.training.data import probe_mix_input

    with (
        open_container(_flat(tmp_path / "dark.h5", 0)) as dark,
        open_container(_flat(tmp_path / "bright.h5", 255)) as bright,
    ):
        spec = probe_mix_input(MPI.COMM_SELF, [dark, bright], [3.0, 1.0], stats_samples=8)
        given = probe_mix_input(MPI.COMM_SELF, [dark, bright], [3.0, 1.0], mean=(0.5,), std=(0.2,))
    assert spec.image_size == (4, 4) and spec.channels == 1
    assert spec.mean == pytest.approx((0.25,)) and spec.std == pytest.approx(((0.25 * 0.75) ** 0.5,))
    assert given.mean == (0.5,) and given.std == (0.2,)
