"""Passive-target progress without shared memory (issue 11, "Also"): a Get from a rank that computes
without MPI calls completes while it computes when that rank runs a ProgressThread."""

from __future__ import annotations

import json

import pytest
from support.mpirun import run_mpi

from dstore.errors import ConfigError

SCRIPT = """
import json, sys, time
import numpy as np
from mpi4py import MPI
from dstore.runtime.progress import ProgressThread
from dstore.store.window import Arena

comm = MPI.COMM_WORLD
use_thread, compute_s = sys.argv[1] == "1", float(sys.argv[2])
arena = Arena(comm, 1 << 20)
arena.local[:] = comm.rank + 1
arena.publish()
result = {}
with arena.reading():
    comm.Barrier()
    if comm.rank == 0:  # the owner computes with no MPI call (a long forward/backward pass)
        a = np.random.default_rng(0).random((300, 300))
        progress = ProgressThread(comm).start() if use_thread else None
        t = time.time()
        while time.time() - t < compute_s:
            a = a @ a
            a /= np.abs(a).max()
        result["compute_end"] = time.time()
        if progress is not None:
            progress.stop()
            result["calls"] = progress.calls
    else:
        time.sleep(0.3)
        out = np.empty(1000, np.uint8)
        arena._win.Get(out, 0, (0, 1000, MPI.BYTE))
        arena._win.Flush(0)
        result["get_done"] = time.time()
        result["ok"] = bool((out == 1).all())
    comm.Barrier()
parts = comm.gather(result, root=0)
if comm.rank == 0:
    print(json.dumps({**parts[0], **parts[1]}))
arena.free()
"""

TCP = {"MPIR_CVAR_NOLOCAL": "1", "UCX_TLS": "tcp,self"}


def _run(tmp_path, use_thread: bool) -> dict:
    script = tmp_path / "progress.py"
    script.write_text(SCRIPT)
    res = run_mpi(2, ["python", str(script), "1" if use_thread else "0", "2.0"], timeout=90, env=TCP)
    return json.loads(res.stdout.strip().splitlines()[-1])


@pytest.mark.mpi
def test_a_get_completes_while_its_owner_computes(tmp_path):
    without = _run(tmp_path, False)
    assert without["ok"]
    if without["get_done"] < without["compute_end"]:
        pytest.skip("this MPI completes gets without the target's help: nothing to bound")
    with_thread = _run(tmp_path, True)
    assert with_thread["ok"] and with_thread["calls"] > 0
    # Loose: the get is issued 0.3 s into a 2 s computation and must be done well before its end.
    assert with_thread["get_done"] < with_thread["compute_end"] - 0.5, (without, with_thread)


def test_progress_thread_arguments_and_stop_twice():
    from mpi4py import MPI

    from dstore.runtime.progress import ProgressThread

    with pytest.raises(ConfigError, match="period"):
        ProgressThread(MPI.COMM_SELF, period=0)
    with ProgressThread(MPI.COMM_SELF, period=0.001) as p:
        pass
    p.stop()
