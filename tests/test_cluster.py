"""The store and the trainer across the nodes of an emulated cluster (`dstore cluster`: one network
namespace, host name, /dev/shm and /tmp per node, MPICH's launcher), not only ranks that pretend.

One cluster of 3 nodes serves the whole file (each job picks its layout with --hosts); skipped,
with the reason, where this machine cannot host one (not root, no `ip netns`).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cluster_run import mix_sources
from support.cluster import run_on, started

from dstore.tools import cluster

pytestmark = [pytest.mark.cluster, pytest.mark.mpi]

SCEN = str(Path(__file__).resolve().parent / "cluster_run.py")


@pytest.fixture(scope="module")
def box():
    """(cluster of 3 nodes x 2 ranks, each with its own /tmp; shared work folder; a store container in
    it, with the tiered scenario's, a container with fields and a mix's two sources beside it)."""
    from mpi4py import MPI
    from store_scenarios import mix_scenario
    from store_scenarios.scenarios import make_container, make_tier_container
    from test_served_fields import detection_items

    from dstore.ingest import ingest_items

    with started(nodes=3, ranks_per_node=2) as (c, work):
        path = make_container(str(work / "set.h5"))
        make_tier_container(path)
        ingest_items(iter(detection_items(23)), str(work / "fields.h5"), comm=MPI.COMM_SELF, progress=False)
        mix_scenario.make_sources(work)
        yield c, work, path


def _lines(out: str, name: str) -> list[dict]:
    return [json.loads(x) for x in out.splitlines() if x.startswith("{") and f'"scenario": "{name}"' in x]


def test_store_on_2x2_nodes_exactly_once_node_views_one_index_per_node_tiered_and_fields(box):
    c, _, path = box
    res = run_on(c, ["python", "-m", "mpi4py", SCEN, path, "nodes", "store", "tiered", "fields"],
                 hosts="node1:2,node2:2")
    assert _lines(res.stdout, "nodes")[0]["hosts"] == ["node1", "node1", "node2", "node2"]
    store = _lines(res.stdout, "store")[0]
    for split in store["split"]:
        assert sorted(split["per_node"]) == ["node1", "node2"]
        assert all(d["readers"] == 1 and d["node_size"] == 2 for d in split["per_node"].values())


def test_store_on_uneven_nodes_3_plus_1_stream_population_a_mix_and_no_path_of_one_node(box):
    from mpi4py import MPI
    from store_scenarios import mix_scenario

    c, work, path = box
    res = run_on(c, ["python", "-m", "mpi4py", SCEN, path, "nodes", "store", "stream", "mix", "paths"],
                 hosts="node1:3,node2:1")
    assert _lines(res.stdout, "nodes")[0]["hosts"] == ["node1"] * 3 + ["node2"]
    per_node = _lines(res.stdout, "store")[0]["split"][0]["per_node"]
    assert (per_node["node1"]["node_size"], per_node["node2"]["node_size"]) == (3, 1)
    across = json.loads(Path(_lines(res.stdout, "mix")[0]["out"]).read_text())
    alone = mix_scenario.run(MPI.COMM_SELF, mix_sources(path), "full", str(work / "alone.json"))
    assert across["entries"] == alone["entries"]  # the same global sequence as one process's


def test_store_state_resumes_on_3_nodes_and_on_1(box):
    c, _, path = box
    save = run_on(c, ["python", "-m", "mpi4py", SCEN, path, "resume_save"], hosts="node1:2,node2:2")
    assert _lines(save.stdout, "resume_save")[0]["hosts"] == ["node1", "node1", "node2", "node2"]
    for layout, nodes in (("node1:1,node2:1,node3:1", ["node1", "node2", "node3"]), ("node1:2", ["node1"])):
        res = run_on(c, ["python", "-m", "mpi4py", SCEN, path, "resume_load"], hosts=layout)
        assert sorted(set(_lines(res.stdout, "resume_load")[0]["hosts"])) == nodes


def test_refused_with_one_line_where_it_cannot_work(box, monkeypatch, capsys, tmp_path):
    from dstore.tools.cli import main

    c, _, _ = box
    with pytest.raises(cluster.ConfigError, match="already used"):
        cluster.up("other", c.subnet, 1)
    with pytest.raises(cluster.ConfigError, match="is not a node of cluster"):
        cluster.hosts_for(c, "node1:2,node9:1")
    with monkeypatch.context() as m:
        m.setenv("PATH", str(tmp_path))  # no `ip`, no `unshare`
        assert "needs `ip` (iproute2)" in (cluster.unavailable() or "")
        m.setattr(cluster.os, "geteuid", lambda: 1000)
        assert main(["cluster", "up", "--name", "nobody"]) == 1
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "needs root" in lines[0], lines
    assert "nobody" not in cluster.clusters()
