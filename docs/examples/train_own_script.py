"""Using the store from your own PyTorch script: a plain training loop, no dstore trainer.

    mpiexec -n 2 python docs/examples/train_own_script.py [CONTAINER] [--epochs N]
                 [--checkpoint ck.pt [--stop-after-steps K]]
    srun -n 2 --mpi=pmi2 python docs/examples/train_own_script.py ...     # under Slurm (pmix: Open MPI)

Not torchrun: the store and the process group come from MPI (torchrun's N separate 1-rank worlds
are refused). While the store is open, an exception on any rank prints once and ends the job.

With no container it ingests the built-in `digits` set into a temporary file first. Any container
works (raw arrays, JPEG, PNG; grey or colour; any number of classes): its image size, channels,
classes and mean/std are measured first, and images larger than 32x32 are resized to it. Everything
training-specific here is ordinary PyTorch; the store only replaces the Dataset/DataLoader.
With --checkpoint, the script saves model, optimizer and `loader.state_dict()` (the position after
the batches it trained on) there every 10 steps and at the end, and resumes from it if it exists:
a run stopped with --stop-after-steps and started again ends with the same model as one that was
never stopped.
"""

import argparse
import os
import sys
import tempfile

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from mpi4py import MPI
from torch.nn.parallel import DistributedDataParallel as DDP

from dstore import DataStore, StoreLoader
from dstore.formats import open_container
from dstore.runtime.preemption import PREEMPTED_EXIT, Preemption
from dstore.training.data import probe_input
from dstore.training.dist import init_distributed


def normalizer(mean, std):
    """The loader's transform (run in its decode threads): an (H, W, C) uint8 image -> a normalised
    CHW float tensor. (A seeded augmentation takes the loader's per-sample rng instead:
    transform=seeded(fn) with fn(img, rng), from dstore.loader.store_loader.)"""
    mean = torch.tensor(mean, dtype=torch.float32).view(-1, 1, 1)
    std = torch.tensor(std, dtype=torch.float32).view(-1, 1, 1)

    def to_tensor(img: np.ndarray) -> torch.Tensor:
        x = torch.from_numpy(img.astype(np.float32) / 255.0).permute(2, 0, 1)
        return (x - mean) / std

    return to_tensor


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("container", nargs="?")
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--checkpoint", default=None, help="save here; resume from it if it exists")
    parser.add_argument("--stop-after-steps", type=int, default=0, help="stop (after saving) after K steps")
    args = parser.parse_args()
    comm = MPI.COMM_WORLD

    path = args.container
    if path is None:  # rank 0 ingests the real digits set once; the others wait
        path = comm.bcast(os.path.join(tempfile.mkdtemp(), "digits.h5") if comm.rank == 0 else None)
        if comm.rank == 0:
            from dstore.ingest import ingest

            ingest("digits", path, comm=MPI.COMM_SELF, progress=False)
        comm.Barrier()

    with open_container(path) as reader:
        n = reader.num_samples
        split = int(n * 0.8)
        # Image size, channels, classes and per-channel mean/std of this container, measured by rank 0
        # on its first training samples (any encoding: raw arrays, JPEG, PNG; grey or colour).
        spec = probe_input(comm, reader, (0, split))
    size = spec.image_size if max(spec.image_size) <= 32 else (32, 32)  # the loader resizes larger images
    to_tensor = normalizer(spec.mean, spec.std)
    torch.manual_seed(0)
    with init_distributed(comm, "cpu") as ctx:  # gloo process group bootstrapped over MPI
        model = torch.nn.Sequential(
            torch.nn.Flatten(),
            torch.nn.Linear(spec.channels * size[0] * size[1], 64),
            torch.nn.ReLU(),
            torch.nn.Linear(64, spec.num_classes),
        )
        ddp = DDP(model, process_group=ctx.group)
        opt = torch.optim.Adam(model.parameters(), lr=1e-2)
        # Train on the first 80% and test on the rest: the container is already in a seeded
        # random order, so its tail is a random held-out set.
        with (
            Preemption() as preempt,
            DataStore(comm, path, batch_size=64, seed=0, sample_range=(0, split)) as train,
            DataStore(comm, path, batch_size=64, sample_range=(split, n)) as test,
            StoreLoader(train, transform=to_tensor, decode_threads=2, channels=spec.channels, size=size) as loader,
            StoreLoader(test, transform=to_tensor, channels=spec.channels, size=size) as test_loader,
        ):
            if args.checkpoint and os.path.exists(args.checkpoint):
                ck = torch.load(args.checkpoint, weights_only=True)
                model.load_state_dict(ck["model"])
                opt.load_state_dict(ck["optimizer"])
                loader.load_state_dict(ck["loader"])  # the next iter(loader) continues mid-epoch
            steps = 0

            def save():
                state = {"model": model.state_dict(), "optimizer": opt.state_dict(), "loader": loader.state_dict()}
                if comm.rank == 0:
                    torch.save(state, args.checkpoint)
                comm.Barrier()

            stop = preempted = False
            while loader.state_dict()["epoch"] < args.epochs and not stop:
                for images, labels in loader:  # this epoch's batches (from the resumed one, if any)
                    loss = F.cross_entropy(ddp(images), labels)
                    opt.zero_grad()
                    loss.backward()
                    opt.step()
                    steps += 1
                    if args.checkpoint and steps % 10 == 0:
                        save()
                    # SIGTERM/SIGUSR1 (Slurm's warning before a kill) on any rank: every rank stops after
                    # this step (agreed: one small allreduce), saves, and exits 75 for the batch script
                    preempted = bool(args.checkpoint) and preempt.agreed(comm)
                    stop = preempted or steps == args.stop_after_steps
                    if stop:
                        break
            if args.checkpoint:
                save()
            if preempted:
                return PREEMPTED_EXIT
            if steps == args.stop_after_steps:
                if comm.rank == 0:
                    print(
                        f"stopped after {steps} steps at {loader.state_dict()['epoch']}:{loader.state_dict()['step']}",
                        flush=True,
                    )
                return
            correct = total = 0
            with torch.no_grad():
                for images, labels in test_loader.epoch(0):
                    correct += int((model(images).argmax(1) == labels).sum())
                    total += len(labels)
        counts = torch.tensor([correct, total])
        dist.all_reduce(counts, group=ctx.group)
    if comm.rank == 0:
        weights = sum(float(p.detach().double().sum()) for p in model.parameters())
        print(
            f"test accuracy {counts[0] / counts[1]:.3f} on {int(counts[1])} samples; weight sum {weights:.9e}",
            flush=True,
        )


if __name__ == "__main__":
    sys.exit(main())
