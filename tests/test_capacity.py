"""`dstore plan`'s arithmetic (dstore.memory.capacity) and its command line."""

import dataclasses
import json
import math
import subprocess
import sys

import numpy as np
import pytest
from support.formats import random_samples, raw_container, write_samples
from support.mpirun import run_mpi

from dstore.errors import ConfigError
from dstore.memory import budget, capacity
from dstore.order import tiers
from dstore.store import budget as store_budget
from dstore.store import preload
from dstore.tools.measure import plan_check

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
    assert a["per_node"]["index_bytes"] == b["per_node"]["index_bytes"] == 13 * 10_000_000
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
        capacity.forecast(100, 10, capacity.Cluster(nodes=2, ranks_per_node=4, memory_per_node=1e9, batch_size=4), PFS8)
    with pytest.raises(ConfigError, match="mean_bytes"):
        capacity.forecast(100, 0, capacity.Cluster(nodes=1, ranks_per_node=1, memory_per_node=1e9), PFS8)


def test_the_command_prints_json_forecasts():
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "dstore.tools",
            "plan",
            "--samples",
            "1281167",
            "--mean-bytes",
            "110KB",
            "--nodes",
            "1",
            "16",
            "--memory-per-node",
            "64G",
            "--storage",
            "pfs:latency=2ms,iops=2000",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)
    assert [r["nodes"] for r in rows] == [1, 16]
    assert rows[0]["resident_fraction"] < rows[1]["resident_fraction"] == 1.0


def test_the_command_reads_a_containers_sizes(tmp_path):
    path = write_samples(tmp_path / "c.h5", "hdf5", random_samples(50, seed=1))
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "dstore.tools",
            "plan",
            path,
            "--nodes",
            "2",
            "--ranks-per-node",
            "2",
            "--memory-per-node",
            "1G",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    f = json.loads(out.stdout)
    assert f["samples"] == 50 and f["ranks"] == 4 and 0 < f["per_rank"]["receive_buffer_bytes"]


def test_the_model_of_a_tiered_preload_is_its_reads():
    # A random residency's reads as dstore.order.tiers.preload_reads plans them: bytes (resident ones and
    # the gaps crossed) and the number of reads, which the population's requests count.
    n, size, piece = 20_000, 110_000, 4_500_000
    offsets = np.arange(n + 1, dtype=np.int64) * size
    for f in (0.3, 0.62, 0.9):
        res = tiers.resident_mask(np.full(n, size), np.zeros(n, np.int64), np.array([int(f * n * size)]), 1)
        ids = np.nonzero(res)[0]
        groups = tiers.preload_reads(ids, offsets, piece, capacity.GAP_BYTES)
        nbytes = sum(int(offsets[ids[m - 1] + 1] - offsets[ids[k]]) for k, m in groups)
        pb, reads = capacity.tiered_preload(ids.size * size, size, res.mean(), piece)
        assert pb == pytest.approx(nbytes, rel=0.02) and reads == pytest.approx(len(groups), rel=0.05)
    assert (capacity.GAP_BYTES, capacity.PRELOAD_SCRATCH, capacity.READER_INDEX_BYTES) == (
        preload.GAP_BYTES,
        preload.PRELOAD_SCRATCH,
        budget.READER_INDEX_BYTES,
    )


def test_the_budget_holds_the_stores_buffers_not_the_interpreter():
    # A 10 MB share per rank and a 9 MB budget: the store keeps 9 MB less its buffers resident;
    # the interpreter and the metadata are not in the store's budget, the loaders' reserve is in
    # the trainer's.
    # (32 x 32 inputs: a 224 x 224 one would add the compiled kernels' 144 MiB, more than this budget)
    cl = capacity.Cluster(
        nodes=2,
        ranks_per_node=1,
        memory_per_node=1e9,
        memory_budget=9e6,
        batch_size=2,
        trainer=False,
        input_shape=(32, 32, 3),
        image_shape=(32, 32, 3),
    )
    f = capacity.forecast(200, 1e5, cl, PFS8, largest_step_bytes=2e5, replicate=False)
    bufs = 3 * 2e5 + 5 * 2e5  # prefetch + 1 receive buffers, storage_lookahead + 1 storage buffers
    assert f["resident_fraction"] == pytest.approx((9e6 - bufs) / 1e7)
    assert f["per_rank"]["store_bytes"] == pytest.approx(9e6)
    trained = capacity.forecast(
        200, 1e5, dataclasses.replace(cl, trainer=True, workers=0), PFS8, largest_step_bytes=2e5, replicate=False
    )
    reserve = trained["per_rank"]["decode_bytes"]
    assert reserve > 0 and trained["resident_fraction"] == pytest.approx((9e6 - reserve - bufs) / 1e7)


@pytest.mark.mpi
@pytest.mark.parametrize("ranks", [1, 2])
def test_the_forecast_resident_fraction_is_the_tiered_stores(tmp_path, ranks):
    # The measurement program's run of a real tiered store (a budget of 70% of a rank's share) beside
    # `dstore plan`'s forecast for the same inputs: the same resident fraction, to one sample.
    path = raw_container(tmp_path / "c.h5", n=400, shape=(32, 32, 3))
    out = run_mpi(
        ranks,
        ["python", "-m", "dstore.tools.measure.plan_check", "--worker", path, "--batch", "8", "--tiered", "0.7"],
        timeout=120,
    )
    row = json.loads(out.stdout.strip().splitlines()[-1])[0]
    f = plan_check.predict(path, ranks, 8, row["budget_bytes"], "local", math.inf)
    assert 0.2 < row["resident_fraction"] < 0.8
    assert f["resident_fraction"] == pytest.approx(row["resident_fraction"], abs=ranks * 32 * 32 * 3 / 1.2288e6)


def test_a_streaming_store_counts_no_reader_index_its_readers_do_not_load(tmp_path):
    # The stream's StorageReader opens HDF5 without the index (byte ranges): 20 B x N per thread
    # counted in the budget would be memory no reader holds (fewer samples resident for nothing).
    from mpi4py import MPI

    from dstore.store.data_store import DataStore

    path = raw_container(tmp_path / "c.h5", n=400, shape=(8, 8, 3))
    store = DataStore(MPI.COMM_SELF, path, batch_size=8, population="stream")
    try:
        assert store.plan.reader_index == 0
        assert store_budget.stream_buffers(store.plan) == (store.prefetch + 1) * store_budget.recv_bound(store.plan)
    finally:
        store.close()


def test_the_command_takes_the_stores_budget_and_lookahead():
    # 2 GB on one rank with a 1 GB budget: the trainer's loaders' reserve first, then
    # storage_lookahead + 1 storage buffers of twice a mean step (no container) and the data.
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "dstore.tools",
            "plan",
            "--samples",
            "20000",
            "--mean-bytes",
            "100KB",
            "--ranks-per-node",
            "1",
            "--memory-budget",
            "1GB",
            "--storage-lookahead",
            "2",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    f = json.loads(out.stdout)
    tier = 3 * 2 * 64 * 100e3
    assert f["per_rank"]["storage_buffer_bytes"] == pytest.approx(tier)
    assert f["resident_fraction"] == pytest.approx((1e9 - f["per_rank"]["decode_bytes"] - tier) / 2e9)
