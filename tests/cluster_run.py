"""Store scenarios across the nodes of an emulated cluster (tests/test_cluster.py), run as
`python -m mpi4py cluster_run.py CONTAINER SCENARIO...` over `dstore cluster run`.

Where a node is comes from outside the store: each rank's host name (every emulated node has its own),
so the checks hold the store's node detection against the launcher's placement. Every check is
collective and raises on every rank (python -m mpi4py ends the job); rank 0 prints one JSON line per
scenario with what it measured.
"""

from __future__ import annotations

import json
import os
import socket
import sys

import numpy as np
from store_scenarios import scenarios
from store_scenarios.scenarios import BATCH, check_delivery, check_stats, run_epoch

from dstore.formats import open_container
from dstore.runtime.collective import node_comm
from dstore.store.data_store import DataStore


def hosts(comm) -> list[str]:
    """Every rank's host name, by rank."""
    return comm.allgather(socket.gethostname())


def shm_used() -> int:
    """Bytes in use in this node's /dev/shm (each emulated node has its own)."""
    st = os.statvfs("/dev/shm")
    return (st.f_blocks - st.f_bfree) * st.f_frsize


def report(comm, name: str, **figures) -> None:
    if comm.rank == 0:
        print(json.dumps({"scenario": name, "ranks": comm.size, **figures}), flush=True)


def scenario_nodes(comm, path):
    """The store's nodes are the launcher's: node_comm (with and without the test emulation) groups
    exactly the ranks of one host; each node has its own /dev/shm (MPICH's segment of another node
    is not in it)."""
    names = hosts(comm)
    for emulate in (False, True):
        node = node_comm(comm, emulate=emulate)
        members = sorted(node.allgather(comm.rank))
        node.Free()
        want = [r for r, h in enumerate(names) if h == names[comm.rank]]
        if members != want:
            raise AssertionError(f"rank {comm.rank} on {names[comm.rank]}: node_comm(emulate={emulate}) "
                                 f"groups ranks {members}, the host holds {want}")
    segments = comm.allgather(sorted(f for f in os.listdir("/dev/shm") if f.startswith("mpich_shm")))
    for r, segs in enumerate(segments):
        if names[r] != names[comm.rank] and set(segs) & set(segments[comm.rank]):
            raise AssertionError(f"ranks {comm.rank} and {r} on different hosts see the same /dev/shm segment")
    report(comm, "nodes", hosts=names)


def _expected(store, reader, ids, names) -> tuple[int, int, int, int]:
    """(samples, bytes) served from node peers' windows and fetched by gets, for `ids` delivered to
    this rank: node peers are the ranks on this rank's host (`reader` holds the sizes)."""
    owners = store.layout.owner[ids]
    length = np.diff(reader.offsets)[ids]
    peer = np.array([names[o] == names[store.rank] for o in owners], dtype=bool)
    other = owners != store.rank
    node, remote = other & peer, other & ~peer
    return int(node.sum()), int(length[node].sum()), int(remote.sum()), int(length[remote].sum())


def scenario_store(comm, path):
    """Every sample once in the reference global order (as on one host) for every policy; node views
    serve exactly the samples of the same host's ranks and gets fetch exactly the other hosts' (samples
    and bytes counted per rank from the stats); one index per node: one rank of each host reads it,
    every rank of the host maps it, and the host's /dev/shm holds it (bytes measured there)."""
    names = hosts(comm)
    scenarios.scenario_exactly_once(comm, path)
    reader = open_container(path)
    split = []
    for policy in ("global", "partial"):
        comm.Barrier()
        before = shm_used()
        with DataStore(comm, path, batch_size=BATCH, seed=4, shuffle=policy) as st:
            comm.Barrier()
            grown = shm_used() - before
            index = st._index
            got = run_epoch(st, 1)
            check_stats(st, got, reader)
            s = st.stats
            want = _expected(st, reader, got[0], names)
            have = (s.samples_node, s.bytes_node, s.samples_remote, s.bytes_remote)
            if have != want:
                raise AssertionError(f"rank {comm.rank} on {names[comm.rank]}: (node samples, node bytes, remote "
                                     f"samples, remote bytes) {have}, expected {want} from the owners' hosts")
            check_delivery(comm, reader, got, epoch=1, policy=policy, seed=4, drop_last=False)
            rows = comm.allgather((names[comm.rank], index.bytes_read, index.node_size, index.nbytes, grown,
                                   have))
        per_node = {}
        for host, read, size, nbytes, shm, _ in rows:
            d = per_node.setdefault(host, {"ranks": 0, "readers": 0, "index_bytes_read": 0, "node_size": size,
                                           "index_bytes": nbytes, "shm_growth": shm})
            d["ranks"] += 1
            d["readers"] += read > 0
            d["index_bytes_read"] += read
        for host, d in per_node.items():
            # (a node of one rank needs no shared memory: MPICH keeps its window in private memory)
            in_shm = d["ranks"] == 1 or d["shm_growth"] >= d["index_bytes"]
            if d["readers"] != 1 or d["node_size"] != d["ranks"] or not in_shm:
                raise AssertionError(f"{host}: expected one index reader among its {d['ranks']} ranks, shared by "
                                     f"all, in its /dev/shm: {d}")
        split.append({"policy": policy, "per_rank_node_remote_bytes": [r[5][1::2] for r in rows],
                      "per_node": per_node})
        if len(per_node) > 1 and not all(r[5][3] for r in rows):
            raise AssertionError(f"a rank fetched nothing from another node: {[r[5] for r in rows]}")
    reader.close()
    report(comm, "store", hosts=names, split=split)


def scenario_tiered(comm, path):
    """Data larger than the budget, across nodes (scenarios.scenario_tiered on its tier container)."""
    scenarios.scenario_tiered(comm, path)
    report(comm, "tiered", hosts=hosts(comm))


def scenario_stream(comm, path):
    """Stream population across nodes (store_scenarios.stream_scenarios)."""
    from store_scenarios import stream_scenarios

    stream_scenarios.scenario_stream_order(comm, path)
    report(comm, "stream", hosts=hosts(comm))


SCENARIOS = {name[len("scenario_"):]: fn for name, fn in globals().items() if name.startswith("scenario_")}

if __name__ == "__main__":
    scenarios.main(sys.argv[1:], SCENARIOS)
