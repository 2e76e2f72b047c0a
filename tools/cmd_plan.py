"""`dstore plan`: what a data set costs a cluster (memory per rank, population, traffic per step), and
the settings to use, before a job is queued (dstore.memory.capacity)."""

from __future__ import annotations

HELP = "Forecast per-rank memory, resident fraction, population time and traffic for a data set on a cluster."

LOCAL_BANDWIDTH = "480MB/s"
"""This machine's evicted sequential read of a container (docs/benchmarks.md): the population's floor."""


def add_arguments(parser) -> None:
    parser.add_argument(
        "container", nargs="?", help="a container (its N, mean and largest samples); or give --samples and --mean-bytes"
    )
    parser.add_argument("--samples", type=int, help="number of samples (without a container)")
    parser.add_argument("--mean-bytes", help="mean sample size, e.g. 110KB (without a container)")
    parser.add_argument("--nodes", type=int, nargs="+", default=[1], help="nodes (several: one forecast each)")
    parser.add_argument("--ranks-per-node", type=int, default=8, help="ranks per node")
    parser.add_argument("--memory-per-node", default="256G", help="memory per node, e.g. 256G")
    parser.add_argument(
        "--memory-budget",
        help="each rank's store budget, as the store's memory_budget / "
        "$DSTORE_MEMORY_BUDGET (default: the store's, 70%% of the node's memory left once its ranks "
        "started, over its ranks)",
    )
    parser.add_argument("--storage-lookahead", type=int, default=4, help="the tiered store's storage_lookahead")
    parser.add_argument("--network", type=float, default=12.5, help="network GB/s per node")
    parser.add_argument(
        "--storage",
        default="local",
        metavar="local|pfs:KEY=VALUE,...",
        help="the job's share of the storage, as `dstore pfs` spells it, e.g. "
        "pfs:latency=2ms,iops=2000,bandwidth=1GB/s",
    )
    parser.add_argument(
        "--local-bandwidth",
        default=None,
        help="bytes/s per node of the disk under the storage (the population's floor); default "
        f"{LOCAL_BANDWIDTH} (this machine's, measured) with --storage local, else none",
    )
    parser.add_argument("--consume", type=float, default=1000.0, help="samples/s each rank's training step takes")
    parser.add_argument("--batch-size", type=int, default=None, help="global batch size (default: 64 per rank)")
    parser.add_argument("--threads", type=int, default=4, help="population reads in flight per rank")
    parser.add_argument("--workers", type=int, help="decode workers per rank (default: as many as --consume needs)")
    parser.add_argument("--decode-ms", type=float, default=4.0, help="CPU ms to decode and augment one sample")
    parser.add_argument(
        "--bench",
        help="a `dstore bench` results.json: the disk bandwidth and decode cost "
        "it measured replace --local-bandwidth and --decode-ms",
    )
    parser.add_argument("--json", action="store_true", help="print the forecasts as JSON")


NUMBER_FLAGS = (  # flag, its dest, dstore.memory.capacity.check_number's rule
    ("--samples", "samples", {"low": 1, "integer": True}),
    ("--ranks-per-node", "ranks_per_node", {"low": 1, "integer": True}),
    ("--storage-lookahead", "storage_lookahead", {"integer": True}),
    ("--network", "network", {"strict": True, "high": 1e21}),  # GB/s: dstore.memory.capacity.MAX_FIGURE bytes/s
    ("--consume", "consume", {"strict": True}),
    ("--batch-size", "batch_size", {"low": 1, "integer": True}),
    ("--threads", "threads", {"low": 1, "integer": True}),
    ("--workers", "workers", {"integer": True}),
    ("--decode-ms", "decode_ms", {}),
)
"""The numeric flags and what each allows (None: not given, the default applies)."""


def _from_bench(path: str) -> tuple[float | None, float | None]:
    """(cold read bytes/s, decode seconds per sample) from a bench results.json, where measured.

    Raises:
        ConfigError: naming the file, if it cannot be read as one or a figure is not a positive rate
            or a duration >= 0.
    """
    import json

    from dstore.errors import ConfigError
    from dstore.memory import capacity

    try:
        with open(path) as f:
            doc = json.load(f)
        rows = doc.get("measurements", doc) if isinstance(doc, dict) else doc
        disk, decode = None, None
        for i, m in enumerate(rows if isinstance(rows, list) else []):
            secs = max(m.get("seconds") or [0]) or 0
            if not secs:  # not measured
                continue
            capacity.check_number(f"--bench {path}: measurement {i}'s seconds", secs, strict=True)
            if m.get("cache") == "cold" and m.get("group") in ("limit", "population"):
                disk = max(disk or 0.0, sum(m.get("nbytes", [])) / secs)
            if m.get("group") == "decode" and sum(m.get("samples", [])):
                decode = secs * len(m["seconds"]) / sum(m["samples"])
    except (OSError, ValueError, TypeError, AttributeError, KeyError) as exc:
        raise ConfigError(f"--bench {path}: not a `dstore bench` results.json ({type(exc).__name__}: {exc})") from None
    if disk is not None:
        capacity.check_number(f"--bench {path}: its measured disk bandwidth (bytes/s)", disk, strict=True)
    if decode is not None:
        capacity.check_number(f"--bench {path}: its measured decode seconds per sample", decode)
    return disk, decode


def _inputs(args) -> dict:
    """Every flag checked (ConfigError naming the flag, its value and what is allowed, before any
    file is read) and read: the data set's (n, mean bytes) where given as flags, and the cluster's."""
    from dstore.errors import ConfigError
    from dstore.memory import capacity
    from dstore.memory.limits import parse_bytes
    from dstore.tools.pfs.model import parse_bandwidth, parse_spec

    for flag, dest, rule in NUMBER_FLAGS:
        if getattr(args, dest) is not None:
            capacity.check_number(flag, getattr(args, dest), **rule)
    for nodes in args.nodes:
        capacity.check_number("--nodes", nodes, low=1, integer=True)
        ranks = nodes * args.ranks_per_node
        if args.batch_size is not None and args.batch_size < ranks:
            raise ConfigError(
                f"--batch-size={args.batch_size} is the global batch size and must be >= the number "
                f"of ranks ({ranks} for --nodes {nodes} x --ranks-per-node {args.ranks_per_node})"
            )
    if args.container and (args.samples is not None or args.mean_bytes is not None):
        raise ConfigError("give a container or --samples and --mean-bytes, not both (the container has its own)")
    if not args.container and (args.samples is None or args.mean_bytes is None):
        raise ConfigError("give a container, or both --samples and --mean-bytes")
    sizes = {}
    for flag, dest in (
        ("--mean-bytes", "mean_bytes"),
        ("--memory-per-node", "memory_per_node"),
        ("--memory-budget", "memory_budget"),
    ):
        text = getattr(args, dest)
        if text is not None:
            sizes[dest] = parse_bytes(text, flag)
            capacity.check_number(flag, sizes[dest], strict=True)
    model = parse_spec(args.storage)
    local = args.local_bandwidth or (LOCAL_BANDWIDTH if args.storage.strip() in ("local", "pfs:local") else "unlimited")
    local_bw, decode_s = parse_bandwidth(local, "--local-bandwidth"), args.decode_ms / 1e3
    capacity.check_number("--local-bandwidth", local_bw, strict=True, cap=True)
    capacity.check_number(f"--storage {args.storage}: latency", model.latency)
    capacity.check_number(f"--storage {args.storage}: iops", model.iops, strict=True, cap=True)
    capacity.check_number(f"--storage {args.storage}: bandwidth", model.bandwidth, strict=True, cap=True)
    if args.bench:
        disk, dec = _from_bench(args.bench)
        local_bw = disk if disk is not None else local_bw
        decode_s = dec if dec is not None else decode_s
    return {
        "sizes": sizes,
        "local_bandwidth": local_bw,
        "decode_seconds": decode_s,
        "storage": capacity.Storage(latency=model.latency, iops=model.iops, bandwidth=model.bandwidth),
    }


def run(args) -> int:
    import json

    import numpy as np

    from dstore.errors import ConfigError
    from dstore.memory import capacity

    inputs = _inputs(args)
    sizes = inputs["sizes"]
    from dstore.order import plan

    largest, reader_index, offsets = None, 0, None
    if args.container:
        from dstore.formats import open_container

        with open_container(args.container) as c:
            n, mean = c.num_samples, c.total_bytes / max(1, c.num_samples)
            offsets = np.asarray(c.offsets)
            reader_index = 0 if getattr(c, "index_on_demand", False) else capacity.READER_INDEX_BYTES
    else:
        n, mean = args.samples, sizes["mean_bytes"]
    out = []
    for nodes in args.nodes:
        if args.batch_size is not None and args.batch_size > n:  # (the default, 64 per rank, is a sketch's)
            raise ConfigError(
                f"--batch-size={args.batch_size} is larger than the data ({n:,} samples): no epoch has "
                f"one whole step; give --batch-size {n:,} or less"
            )
        cl = capacity.Cluster(
            nodes=nodes,
            ranks_per_node=args.ranks_per_node,
            memory_per_node=sizes["memory_per_node"],
            network=args.network * 1e9,
            consume=args.consume,
            batch_size=args.batch_size or 64 * nodes * args.ranks_per_node,
            threads=args.threads,
            workers=args.workers,
            decode_seconds=inputs["decode_seconds"],
            local_bandwidth=inputs["local_bandwidth"],
            storage_lookahead=args.storage_lookahead,
            memory_budget=sizes.get("memory_budget"),
            reader_index_bytes=reader_index,
        )
        if offsets is not None:  # a container given
            per_step = min(-(-cl.batch_size // cl.ranks) + 1, n)
            largest = plan.largest_sum(offsets, per_step)
        out.append(capacity.forecast(n, mean, cl, inputs["storage"], largest_step_bytes=largest))
    if args.json:
        print(json.dumps(out if len(out) > 1 else out[0], indent=1))
    else:
        print("\n\n".join(capacity.format_forecast(f) for f in out))
    return 0
