"""Capacity planning (`dstore plan`): what a data set costs a cluster, before a job is queued. Pure.

Given the data (samples N, their bytes) and the cluster (nodes, ranks per node, memory per node,
network, the job's share of the storage, how fast each rank consumes samples), `forecast` says per
rank: the data share, the metadata (dstore.index: 20 bytes per sample once per node; an epoch's
schedule: ~13 bytes per sample the rank serves), the buffers, the decode workers' memory; the
resident fraction (the tiered store's arithmetic: what fits the budget after buffers and metadata);
the population time; remote and storage bytes and time per step; whether input stays off the
critical path; and the settings it recommends.

The population model, fitted to the preloads measured on this machine (docs/benchmarks.md,
"The store's population with reads in flight"; validated in docs/benchmarks.md, "Scale"):
``max(bytes / bandwidth, requests / iops) + requests_per_rank * latency / threads``: the job's
bytes go through the slower of the storage's bandwidth and its request rate (both shared by every
reader), and each rank's chain of requests (1 MiB each: the kernel's split of a large read) pays
the round trip `threads` at a time.
"""

from __future__ import annotations

import dataclasses
import math

from dstore.errors import ConfigError

REQUEST_BYTES = 1 << 20
"""Bytes of one storage request of a large read (the kernel splits reads into about 1 MiB)."""
INDEX_BYTES = 20
"""Per sample, once per node: offsets, labels and checksums (dstore.index.NodeIndex)."""
SCHEDULE_BYTES = 13
"""Per sample a rank serves in an epoch: its id (8), pad flag (1), owner (4) (dstore.epoch)."""
RANK_BASE_BYTES = 300 << 20
"""A rank's interpreter, numpy, MPI and torch before any data (measured here: 250-350 MB)."""
DECODED_SAMPLE_BYTES = 3 * 224 * 224
"""A decoded, augmented sample handed to the model (uint8, 224x224 RGB)."""
WORKER_BYTES = 150 << 20
"""One decode worker process (interpreter, decoder, its batch buffers)."""
BUDGET_FRACTION = 0.7
"""What the store takes of a node's memory by default (dstore.memory.default_budget)."""


@dataclasses.dataclass(frozen=True)
class Storage:
    """The job's share of the file system the data comes from (`dstore pfs`'s model).

    Attributes:
        latency: seconds per request round trip.
        iops: requests per second, shared by every reader (inf: no cap).
        bandwidth: bytes per second, shared by every reader (inf: no cap).
    """

    latency: float = 0.0
    iops: float = math.inf
    bandwidth: float = math.inf


@dataclasses.dataclass(frozen=True)
class Cluster:
    """Attributes: nodes, ranks_per_node, memory_per_node (bytes), network (bytes/s per node),
    consume (samples/s per rank the training step takes), batch_size (global), threads (population
    reads in flight per rank), prefetch, workers (decode processes per rank; None: as needed),
    decode_seconds (CPU seconds to decode and augment one sample), local_bandwidth (bytes/s per node
    of the disk under the storage: the population's floor where the storage is the nodes' own)."""

    nodes: int
    ranks_per_node: int
    memory_per_node: float
    network: float = 12.5e9
    consume: float = 1000.0
    batch_size: int = 1024
    threads: int = 4
    prefetch: int = 2
    workers: int | None = None
    decode_seconds: float = 0.004
    local_bandwidth: float = math.inf

    @property
    def ranks(self) -> int:
        return self.nodes * self.ranks_per_node


def _check(cluster: Cluster, samples: int, mean_bytes: float) -> None:
    for name, value, low in (("nodes", cluster.nodes, 1), ("ranks_per_node", cluster.ranks_per_node, 1),
                             ("samples", samples, 1), ("batch_size", cluster.batch_size, 1)):
        if int(value) < low:
            raise ConfigError(f"{name}={value} must be >= {low}")
    if cluster.batch_size < cluster.ranks:
        raise ConfigError(f"batch_size={cluster.batch_size} is the global batch size and must be >= the number of "
                          f"ranks ({cluster.ranks})")
    for name, value in (("memory_per_node", cluster.memory_per_node), ("mean_bytes", mean_bytes),
                        ("consume", cluster.consume), ("network", cluster.network)):
        if not value > 0:
            raise ConfigError(f"{name}={value} must be > 0")


def population_seconds(total_bytes: float, ranks: int, storage: Storage, threads: int,
                       local_bandwidth: float = math.inf, nodes: int = 1) -> float:
    """The preload's time (see the module docstring): every rank reads total/ranks bytes."""
    requests = math.ceil(total_bytes / REQUEST_BYTES)
    per_rank = math.ceil(total_bytes / ranks / REQUEST_BYTES)
    bw = min(storage.bandwidth, local_bandwidth * nodes)
    shared = max(total_bytes / bw if bw < math.inf else 0.0, requests / storage.iops if storage.iops < math.inf else 0.0)
    return shared + per_rank * storage.latency / max(1, threads)


def forecast(samples: int, mean_bytes: float, cluster: Cluster, storage: Storage, *,
             largest_step_bytes: float | None = None, replicate: bool | None = None) -> dict:
    """What the data set costs each rank of `cluster`, and the settings to use (a plain dict).

    Args:
        samples, mean_bytes: the data set (N and its mean sample bytes).
        largest_step_bytes: the most bytes one rank's step can hold (the receive buffer); None:
            twice the mean step (a container gives the exact figure).
        replicate: force node replication on or off; None: the better of the two: a copy per node
            where one fits and its population (every node reads everything) costs at most twice the
            distributed one's, or the distributed store's input is on the critical path.
    """
    _check(cluster, samples, mean_bytes)
    if replicate is None:
        spread = forecast(samples, mean_bytes, cluster, storage, largest_step_bytes=largest_step_bytes,
                          replicate=False)
        if cluster.nodes == 1:
            return spread
        copy = forecast(samples, mean_bytes, cluster, storage, largest_step_bytes=largest_step_bytes,
                        replicate=True)
        better = copy["resident_fraction"] == 1.0 and (
            copy["population_seconds"] <= 2 * spread["population_seconds"] or not spread["input_off_critical_path"])
        return copy if better else spread
    c, n = cluster, int(samples)
    total = n * float(mean_bytes)
    p, rpn = c.ranks, c.ranks_per_node
    per_step = -(-c.batch_size // p)  # samples per rank per step
    step_bytes = per_step * mean_bytes
    recv = (c.prefetch + 1) * (largest_step_bytes if largest_step_bytes else 2 * step_bytes)
    step_seconds = per_step / c.consume
    workers = c.workers if c.workers is not None else max(1, math.ceil(1.25 * c.consume * c.decode_seconds))
    decode = workers * WORKER_BYTES + (c.prefetch + 1) * per_step * DECODED_SAMPLE_BYTES
    metadata = INDEX_BYTES * n / rpn + SCHEDULE_BYTES * n / p  # the node's index shared by its ranks
    budget = BUDGET_FRACTION * c.memory_per_node / rpn
    free = budget - metadata - recv - decode - RANK_BASE_BYTES
    share = total / rpn if replicate else total / p
    resident = 1.0 if share <= 0 else max(0.0, min(1.0, free / share))
    storage_step = step_bytes * (1.0 - resident)  # non-resident samples, read by the rank that needs them
    reads_step = per_step * (1.0 - resident)
    storage_time = (storage_step * p / storage.bandwidth if storage.bandwidth < math.inf else 0.0)
    storage_time = max(storage_time, reads_step * p / storage.iops if storage.iops < math.inf else 0.0)
    remote = 0.0 if replicate else step_bytes * resident * (1.0 - 1.0 / c.nodes)
    remote_time = remote * rpn / c.network  # the node's ranks share its link
    pop_bytes = total * resident * (c.nodes if replicate else 1)
    pop = population_seconds(pop_bytes, p, storage, c.threads, c.local_bandwidth, c.nodes)
    decode_time = per_step * c.decode_seconds / workers
    # The gets and storage reads of the next `lookahead` steps overlap this one: input is off the
    # critical path while each stream keeps up with the step on its own.
    lookahead = max(1, math.ceil((storage.latency + storage_time) / step_seconds) + 1) if resident < 1 else 4
    off_critical = max(remote_time, storage_time, decode_time) <= step_seconds
    return {
        "samples": n, "mean_bytes": float(mean_bytes), "total_bytes": total,
        "nodes": c.nodes, "ranks_per_node": rpn, "ranks": p, "batch_size": c.batch_size,
        "per_rank": {"data_share_bytes": share, "metadata_bytes": metadata, "receive_buffer_bytes": recv,
                     "decode_bytes": decode, "budget_bytes": budget,
                     "total_bytes": RANK_BASE_BYTES + metadata + recv + decode + share * resident},
        "per_node": {"index_bytes": INDEX_BYTES * n, "metadata_bytes": INDEX_BYTES * n + SCHEDULE_BYTES * n * rpn / p},
        "resident_fraction": resident, "replicate": replicate,
        "population_seconds": pop, "population_bytes": pop_bytes,
        "step": {"samples_per_rank": per_step, "seconds_at_consume": step_seconds,
                 "remote_bytes": remote, "remote_seconds": remote_time,
                 "storage_bytes": storage_step, "storage_seconds": storage_time, "decode_seconds": decode_time},
        "input_off_critical_path": off_critical,
        "recommend": {"replicate": replicate, "tiered": resident < 1.0, "storage_lookahead": lookahead,
                      "decode_workers": workers,
                      "nodes_for_resident": _nodes_needed(total, n, c, recv, decode)},
    }


def _nodes_needed(total: float, n: int, c: Cluster, recv: float, decode: float) -> int | None:
    """The fewest nodes (this shape) that hold every sample resident, or None if none up to 1M."""
    budget = BUDGET_FRACTION * c.memory_per_node / c.ranks_per_node
    nodes = 1
    while nodes <= 1 << 20:
        p = nodes * c.ranks_per_node
        free = budget - INDEX_BYTES * n / c.ranks_per_node - SCHEDULE_BYTES * n / p - recv - decode - RANK_BASE_BYTES
        if free > 0 and total / p <= free:
            return nodes
        if free <= 0 and INDEX_BYTES * n / c.ranks_per_node + RANK_BASE_BYTES + recv + decode > budget:
            return None  # what a rank holds besides its data exceeds its budget: no node count helps
        nodes *= 2
    return None


_NO_NODES = "none (a rank's memory besides its data exceeds its budget)"


def format_forecast(f: dict) -> str:
    """The forecast as the lines `dstore plan` prints."""
    def b(x):
        for unit, k in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
            if x >= k:
                return f"{x / k:.1f} {unit}"
        return f"{x:.0f} B"

    r, s, rec = f["per_rank"], f["step"], f["recommend"]
    lines = [
        f"data: {f['samples']:,} samples, {b(f['total_bytes'])} (mean {b(f['mean_bytes'])}); "
        f"{f['nodes']} nodes x {f['ranks_per_node']} ranks, global batch {f['batch_size']}",
        f"per rank: data share {b(r['data_share_bytes'])}, metadata {b(r['metadata_bytes'])}, receive buffers "
        f"{b(r['receive_buffer_bytes'])}, decode {b(r['decode_bytes'])}; budget {b(r['budget_bytes'])}, "
        f"holds {b(r['total_bytes'])}",
        f"per node: index {b(f['per_node']['index_bytes'])}, metadata {b(f['per_node']['metadata_bytes'])}",
        f"resident fraction: {100 * f['resident_fraction']:.1f}%" + (" (one copy per node)" if f["replicate"] else ""),
        f"population: {f['population_seconds']:.1f} s for {b(f['population_bytes'])}",
        f"per step and rank: {s['samples_per_rank']} samples in {1e3 * s['seconds_at_consume']:.1f} ms; remote "
        f"{b(s['remote_bytes'])} in {1e3 * s['remote_seconds']:.2f} ms, storage {b(s['storage_bytes'])} in "
        f"{1e3 * s['storage_seconds']:.2f} ms, decode {1e3 * s['decode_seconds']:.1f} ms",
        "input " + ("stays off" if f["input_off_critical_path"] else "is ON") + " the critical path",
        f"recommended: replicate={rec['replicate']}, tiered={rec['tiered']}, storage_lookahead="
        f"{rec['storage_lookahead']}, decode workers={rec['decode_workers']}; nodes for all resident: "
        f"{rec['nodes_for_resident'] if rec['nodes_for_resident'] is not None else _NO_NODES}",
    ]
    return "\n".join(lines)
