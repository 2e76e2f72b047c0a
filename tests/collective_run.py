"""Run under mpiexec by test_collective as `collective_run.py RESULTS_DIR WORK_DIR`: each rank records
its topologies (real and emulated, over COMM_WORLD and over a sub-communicator), and writes them as
one JSON object to RESULTS_DIR/rank<r>.json (files, not stdout, where the ranks' lines could
interleave)."""

import dataclasses
import json
import os
import sys

from mpi4py import MPI

from dstore import collective


def node_sizes(comm, emulate):
    node = collective.node_comm(comm, emulate=emulate)
    try:
        return [node.Get_rank(), node.Get_size()]
    finally:
        node.Free()


def main(results_dir, work):
    comm = MPI.COMM_WORLD
    half = comm.Split(comm.Get_rank() % 2, comm.Get_rank())  # world ranks 0, 2, ... and 1, 3, ...
    out = {
        "real": dataclasses.asdict(collective.topology(comm)),
        "emulated": dataclasses.asdict(collective.topology(comm, emulate=True)),
        "half_emulated": dataclasses.asdict(collective.topology(half, emulate=True)),
        "node_comm": node_sizes(comm, False),
        "node_comm_emulated": node_sizes(comm, True),
    }
    half.Free()
    with open(os.path.join(results_dir, f"rank{comm.Get_rank()}.json"), "w") as f:
        json.dump(out, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
