"""`dstore plan`: what a data set costs a cluster (memory per rank, population, traffic per step), and
the settings to use, before a job is queued (dstore.capacity)."""

from __future__ import annotations

HELP = "Forecast per-rank memory, resident fraction, population time and traffic for a data set on a cluster."

LOCAL_BANDWIDTH = "480MB/s"
"""This machine's evicted sequential read of a container (docs/benchmarks.md): the population's floor."""


def add_arguments(parser) -> None:
    parser.add_argument("container", nargs="?", help="a container (its N, mean and largest samples); or give "
                        "--samples and --mean-bytes")
    parser.add_argument("--samples", type=int, help="number of samples (without a container)")
    parser.add_argument("--mean-bytes", help="mean sample size, e.g. 110KB (without a container)")
    parser.add_argument("--nodes", type=int, nargs="+", default=[1], help="nodes (several: one forecast each)")
    parser.add_argument("--ranks-per-node", type=int, default=8, help="ranks per node")
    parser.add_argument("--memory-per-node", default="256G", help="memory per node, e.g. 256G")
    parser.add_argument("--memory-budget", help="each rank's store budget, as the store's memory_budget / "
                        "$DSTORE_MEMORY_BUDGET (default: the store's, 70%% of the node's memory left once its ranks "
                        "started, over its ranks)")
    parser.add_argument("--storage-lookahead", type=int, default=4, help="the tiered store's storage_lookahead")
    parser.add_argument("--network", type=float, default=12.5, help="network GB/s per node")
    parser.add_argument("--storage", default="local", metavar="local|pfs:KEY=VALUE,...",
                        help="the job's share of the storage, as `dstore pfs` spells it, e.g. "
                             "pfs:latency=2ms,iops=2000,bandwidth=1GB/s")
    parser.add_argument("--local-bandwidth", default=None,
                        help="bytes/s per node of the disk under the storage (the population's floor); default "
                             f"{LOCAL_BANDWIDTH} (this machine's, measured) with --storage local, else none")
    parser.add_argument("--consume", type=float, default=1000.0, help="samples/s each rank's training step takes")
    parser.add_argument("--batch-size", type=int, default=None, help="global batch size (default: 64 per rank)")
    parser.add_argument("--threads", type=int, default=4, help="population reads in flight per rank")
    parser.add_argument("--workers", type=int, help="decode workers per rank (default: as many as --consume needs)")
    parser.add_argument("--decode-ms", type=float, default=4.0, help="CPU ms to decode and augment one sample")
    parser.add_argument("--bench", help="a `dstore bench` results.json: the disk bandwidth and decode cost "
                                        "it measured replace --local-bandwidth and --decode-ms")
    parser.add_argument("--json", action="store_true", help="print the forecasts as JSON")


def _from_bench(path: str) -> tuple[float | None, float | None]:
    """(cold read bytes/s, decode seconds per sample) from a bench results.json, where measured."""
    import json

    with open(path) as f:
        doc = json.load(f)
    rows = doc.get("measurements", doc) if isinstance(doc, dict) else doc
    disk, decode = None, None
    for m in rows if isinstance(rows, list) else []:
        secs = max(m.get("seconds") or [0]) or 0
        if not secs:
            continue
        if m.get("cache") == "cold" and m.get("group") in ("limit", "population"):
            disk = max(disk or 0.0, sum(m.get("nbytes", [])) / secs)
        if m.get("group") == "decode" and sum(m.get("samples", [])):
            decode = secs * len(m["seconds"]) / sum(m["samples"])
    return disk, decode


def run(args) -> int:
    import json

    import numpy as np

    from dstore import capacity
    from dstore.errors import ConfigError
    from dstore.memory import parse_bytes
    from dstore.tools.pfs.model import parse_bandwidth, parse_spec

    largest, reader_index = None, 0
    if args.container:
        from dstore import plan
        from dstore.formats import open_container

        with open_container(args.container) as c:
            n, mean = c.num_samples, c.total_bytes / max(1, c.num_samples)
            offsets = np.asarray(c.offsets)
            reader_index = 0 if getattr(c, "index_on_demand", False) else capacity.READER_INDEX_BYTES
    elif args.samples is None or args.mean_bytes is None:
        raise ConfigError("give a container, or both --samples and --mean-bytes")
    else:
        n, mean = args.samples, parse_bytes(args.mean_bytes, "--mean-bytes")
    model = parse_spec(args.storage)
    storage = capacity.Storage(latency=model.latency, iops=model.iops, bandwidth=model.bandwidth)
    local = args.local_bandwidth or (LOCAL_BANDWIDTH if args.storage.strip() in ("local", "pfs:local") else "unlimited")
    local_bw, decode_s = parse_bandwidth(local, "--local-bandwidth"), args.decode_ms / 1e3
    if args.bench:
        disk, dec = _from_bench(args.bench)
        local_bw, decode_s = disk or local_bw, dec or decode_s
    out = []
    for nodes in args.nodes:
        cl = capacity.Cluster(nodes=nodes, ranks_per_node=args.ranks_per_node,
                              memory_per_node=parse_bytes(args.memory_per_node, "--memory-per-node"),
                              network=args.network * 1e9, consume=args.consume,
                              batch_size=args.batch_size or 64 * nodes * args.ranks_per_node,
                              threads=args.threads, workers=args.workers, decode_seconds=decode_s,
                              local_bandwidth=local_bw, storage_lookahead=args.storage_lookahead,
                              memory_budget=(parse_bytes(args.memory_budget, "--memory-budget")
                                             if args.memory_budget else None), reader_index_bytes=reader_index)
        if args.container:
            per_step = min(-(-cl.batch_size // cl.ranks) + 1, n)
            largest = plan.largest_sum(offsets, per_step)
        out.append(capacity.forecast(n, mean, cl, storage, largest_step_bytes=largest))
    if args.json:
        print(json.dumps(out if len(out) > 1 else out[0], indent=1))
    else:
        print("\n\n".join(capacity.format_forecast(f) for f in out))
    return 0
