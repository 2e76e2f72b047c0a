"""The store and the trainer across the nodes of an emulated cluster (`dstore cluster`: one network
namespace, host name, /dev/shm and /tmp per node, MPICH's launcher), not only ranks that pretend.

One cluster of 3 nodes serves the whole file (each job picks its layout with --hosts); skipped,
with the reason, where this machine cannot host one (not root, no `ip netns`).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from cluster_run import mix_sources
from support.cluster import ranks_on, run_on, start_on, started

from dstore.runtime.preemption import PREEMPTED_EXIT
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
    res = run_on(
        c, ["python", "-m", "mpi4py", SCEN, path, "nodes", "store", "tiered", "fields"], hosts="node1:2,node2:2"
    )
    assert _lines(res.stdout, "nodes")[0]["hosts"] == ["node1", "node1", "node2", "node2"]
    store = _lines(res.stdout, "store")[0]
    for split in store["split"]:
        assert sorted(split["per_node"]) == ["node1", "node2"]
        assert all(d["readers"] == 1 and d["node_size"] == 2 for d in split["per_node"].values())


def test_store_on_uneven_nodes_3_plus_1_stream_population_a_mix_and_no_path_of_one_node(box):
    from mpi4py import MPI
    from store_scenarios import mix_scenario

    c, work, path = box
    res = run_on(
        c, ["python", "-m", "mpi4py", SCEN, path, "nodes", "store", "stream", "mix", "paths"], hosts="node1:3,node2:1"
    )
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


TRAIN = ["--epochs", "1", "--batch-size", "64", "--seed", "3", "--log-batches", "--no-progress"]


def _batches(run_dir) -> dict:
    """{(epoch, step): [ids of every rank's part]} from every batches.rank*.jsonl of a run."""
    steps: dict = {}
    for log in sorted(Path(run_dir).glob("batches.rank*.jsonl")):
        for line in log.read_text().splitlines():
            b = json.loads(line)
            steps.setdefault((b["epoch"], b["step"]), []).extend(b["ids"])
    return steps


def test_ingest_verify_and_train_across_nodes_preempted_on_one_node_resumed_on_3(box):
    from support.ingest import check_container_against_folder, make_mixed_folder

    from dstore.formats import open_container
    from dstore.ingest.plan import sample_order

    c, work, _ = box
    images, out = work / "images", work / "ingested"
    make_mixed_folder(str(images), jpegs=30, pngs=14)
    res = run_on(
        c,
        ["dstore", "ingest", str(images), str(out), "--shards", "2", "--seed", "7", "--no-progress", "--json"],
        hosts="node1:1,node2:1",
    )
    assert json.loads(res.stdout)["ranks"] == 2
    check_container_against_folder(str(out), str(images))
    with open_container(str(out)) as r:
        assert (r.source_index == sample_order(44, 7)).all()  # as on one host
    res = run_on(c, ["dstore", "verify", str(out), "--json"], hosts="node2:1,node3:1")
    assert json.loads(res.stdout)["ok"] is True

    # dstore train on 2 nodes (1 + 2 ranks); SIGUSR1 to node2's ranks only, once rank 0 trained 3 steps:
    # every rank stops after the same step with a checkpoint (exit 75); then 3 nodes of 1 rank resume.
    run_dir, env = work / "run", {"DSTORE_CACHE": str(work / "cache")}
    proc = start_on(c, ["dstore", "train", "--run-dir", str(run_dir)] + TRAIN, hosts="node1:1,node2:2", env=env)
    log = run_dir / "batches.rank0.jsonl"
    try:
        deadline = time.monotonic() + 150
        while not (log.exists() and log.read_text().count("\n") >= 3):
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate(timeout=5)
            time.sleep(0.05)
        signalled = ranks_on(c, 2)
        assert len(signalled) == 2, signalled
        for pid in signalled:
            os.kill(pid, signal.SIGUSR1)
        out_text, err_text = proc.communicate(timeout=150)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == PREEMPTED_EXIT, (proc.returncode, out_text, err_text)
    assert "checkpoint in" in out_text, out_text
    stopped = _batches(run_dir)
    assert 3 <= len(stopped) < 23 and all(len(ids) == 64 for ids in stopped.values())  # 23 steps per epoch
    res = run_on(
        c,
        ["dstore", "train", "--run-dir", str(run_dir), "--resume", "auto"] + TRAIN,
        hosts="node1:1,node2:1,node3:1",
        env=env,
        timeout=150,
    )
    assert "resumed from" in res.stdout, res.stdout
    steps = _batches(run_dir)
    assert sorted(steps) == [(0, s) for s in range(23)]
    ids = sorted(i for part in steps.values() for i in part)
    assert ids == list(range(1438))  # every training sample once over the two jobs


def test_ltfb_with_its_two_trainers_on_two_nodes(box):
    c, work, _ = box
    run_dir = work / "ltfb"
    received = Path(f"/sys/class/net/{c.veth(3)}/statistics/tx_bytes")  # what the bridge sent node3
    before = int(received.read_text())
    run_on(
        c,
        [
            "dstore",
            "train",
            "--trainers",
            "2",
            "--epochs",
            "1",
            "--batch-size",
            "32",
            "--ltfb-round",
            "5",
            "--seed",
            "4",
            "--no-progress",
            "--run-dir",
            str(run_dir),
        ],
        hosts="node1:1,node3:1",
        env={"DSTORE_CACHE": str(work / "cache")},
        timeout=150,
    )
    log = [json.loads(x) for x in (run_dir / "tournament.jsonl").read_text().splitlines()]
    assert log and {tuple(sorted(r["pair"])) for r in log} == {(0, 1)}, log  # trainer 0 on node1 met trainer 1 on node3
    assert all(r["own_score"] is not None and r["partner_score"] is not None for r in log), log
    models = sum((run_dir / f"trainer{k}" / "checkpoint.pt").stat().st_size for k in (0, 1))
    # every round moved a model both ways over node3's link (and the gradients of its own trainer stay on it)
    assert int(received.read_text()) - before > len({r["round"] for r in log}) * models // 4


def test_down_after_a_crash_removes_processes_namespaces_and_links_by_name(box):
    """`up`'s state record lost (a crash), a job still running on the nodes: `down` finds everything by name."""
    c0, work, _ = box
    name = f"t{os.getpid()}z"
    c = cluster.up(name, cluster.free_subnet(first=200), nodes=2, ranks_per_node=1)
    try:
        proc = start_on(c, ["python", "-c", "import time; time.sleep(600)"])
        deadline = time.monotonic() + 60
        while len(ranks_on(c, 1, "time.sleep") + ranks_on(c, 2, "time.sleep")) < 2:
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate(timeout=5)
            time.sleep(0.05)
        (c.folder / "state.json").unlink()  # as if `up` had crashed before writing it
        removed = cluster.down(name)
        assert proc.wait(timeout=30) is not None
    finally:
        cluster.down(name)
    assert any(r.startswith("namespace ") for r in removed) and any(r.startswith("link ") for r in removed), removed
    # the first node's processes ended (its proxy among them), mpiexec ended the others itself
    assert any("process(es) in" in r for r in removed) and proc.returncode != 0, removed
    out = (
        subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
        + subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    )
    assert name not in out and not c.folder.exists()
    assert c0.name in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout  # the other kept
