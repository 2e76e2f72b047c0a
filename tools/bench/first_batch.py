"""`mpiexec -n 2 python -m dstore.tools.bench.first_batch --data-dir DIR`: the first batch and
epoch 0 of the store (streamed and preloaded) beside WebDataset's in-process pipeline, alone and
repeated, through a fresh `dstore pfs` mount per pass (issue 24's goal: the first batch no later
than WebDataset's, epoch 0 no slower, at 2 ms and 300 operations/s).

The loaders are `dstore bench --peers`' (tools/bench/peers.py: the same samples' raw bytes, batch
32 per rank, times from the loader's construction, the slowest rank), over the data set and tar
shards that `dstore bench --peers --data-dir DIR` writes (made here if missing). Passes alternate
between the loaders, `--repeats` of each; the report gives every pass and the median, with the
load average before and after, since a shared machine moves CPU-bound times.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

DEFAULT_RUNG = "pfs:latency=2ms,iops=300"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m dstore.tools.bench.first_batch", description=__doc__)
    p.add_argument("--data-dir", required=True, help="the bench's data directory (generated there if missing)")
    p.add_argument("--count", type=int, default=2000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--batch-size", type=int, default=64, help="global batch (per rank: divided by the ranks)")
    p.add_argument("--rung", default=DEFAULT_RUNG, help="local or pfs:...")
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args(argv)

    from mpi4py import MPI

    from dstore.tools.bench import peer_data, peers
    from dstore.tools.bench.data import container_path, data_tag, prepare_data
    from dstore.tools.bench.storage import mount_roots

    comm = MPI.COMM_WORLD
    ranks = comm.Get_size()
    prepare_data(comm, args.count, args.data_dir, seed=args.seed)
    container = container_path(args.data_dir, data_tag(args.count, args.seed), "hdf5")
    pd = peer_data.prepare(comm, container, os.path.join(args.data_dir, "peers"), seed=args.seed, litdata_ok=False)
    skip = peers.missing("webdataset")

    def specs(tr):
        out = [peers.store_spec(tr(container), pop, args.batch_size, args.seed) for pop in ("stream", "preload")]
        if not skip:
            out.append(
                peers.wds_spec(
                    [tr(s) for s in pd.tars["shuffled"]], 0, True, max(1, args.batch_size // ranks), args.seed
                )
            )
        return out

    roots = mount_roots(args.data_dir, container)
    load = os.getloadavg()[0]
    rows: dict = {}
    for _ in range(args.repeats):
        for k in range(len(specs(lambda x: x))):
            with peers.storage_rung(comm, args.rung, roots) as (tr, stats):
                spec = specs(tr)[k]
                if args.rung == "local":
                    from dstore.tools.bench.common import evict_on_nodes

                    evict_on_nodes(comm, spec.paths)
                res = peers.run_pass(comm, spec, epochs=1)
            if "error" in res:
                raise SystemExit(f"{spec.name}: {res['error']}")
            ops = sum(s.get("ops", 0) for s in stats) if stats else None
            rows.setdefault(spec.name, []).append((res["first_batch_s"], res["epoch0_s"], ops))
    if comm.Get_rank() == 0:
        print(
            f"{ranks} ranks, {args.count} samples, global batch {args.batch_size}, {args.rung}; "
            f"load average {load:.1f} before, {os.getloadavg()[0]:.1f} after; "
            f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}"
        )
        print("| loader | first batch s (median; passes) | epoch 0 s (median; passes) | storage ops / pass |")
        print("|---|---|---|---|")
        for name, r in rows.items():
            fb, e0, ops = zip(*r)
            print(
                f"| {name} | {statistics.median(fb):.2f} ({', '.join(f'{x:.2f}' for x in fb)}) | "
                f"{statistics.median(e0):.2f} ({', '.join(f'{x:.2f}' for x in e0)}) | "
                f"{', '.join('-' if o is None else f'{o:,}' for o in ops)} |"
            )
        if skip:
            print(f"\nSkipped WebDataset: {skip}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
