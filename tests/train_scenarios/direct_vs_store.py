"""Scenario for tests/test_train_units.py (mpiexec -n 2): the no-store baseline (DirectSource)
delivers the same ids, labels and bytes per step as the DataStore, also after a mid-epoch resume."""

import json
import sys
from typing import Any

from mpi4py import MPI

from dstore.formats import open_container
from dstore.store.data_store import DataStore
from dstore.training.data import DirectSource


def deliveries(source, epoch):
    return [
        (b.step, b.ids.tolist(), b.labels.tolist(), [bytes(s) for s in b.samples], b.pad.tolist())
        for b in source.epoch(epoch)
    ]


def main(path):
    comm = MPI.COMM_WORLD
    kw: dict[str, Any] = dict(batch_size=10, seed=5, sample_range=(3, 50))
    with open_container(path) as reader, DataStore(comm, path, **kw) as store:
        direct = DirectSource(comm, reader, prefetch=2, **kw)
        same = [deliveries(store, e) == deliveries(direct, e) for e in (0, 1)]
        steps = direct.steps_per_epoch == store.steps_per_epoch
        it = direct.epoch(2)
        next(it)  # two steps in
        next(it)
        state = direct.state_dict()
        it.close()
        fresh = DirectSource(comm, reader, **kw)
        fresh.load_state_dict(state)
        store.load_state_dict({**store.state_dict(), "epoch": 2, "step": 2, "position": 20})
        resumed = deliveries(fresh, 2) == deliveries(store, 2)
        first_step = deliveries(fresh, 3)[0][0] == 0
    ok = comm.allgather(all(same) and steps and resumed and first_step)
    if comm.rank == 0:
        print(json.dumps({"ok": ok, "same": same, "steps": steps, "resumed": resumed}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
