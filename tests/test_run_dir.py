"""A run directory belongs to one job at a time and never to a user's folder; resume states what it
restores and refuses, or applies, changed flags (issue 19: failures 4, 5 and 6). In-process on
COMM_SELF: the CLI calls the same train()."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys

import numpy as np
import pytest
from support.fixtures import tmpfs
from support.formats import raw_container

from dstore.errors import ConfigError
from dstore.formats import create_writer
from dstore.training.rundir import MARKER


def _container(path, n=64, seed=0):
    return raw_container(path, n=n, seed=seed)


@pytest.fixture()
def run(tmp_path):
    """run(**config) -> (train()'s result, the lines it reported), on a small raw container."""
    from mpi4py import MPI

    from dstore.training.run import TrainConfig, train

    data = _container(tmp_path / "d.h5")

    def go(**kw):
        lines = []
        kw = {
            "epochs": 1,
            "batch_size": 16,
            "runs_root": str(tmp_path / "runs"),
            "progress": False,
            "holdout": 0.25,
            **kw,
        }
        return train(TrainConfig(data=data, **kw), MPI.COMM_SELF, say=lines.append), lines

    return go


def _snapshot(folder):
    return {p.name: p.read_bytes() for p in folder.iterdir()}


# ------------------------------------------------------------------ failure 4: two jobs, one run dir
def test_a_second_job_in_a_held_run_dir_is_refused_and_the_hold_dies_with_the_job(run, tmp_path):
    held = tmp_path / "held"
    # the other job, as dstore train holds a run dir: an exclusive flock on its marker
    code = (
        "import fcntl, os, sys, time; os.makedirs(sys.argv[1]); f = open(os.path.join(sys.argv[1], sys.argv[2]), "
        "'a'); fcntl.flock(f, fcntl.LOCK_EX); print('held', flush=True); time.sleep(60)"
    )
    other = subprocess.Popen([sys.executable, "-c", code, str(held), MARKER], stdout=subprocess.PIPE, text=True)
    try:
        assert other.stdout is not None  # piped
        assert other.stdout.readline().strip() == "held"
        with pytest.raises(ConfigError, match="is in use by another job now") as err:
            run(run_dir=str(held))
        assert str(held) in str(err.value) and "\n" not in str(err.value)
        assert sorted(os.listdir(held)) == [MARKER]  # nothing written beside the other job's files
    finally:
        other.send_signal(signal.SIGKILL)  # the lock goes with the process, also on kill -9
        other.wait(timeout=30)
    result, _ = run(run_dir=str(held))
    assert result["epochs"] and (held / "metrics.jsonl").exists()


# ------------------------------------------------------------------ failure 5: a user's folder
def test_a_users_folder_is_never_taken_over(run, tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "config.json").write_text('{"my": "settings"}')
    (mine / "metrics.jsonl").write_text("my line\n")
    before = _snapshot(mine)
    with pytest.raises(ConfigError, match="not made by dstore train") as err:
        run(run_dir=str(mine))
    assert str(mine) in str(err.value) and MARKER in str(err.value)
    assert _snapshot(mine) == before


def test_an_empty_folder_and_an_earlier_run_dir_are_taken(run, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    run(run_dir=str(empty), stop_after_steps=1)
    assert {MARKER, "config.json", "checkpoint.pt"} <= set(os.listdir(empty))
    result, lines = run(run_dir=str(empty), resume="auto")  # our own run dir: continued
    assert not result["stopped_early"] and any(line.startswith("resumed from") for line in lines)


@pytest.mark.parametrize("kind", ["file", "unwritable"])
def test_a_run_dir_that_is_a_file_or_unwritable_is_one_line(run, tmp_path, kind):
    with contextlib.ExitStack() as mounted:
        if kind == "file":
            target = tmp_path / "f"
            target.write_text("x")
            match = "is a file, not a directory"
        else:
            target = mounted.enter_context(tmpfs(tmp_path / "ro", "ro,size=1m")) / "run"
            match = "cannot create it: Read-only file system"
        with pytest.raises(ConfigError, match=match) as err:
            run(run_dir=str(target))
        assert str(target) in str(err.value) and "\n" not in str(err.value)


def test_a_refused_start_leaves_no_new_run_dir(run, tmp_path):
    with pytest.raises(ConfigError, match="no such checkpoint"):
        run(run_dir=str(tmp_path / "new"), resume=str(tmp_path / "missing.pt"))
    assert not (tmp_path / "new").exists()


# ------------------------------------------------------------------ failure 6: resume with other flags
def test_resume_auto_in_a_new_run_dir_starts_fresh(run, tmp_path):
    run(stop_after_steps=1)  # a checkpoint in runs/<stamp>/
    result, lines = run(run_dir=str(tmp_path / "fresh"), resume="auto")
    assert not any(line.startswith("resumed from") for line in lines), lines
    assert result["epochs"][0]["global_step"] == 3  # 48 training samples / 16: all three steps of epoch 0


def test_more_epochs_on_resume_rederive_the_schedule_and_say_so(run, tmp_path):
    rd = str(tmp_path / "r")
    run(run_dir=rd, epochs=1)
    result, lines = run(run_dir=rd, epochs=3, resume="auto")
    assert any("--epochs changed from 1 to 3" in line and "re-derived" in line for line in lines), lines
    lrs = [e["lr"] for e in result["epochs"]]
    # cosine over 3 epochs of 3 steps, at the end of epoch 1: 0.5 * (1 + cos(pi * 6 / 9)) of 3e-3
    assert lrs[0] == pytest.approx(3e-3 * 0.5 * (1 + np.cos(np.pi * 6 / 9))) and lrs[1] == pytest.approx(0.0)
    now = json.loads((tmp_path / "r" / "config.json").read_text())
    assert now["config"]["epochs"] == 3  # config.json describes what runs; resumes.jsonl the history
    (resumed,) = [json.loads(line) for line in (tmp_path / "r" / "resumes.jsonl").read_text().splitlines()]
    assert resumed["changes"] == {"epochs": [1, 3], "resume": [None, "auto"]} and resumed["epoch"] == 1


@pytest.mark.parametrize(
    "flag, field, value", [("--lr", "lr", 0.3), ("--schedule", "schedule", "step"), ("--optimizer", "optimizer", "sgd")]
)
def test_a_changed_learning_rate_or_schedule_on_resume_is_refused(run, tmp_path, flag, field, value):
    rd = tmp_path / "r"
    run(run_dir=str(rd), stop_after_steps=1)
    before = _snapshot(rd)
    with pytest.raises(
        ConfigError, match=f"made with {flag} .* \\(this run: {value}; it fixes the learning rate\\)"
    ) as err:
        run(run_dir=str(rd), resume="auto", **{field: value})
    assert "\n" not in str(err.value)
    assert _snapshot(rd) == before


def test_fewer_epochs_than_the_checkpoint_has_done_is_refused(run, tmp_path):
    rd = str(tmp_path / "r")
    run(run_dir=rd, epochs=2)
    with pytest.raises(ConfigError, match="at epoch 2, past --epochs 1"):
        run(run_dir=rd, epochs=1, resume="auto")


# ------------------------------------------------------------------ partly held: the values a run meets
def test_training_that_diverges_ends_with_a_clear_error_and_keeps_the_last_good_checkpoint(run, tmp_path):
    from dstore.training.fit import DivergedError

    rd = tmp_path / "r"
    with pytest.raises(DivergedError, match=r"training diverged: the loss of epoch 0 is (nan|inf)") as err:
        run(run_dir=str(rd), optimizer="sgd", lr=1e30, epochs=2)
    assert "--lr" in str(err.value) and "\n" not in str(err.value)
    assert not (rd / "checkpoint.pt").exists()  # no checkpoint of a diverged model


@pytest.mark.parametrize("kind", ["itself", "a copy", "another shape", "another encoding"])
def test_val_that_is_the_training_set_or_of_another_kind_is_refused(run, tmp_path, kind):
    other = tmp_path / "other.h5"
    if kind == "itself":
        other = tmp_path / "d.h5"
    elif kind == "a copy":
        other.write_bytes((tmp_path / "d.h5").read_bytes())
    else:
        with create_writer(
            str(other),
            "hdf5",
            encoding="raw" if kind == "another shape" else "png",
            class_names=["a", "b"],
            raw_dtype="uint8" if kind == "another shape" else None,
            raw_shape=(8, 8, 1) if kind == "another shape" else None,
        ) as w:
            for i in range(8):
                w.append(_png() if kind == "another encoding" else bytes(64), i % 2, f"v{i}", i)
    words = {
        "itself": "holds the same samples",
        "a copy": "holds the same samples",
        "another shape": "has sample shape (8, 8, 1) but",
        "another encoding": "has encoding 'png' but",
    }[kind]
    with pytest.raises(ConfigError, match=re.escape(words)):
        run(val=str(other))


def _png():
    import io

    from PIL import Image

    buf = io.BytesIO()
    Image.new("L", (4, 4)).save(buf, format="PNG")
    return buf.getvalue()


def test_the_digits_cache_lock_never_follows_a_symlink(tmp_path):
    from dstore.training.data import _open_cache_lock

    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "digits.h5.lock").symlink_to(victim)
    with pytest.raises(ConfigError, match="is a symbolic link"):
        _open_cache_lock(str(tmp_path / "cache" / "digits.h5.lock"))
    assert victim.read_text() == "precious"


def test_an_unusable_cache_is_one_line(tmp_path):
    from mpi4py import MPI

    from dstore.training.data import ensure_builtin

    (tmp_path / "file").write_text("x")
    with pytest.raises(ConfigError, match="the data set cache .* cannot be used") as err:
        ensure_builtin(MPI.COMM_SELF, "digits", str(tmp_path / "file" / "cache"))  # a path under a file
    assert "\n" not in str(err.value)


# ------------------------------------------------------------------ hand-edited checkpoints: one line naming the key
def _edit(ck, kind):
    import torch

    if kind == "epoch-text":
        ck["epoch"] = "one"
    elif kind == "global-step-negative":
        ck["global_step"] = -3
    elif kind == "model-list":
        ck["model"] = [1, 2]
    elif kind == "model-missing-tensor":
        ck["model"].pop(next(iter(ck["model"])))
    elif kind == "model-wrong-shape":
        key = next(iter(ck["model"]))
        ck["model"][key] = torch.zeros(3, 3, 3, 3, 3)
    elif kind == "optimizer-empty":
        ck["optimizer"] = {}
    elif kind == "scheduler-text":
        ck["scheduler"] = "cosine"
    elif kind == "scheduler-foreign":
        ck["scheduler"] = {"something": 1}
    elif kind == "store-empty":
        ck["store"] = {}
    elif kind == "store-step-past-the-epoch":
        ck["store"]["position"] = 10**6
    elif kind == "rng-empty":
        ck["rng"] = []
    elif kind == "rng-missing-state":
        ck["rng"] = [{}]
    elif kind == "config-text":
        ck["config"] = "lr=0.1"
    elif kind == "meta-container-text":
        ck["meta"]["container"] = "d.h5"
    elif kind == "step-disagrees-with-store":
        ck["step_in_epoch"] = ck["step_in_epoch"] + 1
    return ck


EDITS = {
    "epoch-text": "epoch",
    "global-step-negative": "global_step",
    "model-list": "model",
    "model-missing-tensor": "model",
    "model-wrong-shape": "model",
    "optimizer-empty": "optimizer",
    "scheduler-text": "scheduler",
    "scheduler-foreign": "scheduler",
    "store-empty": "store",
    "store-step-past-the-epoch": "store",
    "rng-empty": "rng",
    "rng-missing-state": "rng",
    "config-text": "config",
    "meta-container-text": "meta.container",
    "step-disagrees-with-store": "epoch",
}


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A real checkpoint (after one step) and the container it was made on."""
    from mpi4py import MPI

    from dstore.training.run import TrainConfig, train

    root = tmp_path_factory.mktemp("ck")
    data = _container(root / "d.h5")
    train(
        TrainConfig(data=data, epochs=1, batch_size=16, run_dir=str(root / "r"), stop_after_steps=1, progress=False),
        MPI.COMM_SELF,
        say=lambda line: None,
    )
    return root, data


@pytest.mark.parametrize("kind", sorted(EDITS))
def test_a_hand_edited_checkpoint_is_one_line_naming_the_key(saved, tmp_path, kind):
    import torch
    from mpi4py import MPI

    from dstore.training.run import TrainConfig, train

    root, data = saved
    path = tmp_path / "edited.pt"
    torch.save(_edit(torch.load(root / "r" / "checkpoint.pt", weights_only=True), kind), path)
    with pytest.raises(ConfigError) as err:
        train(
            TrainConfig(
                data=data, epochs=1, batch_size=16, run_dir=str(tmp_path / "r"), resume=str(path), progress=False
            ),
            MPI.COMM_SELF,
            say=lambda line: None,
        )
    text = str(err.value)
    assert str(path) in text and f"'{EDITS[kind]}'" in text and "\n" not in text, text


@pytest.mark.mpi
def test_two_ranks_refuse_a_held_run_dir_together(tmp_path):
    """Rank 0 takes the claim; its refusal ends both ranks with its one line, never a hang."""
    from support.mpirun import run_mpi

    data = _container(tmp_path / "d.h5")
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("mine")
    res = run_mpi(
        2, ["dstore", "train", data, "--run-dir", str(mine), "--epochs", "1", "--no-progress"], timeout=120, check=False
    )
    assert res.returncode != 0, res.stdout
    assert "not made by dstore train" in res.stderr and "Traceback" not in res.stderr, res.stderr
    assert sorted(os.listdir(mine)) == ["notes.txt"]


def test_a_full_disk_while_checkpointing_is_one_line_and_keeps_the_earlier_checkpoint(tmp_path):
    import torch

    from dstore.errors import OutputError
    from dstore.training.checkpoint import load_checkpoint, save_checkpoint

    with tmpfs(tmp_path / "tiny", "size=200k") as tiny:
        path = tiny / "checkpoint.pt"
        save_checkpoint(path, {"epoch": 1, "w": torch.zeros(10)})
        with pytest.raises(OutputError, match=r"No space left on device.*; the checkpoint there before is kept") as err:
            save_checkpoint(path, {"epoch": 2, "w": torch.zeros(1_000_000)})
        assert str(path) in str(err.value) and "\n" not in str(err.value)
        assert load_checkpoint(path)["epoch"] == 1 and os.listdir(tiny) == ["checkpoint.pt"]
