"""`dstore plan`'s arithmetic (dstore.capacity) and its command line."""

import json
import math
import subprocess
import sys

import pytest
from formats_helpers import random_samples, write_samples

from dstore import capacity
from dstore.errors import ConfigError

PFS8 = capacity.Storage(latency=8e-3, iops=2000, bandwidth=1e9)


def test_population_is_the_shared_rate_plus_each_ranks_round_trips():
    # 225 MB, one rank, 4 threads, 8 ms: 215 requests; the disk's 480 MB/s bounds the bytes.
    t = capacity.population_seconds(225e6, 1, PFS8, 4, 480e6)
    assert t == pytest.approx(225e6 / 480e6 + 215 * 8e-3 / 4)
    # iops-bound: 1 GB of 1 MiB requests at 100/s
    t = capacity.population_seconds(1e9, 2, capacity.Storage(iops=100), 4)
    assert t == pytest.approx(math.ceil(1e9 / 2**20) / 100)


def test_more_nodes_shrink_the_share_not_the_node_index():
    def f(nodes, mem=64e9):
        cl = capacity.Cluster(nodes=nodes, ranks_per_node=8, memory_per_node=mem, batch_size=64 * 8 * nodes)
        return capacity.forecast(10_000_000, 100e3, cl, PFS8, replicate=False)

    a, b = f(4), f(64)
    assert b["per_rank"]["data_share_bytes"] == pytest.approx(a["per_rank"]["data_share_bytes"] / 16)
    assert a["per_node"]["index_bytes"] == b["per_node"]["index_bytes"] == 20 * 10_000_000
    assert a["resident_fraction"] < 1.0 and a["recommend"]["tiered"]  # 1 TB on 4 x 64 GB: tiered
    assert b["resident_fraction"] == 1.0 and not b["recommend"]["tiered"]
    assert a["step"]["storage_bytes"] > 0 == b["step"]["storage_bytes"]
    k = f(1)["recommend"]["nodes_for_resident"]  # the fewest (doubling) that hold it all
    assert f(k)["resident_fraction"] == 1.0 > f(k // 2)["resident_fraction"]


def test_replication_is_chosen_where_it_pays():
    def f(network):
        cl = capacity.Cluster(nodes=4, ranks_per_node=4, memory_per_node=256e9, batch_size=1024, network=network)
        return capacity.forecast(1_000_000, 100e3, cl, PFS8)

    fast = f(12.5e9)  # gets keep up: four copies' population (4x the reads) is not worth it
    assert not fast["replicate"] and fast["input_off_critical_path"] and fast["step"]["remote_bytes"] > 0
    slow = f(1e6)  # gets would stall every step: one copy per node, no remote traffic
    assert slow["replicate"] and slow["step"]["remote_bytes"] == 0 and slow["population_bytes"] == 4 * 1e11
    assert slow["population_seconds"] > 2 * fast["population_seconds"]


def test_bad_clusters_are_refused_naming_the_parameter():
    with pytest.raises(ConfigError, match="batch_size=4"):
        capacity.forecast(100, 10, capacity.Cluster(nodes=2, ranks_per_node=4, memory_per_node=1e9, batch_size=4),
                          PFS8)
    with pytest.raises(ConfigError, match="mean_bytes"):
        capacity.forecast(100, 0, capacity.Cluster(nodes=1, ranks_per_node=1, memory_per_node=1e9), PFS8)


def test_the_command_prints_json_forecasts():
    out = subprocess.run([sys.executable, "-m", "dstore.tools", "plan", "--samples", "1281167", "--mean-bytes",
                          "110KB", "--nodes", "1", "16", "--memory-per-node", "64G", "--storage",
                          "pfs:latency=2ms,iops=2000", "--json"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)
    assert [r["nodes"] for r in rows] == [1, 16]
    assert rows[0]["resident_fraction"] < rows[1]["resident_fraction"] == 1.0


def test_the_command_reads_a_containers_sizes(tmp_path):
    path = write_samples(tmp_path / "c.h5", "hdf5", random_samples(50, seed=1))
    out = subprocess.run([sys.executable, "-m", "dstore.tools", "plan", path, "--nodes", "1", "--ranks-per-node",
                          "2", "--memory-per-node", "1G", "--json"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    f = json.loads(out.stdout)
    assert f["samples"] == 50 and f["ranks"] == 2 and 0 < f["per_rank"]["receive_buffer_bytes"]
