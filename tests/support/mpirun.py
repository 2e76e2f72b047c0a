"""Launching real `mpiexec -n N` jobs from pytest: a subprocess per scenario, a timeout that turns a
hang into a failure, and every rank's output in the failure message."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent.parent
TESTS = REPO / "tests"
"""On $PYTHONPATH of every job launched here: its scripts import `support.*`, `store_scenarios.*`
and test modules by name, with no sys.path edits of their own."""

MARKED: bool | None = None
"""Whether the running test is marked `mpi` (set by conftest before its fixtures; None outside a test):
a test that launches mpiexec unmarked fails, so `pytest -m "not mpi"` stays the fast loop."""


def mpiexec() -> str:
    """The mpiexec beside this Python (the venv's MPICH wheel), else the one on PATH.

    Raises:
        AssertionError: the running test launches mpiexec without the `mpi` mark.
    """
    if MARKED is False:
        raise AssertionError("this test launches mpiexec: mark it @pytest.mark.mpi (pytest -m 'not mpi' skips those)")
    here = Path(sys.executable).parent / "mpiexec"
    if here.exists():
        return str(here)
    found = shutil.which("mpiexec")
    if found is None:
        raise RuntimeError("no mpiexec found beside the interpreter or on PATH")
    return found


def _decoded(pair):
    """(stdout, stderr) as str: bytes (from a binary-mode pipe) decoded as UTF-8, newlines kept."""
    return tuple(x.decode("utf-8", "replace") if isinstance(x, bytes) else x for x in pair)


def run_mpi(
    nprocs: int,
    argv: list[str],
    *,
    timeout: float = 120,
    check: bool = True,
    env: dict | None = None,
    cwd: str | os.PathLike | None = None,
    keep_cr: bool = False,
) -> subprocess.CompletedProcess:
    """Runs `mpiexec -n nprocs <argv>`; argv[0] may be "python" (this interpreter) or "dstore".

    With `keep_cr` the output is decoded without newline translation (text mode turns every \\r
    into \\n, so a check for progress frames on text-mode output could not fail).

    Raises AssertionError, with the command and all ranks' stdout/stderr, if the job times out
    (a hang) or, when `check`, exits non-zero.
    """
    argv = list(argv)
    if argv and argv[0] == "python":
        argv[0] = sys.executable
    elif argv and argv[0] == "dstore":
        argv = [sys.executable, "-m", "dstore.tools"] + argv[1:]
    cmd = [mpiexec(), "-n", str(nprocs)] + argv
    full_env = dict(os.environ)
    full_env.setdefault("PYTHONUNBUFFERED", "1")
    full_env.setdefault("OMP_NUM_THREADS", "1")
    full_env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH")]))
    if env:
        full_env.update(env)
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=not keep_cr,
        env=full_env,
        cwd=cwd or REPO,
        start_new_session=True,
    )
    try:
        out, err = _decoded(proc.communicate(timeout=timeout))
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = _decoded(proc.communicate())
        raise AssertionError(
            f"HANG: `{' '.join(cmd)}` did not finish within {timeout}s\n--- stdout ---\n{out}\n--- stderr ---\n{err}"
        ) from None
    result = subprocess.CompletedProcess(cmd, proc.returncode, out, err)
    if check and proc.returncode != 0:
        raise AssertionError(
            f"`{' '.join(cmd)}` exited {proc.returncode}\n--- stdout ---\n{out}\n--- stderr ---\n{err}"
        )
    return result
