"""The CPU a `dstore train` rank spends importing, by whom: torch, torch._dynamo (which torch itself
loads on every training run: DistributedDataParallel's constructor and the optimizers'
`add_param_group` import it, whether or not anything is compiled), numpy + mpi4py + h5py, and
dstore's own modules on top (`dstore.training.run`, everything a run on a container loads). Each round
in a fresh interpreter, the parts in that order, process CPU time (user + system).

    python -m dstore.tools.measure.import_cost --rounds 5
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys

PROBE = """
import json, sys, time
t = [time.process_time()]
import torch; t.append(time.process_time())
import torch._dynamo; t.append(time.process_time())
import numpy, mpi4py.MPI, h5py; t.append(time.process_time())
before = set(sys.modules)
import dstore.training.run; t.append(time.process_time())
own = [m for m in set(sys.modules) - before if m.startswith("dstore")]
others = sorted({m.split(".")[0] for m in set(sys.modules) - before} - {"dstore"})
print(json.dumps({"parts": [b - a for a, b in zip(t, t[1:])], "modules": len(own), "others": others}))
"""

PARTS = ("torch", "torch._dynamo (loaded by torch's DDP and optimizers)", "numpy + mpi4py + h5py", "dstore's own")


def measure(rounds: int) -> tuple[list[list[float]], dict]:
    runs = []
    for _ in range(rounds):
        out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, check=True).stdout
        runs.append(json.loads(out.strip().splitlines()[-1]))
    return [[r["parts"][i] for r in runs] for i in range(len(PARTS))], runs[-1]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m dstore.tools.measure.import_cost",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args(argv)
    parts, last = measure(args.rounds)
    print("| part | CPU-s, median | min - max |\n|---|---:|---|")
    for name, xs in zip(PARTS, parts):
        print(f"| {name} | {statistics.median(xs):.2f} | {min(xs):.2f} - {max(xs):.2f} |")
    total = [sum(x) for x in zip(*parts)]
    print(f"| all | {statistics.median(total):.2f} | {min(total):.2f} - {max(total):.2f} |")
    print(f"\ndstore's own: {last['modules']} modules; other packages it loads: {', '.join(last['others']) or 'none'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
