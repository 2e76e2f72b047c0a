"""Capacity planning (`dstore plan`): what a data set costs a cluster, before a job is queued. Pure.

Given the data (samples N, their bytes) and the cluster (nodes, ranks per node, memory per node,
network, the job's share of the storage, how fast each rank consumes samples), `forecast` says per
rank: the data share, the metadata (dstore.store.index: 13 bytes per sample once per node; an epoch's
schedule: nothing per sample when every sample is resident, computed per step; a tiered store's
~10 bytes per sample the rank serves, and its resident mask and resident offsets, 9 bytes per
sample of N on every rank), the buffers, the decode workers' memory; the
resident fraction (the tiered store's arithmetic: what fits the budget beside the store's buffers);
the population time; remote and storage bytes and time per step; whether input stays off the
critical path; and the settings it recommends.

The resident fraction is the store's own arithmetic (dstore.store.budget.check_budget): the store's
budget holds its resident data and its buffers (receive buffers beside other ranks; when tiered,
`storage_lookahead + 1` steps of storage reads and each storage thread's reader index). Under
`dstore train` (`Cluster.trainer`) a rank's budget is shared with its loaders' decoded batches and
decode workers (dstore.training.budget: the store gets the budget less that reserve). The default
budget is the store's: 70% of what the node has available once its ranks have started and opened
the node's index, shared by its ranks. The interpreter and the metadata live beside the budget.

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
import numbers

from dstore.errors import ConfigError
from dstore.memory import costs
from dstore.memory.costs import KEEP_HANDED, WORKER_BYTES

REQUEST_BYTES = 1 << 20
"""Bytes of one storage request of a large read (the kernel splits reads into about 1 MiB)."""
INDEX_BYTES = 13
"""Per sample, once per node: offsets (8), checksums (4), labels (1, up to 256 classes) (dstore.store.index.NodeIndex)."""
SCHEDULE_BYTES = 0
"""Per sample a rank serves in an epoch of a resident store: none (the global order's schedule is
computed per step from the bijection, dstore.order.plan.global_schedule)."""
TIER_SCHEDULE_BYTES = 10
"""Per sample a tiered rank serves in an epoch: its id (8) and two flags (dstore.store.storage.StorageEpoch)."""
TIER_INDEX_BYTES = 9
"""Per sample of N, on every rank of a tiered store: which samples are resident (bool,
dstore.order.tiers.resident_blocks) and the offsets over the resident samples (int64), from which each
window's displacements are looked up (dstore.store.budget.choose_resident)."""
LOADER_AHEAD = 2
"""Batches a StoreLoader decodes ahead (its default `ahead`), counted in `loader_reserve`."""
RANK_BASE_BYTES = 300 << 20
"""A rank's interpreter, numpy, MPI and torch before any data (measured here: 250-350 MB)."""
BUDGET_FRACTION = 0.7
"""What the store takes of a node's memory by default (dstore.memory.limits.default_budget)."""
GAP_BYTES = 256 << 10
"""dstore.store.preload.GAP_BYTES: the most bytes of non-resident samples a tiered preload's read crosses."""
PRELOAD_SCRATCH = 8 << 20
"""dstore.store.preload.PRELOAD_SCRATCH: the most bytes of one read of a tiered preload."""
READER_INDEX_BYTES = 20
"""Per sample, in each storage thread's reader where its backend loads the index (dstore.memory.budget:
sharded containers; HDF5 and Zarr readers read byte ranges without it)."""


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
    of the disk under the storage: the population's floor where the storage is the nodes' own),
    memory_budget (bytes per rank, the store's `memory_budget`; None: the store's default),
    storage_lookahead and storage_threads (the tiered store's, as the store's settings),
    reader_index_bytes (per sample, in each storage thread's reader: 0 for HDF5 and Zarr), trainer
    (the budget is `dstore train`'s, its loaders' reserve taken first; False: a DataStore's alone),
    input_shape (the model's input), image_shape (the data's decoded images; default a typical
    ImageNet photo) and decode_threads (the trainer's), which size that reserve (`loader_reserve`)."""

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
    memory_budget: float | None = None
    storage_lookahead: int = 4
    storage_threads: int = 4
    reader_index_bytes: float = 0.0
    trainer: bool = True
    input_shape: tuple = (224, 224, 3)
    image_shape: tuple = (375, 500, 3)
    decode_threads: int = 2

    @property
    def ranks(self) -> int:
        return self.nodes * self.ranks_per_node


MAX_COUNT = 2**63 - 1
"""The largest count a forecast takes (samples, ranks, threads, ...): an int64, as the store's arrays hold."""
MAX_FIGURE = 1e30
"""The largest figure a forecast takes (bytes, bytes/s, samples/s, seconds), and 1/MAX_FIGURE the
smallest of those that must be > 0: far past any cluster's, and near enough that no product or
ratio of a few of them overflows a float (inf / inf would be NaN)."""


def check_number(
    name: str,
    value,
    *,
    low: float = 0,
    strict: bool = False,
    integer: bool = False,
    cap: bool = False,
    high: float | None = None,
) -> None:
    """Refuses (ConfigError, one line naming `name`, the value and what is allowed) anything but a
    number >= `low` (> `low` if `strict`, and then at least 1/MAX_FIGURE unless an integer) and
    <= `high` (default MAX_COUNT for an integer, else MAX_FIGURE), an integer if `integer`; inf only
    if `cap` (it means no cap). NaN, bools and text are refused."""
    high = (MAX_COUNT if integer else MAX_FIGURE) if high is None else high
    ok = isinstance(value, numbers.Integral) if integer else isinstance(value, numbers.Real)
    # compared as they are, not as floats: an int past 1e308 has none
    ok = ok and not isinstance(value, bool) and (value > low if strict else value >= low)
    ok = ok and (cap or value < math.inf)
    if not ok:  # also NaN, which compares false
        kind = "an integer" if integer else ("a number" if cap else "a finite number")
        raise ConfigError(
            f"{name}={value!r} must be {kind} {'>' if strict else '>='} {low:g}" + (" (or inf: no cap)" if cap else "")
        )
    if strict and not integer and value < 1 / MAX_FIGURE:
        raise ConfigError(f"{name}={value!r} must be at least {1 / MAX_FIGURE:g}")
    if value > high and not (cap and value == math.inf):  # exact: 2**63 - 1 is no float
        limit = high if integer else f"{high:g}"
        raise ConfigError(f"{name}={value!r} must be at most {limit}" + (" (or inf: no cap)" if cap else ""))


def _check(cluster: Cluster, samples: int, mean_bytes: float, storage: Storage) -> None:
    """Every input of a forecast in its range (check_number), naming the first one that is not."""
    c = cluster
    rules: list[tuple[str, object, dict]] = [
        ("samples", samples, {"low": 1, "integer": True}),
        ("mean_bytes", mean_bytes, {"low": 1}),
        ("nodes", c.nodes, {"low": 1, "integer": True}),
        ("ranks_per_node", c.ranks_per_node, {"low": 1, "integer": True}),
        ("memory_per_node", c.memory_per_node, {"strict": True}),
        ("network", c.network, {"strict": True}),
        ("consume", c.consume, {"strict": True}),
        ("batch_size", c.batch_size, {"low": 1, "integer": True}),
        ("threads", c.threads, {"low": 1, "integer": True}),
        ("prefetch", c.prefetch, {"integer": True}),
        ("decode_seconds", c.decode_seconds, {}),
        ("local_bandwidth", c.local_bandwidth, {"strict": True, "cap": True}),
        ("storage_lookahead", c.storage_lookahead, {"integer": True}),
        ("storage_threads", c.storage_threads, {"low": 1, "integer": True}),
        ("reader_index_bytes", c.reader_index_bytes, {}),
        ("decode_threads", c.decode_threads, {"integer": True}),
        ("storage.latency", storage.latency, {}),
        ("storage.iops", storage.iops, {"strict": True, "cap": True}),
        ("storage.bandwidth", storage.bandwidth, {"strict": True, "cap": True}),
    ]
    if c.workers is not None:
        rules.append(("workers", c.workers, {"integer": True}))
    if c.memory_budget is not None:
        rules.append(("memory_budget", c.memory_budget, {"strict": True}))
    for name, value, kw in rules:
        check_number(name, value, **kw)
    for name, shape in (("input_shape", c.input_shape), ("image_shape", c.image_shape)):
        for x in shape:
            check_number(f"{name}={tuple(shape)!r}: each", x, low=1, integer=True)
    if c.batch_size < c.ranks:
        raise ConfigError(
            f"batch_size={c.batch_size} is the global batch size and must be >= the number of ranks ({c.ranks})"
        )


def loader_reserve(
    *,
    local_batch: int,
    input_shape: tuple[int, ...],
    image_shape: tuple[int, ...],
    mean_sample_bytes: float,
    decode_threads: int,
    loaders: int = 1,
    workers: int = 0,
    deferred_resize: bool = False,
) -> int:
    """Bytes a rank's StoreLoaders hold at most, estimated: per loader, `LOADER_AHEAD + 1` batches
    of `local_batch` samples, each as its bytes plus the decoded uint8 image at the model's input
    shape twice (the per-sample tensors and the stacked batch), and per decode thread two images at
    the data's decoded shape (the decode and its resize). `loaders`: those alive at once.

    `workers` > 0: the training loader decodes in that many processes instead of threads (NOTE
    [decode workers] in dstore.loader.workers): each costs `WORKER_BYTES` and two decoded images, and the
    `KEEP_HANDED` spare batch segments are kept to be written again. `deferred_resize`: the
    workers leave the resize to a batch op (StoreLoader(resize_on="device")), their ring's slots
    hold canvases of 4x the input's pixels instead. An input of dstore.memory.costs.NATIVE_MIN_PIXELS or
    more adds, once, what the compiled kernels cost (`costs.RESERVE_BYTES`)."""
    batch_pixels = local_batch * math.prod(input_shape)
    batches = (LOADER_AHEAD + 1) * (local_batch * mean_sample_bytes + 2 * batch_pixels)
    threads = decode_threads * 2 * math.prod(image_shape)
    total = loaders * (batches + threads)
    if workers:
        total += workers * (WORKER_BYTES + 2 * math.prod(image_shape)) + KEEP_HANDED * batch_pixels - threads
        if deferred_resize:
            total += (LOADER_AHEAD + 1) * 4 * batch_pixels
    if math.prod(input_shape[:2]) >= costs.NATIVE_MIN_PIXELS:  # the compiled kernels will load
        total += costs.RESERVE_BYTES
    return int(total)


def population_seconds(
    total_bytes: float,
    ranks: int,
    storage: Storage,
    threads: int,
    local_bandwidth: float = math.inf,
    nodes: int = 1,
    reads: float = 0.0,
) -> float:
    """The preload's time (see the module docstring): every rank reads total/ranks bytes, in 1 MiB
    requests; `reads` separate reads (a tiered preload's) add half a request each on average (the
    last, partial one of each)."""
    requests = math.ceil(total_bytes / REQUEST_BYTES + reads / 2)
    per_rank = math.ceil(requests / ranks)
    bw = min(storage.bandwidth, local_bandwidth * nodes)
    shared = max(
        total_bytes / bw if bw < math.inf else 0.0, requests / storage.iops if storage.iops < math.inf else 0.0
    )
    return shared + per_rank * storage.latency / max(1, threads)


def tiered_preload(
    resident_bytes: float, mean_bytes: float, fraction: float, piece: float, gap: float = GAP_BYTES
) -> tuple[float, float]:
    """(bytes read, reads) of a tiered preload (dstore.order.tiers.preload_reads) of `resident_bytes`.

    The resident samples are a random subset (dstore.order.tiers.resident_mask): after each comes a run of
    k non-resident ones with probability (1 - f)^k f. A read goes on across such a run where its
    bytes are at most `gap` (k <= m = gap // mean), reading and dropping them, and ends after a
    longer one; and it ends at `piece` bytes. So each resident sample costs its bytes plus the
    expected crossed ones, sum_{k<=m} k (1-f)^k f of them, and ends a run of reads with probability
    (1 - f)^(m + 1); a run longer than `piece` is several reads. (Byte-addressable containers,
    unfiltered HDF5 as `dstore ingest` writes them; others are read in whole pieces of the block.)"""
    if fraction >= 1.0 or resident_bytes <= 0 or fraction <= 0:
        return resident_bytes, resident_bytes / piece
    f, q, m = fraction, 1.0 - fraction, int(gap // mean_bytes)
    # the sum's closed form; >= 0, which rounding in its difference can miss where f is tiny
    crossed = max(0.0, q * (1.0 - (m + 1) * q**m + m * q ** (m + 1)) / f)
    nbytes = resident_bytes * (1.0 + crossed)
    end = q ** (m + 1)  # a resident sample ends its run of reads
    if end < 1e-12:
        return nbytes, nbytes / piece
    # a run of L resident samples (L geometric: P(L > t) = (1 - end)^t) of `each` bytes apiece is
    # ceil(L x each / piece) reads: E = sum_j P(L x each > j x piece) ~ 1 / (1 - (1 - end)^(piece/each))
    each = mean_bytes * (1.0 + crossed)
    runs = resident_bytes / mean_bytes * end
    # 1 - (1 - end)^x as -expm1(x log1p(-end)): exact where x is tiny and (1 - end)^x rounds to 1
    # (end 1: each resident sample alone between non-resident ones, log1p(-1) = -inf, one read each)
    return nbytes, runs / -math.expm1(piece / each * (math.log1p(-end) if end < 1.0 else -math.inf))


def forecast(
    samples: int,
    mean_bytes: float,
    cluster: Cluster,
    storage: Storage,
    *,
    largest_step_bytes: float | None = None,
    replicate: bool | None = None,
) -> dict:
    """What the data set costs each rank of `cluster`, and the settings to use (a plain dict).

    Args:
        samples, mean_bytes: the data set (N and its mean sample bytes).
        largest_step_bytes: the most bytes one rank's step can hold (the receive buffer); None:
            twice the mean step (a container gives the exact figure).
        replicate: force node replication on or off; None: the better of the two: a copy per node
            where one fits and its population (every node reads everything) costs at most twice the
            distributed one's, or the distributed store's input is on the critical path.
    """
    _check(cluster, samples, mean_bytes, storage)
    if replicate is None:
        spread = forecast(samples, mean_bytes, cluster, storage, largest_step_bytes=largest_step_bytes, replicate=False)
        if cluster.nodes == 1:
            return spread
        copy = forecast(samples, mean_bytes, cluster, storage, largest_step_bytes=largest_step_bytes, replicate=True)
        better = copy["resident_fraction"] == 1.0 and (
            copy["population_seconds"] <= 2 * spread["population_seconds"] or not spread["input_off_critical_path"]
        )
        return copy if better else spread
    c, n = cluster, int(samples)
    total = n * float(mean_bytes)
    p, rpn = c.ranks, c.ranks_per_node
    per_step = -(-c.batch_size // p)  # samples per rank per step
    step_bytes = per_step * mean_bytes
    step_max = largest_step_bytes if largest_step_bytes else 2 * step_bytes
    # The store's budget counts receive buffers wherever a rank gets samples from others
    # (dstore.store.budget.receive_buffers); it allocates them only for samples in other nodes' windows
    # (dstore.store.epoch: a node's windows are read in place): none on one node, at most the bound on more.
    recv_counted = 0.0 if (replicate or p == 1) else (c.prefetch + 1) * step_max
    recv = recv_counted if c.nodes > 1 else 0.0
    step_seconds = per_step / c.consume
    workers = c.workers if c.workers is not None else max(1, math.ceil(1.25 * c.consume * c.decode_seconds))
    decode = (
        loader_reserve(
            local_batch=per_step,
            input_shape=c.input_shape,
            image_shape=c.image_shape,
            mean_sample_bytes=mean_bytes,
            decode_threads=c.decode_threads,
            workers=workers,
        )
        if c.trainer
        else 0
    )
    metadata = INDEX_BYTES * n / rpn + SCHEDULE_BYTES * n / p  # the node's index shared by its ranks
    budget = default_budget(c, n)
    store_budget = budget - decode  # dstore.training.budget.share_budget: the loaders' reserve first
    share = total / rpn if replicate else total / p
    tier_scratch = (c.storage_lookahead + 1) * step_max  # the storage buffers (the preload's scratch)
    tier = tier_scratch + c.storage_threads * c.reader_index_bytes * n
    resident = resident_fraction(share, store_budget, recv_counted, tier, rpn if replicate else 1)
    held = recv + (tier if resident < 1.0 else 0.0) + share * resident  # what the rank holds of its budget
    if resident < 1.0:  # the tiered epoch's plan, beside the budget
        metadata += TIER_SCHEDULE_BYTES * n / p + TIER_INDEX_BYTES * n
    storage_step = step_bytes * (1.0 - resident)  # non-resident samples, read by the rank that needs them
    reads_step = per_step * (1.0 - resident)
    bw = min(storage.bandwidth, c.local_bandwidth * c.nodes)  # the disk under the storage bounds it too
    storage_time = storage_step * p / bw if bw < math.inf else 0.0
    storage_time = max(storage_time, reads_step * p / storage.iops if storage.iops < math.inf else 0.0)
    remote = 0.0 if replicate else step_bytes * resident * (1.0 - 1.0 / c.nodes)
    remote_time = remote * rpn / c.network  # the node's ranks share its link
    pop_bytes, reads = total * resident * (c.nodes if replicate else 1), 0.0
    if resident < 1.0:  # the storage threads' reads, at most a scratch buffer each (dstore.store.populate._fill)
        threads = min(c.threads, c.storage_threads)
        piece = min(PRELOAD_SCRATCH, tier_scratch / threads)
        pop_bytes, reads = tiered_preload(pop_bytes, mean_bytes, resident, piece)
    pop = population_seconds(pop_bytes, p, storage, c.threads, c.local_bandwidth, c.nodes, reads)
    decode_time = per_step * c.decode_seconds / max(1, workers)  # 0 workers: the rank decodes
    # The gets and storage reads of the next `lookahead` steps overlap this one: input is off the
    # critical path while each stream keeps up with the step on its own.
    lookahead = max(1, math.ceil((storage.latency + storage_time) / step_seconds) + 1) if resident < 1 else 4
    schedules = rpn * (metadata - INDEX_BYTES * n / rpn)  # the node's ranks' own metadata
    node_bytes = rpn * (RANK_BASE_BYTES + decode + held) + INDEX_BYTES * n + schedules
    off_critical = max(remote_time, storage_time, decode_time) <= step_seconds
    return {
        "samples": n,
        "mean_bytes": float(mean_bytes),
        "total_bytes": total,
        "nodes": c.nodes,
        "ranks_per_node": rpn,
        "ranks": p,
        "batch_size": c.batch_size,
        "per_rank": {
            "data_share_bytes": share,
            "metadata_bytes": metadata,
            "receive_buffer_bytes": recv,
            "storage_buffer_bytes": tier if resident < 1.0 else 0.0,
            "decode_bytes": decode,
            "budget_bytes": budget,
            "store_bytes": held,
            "total_bytes": RANK_BASE_BYTES + metadata + decode + held,
        },
        "per_node": {
            "index_bytes": INDEX_BYTES * n,
            "metadata_bytes": INDEX_BYTES * n + schedules,
            "memory_bytes": node_bytes,
            "fits": node_bytes <= c.memory_per_node,
        },
        "resident_fraction": resident,
        "replicate": replicate,
        "population_seconds": pop,
        "population_bytes": pop_bytes,
        "step": {
            "samples_per_rank": per_step,
            "seconds_at_consume": step_seconds,
            "remote_bytes": remote,
            "remote_seconds": remote_time,
            "storage_bytes": storage_step,
            "storage_seconds": storage_time,
            "decode_seconds": decode_time,
        },
        "input_off_critical_path": off_critical,
        "recommend": {
            "replicate": replicate,
            "tiered": resident < 1.0,
            "storage_lookahead": lookahead,
            "decode_workers": workers,
            "nodes_for_resident": _nodes_needed(total, n, c, step_max, store_budget),
        },
    }


def default_budget(c: Cluster, n: int) -> float:
    """A rank's memory budget: `c.memory_budget`, else the store's default (dstore.memory.limits.default_budget):
    BUDGET_FRACTION of what the node has available when the store opens (its memory less the ranks'
    interpreters and the node's index) over its ranks."""
    if c.memory_budget is not None:
        return float(c.memory_budget)
    avail = c.memory_per_node - c.ranks_per_node * RANK_BASE_BYTES - INDEX_BYTES * n
    return BUDGET_FRACTION * max(0.0, avail) / c.ranks_per_node


def resident_fraction(share: float, budget: float, recv: float, tier: float, pooled: int = 1) -> float:
    """The fraction of a rank's `share` the store keeps resident (dstore.store.budget.check_budget and
    choose_resident): all of it where it fits beside the receive buffers, else what the budget
    keeps beside the receive and the tier's buffers (`tier`). `pooled`: ranks whose budgets hold
    one copy together (replicated: the node's ranks; no tier, all or nothing in the store)."""
    if share <= 0 or share + recv <= budget * pooled:
        return 1.0
    if pooled > 1:
        return max(0.0, min(1.0, (budget * pooled - recv) / share))
    return max(0.0, min(1.0, (budget - recv - tier) / share))


def _nodes_needed(total: float, n: int, c: Cluster, step_max: float, budget: float) -> int | None:
    """The fewest nodes (this shape) whose ranks hold every sample resident in their stores' `budget`,
    or None if none up to 1M (a rank's buffers alone exceed it: no node count helps)."""
    nodes = 1
    while nodes <= 1 << 20:
        p = nodes * c.ranks_per_node
        recv = 0.0 if p == 1 else (c.prefetch + 1) * step_max
        if recv >= budget:
            return None
        if total / p + recv <= budget:
            return nodes
        nodes *= 2
    return None


_NO_NODES = "none (a rank's memory besides its data exceeds its budget)"


def format_forecast(f: dict) -> str:
    """The forecast as the lines `dstore plan` prints: sizes and times in the units every command
    prints (dstore.runtime.units: SI, three significant digits)."""
    from dstore.runtime.units import fmt_seconds, fmt_size

    b, t = fmt_size, fmt_seconds

    r, s, rec = f["per_rank"], f["step"], f["recommend"]
    lines = [
        f"data: {f['samples']:,} samples, {b(f['total_bytes'])} (mean {b(f['mean_bytes'])}); "
        f"{f['nodes']} nodes x {f['ranks_per_node']} ranks, global batch {f['batch_size']}",
        f"per rank: data share {b(r['data_share_bytes'])}, metadata {b(r['metadata_bytes'])}, receive buffers "
        f"{b(r['receive_buffer_bytes'])}, storage buffers {b(r['storage_buffer_bytes'])}, decode "
        f"{b(r['decode_bytes'])}; budget {b(r['budget_bytes'])} (the store holds {b(r['store_bytes'])}), "
        f"holds {b(r['total_bytes'])}",
        f"per node: index {b(f['per_node']['index_bytes'])}, metadata {b(f['per_node']['metadata_bytes'])}, memory "
        f"{b(f['per_node']['memory_bytes'])}"
        + ("" if f["per_node"]["fits"] else " (MORE than the node has: lower memory_budget or decode workers)"),
        f"resident fraction: {100 * f['resident_fraction']:.3g}%" + (" (one copy per node)" if f["replicate"] else ""),
        f"population: {t(f['population_seconds'])} for {b(f['population_bytes'])}",
        f"per step and rank: {s['samples_per_rank']} samples in {t(s['seconds_at_consume'])}; remote "
        f"{b(s['remote_bytes'])} in {t(s['remote_seconds'])}, storage {b(s['storage_bytes'])} in "
        f"{t(s['storage_seconds'])}, decode {t(s['decode_seconds'])}",
        "input " + ("stays off" if f["input_off_critical_path"] else "is ON") + " the critical path",
        f"recommended: replicate={rec['replicate']}, tiered={rec['tiered']}, storage_lookahead="
        f"{rec['storage_lookahead']}, decode workers={rec['decode_workers']}; nodes for all resident: "
        f"{rec['nodes_for_resident'] if rec['nodes_for_resident'] is not None else _NO_NODES}",
    ]
    return "\n".join(lines)
