"""dstore.tools.cluster's pure parts (names, subnets, layouts, the launch line, the files it writes), which
need neither root nor a cluster; tests/test_cluster.py runs jobs on a real one."""

from __future__ import annotations

import dataclasses
import subprocess

import pytest

from dstore.errors import ConfigError
from dstore.tools import cluster

C = cluster.Cluster("demo", "10.99.7.0/24", nodes=3, ranks_per_node=2, link="1gbit", node_tmp=True)


@pytest.mark.parametrize("name", ["", "1abc", "Abc", "a-b", "abcdefghijk", "a b"])
def test_names_that_cannot_prefix_a_link_are_refused(name):
    with pytest.raises(ConfigError, match="--name"):
        cluster.check_name(name)


def test_longest_name_and_largest_node_fit_a_link_name():
    c = cluster.Cluster("a" * cluster.MAX_NAME, "10.99.7.0/24", nodes=cluster.MAX_NODES)
    assert len(c.veth(cluster.MAX_NODES) + "p") <= 15 and len(c.bridge) <= 15


@pytest.mark.parametrize(
    "subnet, ok",
    [
        ("10.99.7.0/24", True),
        ("10.99.7.5/24", True),
        ("10.99.0.0/16", False),
        ("8.8.8.0/24", False),
        ("nonsense", False),
    ],
)
def test_subnets(subnet, ok):
    if ok:
        assert cluster.check_subnet(subnet) == "10.99.7.0/24"
    else:
        with pytest.raises(ConfigError, match="--subnet"):
            cluster.check_subnet(subnet)


def test_addresses_names_and_default_layout():
    assert [C.address(i) for i in (1, 3)] == ["10.99.7.1", "10.99.7.3"] and C.host_address == "10.99.7.254"
    assert (C.namespace(2), C.veth(2), C.bridge, C.hostname(2)) == ("demo-node2", "demon2", "demobr", "node2")
    assert C.hosts() == "node1:2,node2:2,node3:2"


def test_layouts_uneven_checked_and_the_launch_line():
    assert cluster.hosts_for(C, "node1:3, node2:1") == "node1:3,node2:1"
    assert cluster.hosts_for(C, "node2") == "node2:1"
    for bad, word in (("node4:1", "not a node"), ("node1:0", "rank count"), ("node1:x", "rank count")):
        with pytest.raises(ConfigError, match=word):
            cluster.hosts_for(C, bad)
    argv = cluster.mpiexec_command(C, ["dstore", "train"], "node1:3,node2:1", None, "/x/mpiexec")
    assert argv == [
        "/x/mpiexec",
        "-launcher",
        "ssh",
        "-launcher-exec",
        str(C.launcher),
        "-hosts",
        "node1:3,node2:1",
        "-localhost",
        "10.99.7.254",
        "-n",
        "4",
        "dstore",
        "train",
    ]
    assert cluster.mpiexec_command(C, ["x"], None, 5, "m")[-3:] == ["-n", "5", "x"]
    with pytest.raises(ConfigError, match="after `--`"):
        cluster.mpiexec_command(C, [], None, None, "m")


def test_a_run_crosses_the_links_and_sees_real_nodes():
    env = cluster.run_env({"DSTORE_RANKS_PER_NODE": "2", "UCX_TLS": "sm", "KEEP": "1"})
    assert env["UCX_TLS"] == "tcp,self" and env["UCX_NET_DEVICES"] == "eth0" and env["KEEP"] == "1"
    assert "DSTORE_RANKS_PER_NODE" not in env


def test_launch_script_and_hosts_file():
    script = cluster._launch_script(C)
    assert 'ip netns exec "demo-$host" unshare --uts --mount --propagation private' in script
    assert (
        "mount -t tmpfs -o mode=1777 tmpfs /dev/shm && mount --bind /tmp /run/dstore-cluster/demo/host-tmp "
        "&& mount -t tmpfs -o mode=1777 tmpfs /tmp"
    ) in script
    # a clone under /tmp (as CI may make) stays seen by every node of a node_tmp cluster
    kept = cluster._launch_script(dataclasses.replace(C, shared_in_tmp=("ci1",)))
    assert "mkdir -p /tmp/ci1 && mount --bind /run/dstore-cluster/demo/host-tmp/ci1 /tmp/ci1" in kept
    assert (
        "/tmp"
        not in cluster._launch_script(cluster.Cluster("demo", "10.99.7.0/24", 2))
        .split("/dev/shm", 1)[1]
        .split("&& exec")[0]
    )
    res = subprocess.run(["sh", "-n"], input=script, text=True, capture_output=True)
    assert res.returncode == 0, res.stderr  # valid shell
    hosts = cluster._hosts_file(C).splitlines()
    assert "10.99.7.3 node3" in hosts and "::ffff:10.99.7.1 node1" in hosts and hosts[0] == "127.0.0.1 localhost"


def test_up_with_a_bad_link_or_count_is_refused_before_anything_is_made(monkeypatch):
    monkeypatch.setattr(cluster, "unavailable", lambda: None)
    for kw, word in (({"link": "fast"}, "--link"), ({"nodes": 0}, "--nodes"), ({"ranks_per_node": 0}, "--ranks")):
        with pytest.raises(ConfigError, match=word):
            cluster.up("zz", "10.99.7.0/24", **{"nodes": 2, **kw})
