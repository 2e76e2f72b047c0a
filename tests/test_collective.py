"""dstore.runtime.collective's topology (node_comm, topology) and root-only work (on_root): in this process on
one rank, and under `mpiexec -n 4` with and without $DSTORE_RANKS_PER_NODE=2."""

import dataclasses
import json
import os
from typing import Any

import pytest
from mpi4py import MPI
from support.mpirun import run_mpi

from dstore.errors import ConfigError, FormatError
from dstore.runtime import collective
from dstore.runtime.collective import Topology, node_comm, on_root, topology

COMMS = {"self": MPI.COMM_SELF, "world": MPI.COMM_WORLD}


@pytest.mark.parametrize("name", sorted(COMMS))
@pytest.mark.parametrize("emulate", [False, True])
def test_one_rank_is_one_node(name, emulate, monkeypatch):
    monkeypatch.setenv(collective.RANKS_PER_NODE_ENV, "2")
    here = topology(COMMS[name], emulate=emulate)
    assert here == Topology(rank=0, size=1, node=0, nodes=1, local_rank=0, local_size=1)
    assert here.single_node
    with pytest.raises(dataclasses.FrozenInstanceError):
        here.node = 1  # pyright: ignore[reportAttributeAccessIssue] - frozen: the assignment is refused
    node = node_comm(COMMS[name], emulate=emulate)
    try:
        assert (node.Get_rank(), node.Get_size()) == (0, 1)
    finally:
        node.Free()


@pytest.mark.parametrize("value", ["0", "-1", "two", "1.5"])
def test_a_bad_ranks_per_node_is_refused_where_it_is_honoured(value, monkeypatch):
    monkeypatch.setenv("DSTORE_RANKS_PER_NODE", value)
    with pytest.raises(ConfigError) as err:
        node_comm(MPI.COMM_SELF, emulate=True)
    assert str(err.value) == f"$DSTORE_RANKS_PER_NODE={value!r} must be an integer >= 1"
    with pytest.raises(ConfigError):
        topology(MPI.COMM_SELF, emulate=True)
    assert topology(MPI.COMM_SELF).local_size == 1  # the real node ignores it


def test_on_root_alone_returns_its_result_or_raises_its_own_error():
    assert on_root(MPI.COMM_SELF, lambda a, b=0: (a, b), 1, b=2) == (1, 2)
    exc = FormatError("bad")

    def fail():
        raise exc

    kws: tuple[dict[str, Any], ...] = ({}, {"types": {}})
    for kw in kws:
        with pytest.raises(FormatError) as err:
            on_root(MPI.COMM_SELF, fail, **kw)
        assert err.value is exc and collective.is_agreed(err.value)


def expected_topology(rank: int, size: int, k: int) -> dict:
    """On one machine, runs of k consecutive ranks stand for nodes (k = size: one node)."""
    node = rank // k
    return {
        "rank": rank,
        "size": size,
        "node": node,
        "nodes": -(-size // k),
        "local_rank": rank % k,
        "local_size": min(k, size - node * k),
    }


def check_consistent(tops: list[dict]) -> None:
    """Every rank sees the same size and number of nodes; a node's ranks are numbered 0..n-1 among
    themselves and say n; nodes are numbered in the order of their first ranks."""
    assert [t["rank"] for t in tops] == list(range(len(tops)))
    assert {(t["size"], t["nodes"]) for t in tops} == {(len(tops), tops[0]["nodes"])}
    firsts = []
    for node in range(tops[0]["nodes"]):
        members = [t for t in tops if t["node"] == node]
        assert sorted(t["local_rank"] for t in members) == list(range(len(members)))
        assert {t["local_size"] for t in members} == {len(members)}
        firsts.append(members[0]["rank"])
    assert firsts == sorted(firsts)


def error(type_: str, message: str) -> dict:
    return {"ok": False, "type": type_, "message": message, "agreed": True}


@pytest.mark.mpi
@pytest.mark.parametrize("per_node", [None, 2])
def test_topology_and_on_root_on_four_ranks(per_node, tmp_path):
    n = 4
    results, work = tmp_path / "results", tmp_path / "work"
    results.mkdir()
    work.mkdir()
    (work / "taken.h5").write_bytes(b"not ours to replace")
    env = {} if per_node is None else {"DSTORE_RANKS_PER_NODE": str(per_node)}
    run_mpi(
        n,
        ["python", os.path.join(os.path.dirname(__file__), "collective_run.py"), str(results), str(work)],
        timeout=90,
        env=env,
    )
    ranks = [json.loads((results / f"rank{r}.json").read_text()) for r in range(n)]
    k = per_node or n
    for key, per in (("real", n), ("emulated", k)):
        tops = [r[key] for r in ranks]
        check_consistent(tops)
        assert tops == [expected_topology(r, n, per) for r in range(n)], key
    halves = [r["half_emulated"] for r in ranks]  # {0, 2} and {1, 3}: ranks 0 and 1 of a 2-rank comm
    assert halves == [expected_topology(r // 2, 2, min(k, 2)) for r in range(n)]
    assert [r["node_comm"] for r in ranks] == [[r, n] for r in range(n)]
    assert [r["node_comm_emulated"] for r in ranks] == [[r % k, k] for r in range(n)]

    assert [r["result"] for r in ranks] == [{"ok": True, "value": [5, 7, 0]}] * n
    root, others = ranks[0], ranks[1:]
    assert root["trainer"] == root["ours"] == error("FormatError", "bad chunk")
    assert root["typed"] == error("PeerError", "peer")
    assert root["foreign"] == error("KeyError", "'k'")
    for r in others:
        assert r["trainer"] == error("ConfigError", "rank 0 failed: FormatError: bad chunk")
        assert r["ours"] == error("FormatError", "bad chunk (on rank 0)")
        assert r["typed"] == error("PeerError", "peer (on rank 0)")
        assert r["foreign"] == error("IngestError", "rank 0 failed: KeyError: 'k'")
    # ingest's rank-0-only steps: listing the source, checking the output
    assert root["open_source"]["type"] == "ConfigError" and "no-such-folder" in root["open_source"]["message"]
    assert root["output_exists"]["type"] == "ContainerExistsError"
    assert "taken.h5 already exists" in root["output_exists"]["message"]
    for key in ("open_source", "output_exists"):
        for r in others:
            assert r[key] == {**root[key], "message": root[key]["message"] + " (on rank 0)"}, key
    assert (work / "taken.h5").read_bytes() == b"not ours to replace"


@pytest.mark.mpi
def test_a_rank_waiting_for_a_late_rank_sleeps(tmp_path):
    """A blocking MPI collective busy-polls: a rank at the store's agreement or an epoch's start
    first spent the whole wait for a late rank at 100% of a core (0.7-1.0 s of CPU per second of
    wait, measured), its own CPU and its decode workers' loss. `collective.wait_asleep` waits asleep.
    CPU seconds, not time, are compared, with a margin: over the 2 s wait spinning cost 0.8 s and
    more here even on a machine loaded 4-fold, sleeping a few ms."""
    results, work = tmp_path / "results", tmp_path / "work"
    results.mkdir()
    work.mkdir()
    # MPICH's plain busy-poll (conftest turns on its heavy yield, which would make even an unsettled
    # wait cheap, so this check could not fail).
    run_mpi(
        2,
        ["python", os.path.join(os.path.dirname(__file__), "settle_run.py"), str(results), str(work)],
        timeout=90,
        env={"MPIR_CVAR_ENABLE_HEAVY_YIELD": "0"},
    )
    waiting = json.loads((results / "rank1.json").read_text())
    for step in ("agree", "epoch_start"):
        assert waiting[step]["wall"] > 1.5, (step, waiting)  # it did wait for rank 0
        assert waiting[step]["cpu"] < 0.25, (step, waiting)
