"""Delivery between the nodes of an emulated cluster (`dstore cluster`) against what its links carry,
the `dstore plan` forecast against what is measured, the training view (AU) over slow links, and the
watchdog's cost. As root:

    python -m dstore.tools.measure.links --out links.json   # saves links.json and links.md, prints the table

For each link speed (`--links none 10gbit 1gbit`) it brings up a cluster of 2 nodes x 2 ranks, then
  1. a plain TCP socket through the same links: one stream node2 -> node1, then both ways at once
     (the store's traffic goes both ways: every node reads from the other);
  2. a store job (this module's `job`, under `cluster.run`): epochs with no compute; remote bytes
     received per node per second, as a ratio to the socket's;
  3. the forecast of `dstore plan` (dstore.memory.capacity.forecast, the distributed store, not the
     replicated copy it may recommend) for the same data set, cluster and link: remote bytes and
     seconds per step, as ratios to the measured ones;
  4. the training view: the same job with a sleep of `--compute-ms` per step (DLIO's method: AU =
     compute / wall, data wait = the consumer's wait for batches).
With `--watchdog-ab`, unshaped links only: epochs with the watchdog off and on ($DSTORE_WAIT_BOUND=0
and 60), alternating. The machine's load (`os.getloadavg`) is saved beside every figure.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

SAMPLE_BYTES = 100_000
SAMPLES = 2000
JOB = [sys.executable, "-m", "dstore.tools.measure.links", "job"]

SERVER = """
import socket, sys, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(("0.0.0.0", int(sys.argv[1])))
s.listen(1); print("ready", flush=True); c, _ = s.accept(); n = 0; t0 = time.perf_counter()
while True:
    b = c.recv(1 << 20)
    if not b: break
    n += len(b)
print(n, time.perf_counter() - t0, flush=True)
"""
CLIENT = """
import socket, sys, time
c = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=60); buf = b"x" * (1 << 20); left = int(sys.argv[3])
while left > 0:
    c.sendall(buf[:min(left, len(buf))]); left -= len(buf)
c.close()
"""


def load() -> float:
    return round(os.getloadavg()[0], 1)


# ------------------------------------------------------------------------- the job (under mpiexec)
def job(argv: list[str]) -> None:
    """Under mpiexec: `job CONTAINER BATCH_PER_RANK EPOCHS COMPUTE_MS`; rank 0 prints one JSON line:
    per epoch (after the first) the wall seconds and every rank's stats."""
    from mpi4py import MPI

    from dstore.store.data_store import DataStore

    path, per_rank, epochs, compute = argv[0], int(argv[1]), int(argv[2]), float(argv[3]) / 1e3
    comm = MPI.COMM_WORLD
    rows = []
    with DataStore(comm, path, batch_size=per_rank * comm.Get_size(), seed=0) as store:
        for e in range(epochs):
            comm.Barrier()
            t0 = time.perf_counter()
            for _ in store.epoch(e):
                if compute:
                    time.sleep(compute)
            wall = time.perf_counter() - t0
            stats = store.gather_stats()
            rows.append({"epoch": e, "wall": comm.allreduce(wall, op=MPI.MAX), "stats": stats})
        hosts = comm.gather(MPI.Get_processor_name())
    if comm.Get_rank() == 0:
        print("JOB " + json.dumps({"hosts": hosts, "epochs": rows}), flush=True)


def make_container(path: str) -> None:
    import numpy as np

    from dstore.formats import create_writer

    rng = np.random.default_rng(0)
    with create_writer(
        path + ".part", "hdf5", encoding="raw", class_names=["a", "b"], raw_dtype="uint8", raw_shape=(SAMPLE_BYTES,)
    ) as w:
        for i in range(SAMPLES):
            w.append(rng.integers(0, 256, SAMPLE_BYTES, dtype=np.uint8), i % 2, f"s{i}", i)
    os.replace(path + ".part", path)


# ------------------------------------------------------------------------- the driver (root)
def socket_rate(c, nbytes: int, both: bool) -> float:
    """Bytes/s of one TCP stream node2 -> node1 (both: also node1 -> node2 at once; their mean)."""
    pairs = [(1, 2)] + ([(2, 1)] if both else [])
    servers = []
    for port, (dst, _) in enumerate(pairs, 45001):
        srv = subprocess.Popen(
            ["ip", "netns", "exec", c.namespace(dst), sys.executable, "-c", SERVER, str(port)],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert srv.stdout is not None and srv.stdout.readline().strip() == "ready"
        servers.append(srv)
    clients = [
        subprocess.Popen(
            [
                "ip",
                "netns",
                "exec",
                c.namespace(src),
                sys.executable,
                "-c",
                CLIENT,
                c.address(dst),
                str(port),
                str(nbytes),
            ]
        )
        for port, (dst, src) in enumerate(pairs, 45001)
    ]
    for cl in clients:
        cl.wait(timeout=600)
    rates = []
    for srv in servers:
        out, _ = srv.communicate(timeout=60)
        n, secs = out.split()
        rates.append(int(n) / float(secs))
    return sum(rates) / len(rates)


def run_job(c, path: str, per_rank: int, epochs: int, compute_ms: float, env: dict | None = None) -> dict:
    from dstore.tools import cluster

    res = cluster.run(
        c,
        JOB + [path, str(per_rank), str(epochs), str(compute_ms)],
        env=dict(os.environ, **(env or {})),
        timeout=900,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    line = next((x for x in res.stdout.splitlines() if x.startswith("JOB ")), None)
    if res.returncode != 0 or line is None:
        raise RuntimeError(f"job failed ({res.returncode}):\n{res.stdout[-2000:]}\n{res.stderr[-3000:]}")
    return json.loads(line[4:])


def delivery(out: dict, nodes: int = 2, ranks_per_node: int = 2) -> dict:
    """Remote bytes received per node per second, per step, and the data-wait fraction, over the
    epochs after the first (its first batch pays the connection set-up)."""
    eps = out["epochs"][1:]
    wall = sum(e["wall"] for e in eps)
    remote = sum(s["bytes_remote"] for e in eps for s in e["stats"])
    steps = sum(e["stats"][0]["steps"] for e in eps)
    wait = max(
        sum(s["wait_seconds"] for e in eps for s in e["stats"] if s["rank"] == r) for r in range(nodes * ranks_per_node)
    )
    return {
        "wall_s": wall,
        "steps": steps,
        "remote_bytes_per_node_per_s": remote / nodes / wall,
        "remote_bytes_per_rank_step": remote / (nodes * ranks_per_node) / steps,
        "seconds_per_step": wall / steps,
        "data_wait_fraction": wait / wall,
    }


def plan_forecast(link_bps: float, per_rank: int) -> dict:
    """What `dstore plan --samples SAMPLES --mean-bytes SAMPLE_BYTES --nodes 2 --ranks-per-node 2
    --network <link GB/s> --batch-size <4 x per_rank> --json` prints as `step` for the distributed
    store (capacity.forecast with replicate=False: the plan itself would recommend the node copy here)."""
    from dstore.memory import capacity

    cl = capacity.Cluster(nodes=2, ranks_per_node=2, memory_per_node=256e9, network=link_bps, batch_size=4 * per_rank)
    f = capacity.forecast(SAMPLES, SAMPLE_BYTES, cl, capacity.Storage(), replicate=False)
    return {
        "remote_bytes_per_rank_step": f["step"]["remote_bytes"],
        "remote_seconds_per_step": f["step"]["remote_seconds"],
    }


NOMINAL = {"none": None, "10gbit": 10e9 / 8, "1gbit": 1e9 / 8}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--links", nargs="+", default=["none", "10gbit", "1gbit"])
    ap.add_argument("--work", default="/var/tmp/dstore-links", help="a folder every node sees")
    ap.add_argument("--name", default="dlinks")
    ap.add_argument("--subnet", default=None)
    ap.add_argument("--per-rank", type=int, default=32, help="samples per rank per step")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--compute-ms", type=float, default=20.0, help="the training view's step")
    ap.add_argument("--socket-mb", type=int, default=300)
    ap.add_argument("--watchdog-ab", type=int, default=0, metavar="PAIRS", help="pairs of off/on runs, unshaped")
    ap.add_argument("--out", default="links.json")
    args = ap.parse_args(argv)
    from dstore.tools import cluster

    os.makedirs(args.work, exist_ok=True)
    path = os.path.join(args.work, "links.h5")
    if not os.path.exists(path):
        make_container(path)
    results = {"samples": SAMPLES, "sample_bytes": SAMPLE_BYTES, "per_rank": args.per_rank, "links": {}}
    for link in args.links:
        subnet = args.subnet or cluster.free_subnet()
        c = cluster.up(args.name, subnet, nodes=2, ranks_per_node=2, link=link)
        try:
            r: dict = {"load_before": load()}
            r["socket_one_way_Bps"] = socket_rate(c, args.socket_mb << 20, both=False)
            r["socket_both_ways_Bps"] = socket_rate(c, args.socket_mb << 20, both=True)
            r["store"] = delivery(run_job(c, path, args.per_rank, args.epochs, 0))
            r["train"] = delivery(run_job(c, path, args.per_rank, args.epochs, args.compute_ms))
            r["train"]["AU"] = args.compute_ms / 1e3 * r["train"]["steps"] / r["train"]["wall_s"]
            nominal = NOMINAL.get(link)
            r["plan"] = plan_forecast(nominal or r["socket_both_ways_Bps"], args.per_rank)
            r["plan"]["network_Bps"] = nominal or r["socket_both_ways_Bps"]
            if link == "none" and args.watchdog_ab:
                ab = {"off": [], "on": []}
                for _ in range(args.watchdog_ab):
                    for k, bound in (("off", "0"), ("on", "60")):
                        ab[k].append(
                            delivery(run_job(c, path, args.per_rank, args.epochs, 0, {"DSTORE_WAIT_BOUND": bound}))[
                                "seconds_per_step"
                            ]
                        )
                r["watchdog_ab_seconds_per_step"] = ab
            r["load_after"] = load()
        finally:
            cluster.down(args.name)
        results["links"][link] = r
        print(json.dumps({link: r}), flush=True)
    with open(args.out, "w") as fh:
        json.dump(results, fh, indent=1)
    md = table(results)
    with open(os.path.splitext(args.out)[0] + ".md", "w") as fh:
        fh.write(md + "\n")
    print(md)
    return 0


def table(res: dict) -> str:
    mb = 1e6
    rows = [
        "| link | load | TCP one way MB/s | TCP both ways MB/s | store remote MB/s per node | ratio | "
        "plan bytes/step : measured | plan s/step : measured | AU (compute ms) | data wait |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for link, r in res["links"].items():
        s, p, t = r["store"], r["plan"], r["train"]
        rows.append(
            f"| {link} | {r['load_before']}-{r['load_after']} | {r['socket_one_way_Bps'] / mb:.0f} | "
            f"{r['socket_both_ways_Bps'] / mb:.0f} | {s['remote_bytes_per_node_per_s'] / mb:.0f} | "
            f"{s['remote_bytes_per_node_per_s'] / r['socket_both_ways_Bps']:.2f} | "
            f"{p['remote_bytes_per_rank_step'] / s['remote_bytes_per_rank_step']:.2f} | "
            f"{p['remote_seconds_per_step'] / s['seconds_per_step']:.2f} | {t['AU']:.2f} | "
            f"{t['data_wait_fraction']:.2f} |"
        )
    return "\n".join(rows)


if __name__ == "__main__":
    if sys.argv[1:2] == ["job"]:
        job(sys.argv[2:])
    else:
        sys.exit(main())
