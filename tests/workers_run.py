"""Scenarios for test_decode_workers, run as separate processes.

`workers_run.py ranks CONTAINER OUT` (under mpiexec -n 2): every rank serves epoch 1 through a
StoreLoader with 2 decode workers (whose environment must lack the MPI launcher's variables) and
saves the pixels of the samples it delivered, by id, in OUT/rank<r>.npz; rank 0 also saves the
loader's state after the first step in OUT/state.json.

`workers_run.py hold CONTAINER`: one process, a loader with 2 workers that has delivered a batch;
prints "pids <rank> <worker> <worker>" and sleeps (the test kills it with SIGKILL).

`workers_run.py term CONTAINER`: one process watching SIGTERM, a loader with 2 workers; after a batch
it sends SIGTERM to its process group and to each worker, then serves the rest of the epoch and
prints "served <batches> after TERM".
"""

import json
import os
import signal
import sys
import time

import numpy as np
from mpi4py import MPI

from dstore.loader.store_loader import StoreLoader
from dstore.store.data_store import DataStore
from dstore.training.augment import ImageTransform

TRANSFORM = ImageTransform(
    size=(32, 32),
    channels=3,
    mean=(0.5,) * 3,
    std=(0.25,) * 3,
    train=True,
    pad=4,
    flip=True,
    jitter=0.3,
    normalize=False,
)


def ranks(path: str, out: str) -> None:
    comm = MPI.COMM_WORLD
    with (
        DataStore(comm, path, batch_size=8, seed=3) as st,
        StoreLoader(st, transform=TRANSFORM, size=(32, 32), channels=3, workers=2) as ld,
    ):
        ids, images = [], []
        for step, (x, _) in enumerate(ld.epoch(1)):
            if step == 0:  # the launcher's variables are not the workers' (NOTE [decode workers] 1)
                assert any(k.startswith(("PMI_", "HYDRA_")) for k in os.environ), "not under mpiexec?"
                for pid in ld.workers.pids:
                    with open(f"/proc/{pid}/environ", "rb") as fh:
                        env = [kv.split(b"=", 1)[0] for kv in fh.read().split(b"\0") if kv]
                    leaked = [k for k in env if k.startswith((b"PMI_", b"PMIX_", b"HYDRA_", b"OMPI_"))]
                    assert not leaked, f"worker {pid} has the launcher's {leaked}"
            keep = ~ld.last_pad
            ids.append(ld.last_ids[keep])
            images.append(x.numpy()[keep])
            if step == 0 and comm.Get_rank() == 0:
                with open(os.path.join(out, "state.json"), "w") as fh:
                    json.dump(ld.state_dict(), fh)
    np.savez(os.path.join(out, f"rank{comm.Get_rank()}.npz"), ids=np.concatenate(ids), images=np.concatenate(images))


def hold(path: str) -> None:
    with (
        DataStore(MPI.COMM_SELF, path, batch_size=8, seed=3) as st,
        StoreLoader(st, transform=TRANSFORM, size=(32, 32), channels=3, workers=2) as ld,
    ):
        next(iter(ld.epoch(0)))
        print("pids", os.getpid(), *ld.workers.pids, flush=True)
        time.sleep(120)


def term(path: str) -> None:
    """A rank watching SIGTERM (as `dstore train`) sends it to its whole process group, the way MPICH's
    proxy forwards mpiexec's (and Slurm signals every process of the step): its workers must keep serving."""
    from dstore.runtime.preemption import Preemption

    with (
        Preemption(("TERM",)) as watch,
        DataStore(MPI.COMM_SELF, path, batch_size=8, seed=3) as st,
        StoreLoader(st, transform=TRANSFORM, size=(32, 32), channels=3, workers=2) as ld,
    ):
        it = iter(ld.epoch(0))
        next(it)
        os.killpg(0, signal.SIGTERM)
        for pid in ld.workers.pids:  # and to each worker itself
            os.kill(pid, signal.SIGTERM)
        served = sum(1 for _ in it)
        print("served", served, "after", watch.received, flush=True)


if __name__ == "__main__":
    {
        "ranks": lambda: ranks(sys.argv[2], sys.argv[3]),
        "hold": lambda: hold(sys.argv[2]),
        "term": lambda: term(sys.argv[2]),
    }[sys.argv[1]]()
