"""Run under mpiexec by test_collective.py: how much CPU a rank burns while it waits for a late rank
in the store's collective steps (dstore.runtime.collective.wait_asleep), written to RESULTS/rankN.json."""

from __future__ import annotations

import json
import os
import resource
import sys
import time

from mpi4py import MPI

from dstore.ingest import ingest
from dstore.runtime import collective
from dstore.store.data_store import DataStore

LATE = 2.0
"""Seconds rank 0 arrives late at each step."""


def cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def waited(comm, step) -> dict:
    """This rank's CPU and wall seconds in `step()`, rank 0 calling it LATE seconds after the others."""
    comm.Barrier()
    if comm.Get_rank() == 0:
        time.sleep(LATE)
    c0, t0 = cpu(), time.perf_counter()
    step()
    return {"cpu": cpu() - c0, "wall": time.perf_counter() - t0}


def main(results_dir: str, work: str) -> None:
    comm = MPI.COMM_WORLD
    path = os.path.join(work, "tiny.h5")
    ingest("synthetic", path, comm=comm, count=8, progress=False)
    out = {"agree": waited(comm, lambda: collective.agree(comm, None))}
    with DataStore(comm, path, batch_size=4, seed=0) as store:
        for _ in store.epoch(0):
            pass
        epoch = store.epoch(1)
        out["epoch_start"] = waited(comm, lambda: next(epoch))
        epoch.close()
    with open(os.path.join(results_dir, f"rank{comm.Get_rank()}.json"), "w") as fh:
        json.dump(out, fh)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
