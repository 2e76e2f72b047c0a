"""Run under mpiexec by test_collective as `collective_run.py RESULTS_DIR WORK_DIR`: each rank records
its topologies (real and emulated, over COMM_WORLD and over a sub-communicator) and what `on_root`
(and ingest, which uses it) returned or raised in a few scenarios, and writes them as one JSON object
to RESULTS_DIR/rank<r>.json (files, not stdout, where the ranks' lines could interleave). WORK_DIR
holds a file taken.h5 that ingest must refuse to replace."""

import dataclasses
import json
import os
import sys

from mpi4py import MPI

from dstore.errors import FormatError
from dstore.ingest import ingest
from dstore.ingest.run import IngestError, open_source_collective
from dstore.runtime import collective


class PeerError(RuntimeError):
    """A type known to the callers' `types` only."""


def fail(exc):
    raise exc


def outcome(fn, *args, **kwargs):
    """What `fn` returned or raised on this rank."""
    try:
        return {"ok": True, "value": fn(*args, **kwargs)}
    except Exception as exc:  # noqa: BLE001 - what each rank raised is the point
        return {"ok": False, "type": type(exc).__name__, "message": str(exc), "agreed": collective.is_agreed(exc)}


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
        "result": outcome(collective.on_root, comm, lambda a, b=0: [a, b, comm.Get_rank()], 5, b=7),
        "trainer": outcome(collective.on_root, comm, fail, FormatError("bad chunk")),
        "ours": outcome(collective.on_root, comm, fail, FormatError("bad chunk"), types={}),
        "typed": outcome(
            collective.on_root, comm, fail, PeerError("peer"), types={"PeerError": PeerError}, fallback=IngestError
        ),
        "foreign": outcome(collective.on_root, comm, fail, KeyError("k"), types={}, fallback=IngestError),
        "open_source": outcome(open_source_collective, comm, os.path.join(work, "no-such-folder")),
        "output_exists": outcome(
            ingest, "synthetic", os.path.join(work, "taken.h5"), comm=comm, count=4, progress=False
        ),
    }
    half.Free()
    with open(os.path.join(results_dir, f"rank{comm.Get_rank()}.json"), "w") as f:
        json.dump(out, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
