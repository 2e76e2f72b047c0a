"""How dstore fits batch jobs and launchers: plain logs (no progress frames unless asked), one copy of
an error per job, a closed stdout ending quietly, a clear refusal under torchrun-like launchers, and
resumption refused on another container."""

import json
import os
import subprocess
import sys

import pytest
from support.formats import raw_container
from support.mpirun import REPO, run_mpi

from dstore.training.dist import launcher_mismatch


def _env(**extra):
    env = dict(os.environ)
    for var in (
        "WORLD_SIZE",
        "LOCAL_WORLD_SIZE",
        "SLURM_STEP_NUM_TASKS",
        "OMPI_COMM_WORLD_SIZE",
        "PMI_SIZE",
        "RANK",
        "SLURM_PROCID",
    ):
        env.pop(var, None)
    env.update(extra)
    return env


def _container(path, n=40, seed=0):
    return raw_container(path, n=n, seed=seed)


# ------------------------------------------------------------------ batch logs
@pytest.mark.mpi
def test_default_run_leaves_a_plain_small_log(tmp_path, cache):
    """`mpiexec -n 2 dstore train > log 2>&1`: stdout and stderr both pipes, no flags."""
    res = run_mpi(2, ["dstore", "train"], timeout=180, cwd=tmp_path, env={"DSTORE_CACHE": str(cache)}, keep_cr=True)
    log = res.stdout + res.stderr
    assert "\r" not in log, repr(log[:500])
    assert "test accuracy:" in log, log
    assert len(log.encode()) < 5000, (len(log.encode()), log)
    assert all(line.isprintable() for line in log.splitlines()), log


# ------------------------------------------------------------------ errors
FAIL = (
    "import sys\n"
    "from mpi4py import MPI\n"
    "from dstore.tools.cli import abort_on_error\n"
    "from dstore.errors import ConfigError\n"
    "def work():\n"
    "    if MPI.COMM_WORLD.rank in {int(r) for r in sys.argv[1].split(',')}:\n"
    "        raise ConfigError('epochs=0 must be >= 1')\n"
    "    MPI.COMM_WORLD.Barrier()\n"
    "sys.exit(abort_on_error(work))\n"
)


@pytest.mark.mpi
@pytest.mark.parametrize("failing, printer", [("0,1,2", 0), ("1,2", 1)])
def test_one_copy_of_an_error_per_job(tmp_path, failing, printer):
    script = tmp_path / "fail.py"
    script.write_text(FAIL)
    res = run_mpi(3, ["python", str(script), failing], timeout=60, check=False)
    assert res.returncode != 0
    copies = [line for line in res.stderr.splitlines() if line.startswith("dstore: error")]
    assert copies == [f"dstore: error on rank {printer}/3: ConfigError: epochs=0 must be >= 1"], res.stderr


@pytest.mark.mpi
def test_info_under_mpiexec_prints_once_per_job(tmp_path):
    """`info` is not collective: under `mpiexec -n 2` rank 0 alone prints (it printed once per rank),
    and its error ends the job as one copy."""
    path = _container(tmp_path / "c.h5")
    res = run_mpi(2, ["dstore", "info", path])
    assert res.stdout.count("encoding") == 1 and "samples" in res.stdout, res.stdout
    res = run_mpi(2, ["dstore", "info", "--json", path])
    assert json.loads(res.stdout)["num_samples"] == 40, res.stdout  # one JSON document, not two
    missing = str(tmp_path / "nope.h5")
    res = run_mpi(2, ["dstore", "info", missing], check=False)
    copies = [line for line in res.stderr.splitlines() if line.startswith("dstore: error")]
    assert res.returncode != 0 and len(copies) == 1 and missing in copies[0], (res.returncode, res.stderr)
    assert res.stdout == "", res.stdout


def test_closed_stdout_ends_quietly(tmp_path):
    """`dstore info --json X | head -1`: the reader is gone before dstore writes."""
    path = _container(tmp_path / "c.h5")
    proc = subprocess.Popen(
        [sys.executable, "-m", "dstore.tools", "info", "--json", path],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=_env(),
        cwd=REPO,
    )
    assert proc.stdout is not None and proc.stderr is not None  # piped
    proc.stdout.close()  # as `head` does after its line
    err = proc.stderr.read().decode()
    code = proc.wait(timeout=60)
    assert "Traceback" not in err and "BrokenPipe" not in err, err
    assert err == "", err
    assert code == 141


# ------------------------------------------------------------------ launchers
def test_launcher_mismatch_names_the_launcher():
    assert launcher_mismatch({}, 1) is None
    assert launcher_mismatch({"WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1"}, 1) is None
    assert launcher_mismatch({"WORLD_SIZE": "4"}, 4) is None  # mpiexec under a torch env: sizes agree
    msg = launcher_mismatch({"WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2"}, 1)
    assert msg is not None and "torchrun" in msg and "mpiexec -n 2" in msg and "srun" in msg
    msg = launcher_mismatch({"SLURM_STEP_NUM_TASKS": "8"}, 1)
    assert msg is not None and "srun" in msg and "--mpi=pmi2" in msg and "mpiexec -n 8" in msg


@pytest.mark.parametrize("rank, prints", [("0", True), ("1", False)])
def test_torchrun_is_refused_once(tmp_path, rank, prints):
    """What each of torchrun's processes sees: WORLD_SIZE=2 and an MPI world of one."""
    env = _env(WORLD_SIZE="2", LOCAL_WORLD_SIZE="2", RANK=rank, LOCAL_RANK=rank, DSTORE_CACHE=str(tmp_path))
    res = subprocess.run(
        [sys.executable, "-m", "dstore.tools", "train", "--run-dir", str(tmp_path / "run")],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=120,
    )
    assert res.returncode == 2, res.stdout + res.stderr
    assert not (tmp_path / "run").exists() and not (tmp_path / "digits.h5").exists()
    if prints:
        assert "torchrun" in res.stderr and "mpiexec -n 2" in res.stderr and "srun" in res.stderr, res.stderr
        assert res.stderr.count("dstore: error") == 1
    else:
        assert res.stderr == "", res.stderr


# ------------------------------------------------------------------ resume safety
def test_resume_on_another_container_of_the_same_size_is_refused(tmp_path):
    """In-process on COMM_SELF (the CLI path is the same train() call)."""
    from mpi4py import MPI

    from dstore.errors import ConfigError
    from dstore.formats import open_container
    from dstore.training.run import TrainConfig, train

    def run(data, **kw):
        cfg = TrainConfig(data=data, epochs=2, batch_size=16, runs_root=str(tmp_path / "runs"), progress=False, **kw)
        return train(cfg, MPI.COMM_SELF, say=lines.append)

    lines = []
    # Same sample count, same sizes (so the same total bytes), other bytes.
    a, b = _container(tmp_path / "a.h5", n=80, seed=0), _container(tmp_path / "b.h5", n=80, seed=1)
    with open_container(a) as ra, open_container(b) as rb:
        assert (ra.num_samples, ra.total_bytes) == (rb.num_samples, rb.total_bytes)
    assert run(a, stop_after_steps=3)["stopped_early"]
    (run_dir,) = (tmp_path / "runs").iterdir()
    before = {p.name: p.read_bytes() for p in run_dir.iterdir()}

    with pytest.raises(ConfigError, match="cannot resume") as err:
        run(b, resume="auto")  # auto: the newest runs/*/checkpoint.pt, made on a.h5
    assert a in str(err.value) and b in str(err.value) and "checksums_sha256" in str(err.value)
    assert {p.name: p.read_bytes() for p in run_dir.iterdir()} == before  # nothing appended or rewritten

    moved = str(tmp_path / "moved.h5")  # the same container under another name resumes
    os.rename(a, moved)
    lines.clear()
    assert not run(moved, resume="auto")["stopped_early"]
    assert any(line.startswith("resumed from") for line in lines), lines


# ------------------------------------------------------------------ memory budget under cgroups
def _write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_default_budget_honours_cgroup_v2_and_v1_limits(tmp_path, monkeypatch):
    from dstore.memory import limits as memory

    # v2: a Slurm-like job cgroup with a 2 GiB cap above the step's own (unlimited) cgroup.
    v2 = tmp_path / "v2"
    _write(v2 / "cgroup.controllers", "memory\n")
    _write(v2 / "slurm/job_7/memory.max", str(2 << 30))
    _write(v2 / "slurm/job_7/memory.current", str(512 << 20))
    _write(v2 / "slurm/job_7/memory.stat", f"anon 1\ninactive_file {256 << 20}\n")
    _write(v2 / "slurm/job_7/step_0/memory.max", "max\n")
    _write(tmp_path / "cg2", "0::/slurm/job_7/step_0\n")
    got = memory.cgroup_headroom(str(tmp_path / "cg2"), str(v2))
    assert got is not None
    free, where = got
    assert free == (2 << 30) - (512 << 20) + (256 << 20) and "job_7" in where

    # v1: the memory controller's own hierarchy; "no limit" is a huge number.
    v1 = tmp_path / "v1"
    _write(v1 / "memory/job/memory.limit_in_bytes", str(1 << 30))
    _write(v1 / "memory/job/memory.usage_in_bytes", str(100 << 20))
    _write(v1 / "memory/memory.limit_in_bytes", "9223372036854771712\n")
    _write(tmp_path / "cg1", "9:pids:/\n4:memory:/job\n")
    got = memory.cgroup_headroom(str(tmp_path / "cg1"), str(v1))
    assert got is not None and got[0] == (1 << 30) - (100 << 20)
    _write(tmp_path / "none", "4:memory:/\n")
    assert memory.cgroup_headroom(str(tmp_path / "none"), str(v1 / "nothing")) is None

    monkeypatch.delenv(memory.ENV_VAR, raising=False)
    monkeypatch.setattr(memory, "PROC_CGROUP", str(tmp_path / "cg1"))
    monkeypatch.setattr(memory, "CGROUP_ROOT", str(v1))
    budget, source = memory.default_budget(2)
    assert budget == int(((1 << 30) - (100 << 20)) * memory.SAFE_FRACTION) // 2, source
    assert "cgroup" in source


# ------------------------------------------------------------------ flags
def _subparsers():
    import argparse

    from dstore.tools.cli import build_parser

    parser = build_parser()
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return parser, sub.choices


def test_help_states_every_options_default():
    _, commands = _subparsers()
    missing = []
    for name, sp in commands.items():
        fmt = sp._get_formatter()
        for action in sp._actions:
            if not action.option_strings or action.nargs == 0:
                continue  # positionals and on/off flags
            if "default" not in fmt._get_help_string(action):
                missing.append(f"{name} {action.option_strings[0]}")
    assert not missing, missing


def test_memory_budget_takes_units_and_threads_have_one_name():
    parser, _ = _subparsers()
    assert parser.parse_args(["train", "--memory-budget", "8G"]).memory_budget == 8 * 10**9
    assert parser.parse_args(["train", "--memory-budget", "512MiB"]).memory_budget == 512 * 2**20
    with pytest.raises(SystemExit):
        parser.parse_args(["train", "--memory-budget", "lots"])
    assert parser.parse_args(["train", "--decode-threads", "3"]).decode_threads == 3
    with pytest.warns(FutureWarning, match="--decode-threads"):
        assert parser.parse_args(["train", "--threads", "5"]).decode_threads == 5


def test_every_command_summary_has_json():
    _, commands = _subparsers()
    # bench writes results.json, pfs --stats-json and plot a PNG: their summaries are files already;
    # cluster's summary is `dstore cluster status --json` (its other actions change the machine).
    without = [
        name
        for name, sp in commands.items()
        if "--json" not in sp._option_string_actions and name not in ("bench", "pfs", "plot", "cluster")
    ]
    assert not without, without


def test_train_and_verify_json(tmp_path):
    import json

    path = _container(tmp_path / "c.h5", n=60)
    res = subprocess.run(
        [sys.executable, "-m", "dstore.tools", "verify", "--json", path],
        capture_output=True,
        text=True,
        env=_env(),
        cwd=tmp_path,
        timeout=60,
    )
    rep = json.loads(res.stdout)
    assert rep["ok"] is True and rep["num_samples"] == 60, res.stdout
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "dstore.tools",
            "train",
            path,
            "--epochs",
            "1",
            "--json",
            "--batch-size",
            "16",
            "--run-dir",
            str(tmp_path / "run"),
        ],
        capture_output=True,
        text=True,
        env=_env(),
        cwd=tmp_path,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr
    summary = json.loads(res.stdout)  # stdout is the JSON object alone; the progress lines went to stderr
    assert summary["run_dir"] == str(tmp_path / "run") and len(summary["epochs"]) == 1
    assert summary["test"]["samples"] == 12 and "epoch 0:" in res.stderr


def test_progress_bar_only_on_a_terminal_unless_asked(monkeypatch):
    from dstore.training import console

    monkeypatch.setattr(console, "stderr_is_terminal", lambda: False)  # as under `> log 2>&1` or mpiexec
    assert console.progress_bar(None, True, 10, 0) is None
    assert console.progress_bar(False, True, 10, 0) is None
    bar = console.progress_bar(True, True, 10, 0)  # --progress: drawn on a pipe too
    assert bar is not None
    bar.close()
    assert console.progress_bar(True, False, 10, 0) is None  # never on other ranks
    monkeypatch.setattr(console, "stderr_is_terminal", lambda: True)
    bar = console.progress_bar(None, True, 10, 0)
    assert bar is not None
    bar.close()
