"""A store job that serves epochs until it is ended, for the fault tests (tests/test_faults.py):
`mpiexec ... python fault_run.py CONTAINER MARKER [BATCH] [EPOCHS] [SLOW]`.

Rank 0 writes CONTAINER first (raw samples of 12 KB) where it does not exist. Every rank serves
epochs of the store (gets between nodes), checking each batch's sizes, and
after the first full epoch creates `MARKER.RANK`: the test then knows every rank is mid-epoch and
applies its fault. With SLOW, rank 2 stops for SLOW seconds mid-way through epoch 1 without
calling MPI (a long evaluation, a slow read): the others must wait for it, not end the job.
"""

from __future__ import annotations

import os
import sys
import time

import numpy as np
from mpi4py import MPI

from dstore.formats import create_writer
from dstore.store.data_store import DataStore

N, SHAPE = 2000, (64, 64, 3)


def write(path: str) -> None:
    rng = np.random.default_rng(0)
    tmp = path + ".part"
    with create_writer(tmp, "hdf5", encoding="raw", class_names=["a", "b"], raw_dtype="uint8", raw_shape=SHAPE) as w:
        for i in range(N):
            w.append(rng.integers(0, 256, SHAPE, dtype=np.uint8), i % 2, f"s{i}", i)
    os.replace(tmp, path)


def main(argv) -> None:
    path, marker = argv[0], argv[1]
    batch = int(argv[2]) if len(argv) > 2 else 64
    epochs = int(argv[3]) if len(argv) > 3 else 10_000
    slow = float(argv[4]) if len(argv) > 4 else 0.0
    comm = MPI.COMM_WORLD
    if comm.Get_rank() == 0 and not os.path.exists(path):
        write(path)
    comm.Barrier()
    with DataStore(comm, path, batch_size=batch, seed=1) as store:
        for e in range(epochs):
            for k, b in enumerate(store.epoch(e)):
                if slow and e == 1 and k == 3 and comm.Get_rank() == 2:
                    time.sleep(slow)
                if sum(len(s) for s in b.samples) != len(b.samples) * int(np.prod(SHAPE)):
                    raise AssertionError(f"epoch {e}: a batch of wrong sizes")
                time.sleep(0.002)  # a little compute
            if e == 0:
                open(f"{marker}.{comm.Get_rank()}", "w").close()
                print(f"rank {comm.Get_rank()} on {MPI.Get_processor_name()}: epoch 0 done", flush=True)
    print(f"rank {comm.Get_rank()}: all {epochs} epochs done", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
