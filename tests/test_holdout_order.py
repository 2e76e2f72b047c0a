"""Order safety (issue 23): a container written in class order is caught by `dstore train` before it
holds out a one-class tail; `ingest --stratify` writes an order whose every tail is a stratified
random choice; a container re-ingests (the remedy) byte for byte, its checksums checked."""

import json

import numpy as np
import pytest
from mpi4py import MPI
from support.mpirun import run_mpi

from dstore.errors import ConfigError, SampleError
from dstore.formats import create_writer, open_container
from dstore.ingest import ingest
from dstore.ingest.plan import stratified_order
from dstore.training.data import split_ranges
from dstore.training.holdout import check_held_out, label_distance

SELF = MPI.COMM_SELF


def class_ordered(path, classes=6, per_class=30, side=8, damaged=None):
    """A raw container written by hand in class order (class 0's samples, then class 1's...)."""
    gen = np.random.default_rng(1)
    with create_writer(
        str(path),
        encoding="raw",
        class_names=[f"c{k}" for k in range(classes)],
        raw_dtype="uint8",
        raw_shape=(side, side, 1),
    ) as w:
        for i in range(classes * per_class):
            label = i // per_class
            img = np.full((side, side, 1), 40 * label, np.uint8) + gen.integers(0, 20, (side, side, 1), dtype=np.uint8)
            w.append(img, label, f"s{i}", i, checksum=12345 if i == damaged else None)
    return str(path)


def test_stratified_order_spreads_every_class_over_any_tail():
    gen = np.random.default_rng(0)
    labels = np.repeat(np.arange(7), [300, 120, 55, 9, 200, 1, 40])  # class-ordered, unequal classes
    labels = labels[gen.permutation(labels.size)][:700]
    order = stratified_order(labels, seed=3)
    assert np.array_equal(np.sort(order), np.arange(labels.size))
    assert np.array_equal(order, stratified_order(labels, seed=3))
    assert not np.array_equal(order, stratified_order(labels, seed=4))
    counts = np.bincount(labels, minlength=7)
    for m in (1, 7, 35, 140, 351, 699):
        tail = np.bincount(labels[order][-m:], minlength=7)
        assert np.all(np.abs(tail - counts * m / labels.size) <= 2), (m, tail, counts * m / labels.size)


def test_check_held_out_refuses_a_class_ordered_tail_and_warns_on_an_unseeded_one():
    labels = np.repeat(np.arange(10), 180)  # 1,800 samples in class order, like digits sorted
    _, held = split_ranges(labels.size, 0.2)
    with pytest.raises(ConfigError, match=r"holds 2 of the 10 classes") as err:
        check_held_out("x.h5", {}, labels, held)
    assert (
        "--stratify" in str(err.value)
        and "--val" in str(err.value)
        and "not written by dstore ingest" in str(err.value)
    )
    with pytest.raises(ConfigError, match="written in source order"):
        check_held_out("x.h5", {"ingest_order": "source"}, labels, held)
    assert check_held_out("x.h5", {"ingest_order": "seeded"}, labels, held) is None  # the tail is the ingest's draw
    assert check_held_out("x.h5", {}, labels, None) is None
    mixed = labels[np.random.default_rng(0).permutation(labels.size)]
    warning = check_held_out("x.h5", {}, mixed, held)
    assert held is not None and warning is not None
    assert warning.startswith("WARNING") and "--stratify" in warning
    assert label_distance(mixed, held)[0] < 0.1 < 0.7 < label_distance(labels, held)[0]


def test_container_reingests_stratified_byte_for_byte(tmp_path):
    src = class_ordered(tmp_path / "ordered.h5")
    report = ingest(src, str(tmp_path / "strat.zarr"), fmt="zarr", comm=SELF, progress=False, stratify=True, seed=2)
    assert report.samples == 180
    with open_container(src) as a, open_container(str(tmp_path / "strat.zarr")) as b:
        assert b.info.extra["ingest_order"] == "stratified" and b.info.class_names == a.info.class_names
        originals = {a.name(j): (bytes(a.sample(j)[0]), a.sample(j)[1]) for j in range(a.num_samples)}
        for j in range(b.num_samples):
            assert (bytes(b.sample(j)[0]), b.sample(j)[1]) == originals[b.name(j)]
        _, held = split_ranges(b.num_samples, 0.2)
        assert held is not None  # a 0.2 holdout
        assert np.all(np.abs(np.bincount(b.labels[held[0] :], minlength=6) - 6) <= 1)  # 36 held: 6 of each class
        assert check_held_out("strat.zarr", b.info.extra, b.labels, held) is None
    with pytest.raises(ConfigError, match="exclude each other"):
        ingest(src, str(tmp_path / "x.h5"), comm=SELF, progress=False, stratify=True, keep_order=True)
    bad = class_ordered(tmp_path / "bad.h5", damaged=17)
    with pytest.raises(SampleError, match=r"bad.h5\[17\] \(s17\): checksum mismatch"):
        ingest(bad, str(tmp_path / "y.h5"), comm=SELF, progress=False)
    report = ingest(bad, str(tmp_path / "y.h5"), comm=SELF, progress=False, on_error="skip")
    assert report.samples == 179 and "s17" in report.skipped[0][0]


@pytest.mark.mpi
def test_train_catches_a_class_ordered_container_and_trains_after_a_reingest(tmp_path):
    src = class_ordered(tmp_path / "ordered.h5", classes=4, per_class=40)
    common = ["--epochs", "1", "--batch-size", "16", "--model", "small_cnn", "--no-progress"]
    res = run_mpi(2, ["dstore", "train", src, "--run-dir", str(tmp_path / "r1"), *common], timeout=120, check=False)
    assert res.returncode != 0 and "holds 1 of the 4 classes" in res.stderr and "--stratify" in res.stderr, res.stderr
    assert not (tmp_path / "r1" / "metrics.jsonl").exists()
    run_mpi(2, ["dstore", "ingest", src, str(tmp_path / "s.h5"), "--stratify", "--no-progress"], timeout=120)
    res = run_mpi(
        2, ["dstore", "train", str(tmp_path / "s.h5"), "--run-dir", str(tmp_path / "r2"), *common], timeout=120
    )
    assert "WARNING" not in res.stderr
    records = [json.loads(line) for line in (tmp_path / "r2" / "metrics.jsonl").read_text().splitlines()]
    assert any("val_accuracy" in r for r in records), records
