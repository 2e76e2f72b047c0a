"""The `#SBATCH` script of docs/guide.md is valid bash, asks Slurm for what a dstore job needs, and
passes `dstore train` only flags it accepts (so a user can copy it as it is)."""

import re
import shlex
import shutil
import subprocess

import pytest
from support.mpirun import REPO

from dstore.runtime.preemption import PREEMPTED_EXIT
from dstore.tools.cli import build_parser

NEEDED = ("nodes", "ntasks-per-node", "cpus-per-task", "mem", "time", "signal", "requeue")


def _script() -> str:
    text = (REPO / "docs" / "guide.md").read_text()
    blocks = [b for b in re.findall(r"```bash\n(.*?)```", text, re.S) if b.startswith("#!/bin/bash\n#SBATCH")]
    assert len(blocks) == 1, "docs/guide.md should hold one #SBATCH script"
    return blocks[0]


def test_the_batch_script_is_valid_bash(tmp_path):
    path = tmp_path / "job.sh"
    path.write_text(_script())
    bash = shutil.which("bash")
    if bash is None:
        pytest.skip("no bash on this machine")
    res = subprocess.run([bash, "-n", str(path)], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr


def test_the_batch_script_asks_slurm_for_what_the_job_needs():
    script = _script()
    options = dict(re.findall(r"^#SBATCH --([a-z-]+)(?:=(\S+))?", script, re.M))
    missing = [name for name in NEEDED if name not in options]
    assert not missing, missing
    assert re.fullmatch(r"USR1@\d+", options["signal"]), options["signal"]
    assert re.search(r"^srun --mpi=(pmi2|pmix) dstore train ", script, re.M)
    assert f'"$rc" -eq {PREEMPTED_EXIT}' in script  # requeues on the documented exit code


def test_the_batch_scripts_dstore_flags_are_accepted():
    script = _script().replace("\\\n", " ")
    (line,) = [ln for ln in script.splitlines() if ln.startswith("srun ")]
    words = shlex.split(line.split("||")[0])
    argv = words[words.index("dstore") + 1 :]
    argv = [w.replace("$RUN_DIR", "/tmp/run").replace("$HOME", "/home/me") for w in argv]
    args = build_parser().parse_args(argv)  # an unknown flag or a bad value exits (SystemExit: a failure)
    assert args.command == "train" and args.resume == "auto" and args.preempt_signal == "USR1,TERM"
    assert args.run_dir == "/tmp/run"
