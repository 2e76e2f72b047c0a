"""Measures the store's one-time population (dstore.store.populate) against `population_threads`: on
local disk with the container evicted from the page cache before every run, and through `dstore pfs`
mounts of the container's directory. Prints a markdown table and writes JSON.

    python -m dstore.tools.measure.population /tmp/pfs9/data/set-2048-s0.h5 --ranks 1 2 --threads 1 4 \\
        --rungs local pfs:latency=2ms pfs:latency=8ms --repeat 2 --out /tmp/pop.json

Each run is its own `mpiexec -n R` job (this module with --worker) that opens a DataStore, populates
it and reports the slowest rank's population seconds; `--tiered F` also runs a store whose budget
keeps a fraction F resident (the tiered preload). Runs of one rung alternate the thread counts, so
a change of the machine's load moves both alike.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time

from dstore.memory import pagecache
from dstore.tools.pfs.model import parse_spec
from dstore.tools.pfs.mount import pfs_mount


def _mpiexec() -> str:
    here = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    return here if os.path.exists(here) else "mpiexec"


def worker(path: str, threads: int, tiered: float) -> None:
    # Here, not at the top: importing them initialises MPI, and the driver that starts mpiexec must not.
    from mpi4py import MPI

    from dstore.store.data_store import DataStore

    comm = MPI.COMM_WORLD
    kw = dict(batch_size=64, population_threads=threads)
    budget = 1 << 40
    if tiered:
        probe = DataStore(comm, path, **kw)
        budget = probe.tier_overhead() + int(tiered * int(probe.layout.nbytes.max()))
        probe.close()
    t0 = time.perf_counter()
    with DataStore(comm, path, memory_budget=budget, **kw) as st:
        wall = time.perf_counter() - t0
        assert st.windows is not None  # populated on entry
        pop = st.windows.population["population_seconds"]
        nbytes = st.windows.population["population_bytes"]
        frac = st.tier["resident_fraction"]
    rows = comm.gather((pop, nbytes, wall), root=0)
    if rows is not None:  # the root
        print(
            json.dumps(
                {
                    "population_seconds": max(r[0] for r in rows),
                    "bytes": sum(r[1] for r in rows),
                    "open_seconds": max(r[2] for r in rows),
                    "resident_fraction": frac,
                }
            ),
            flush=True,
        )


def run_job(ranks: int, module: str, *args: str):
    """`mpiexec -n ranks python -m module *args`: the JSON of its last line of output."""
    cmd = [_mpiexec(), "-n", str(ranks), sys.executable, "-m", module, *args]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if res.returncode != 0:
        raise RuntimeError(f"{' '.join(map(shlex.quote, cmd))} failed:\n{res.stdout}\n{res.stderr}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def run(path: str, ranks: int, threads: int, tiered: float) -> dict:
    out = run_job(
        ranks, "dstore.tools.measure.population", "--worker", path, "--threads", str(threads), "--tiered", str(tiered)
    )
    out.update(ranks=ranks, threads=threads, tiered=tiered)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("container")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--ranks", type=int, nargs="+", default=[1, 2])
    p.add_argument("--threads", type=int, nargs="+", default=[1, 4])
    p.add_argument("--tiered", type=float, default=0.0, help="also a tiered store keeping this fraction resident")
    p.add_argument("--rungs", nargs="+", default=["local", "pfs:latency=2ms", "pfs:latency=8ms"])
    p.add_argument("--repeat", type=int, default=2)
    p.add_argument("--out", default=None, help="JSON file of every run")
    args = p.parse_args(argv)
    if args.worker:
        worker(args.container, args.threads[0], args.tiered)
        return 0
    src = os.path.realpath(args.container)
    rows = []
    modes = [0.0] + ([args.tiered] if args.tiered else [])
    for spec in args.rungs:
        for rep in range(args.repeat):
            for ranks in args.ranks:
                for tiered in modes:
                    for threads in args.threads:
                        pagecache.evict(src)  # local: a cold read; pfs: its source cold too
                        if spec == "local":
                            row = run(src, ranks, threads, tiered)
                        else:
                            with pfs_mount(os.path.dirname(src), model=parse_spec(spec)) as mnt:
                                row = run(mnt.path(os.path.basename(src)), ranks, threads, tiered)
                        row.update(spec=spec, repeat=rep)
                        rows.append(row)
                        rate = row["bytes"] / 1e6 / row["population_seconds"]
                        print(
                            f"{spec:>20} ranks {ranks} tiered {tiered:.2f} threads {threads}: population "
                            f"{row['population_seconds']:.2f} s, {rate:.0f} MB/s",
                            flush=True,
                        )
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(rows, fh, indent=1)
    print("\n| storage | ranks | store | " + " | ".join(f"{t} thread{'s' * (t > 1)}" for t in args.threads) + " |")
    print("|---|---:|---|" + "---:|" * len(args.threads))
    for spec in args.rungs:
        for ranks in args.ranks:
            for tiered in modes:
                cells = []
                for t in args.threads:
                    xs = [
                        r["population_seconds"]
                        for r in rows
                        if (r["spec"], r["ranks"], r["threads"], r["tiered"]) == (spec, ranks, t, tiered)
                    ]
                    cells.append(" / ".join(f"{x:.2f}" for x in xs) + " s")
                kind = f"tiered {tiered:.0%} resident" if tiered else "resident"
                print(f"| {spec} | {ranks} | {kind} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
