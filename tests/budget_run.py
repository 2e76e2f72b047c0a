"""Run under mpiexec by test_budget_share as `budget_run.py CONTAINER RESULTS_DIR`: every rank shares a
budget between two stores (training part, held-out part), populates them and records what it holds
and the ids it was served; then a budget below the buffers on rank 0 only must fail on every rank
(no rank left in a store's collectives). One JSON object per rank in RESULTS_DIR/rank<r>.json."""

import json
import os
import sys

from mpi4py import MPI

from dstore.errors import MemoryBudgetError
from dstore.store.data_store import DataStore
from dstore.training.budget import share_budget

path, results = sys.argv[1], sys.argv[2]
comm = MPI.COMM_WORLD


def stores():
    return (
        DataStore(comm, path, batch_size=16, seed=1, sample_range=(0, 480)),
        DataStore(comm, path, batch_size=16, seed=2, sample_range=(480, 600)),
    )


train, held = stores()
needs = [train.memory_needs(), held.memory_needs()]
full, least = sum(f for f, _ in needs), sum(x for _, x in needs)
reserve = 100_000
avail = comm.allreduce(least + (full - least) // 2, op=MPI.MIN)  # the same budget on every rank, not all fits
budgets = share_budget(comm, [train, held], budget=avail + reserve, reserve=reserve)
with train, held:
    used = []
    for s, (f, lst) in zip((train, held), needs):
        used.append(f if s.tier["resident_fraction"] >= 1.0 else s.tier["resident_bytes"] // comm.Get_size() + lst)
    served = [sorted(int(i) for b in s.epoch(0) for i, p in zip(b.ids, b.pad) if not p) for s in (train, held)]

small_train, small_held = stores()
tiny = sum(x for _, x in (small_train.memory_needs(), small_held.memory_needs())) if comm.Get_rank() == 0 else 10**12
try:
    share_budget(comm, [small_train, small_held], budget=tiny, reserve=reserve)
    refused = None
except MemoryBudgetError as exc:
    refused = str(exc)
small_train.close()
small_held.close()
with open(os.path.join(results, f"rank{comm.Get_rank()}.json"), "w") as fh:
    json.dump({"budget": avail, "budgets": budgets, "used": used, "served": served, "refused": refused}, fh)
