"""HF Accelerate on the store under mpiexec: the environment it reads (RANK, WORLD_SIZE, MASTER_ADDR,
MASTER_PORT, ...) from dstore.training.dist.torch_env; the model prepared, not the loader (each rank
already gets its slice of every global batch).

    mpiexec -n 2 python tests/ecosystem/accelerate_script.py CONTAINER CHECKPOINT
"""

import os
import sys

import torch
import torch.nn.functional as F
from mpi4py import MPI

from dstore import DataStore, StoreLoader
from dstore.training.dist import torch_env

comm = MPI.COMM_WORLD
os.environ.update(torch_env(comm))
from accelerate import Accelerator  # noqa: E402  # pyright: ignore[reportMissingImports] - not a dependency (the test skips without it); after the environment it reads is set

acc = Accelerator(cpu=True)
assert acc.num_processes == comm.size and acc.process_index == comm.rank, (acc.num_processes, acc.process_index)
model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
model, opt = acc.prepare(model, opt)  # not the loader: the store already gives each rank its slice
with DataStore(comm, sys.argv[1], batch_size=8) as store:
    for x, y in StoreLoader(store, transform=lambda im: torch.from_numpy(im).float().permute(2, 0, 1) / 255):
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        acc.backward(loss)
        opt.step()
w = torch.cat([p.detach().flatten() for p in model.parameters()])
allw = comm.allgather(w)
assert torch.equal(allw[0], allw[1]), "ranks diverged"
if comm.rank == 0:
    print("accelerate ok", acc.distributed_type, flush=True)
