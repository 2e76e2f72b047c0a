"""Own scripts run under mpiexec by test_faults_39, as a user writes them (nothing caught):

faults_39_run.py items MODE OUTPUT   ingest_items, rank 0's iterable raising MODE after two items
                                     (interrupt: KeyboardInterrupt, exit: sys.exit(3), error: RuntimeError)
faults_39_run.py epochs CONTAINER    every rank iterates another epoch inside `with DataStore(...)`:
                                     an error all ranks agree on, raised at the epoch's start
faults_39_run.py stall URL MARKER    a tiered store over the container at URL (object storage); after
                                     the first batch rank 0 makes MARKER, which stalls the endpoint
"""

import io
import sys

import numpy as np
from mpi4py import MPI
from PIL import Image

from dstore import DataStore
from dstore.ingest import ingest_items


def jpeg(k: int) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(np.full((8, 8, 3), 40 * k, np.uint8)).save(buf, "JPEG")
    return buf.getvalue()


def items(mode: str):
    for k in range(2):
        yield jpeg(k), k % 2, f"s{k}.jpg"
    if mode == "interrupt":
        raise KeyboardInterrupt
    if mode == "exit":
        sys.exit(3)
    raise RuntimeError("the source broke")


def main(what: str, *args: str) -> None:
    comm = MPI.COMM_WORLD
    if what == "items":
        mode, output = args
        ingest_items(items(mode) if comm.Get_rank() == 0 else None, output, progress=False)
    elif what == "stall":
        from store_scenarios.scenarios import _tiered

        url, marker = args
        with _tiered(comm, url, batch_size=12, seed=3) as store:
            for step, _ in enumerate(store.epoch(0)):
                if step == 0:
                    comm.Barrier()
                    if comm.Get_rank() == 0:
                        open(marker, "w").close()
                    comm.Barrier()
    else:
        with DataStore(comm, args[0], batch_size=4) as store:
            for _ in store.epoch(comm.Get_rank()):
                pass
    print("not reached", flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
