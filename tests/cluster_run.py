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
            raise AssertionError(
                f"rank {comm.rank} on {names[comm.rank]}: node_comm(emulate={emulate}) "
                f"groups ranks {members}, the host holds {want}"
            )
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
            assert index is not None  # open while the store is
            got = run_epoch(st, 1)
            check_stats(st, got, reader)
            s = st.stats
            assert s is not None  # the epoch's
            want = _expected(st, reader, got[0], names)
            have = (s.samples_node, s.bytes_node, s.samples_remote, s.bytes_remote)
            if have != want:
                raise AssertionError(
                    f"rank {comm.rank} on {names[comm.rank]}: (node samples, node bytes, remote "
                    f"samples, remote bytes) {have}, expected {want} from the owners' hosts"
                )
            check_delivery(comm, reader, got, epoch=1, policy=policy, seed=4, drop_last=False)
            rows = comm.allgather((names[comm.rank], index.bytes_read, index.node_size, index.nbytes, grown, have))
        per_node = {}
        for host, read, size, nbytes, shm, _ in rows:
            d = per_node.setdefault(
                host,
                {
                    "ranks": 0,
                    "readers": 0,
                    "index_bytes_read": 0,
                    "node_size": size,
                    "index_bytes": nbytes,
                    "shm_growth": shm,
                },
            )
            d["ranks"] += 1
            d["readers"] += read > 0
            d["index_bytes_read"] += read
        for host, d in per_node.items():
            # (a node of one rank needs no shared memory: MPICH keeps its window in private memory)
            in_shm = d["ranks"] == 1 or d["shm_growth"] >= d["index_bytes"]
            if d["readers"] != 1 or d["node_size"] != d["ranks"] or not in_shm:
                raise AssertionError(
                    f"{host}: expected one index reader among its {d['ranks']} ranks, shared by "
                    f"all, in its /dev/shm: {d}"
                )
        split.append({"policy": policy, "per_rank_node_remote_bytes": [r[5][1::2] for r in rows], "per_node": per_node})
        if len(per_node) > 1 and not all(r[5][3] for r in rows):
            raise AssertionError(f"a rank fetched nothing from another node: {[r[5] for r in rows]}")
    reader.close()
    report(comm, "store", hosts=names, split=split)


def scenario_paths(comm, path):
    """dstore.runtime.collective.seen_everywhere: a file rank 0 makes in its node's /tmp or /dev/shm is
    refused on every rank, naming the other node; one in the shared folder of `path` passes."""
    from dstore.errors import ConfigError
    from dstore.runtime.collective import seen_everywhere

    names = hosts(comm)
    made = comm.bcast(
        [os.path.join(d, f"dstore-seen-{os.getpid()}") for d in ("/tmp", "/dev/shm", os.path.dirname(path))]
    )
    if comm.rank == 0:
        for m in made:
            with open(m, "w") as f:
                f.write("x")
    comm.Barrier()
    try:
        for m in made[:2]:
            try:
                seen_everywhere(comm, m, "the test file")
            except ConfigError as exc:
                others = sorted(set(names) - {names[0]})
                if not all(h in str(exc) for h in others) or "not on storage every node sees" not in str(exc):
                    raise AssertionError(f"{m}: the refusal does not name {others}: {exc}") from None
            else:
                if len(set(names)) > 1:
                    raise AssertionError(f"{m} on {names[0]}'s own storage passed as seen by every node")
        seen_everywhere(comm, made[2], "the test file")
        _spool_on_one_node(comm, path, names)
    finally:
        comm.Barrier()
        if comm.rank == 0:
            for m in made:
                os.remove(m)
    report(comm, "paths", hosts=names)


def _spool_on_one_node(comm, path, names):
    """ingest_items with its spool on rank 0's /tmp: refused on every rank before any is read, naming
    the other nodes; nothing written."""
    from support.ingest import png_bytes

    from dstore.errors import ConfigError
    from dstore.ingest import ingest_items

    out = os.path.join(os.path.dirname(path), "spooled.h5")
    items = iter([(png_bytes(4, k), k % 2, f"s{k}.png") for k in range(6)]) if comm.rank == 0 else None
    try:
        ingest_items(items, out, comm=comm, spool_dir="/tmp", progress=False)
    except ConfigError as exc:
        if "the spool (spool_dir)" not in str(exc) or not all(h in str(exc) for h in set(names) - {names[0]}):
            raise AssertionError(f"the spool's refusal does not name the other nodes: {exc}") from None
    else:
        if len(set(names)) > 1:
            raise AssertionError("a spool on one node's /tmp was read by every node")
    if os.path.exists(out) and len(set(names)) > 1:
        raise AssertionError(f"{out} was written")


def scenario_tiered(comm, path):
    """Data larger than the budget (about 45% resident) across nodes: two epochs deliver what a fully
    resident store delivers, in the reference order; each rank reads from storage exactly the
    non-resident samples it delivers (scenarios.check_tier). One setting of scenarios.scenario_tiered's
    four: the others do not depend on where the ranks are."""
    reader = open_container(scenarios.tier_container(path))
    kw = dict(batch_size=BATCH, seed=6, storage_lookahead=4)
    with scenarios._tiered(comm, reader, **kw) as st, DataStore(comm, reader, batch_size=BATCH, seed=6) as full:
        for epoch in (0, 1):
            got, ref = run_epoch(st, epoch), run_epoch(full, epoch)
            scenarios.check_tier(comm, st, got, reader)
            check_stats(st, got, reader)
            if not all(np.array_equal(x, y) for x, y in zip(got, ref)):
                raise AssertionError(f"tiered != resident (epoch {epoch})")
            check_delivery(comm, reader, got, epoch=epoch, policy="global", seed=6, drop_last=False)
        fraction = st.tier["resident_fraction"]
    reader.close()
    report(comm, "tiered", hosts=hosts(comm), resident_fraction=fraction)


def scenario_stream(comm, path):
    """Stream population across nodes: epoch 0 is served while the windows fill (some samples read by
    the rank that delivers them, some from windows on this and other nodes) and delivers what a preload
    store does; epoch 1 reads nothing from storage (one setting of stream_scenarios.scenario_stream_order)."""
    from store_scenarios.stream_scenarios import _counts, slow_stream

    slow_stream()
    reader = open_container(path)
    kw = dict(batch_size=BATCH, seed=5)
    with (
        DataStore(comm, reader, **kw) as pre,
        DataStore(comm, path, population="stream", population_threads=2, **kw) as stream,
    ):
        for epoch in (0, 1):
            a, b = run_epoch(stream, epoch), run_epoch(pre, epoch)
            if not all(np.array_equal(x, y) for x, y in zip(a, b)):
                raise AssertionError(f"stream != preload (epoch {epoch})")
            check_delivery(comm, reader, a, epoch=epoch, policy="global", seed=5, drop_last=False)
            storage, windows, _ = _counts(comm, stream)
            if (epoch == 0 and not (storage and windows)) or (epoch == 1 and storage):
                raise AssertionError(f"epoch {epoch}: {storage} samples from storage, {windows} from windows")
    reader.close()
    report(comm, "stream", hosts=hosts(comm))


def scenario_fields(comm, path):
    """Extra fields served across nodes: every sample of an epoch once, with its own image and field
    bytes (fields.h5 beside `path`, made by the caller: fields_container)."""
    from store_scenarios.fields_scenario import served

    fields = fields_container(path)
    names = ["txt", "boxes"]
    with DataStore(comm, fields, batch_size=4, seed=9, fields=names) as st:
        rows = comm.gather(served(st.epoch(0), names), root=0)
    if comm.rank == 0:
        got = [r for part in rows for r in part]
        reader = open_container(fields)
        if sorted(i for i, _, _ in got) != list(range(reader.num_samples)):
            raise AssertionError(f"fields epoch delivered {sorted(i for i, _, _ in got)}")
        for i, image, f in got:
            want = (
                bytes(reader.sample(i)[0]).hex(),
                *(None if reader.field_missing(n, i, i + 1)[0] else reader.field_bytes(n, i).hex() for n in names),
            )
            if (image, f["txt"], f["boxes"]) != want:
                raise AssertionError(f"sample {i}: served image or fields differ from the container's")
        reader.close()
    report(comm, "fields", hosts=hosts(comm))


def fields_container(path) -> str:
    return os.path.join(os.path.dirname(path), "fields.h5")


def mix_sources(path) -> list[str]:
    return [os.path.join(os.path.dirname(path), "a.h5"), os.path.join(os.path.dirname(path), "b.zarr")]


def scenario_mix(comm, path):
    """A MixedStore across nodes (store_scenarios.mix_scenario: every byte checked on every rank); its
    global sequence goes to mix.json beside `path` for the test to hold against one process's."""
    from store_scenarios import mix_scenario

    sources = mix_sources(path)
    out = os.path.join(os.path.dirname(path), f"mix-{comm.size}.json")
    mix_scenario.check_counts(mix_scenario.run(comm, sources, "full", out), sources)
    report(comm, "mix", hosts=hosts(comm), out=out)


def _state_file(path) -> str:
    return os.path.join(os.path.dirname(path), "resume.pkl")


def scenario_resume_save(comm, path):
    """5 steps of epoch 1, then the store's state and what was delivered, to resume.pkl beside `path`."""
    import pickle

    names = hosts(comm)
    with DataStore(comm, path, batch_size=BATCH, seed=11) as st:
        first = run_epoch(st, 1, steps=5)
        sd = st.state_dict()
    rows = comm.gather(first, root=0)
    if comm.rank == 0:
        with open(_state_file(path), "wb") as f:
            pickle.dump({"state": scenarios.checkpoint_bytes(sd), "rows": rows, "hosts": names}, f)
    report(comm, "resume_save", hosts=names)


def scenario_resume_load(comm, path):
    """resume.pkl's state resumed on this job's nodes: with what the saving job delivered, every
    sample of epoch 1 once, in the reference global order."""
    import pickle

    with open(_state_file(path), "rb") as f:
        saved = pickle.load(f)
    reader = open_container(path)
    with DataStore(comm, path, batch_size=BATCH, seed=0) as st:
        st.load_state_dict(scenarios.checkpoint_state(saved["state"]))
        rest = run_epoch(st, 1)
    if comm.rank == 0:  # the saving job's deliveries, its ranks in order: check_delivery rebuilds each step
        rest = tuple(np.concatenate([*(r[k] for r in saved["rows"]), rest[k]]) for k in range(len(rest)))
    check_delivery(comm, reader, rest, epoch=1, policy="global", seed=11, drop_last=False)
    reader.close()
    report(comm, "resume_load", hosts=hosts(comm), saved_on=sorted(set(saved["hosts"])))


SCENARIOS = {name[len("scenario_") :]: fn for name, fn in globals().items() if name.startswith("scenario_")}

if __name__ == "__main__":
    scenarios.main(sys.argv[1:], SCENARIOS)
