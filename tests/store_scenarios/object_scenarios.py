"""A tiered store over a container in object storage: the same scenario in-process (COMM_SELF) or
under `mpiexec -n N python -m mpi4py object_scenarios.py URL LOCAL`, the container at URL being a
copy of the local one at LOCAL. Every check is collective (as in scenarios.py)."""

from __future__ import annotations

import sys

import numpy as np
from store_scenarios.scenarios import BATCH, _tiered, check_delivery, check_stats, check_tier

from dstore.formats import open_container


def tiered_epoch(st, epoch: int, ref) -> tuple:
    """Consumes epoch `epoch` of the store `st`; raises AssertionError (on this rank) at the first
    sample whose bytes differ from the local reference container's; returns run_epoch's tuple."""
    ids, crcs, pads, labels, stepno = [], [], [], [], []
    for b in st.epoch(epoch):
        for i, x in zip(b.ids.tolist(), b.samples):
            if bytes(memoryview(x).cast("B")) != bytes(ref.sample(i)[0]):
                raise AssertionError(f"rank {st.rank}: sample {i}'s bytes differ from the local container's")
        ids.append(b.ids)
        crcs.append(np.asarray(ref.checksums[b.ids], dtype=np.int64))  # the bytes are checked above
        pads.append(b.pad)
        labels.append(b.labels)
        stepno.append(np.full(b.ids.size, b.step))
    return tuple(np.concatenate(x) for x in (ids, crcs, pads, labels, stepno))


def scenario_object_tiered(comm, url: str, local: str, populations=("preload", "stream"), **kw) -> dict:
    """About 45% of the container resident, the rest read from the object by each rank's storage
    tier: each epoch delivers every sample exactly once, in the reference order, with the local
    container's bytes; each rank read exactly the non-resident bytes it delivered, once. `kw` go to
    the store. Returns this rank's stats of the last epoch."""
    stats = {}
    with open_container(local) as ref:
        for population in populations:
            with _tiered(comm, url, batch_size=BATCH, seed=3, population=population, **kw) as st:
                if not str(st.container.path).startswith(url.rstrip("/")):
                    raise AssertionError(f"the store reads {st.container.path}, not {url}")
                for epoch in (0, 1):
                    got = tiered_epoch(st, epoch, ref)
                    if population == "preload":
                        check_tier(comm, st, got, ref)
                    check_stats(st, got, ref)
                    check_delivery(
                        comm,
                        ref,
                        got,
                        epoch=epoch,
                        policy="global",
                        seed=3,
                        drop_last=False,
                        steps_per_epoch=st.steps_per_epoch,
                    )
                stats = st.stats.as_dict() if st.stats is not None else {}
    return stats


if __name__ == "__main__":
    from mpi4py import MPI

    scenario_object_tiered(MPI.COMM_WORLD, sys.argv[1], sys.argv[2])
    if MPI.COMM_WORLD.rank == 0:
        print(f"OK object_tiered on {MPI.COMM_WORLD.size} ranks", flush=True)
