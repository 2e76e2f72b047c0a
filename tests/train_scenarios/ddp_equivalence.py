"""Scenario for tests/test_ddp.py, run with mpiexec -n 3.

World ranks {0, 1} form trainer A (2 ranks, the global batch split unevenly 6/7) and rank {2}
forms trainer B (1 rank, the whole batch): two torch process groups in one MPI job. Both start
from the same weights and take the same steps. Prints one JSON line on world rank 0.
"""

import json
import sys

import numpy as np
import torch
from mpi4py import MPI

from dstore.training.dist import init_distributed
from dstore.training.loop import Trainer
from dstore.training.models import build_model
from dstore.training.optim import Schedule, make_optimizer, make_scheduler

STEPS, GLOBAL_BATCH = 3, 13


def main():
    world = MPI.COMM_WORLD
    color = 0 if world.rank < 2 else 1
    comm = world.Split(color, world.rank)
    try:
        with init_distributed(comm, "cpu") as ctx:
            torch.manual_seed(1234)
            model = build_model("small_cnn", 1, 10, (8, 8))
            if ctx.rank == 1:  # DDP must broadcast rank 0's weights: start rank 1 elsewhere
                with torch.no_grad():
                    for p in model.parameters():
                        p.add_(1.0)
            opt = make_optimizer("sgd", model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
            trainer = Trainer(ctx, model, opt, make_scheduler(opt, Schedule("cosine", total=10, warmup=2)))
            gen = np.random.default_rng(7)
            for _ in range(STEPS):
                images = torch.from_numpy(gen.standard_normal((GLOBAL_BATCH, 1, 8, 8)).astype(np.float32))
                labels = torch.from_numpy(gen.integers(0, 10, GLOBAL_BATCH))
                lo, hi = (GLOBAL_BATCH * ctx.rank) // ctx.size, (GLOBAL_BATCH * (ctx.rank + 1)) // ctx.size
                trainer.train_step(images[lo:hi], labels[lo:hi], GLOBAL_BATCH)
            flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).numpy()
            size = ctx.size
    finally:
        comm.Free()
    every = world.gather((size, flat), root=0)
    if world.rank == 0:
        assert every is not None  # the root's gather
        a0, a1, b = every[0][1], every[1][1], every[2][1]
        print(
            json.dumps(
                {
                    "sizes": [e[0] for e in every],
                    "a_ranks_equal": bool(np.array_equal(a0, a1)),
                    "a_vs_b_max_abs_diff": float(np.abs(a0 - b).max()),
                    "moved": float(np.abs(a0).sum()),
                }
            ),
            flush=True,
        )


if __name__ == "__main__":
    sys.exit(main())
