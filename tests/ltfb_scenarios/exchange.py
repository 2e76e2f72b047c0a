"""Scenario for tests/test_ltfb.py, run with mpiexec -n 2: dstore.training.exchange moves states of unequal
sizes both ways (sendrecv) and one way (send/recv) in many small blocks.

argv: BLOCK_BYTES. Each rank builds a synthetic state from its rank (rank 1's is several times
larger, and not a multiple of the block), swaps it with the other rank, then rank 1 sends its
state to rank 0 alone. Every rank checks that what arrived is exactly the state the peer built
(state_crc of the peer's state, rebuilt locally from the peer's rank) and prints one JSON line.
"""

import json
import sys

import numpy as np
import torch
from mpi4py import MPI

from dstore.training import exchange
from dstore.training.ltfb import state_crc

TAG = 11


def synthetic_state(rank: int) -> dict:
    """A Trainer-like state: model tensors of several dtypes, optimizer moments and plain values."""
    gen = np.random.default_rng(100 + rank)
    layers = 6 + 10 * rank
    model = {
        f"layer{i}.weight": torch.from_numpy(gen.standard_normal((37, 29 + i)).astype(np.float32))
        for i in range(layers)
    }
    model["count"] = torch.tensor(rank * 1000 + 7, dtype=torch.int64)
    model["half"] = torch.from_numpy(gen.standard_normal(1001).astype(np.float16))
    optimizer = {
        "state": {i: {"step": torch.tensor(float(i)), "exp_avg": torch.ones(17) * i} for i in range(layers)},
        "param_groups": [{"lr": 0.001 * (rank + 1), "betas": (0.9, 0.999), "params": list(range(layers))}],
    }
    return {"model": model, "optimizer": optimizer, "scheduler": {"base_lrs": [0.001], "last_epoch": 3}}


def main():
    block = int(sys.argv[1])
    world = MPI.COMM_WORLD
    me, peer = world.rank, 1 - world.rank
    mine = exchange.pack(synthetic_state(me))
    got = exchange.unpack(exchange.sendrecv(world, mine, peer, TAG, block=block))
    swapped = state_crc(got) == state_crc(synthetic_state(peer))
    one_way = None
    if me == 1:
        exchange.send(world, mine, 0, TAG, block=block)
    else:
        one_way = state_crc(exchange.unpack(exchange.recv(world, 1, TAG, block=block))) == state_crc(synthetic_state(1))
    out = {
        "rank": me,
        "bytes": int(mine.size),
        "blocks": len(exchange.blocks(mine.size, block)),
        "swapped_intact": swapped,
        "one_way_intact": one_way,
    }
    every = world.gather(out, root=0)
    if me == 0:
        print(json.dumps(every), flush=True)


if __name__ == "__main__":
    main()
