"""`dstore train` before its first step and across its runs in one directory: a preemption signal
during start-up exits 75 saying "no step yet" (the handlers are installed first thing); a new run
in a directory holding a run is refused unless --overwrite; --resume takes the run's own
config.json as its defaults, refuses every disagreeing flag at once, and keeps config.json true."""

import json
import os
import subprocess
import sys

import pytest
from support.formats import raw_container
from support.mpirun import REPO

from dstore.runtime.preemption import PREEMPTED_EXIT

SIGNALLING_FACTORY = '''
import os, signal
from torch import nn

def signals_itself(in_channels, num_classes, image_size):
    """Sends this process SIGTERM while the run starts up (its model is built before any step)."""
    os.kill(os.getpid(), signal.SIGTERM)
    return nn.Sequential(nn.Flatten(), nn.Linear(in_channels * image_size[0] * image_size[1], num_classes))
'''


def dstore(*argv, env=None, timeout=120):
    return subprocess.run(
        [sys.executable, "-m", "dstore.tools", *map(str, argv)],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
        env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})},
    )


@pytest.fixture(scope="module")
def container(tmp_path_factory):
    return raw_container(tmp_path_factory.mktemp("startup") / "c.h5", n=48, shape=(6, 6, 1), classes=3)


def test_a_signal_during_start_up_exits_75_saying_no_step_yet(container, tmp_path):
    (tmp_path / "sig_models.py").write_text(SIGNALLING_FACTORY)
    run_dir = tmp_path / "run"
    res = dstore(
        "train",
        container,
        "--model",
        "sig_models:signals_itself",
        "--epochs",
        "1",
        "--batch-size",
        "8",
        "--run-dir",
        run_dir,
        env={"PYTHONPATH": str(tmp_path)},
    )
    assert res.returncode == PREEMPTED_EXIT, (res.returncode, res.stdout, res.stderr)
    assert "stopped by SIGTERM during start-up, no step yet: no checkpoint written" in res.stdout, res.stdout
    assert not (run_dir / "checkpoint.pt").exists()


# ------------------------------------------------------------------ one run per run directory
@pytest.fixture()
def run(container, tmp_path):
    """run(**config) -> (train()'s result, the lines it reported), in-process on COMM_SELF."""
    from mpi4py import MPI

    from dstore.training.run import TrainConfig, train

    def go(**kw):
        lines = []
        kw = {
            "epochs": 1,
            "batch_size": 8,
            "runs_root": str(tmp_path / "runs"),
            "progress": False,
            "holdout": 0.25,
            **kw,
        }
        return train(TrainConfig(data=container, **kw), MPI.COMM_SELF, say=lines.append), lines

    return go


def _snapshot(folder):
    return {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}


def _epochs(run_dir):
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r["epoch"] for r in records if "epoch" in r and not r.get("final")]


def test_a_new_run_in_a_finished_runs_dir_is_refused_and_overwrite_starts_clean(run, tmp_path):
    from dstore.errors import ConfigError

    rd = tmp_path / "r"
    run(run_dir=str(rd))
    before = _snapshot(rd)
    with pytest.raises(
        ConfigError,
        match=r"already holds a run \(checkpoint.pt, config.json, metrics.csv, "
        r"metrics.jsonl\).*--resume auto to continue it, --overwrite to start "
        r"again",
    ) as err:
        run(run_dir=str(rd))
    assert str(rd) in str(err.value) and "\n" not in str(err.value)
    assert _snapshot(rd) == before  # nothing overwritten, nothing appended
    _, lines = run(run_dir=str(rd), overwrite=True, seed=5)
    assert any(
        f"{rd}: started again, the earlier run's checkpoint.pt, config.json, metrics.csv, metrics.jsonl removed" in line
        for line in lines
    ), lines
    assert _epochs(rd) == [0]  # one run's records, not two
    assert json.loads((rd / "config.json").read_text())["config"]["seed"] == 5
    with pytest.raises(ConfigError, match="--overwrite starts the run again, --resume auto continues it"):
        run(run_dir=str(rd), overwrite=True, resume="auto")


def test_a_partial_run_is_refused_too_and_resume_auto_without_a_checkpoint_starts_it_again(run, tmp_path):
    from dstore.errors import ConfigError
    from dstore.training.rundir import MARKER

    rd = tmp_path / "partial"  # a run killed before its first checkpoint: its config and a metrics line
    rd.mkdir()
    (rd / MARKER).write_text("")
    (rd / "config.json").write_text('{"config": {}}')
    (rd / "metrics.jsonl").write_text('{"epoch": 0, "global_st')
    with pytest.raises(ConfigError, match=r"already holds a run \(config.json, metrics.jsonl\)"):
        run(run_dir=str(rd))
    _, lines = run(run_dir=str(rd), resume="auto")
    assert any("the earlier run's config.json, metrics.jsonl removed" in line for line in lines), lines
    assert _epochs(rd) == [0]


# ------------------------------------------------------------------ resume: what may change, and config.json
def test_resume_refuses_every_changed_input_flag_at_once_and_says_each_allowed_change(run, tmp_path):
    from dstore.errors import ConfigError

    rd = tmp_path / "r"
    run(run_dir=str(rd), epochs=2, stop_after_steps=1)
    before = _snapshot(rd)
    with pytest.raises(ConfigError) as err:
        run(run_dir=str(rd), epochs=2, resume="auto", image_size=(8, 8), augment="on", channels=3, lr=0.1)
    msg = str(err.value)
    for part in (
        "--image-size (not given) (this run: 8x8; it fixes the model and its input)",
        "--augment auto (this run: on;",
        "--channels (not given) (this run: 3;",
        "--lr 0.003 (this run: 0.1; it fixes the learning rate)",
    ):
        assert part in msg, msg
    assert "\n" not in msg and _snapshot(rd) == before
    result, lines = run(run_dir=str(rd), epochs=3, resume="auto", decode_threads=1, checkpoint_every=2)
    assert any("changed on resume: --decode-threads 2 -> 1, --checkpoint-every 0 -> 2" in line for line in lines), lines
    now = json.loads((rd / "config.json").read_text())["config"]  # config.json: what runs now
    assert (now["epochs"], now["decode_threads"], now["checkpoint_every"]) == (3, 1, 2)
    history = [json.loads(line) for line in (rd / "resumes.jsonl").read_text().splitlines()]
    assert history[-1]["changes"]["decode_threads"] == [2, 1]


def test_resume_takes_the_runs_own_config_as_its_defaults(run, tmp_path, capsys, monkeypatch, container):
    from dstore.tools.cli import main

    rd = tmp_path / "r"
    run(run_dir=str(rd), epochs=2, batch_size=16, lr=0.01, optimizer="sgd", holdout=0.5, stop_after_steps=1)
    capsys.readouterr()
    assert main(["train", "--resume", "auto", "--run-dir", str(rd), "--print-config"]) == 0
    out = capsys.readouterr()
    cfg = json.loads(out.out)["config"]
    assert (cfg["data"], cfg["epochs"], cfg["batch_size"], cfg["lr"], cfg["optimizer"], cfg["holdout"]) == (
        container,
        2,
        16,
        0.01,
        "sgd",
        0.5,
    )
    assert cfg["stop_after_steps"] == 0 and cfg["run_dir"] == str(rd)  # of this invocation only
    assert f"the flags not given are the run's own, from {rd}/config.json" in out.err
    assert main(["train", "--resume", "auto", "--run-dir", str(rd), "--epochs", "4", "--print-config"]) == 0
    assert json.loads(capsys.readouterr().out)["config"]["epochs"] == 4  # a flag given wins
    code = main(
        [
            "train",
            "--resume",
            "auto",
            "--run-dir",
            str(rd),
            "--batch-size",
            "8",
            "--lr",
            "0.5",
            "--optimizer",
            "adam",
            "--no-progress",
        ]
    )
    err = capsys.readouterr().err
    assert code != 0
    (line,) = [ln for ln in err.splitlines() if "ConfigError" in ln]
    for part in ("--batch-size 16 (this run: 8;", "--lr 0.01 (this run: 0.5;", "--optimizer sgd (this run: adam;"):
        assert part in line, line
    assert main(["train", "--resume", "auto", "--run-dir", str(rd), "--no-progress"]) == 0
    assert _epochs(rd) == [0, 1]


# ------------------------------------------------------------------ the heartbeat of a batch log
def test_a_heartbeat_line_comes_after_every_silence_and_says_the_phase_and_step():
    from dstore.training.heartbeat import Heartbeat

    now = [100.0]
    lines = []
    beat = Heartbeat(lines.append, every=20, clock=lambda: now[0])
    now[0] = 119.0
    assert beat.line(now[0]) is None  # less than 20 s of silence
    beat.phase("start-up: populating the store", "1000 training samples")
    now[0] = 125.0
    beat.tick()
    assert lines == ["[heartbeat] start-up: populating the store: 1000 training samples, 6.00 s in it"]
    now[0] = 130.0
    beat.say("epoch 0: loss 1.0")  # a line of the run's: the silence starts again
    beat.phase("epoch 1")
    beat.progress("step 7/50")
    now[0] = 149.0
    beat.tick()
    now[0] = 150.0
    beat.tick()
    assert lines[1:] == ["epoch 0: loss 1.0", "[heartbeat] epoch 1: step 7/50, 20.0 s in it"]
    off = Heartbeat(lines.append, every=0)
    assert off.line(1e9) is None and not off.enabled


def test_a_run_writing_to_a_file_gets_heartbeat_lines_and_no_carriage_returns(run, tmp_path):
    result, lines = run(run_dir=str(tmp_path / "r"), epochs=2, heartbeat=0.01)
    beats = [line for line in lines if line.startswith("[heartbeat] ")]
    assert beats and all(line.endswith(" in it") and "\n" not in line for line in beats), beats
    assert any(line.startswith(("[heartbeat] epoch ", "[heartbeat] start-up: ")) for line in beats), beats
    assert not any("\r" in line for line in lines)
    quiet = run(run_dir=str(tmp_path / "q"), heartbeat=0)[1]
    assert not any(line.startswith("[heartbeat]") for line in quiet)


def test_a_checkpoint_of_another_run_is_not_resumed_into_a_dir_holding_a_run(run, tmp_path):
    from dstore.errors import ConfigError

    a, b = tmp_path / "a", tmp_path / "b"
    run(run_dir=str(a), stop_after_steps=1)
    run(run_dir=str(b))
    before = _snapshot(b)
    with pytest.raises(ConfigError, match=r"already holds a run"):
        run(run_dir=str(b), resume=str(a / "checkpoint.pt"))
    assert _snapshot(b) == before
    result, _ = run(run_dir=str(tmp_path / "c"), resume=str(a / "checkpoint.pt"))  # into a new dir: continued
    assert not result["stopped_early"]


@pytest.mark.mpi
def test_an_ltfb_job_resumes_from_its_own_config_json_alone(container, tmp_path):
    from support.mpirun import run_mpi

    job = tmp_path / "job"
    run_mpi(
        2,
        [
            "dstore",
            "train",
            container,
            "--trainers",
            "2",
            "--epochs",
            "2",
            "--batch-size",
            "4",
            "--lr",
            "0.01",
            "--holdout",
            "0.25",
            "--no-progress",
            "--stop-after-steps",
            "2",
            "--run-dir",
            str(job),
        ],
        timeout=150,
    )
    assert json.loads((job / "config.json").read_text())["config"]["trainers"] == 2  # the job's own
    res = run_mpi(2, ["dstore", "train", "--resume", "auto", "--run-dir", str(job), "--no-progress"], timeout=150)
    assert f"the flags not given are the run's own, from {job}/config.json" in res.stdout, res.stdout
    assert "resumed from" in res.stdout and "best: trainer" in res.stdout, res.stdout
