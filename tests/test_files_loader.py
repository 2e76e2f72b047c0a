"""`dstore train --loader files`: the DataLoader-over-an-image-folder baseline inside the trainer. It
reads each sample from the file the container was ingested from, in the container's order and
split, so training on it equals training on the store batch for batch; files that are missing or
differ from the container are named."""

import json
import os
import re
import shutil

import numpy as np
import pytest
from mpi4py import MPI
from support.mpirun import run_mpi

from dstore.errors import ChecksumError, ConfigError, FormatError
from dstore.formats import open_container
from dstore.ingest import ingest
from dstore.ingest.synthetic import generate_image_folder
from dstore.training.config import TrainConfig
from dstore.training.data import FilesSource
from dstore.training.metrics import read_jsonl


@pytest.fixture(scope="module")
def folder_and_container(tmp_path_factory):
    root = tmp_path_factory.mktemp("files")
    folder = str(root / "images")
    generate_image_folder(folder, 48, seed=2, num_classes=3, mean_bytes=3_000, min_side=40, max_side=56)
    path = str(root / "c.h5")
    ingest(folder, path, progress=False)
    return folder, path


def _source(path, **kw):
    return FilesSource(MPI.COMM_SELF, open_container(path), batch_size=10, seed=4, **kw)


def test_batches_hold_the_files_bytes_in_the_containers_order(folder_and_container):
    folder, path = folder_and_container
    reader = open_container(path)
    files = _source(path, read_threads=3)
    assert files.root == folder  # the container's source attribute
    seen = []
    with files:
        for batch in files.epoch(0):
            for i, data, label in zip(batch.ids.tolist(), batch.samples, batch.labels.tolist()):
                want, want_label = reader.sample(i)
                assert np.array_equal(data, want) and label == want_label
                seen.append(i)
    assert sorted(seen) == list(range(48))
    assert files.stats["samples_read"] == 48 and files.stats["bytes_read"] == reader.total_bytes


def test_missing_root_changed_bytes_and_a_vanished_file_are_named(folder_and_container, tmp_path):
    folder, path = folder_and_container
    with pytest.raises(ConfigError, match="--files-root"):
        _source(path, root=str(tmp_path / "nowhere"))
    copy = str(tmp_path / "copy")
    shutil.copytree(folder, copy)
    first = open_container(path).name(0)
    with open(os.path.join(copy, first), "ab") as fh:
        fh.write(b"\0")
    with pytest.raises(ChecksumError, match="does not hold the bytes of sample 0"):
        _source(path, root=copy)
    os.truncate(os.path.join(copy, first), os.path.getsize(os.path.join(folder, first)))
    src = _source(path, root=copy)
    victim = open_container(path).name(1)
    os.remove(os.path.join(copy, victim))
    with src, pytest.raises(ConfigError, match=f"cannot read sample 1's file .*{re.escape(victim)}"):
        for _ in src.epoch(0):
            pass


def test_every_files_bytes_are_checked_not_only_the_first(folder_and_container, tmp_path):
    # A source file replaced after the ingest by another of the same size: served silently before
    # (only sample 0 was compared); now its batch fails naming the file.
    folder, path = folder_and_container
    copy = str(tmp_path / "copy")
    shutil.copytree(folder, copy)
    reader = open_container(path)
    victim = reader.name(17)
    with open(os.path.join(copy, victim), "r+b") as fh:
        fh.seek(100)
        fh.write(b"\x00\x01\x02")
    with (
        _source(path, root=copy) as src,
        pytest.raises(
            ChecksumError, match=f"{re.escape(os.path.join(copy, victim))} does not hold the bytes of sample 17"
        ),
    ):
        for _ in src.epoch(0):
            pass


@pytest.mark.parametrize("bad", ["../outside.jpg", "/abs/outside.jpg", "sub/../../outside.jpg"])
def test_names_that_lead_outside_the_files_root_are_refused(tmp_path, bad):
    from dstore.formats import create_writer

    root = tmp_path / "root"
    root.mkdir()
    data = b"\xff\xd8" + bytes(range(200))
    (root / "in.jpg").write_bytes(data)
    (tmp_path / "outside.jpg").write_bytes(data)  # readable, with the right bytes: only the name is wrong
    path = str(tmp_path / "c.h5")
    with create_writer(path, "hdf5", encoding="jpeg", class_names=["a", "b"], source=str(root)) as w:
        w.append(data, 0, "in.jpg", 0)
        w.append(data, 1, bad, 1)
    with (
        _source(path) as src,
        pytest.raises(
            ConfigError, match=f"sample 1 of .* is named '{re.escape(bad)}', which leads outside the files root"
        ),
    ):
        for _ in src.epoch(0):
            pass


def test_the_direct_loader_checks_the_bytes_it_reads(folder_and_container, tmp_path):
    from dstore.training.data import DirectSource

    _, path = folder_and_container
    copy = str(tmp_path / "c.h5")
    shutil.copyfile(path, copy)
    reader = open_container(copy)
    sample = reader.sample(5)[0].tobytes()
    with open(copy, "r+b") as fh:
        pos = fh.read().find(sample)
        fh.seek(pos + 50)
        fh.write(b"\x00\x00\x00")
    src = DirectSource(MPI.COMM_SELF, reader, batch_size=10, seed=4)
    with pytest.raises(FormatError, match=f"{re.escape(copy)}: .*1 sample.* do not match their checksums: 5 "):
        for _ in src.epoch(0):
            pass


def test_config_checks_name_the_flags():
    TrainConfig(data="x.h5", loader="files", files_root="/x", read_threads=2).check()
    with pytest.raises(ConfigError, match="--files-root.*--loader files"):
        TrainConfig(data="x.h5", files_root="/x").check()
    with pytest.raises(ConfigError, match="--read-threads"):
        TrainConfig(data="x.h5", loader="files", read_threads=0).check()
    with pytest.raises(ConfigError, match="shuffle='global'"):
        TrainConfig(data="x.h5", loader="files", shuffle="local").check()


@pytest.mark.mpi
def test_training_on_the_files_equals_training_on_the_store(folder_and_container, tmp_path):
    _, path = folder_and_container
    common = [
        "--epochs",
        "1",
        "--batch-size",
        "8",
        "--seed",
        "1",
        "--deterministic",
        "--log-batches",
        "--no-progress",
        "--image-size",
        "32",
    ]
    runs = {}
    for loader in ("store", "files"):
        run_dir = tmp_path / loader
        run_mpi(2, ["dstore", "train", path, "--loader", loader, "--run-dir", str(run_dir)] + common, timeout=180)
        epochs = [r for r in read_jsonl(run_dir / "metrics.jsonl") if "epoch" in r]
        batches = [(run_dir / f"batches.rank{r}.jsonl").read_text() for r in (0, 1)]
        runs[loader] = ([(e["train_loss"], e["val_loss"]) for e in epochs], batches, run_dir)
    assert runs["files"][0] == runs["store"][0]  # the same bytes in the same order: the same losses
    assert runs["files"][1] == runs["store"][1]
    assert json.loads((runs["files"][2] / "config.json").read_text())["config"]["loader"] == "files"
