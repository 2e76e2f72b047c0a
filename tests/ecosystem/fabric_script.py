"""Lightning Fabric on the store under mpiexec: its MPIEnvironment finds the ranks; devices = ranks
per node, num_nodes = nodes; fabric.setup(model, optimizer) but not setup_dataloaders (the store
already shards); loader.state_dict() saved with fabric.save.

    mpiexec -n 2 python tests/ecosystem/fabric_script.py CONTAINER CHECKPOINT
"""

import sys

import lightning as L  # pyright: ignore[reportMissingImports] - not a dependency (the test skips without it)
import torch
import torch.nn.functional as F
from mpi4py import MPI

from dstore import DataStore, StoreLoader
from dstore.runtime.collective import topology

comm = MPI.COMM_WORLD

here = topology(comm)  # ranks per node: Fabric's devices
fabric = L.Fabric(accelerator="cpu", strategy="ddp", devices=here.local_size, num_nodes=comm.size // here.local_size)
fabric.launch()
assert fabric.world_size == comm.size and fabric.global_rank == comm.rank, (fabric.world_size, fabric.global_rank)
model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
model, opt = fabric.setup(model, opt)  # not setup_dataloaders: the store already shards
with DataStore(comm, sys.argv[1], batch_size=8) as store:
    loader = StoreLoader(store, transform=lambda im: torch.from_numpy(im).float().permute(2, 0, 1) / 255)
    for x, y in loader:
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        fabric.backward(loss)
        opt.step()
    fabric.save(sys.argv[2], {"model": model, "loader": loader.state_dict()})
w = torch.cat([p.detach().flatten() for p in model.parameters()])
allw = comm.allgather(w)
assert torch.equal(allw[0], allw[1]), "ranks diverged"
if comm.rank == 0:
    print("fabric ok", type(fabric._connector.cluster_environment).__name__, flush=True)
