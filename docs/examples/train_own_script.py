"""Using the store from your own PyTorch script: a plain training loop, no dstore trainer.

    mpiexec -n 2 python docs/examples/train_own_script.py [CONTAINER] [--epochs N]

With no container it ingests the built-in `digits` set into a temporary file first. Everything
training-specific here is ordinary PyTorch; the store only replaces the Dataset/DataLoader.
"""

import argparse
import os
import tempfile

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from mpi4py import MPI
from torch.nn.parallel import DistributedDataParallel as DDP

from datastore.formats import open_container
from datastore.store import DataStore
from datastore.torch import StoreLoader
from training.dist import init_distributed


def to_tensor(img: np.ndarray, rng) -> torch.Tensor:
    """Runs in the loader's decode threads: an (H, W, C) uint8 image -> a normalised CHW float tensor."""
    x = torch.from_numpy(img.astype(np.float32) / 255.0).permute(2, 0, 1)
    return (x - 0.3) / 0.35


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("container", nargs="?")
    parser.add_argument("--epochs", type=int, default=4)
    args = parser.parse_args()
    comm = MPI.COMM_WORLD

    path = args.container
    if path is None:  # rank 0 ingests the real digits set once; the others wait
        path = comm.bcast(os.path.join(tempfile.mkdtemp(), "digits.h5") if comm.rank == 0 else None)
        if comm.rank == 0:
            from datastore.ingest import ingest

            ingest("digits", path, comm=MPI.COMM_SELF, progress=False)
        comm.Barrier()

    with open_container(path) as reader:
        n = reader.num_samples
    split = int(n * 0.8)
    torch.manual_seed(0)
    with init_distributed(comm, "cpu") as ctx:  # gloo process group bootstrapped over MPI
        model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 64), torch.nn.ReLU(),
                                    torch.nn.Linear(64, 10))
        ddp = DDP(model, process_group=ctx.group)
        opt = torch.optim.Adam(model.parameters(), lr=1e-2)
        # Train on the first 80% and test on the rest: the container is already in a seeded
        # random order, so its tail is a random held-out set.
        with DataStore(comm, path, batch_size=64, seed=0, sample_range=(0, split)) as train, \
                DataStore(comm, path, batch_size=64, sample_range=(split, n)) as test, \
                StoreLoader(train, transform=to_tensor, num_threads=2) as loader, \
                StoreLoader(test, transform=to_tensor) as test_loader:
            for epoch in range(args.epochs):
                for images, labels in loader.epoch(epoch):
                    loss = F.cross_entropy(ddp(images), labels)
                    opt.zero_grad()
                    loss.backward()
                    opt.step()
            correct = total = 0
            with torch.no_grad():
                for images, labels in test_loader.epoch(0):
                    correct += int((model(images).argmax(1) == labels).sum())
                    total += len(labels)
        counts = torch.tensor([correct, total])
        dist.all_reduce(counts, group=ctx.group)
    if comm.rank == 0:
        print(f"test accuracy {counts[0] / counts[1]:.3f} on {int(counts[1])} samples", flush=True)


if __name__ == "__main__":
    main()
