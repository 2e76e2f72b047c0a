"""An emulated cluster for tests (dstore.tools.cluster): `started` brings one up under a name and subnet
no other process on this machine uses and always takes it down; `run_on` runs a job over it as
support.mpirun.run_mpi runs one on this host (a timeout that turns a hang into a failure, every
rank's output in the failure message).

Tests that use it are marked `cluster` and `mpi`; they are skipped, with the reason, where this
machine cannot host a cluster (not root, no `ip netns`, no `unshare`).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from dstore.errors import ConfigError
from dstore.tools import cluster
from support.mpirun import TESTS, mpiexec

SHARED_ROOT = Path("/var/tmp")
"""Where a test's work folder goes: outside /tmp, which each node of a `node_tmp` cluster has to itself
(as on most clusters), so that only what the job puts on shared storage is seen by every node."""

NAME = re.compile(r"t(\d+)[a-z]")
"""Test clusters are named t<pid of the pytest process><a letter>: a crashed run's are found and removed."""

_serial = 0


def sweep_dead() -> None:
    """Removes the clusters that test processes which no longer run left behind."""
    for name in cluster.clusters() + _names_in_use():
        m = NAME.fullmatch(name)
        if m and not Path(f"/proc/{m.group(1)}").exists():
            cluster.down(name)


def _names_in_use() -> list[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return sorted({m.group(1) for m in re.finditer(r"^(t\d+[a-z])-node\d+", out, re.M)})


@contextlib.contextmanager
def started(nodes: int, ranks_per_node: int = 2, link: str = "none", node_tmp: bool = True):
    """Yields (cluster, shared work folder); skips the test where no cluster can start here."""
    global _serial
    reason = cluster.unavailable()
    if reason:
        pytest.skip(reason)
    sweep_dead()
    name = f"t{os.getpid()}{chr(ord('a') + _serial % 26)}"
    _serial += 1
    work = SHARED_ROOT / f"dstore-{name}"
    c = None
    try:
        for attempt in range(5):  # another process may take the free subnet between our look and our up
            try:
                c = cluster.up(
                    name, cluster.free_subnet(first=100 + 20 * attempt), nodes, ranks_per_node, link, node_tmp
                )
                break
            except ConfigError as exc:
                if "--subnet" not in str(exc) or attempt == 4:
                    raise
        assert c is not None
        work.mkdir(parents=True, exist_ok=True)
        yield c, work
    finally:
        cluster.down(name)
        shutil.rmtree(work, ignore_errors=True)


def job_env(env: dict | None = None) -> dict:
    """The environment of a test's job: this one, tests/ on $PYTHONPATH, one OpenMP thread, `env` on top."""
    full = dict(os.environ)
    full.setdefault("PYTHONUNBUFFERED", "1")
    full.setdefault("OMP_NUM_THREADS", "1")
    full["PYTHONPATH"] = os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH")]))
    full.update(env or {})
    return full


def _argv(argv: list[str]) -> list[str]:
    argv = list(argv)
    if argv and argv[0] == "python":
        argv[0] = sys.executable
    elif argv and argv[0] == "dstore":
        argv = [sys.executable, "-m", "dstore.tools"] + argv[1:]
    return argv


def start_on(
    c: cluster.Cluster, argv: list[str], *, hosts: str | None = None, n: int | None = None, env: dict | None = None
) -> subprocess.Popen:
    """Starts `argv` as an mpiexec job over cluster `c` and returns at once (text pipes for stdout and
    stderr; its own session: os.killpg(proc.pid, ...) ends it). For a test that acts while it runs."""
    cmd = cluster.mpiexec_command(c, _argv(argv), hosts, n, mpiexec())
    return subprocess.Popen(
        cmd,
        env=cluster.run_env(job_env(env)),
        cwd=TESTS.parent,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def run_on(
    c: cluster.Cluster,
    argv: list[str],
    *,
    hosts: str | None = None,
    n: int | None = None,
    timeout: float = 120,
    check: bool = True,
    env: dict | None = None,
    cwd: str | os.PathLike | None = None,
) -> subprocess.CompletedProcess:
    """Runs `argv` as an mpiexec job over cluster `c` (argv[0] may be "python" or "dstore": this interpreter).

    Raises AssertionError, with the command and all ranks' output, on a timeout or (with `check`) a
    non-zero exit.
    """
    res = cluster.run(
        c,
        _argv(argv),
        hosts,
        n,
        env=job_env(env),
        timeout=timeout,
        mpiexec=mpiexec(),
        cwd=cwd or TESTS.parent,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    where = f"`{' '.join(res.args)}`"
    if res.returncode == -9:
        raise AssertionError(
            f"HANG: {where} did not finish within {timeout}s\n--- stdout ---\n{res.stdout}\n"
            f"--- stderr ---\n{res.stderr}"
        )
    if check and res.returncode != 0:
        raise AssertionError(
            f"{where} exited {res.returncode}\n--- stdout ---\n{res.stdout}\n--- stderr ---\n{res.stderr}"
        )
    return res


def ranks_on(c: cluster.Cluster, node: int, word: str = "dstore.tools") -> list[int]:
    """The pids of node `node`'s processes whose command line holds `word` (a job's ranks, not its proxy)."""
    found = []
    for pid in cluster.node_pids(c, node):
        try:
            if word in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace"):
                found.append(pid)
        except OSError:
            pass
    return found
