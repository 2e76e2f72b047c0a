"""The LTFB experiment: does the tournament pay, at equal total compute, on the real `digits` set?

    python -m dstore.tools.measure.ltfb_experiment [--out docs/ltfb] [--trainers 4] [--seeds 0 1 2] [--epochs 6]
                                    [--batch-size 32] [--round 5] [--lr 0.003] [--explore lr,momentum]

Every variant is one `mpiexec -n K dstore train` job of K ranks, with the same global batch size,
epochs, learning rate and seed (but see dp_large), so all of them train on the same number of samples:
- `dp`: one data-parallel trainer of K ranks on all the training data (`--trainers 1`);
- `dp_large`: the same with a K times larger global batch, so that its model takes as many optimizer
  steps as each of the K trainers below (the per-rank batch they have; weak scaling);
- `independent`: K trainers of 1 rank, each on its 1/K of the data, that never meet (`--ltfb-round`
  past the last step);
- `pairwise`: the paper's tournament every `--round` steps;
- `truncation`: truncation selection every `--round` steps (`--truncation-fraction`);
- `explore`: truncation with `--explore` (seeded starting values, perturbed when a model is taken).
The K-trainer variants hold out the same tournament sets, so they differ only in what the rounds do.

Per job: the held-out (test) accuracy of every trainer, the best and the mean over trainers, the
held-out accuracy after every epoch, and the job's wall time. Writes OUT/experiment.json (every job),
OUT/experiment.md (a table: mean and sample standard deviation over seeds) and OUT/experiment.png (final
accuracies per variant and seed; the best trainer's held-out accuracy after each epoch).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from dstore.training.metrics import read_jsonl

VARIANTS = ("dp", "dp_large", "independent", "pairwise", "truncation", "explore")
LABELS = {
    "dp": "(a) 1 data-parallel trainer, all data",
    "dp_large": "(a') the same, global batch K x B",
    "independent": "(b) K independent trainers, 1/K each",
    "pairwise": "(c) LTFB pairwise",
    "truncation": "(d) LTFB truncation",
    "explore": "(e) LTFB truncation + exploration",
}


def variant_args(variant: str, opts) -> list[str]:
    """The `dstore train` flags that make a variant (on top of the common ones)."""
    k = ["--trainers", str(opts.trainers)]
    rounds = ["--ltfb-round", str(opts.round)]
    truncation = ["--ltfb-strategy", "truncation", "--truncation-fraction", str(opts.truncation_fraction)]
    return {
        "dp": ["--trainers", "1"],
        "dp_large": ["--trainers", "1"],  # and K x the batch size (run_one)
        "independent": k + ["--ltfb-round", str(10**9)],  # never reached: the trainers never meet
        "pairwise": k + rounds,
        "truncation": k + rounds + truncation,
        "explore": k + rounds + truncation + ["--explore", opts.explore],
    }[variant]


def _final_and_curve(metrics_path: Path) -> tuple[float | None, list[float]]:
    rows = read_jsonl(metrics_path)
    curve = [r["val_accuracy"] for r in rows if "epoch" in r and "val_accuracy" in r]
    final = [r["test_accuracy"] for r in rows if r.get("final") and "test_accuracy" in r]
    return (final[-1] if final else None), curve


def run_one(variant: str, seed: int, opts, work: Path) -> dict:
    """One job; returns its record (accuracies per trainer, best, mean, per-epoch curve, wall time)."""
    run_dir = work / f"{variant}-seed{seed}"
    mpiexec = Path(sys.executable).parent / "mpiexec"
    batch = opts.batch_size * (opts.trainers if variant == "dp_large" else 1)
    cmd = [
        str(mpiexec if mpiexec.exists() else "mpiexec"),
        "-n",
        str(opts.trainers),
        sys.executable,
        "-m",
        "dstore.tools",
        "train",
        "--epochs",
        str(opts.epochs),
        "--batch-size",
        str(batch),
        "--lr",
        str(opts.lr),
        "--seed",
        str(seed),
        "--ltfb-metric",
        opts.metric,
        "--no-progress",
        "--run-dir",
        str(run_dir),
    ] + variant_args(variant, opts)
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=opts.timeout)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"`{' '.join(cmd)}` exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    dirs = [run_dir] if variant.startswith("dp") else [run_dir / f"trainer{j}" for j in range(opts.trainers)]
    finals, curves = zip(*(_final_and_curve(d / "metrics.jsonl") for d in dirs))
    taken = hparams = None
    if variant not in ("dp", "dp_large", "independent"):
        log = read_jsonl(run_dir / "tournament.jsonl")
        taken = sum(r["kept"] != r["trainer"] for r in log)
        if log and "hparams" in log[-1]:  # what each trainer trained with after the last round
            last = max(r["round"] for r in log)
            hparams = [r["hparams"] for r in sorted((r for r in log if r["round"] == last), key=lambda r: r["trainer"])]
    return {
        "variant": variant,
        "seed": seed,
        "command": " ".join(cmd[:1] + ["-n", str(opts.trainers), "dstore"] + cmd[cmd.index("train") :]),
        "test_by_trainer": list(finals),
        "best": max(finals),
        "mean": statistics.fmean(finals),
        "best_curve": [max(vals) for vals in zip(*curves)],
        "models_taken": taken,
        "final_hparams": hparams,
        "wall_s": wall,
    }


def summarize(runs: list[dict]) -> list[dict]:
    """Per variant (in VARIANTS order): mean and sample sd over seeds of best, mean and wall time."""
    rows = []
    for v in VARIANTS:
        mine = [r for r in runs if r["variant"] == v]
        if not mine:
            continue
        row = {"variant": v, "label": LABELS[v], "seeds": len(mine)}
        for key in ("best", "mean", "wall_s"):
            vals = [r[key] for r in mine]
            row[key] = statistics.fmean(vals)
            row[key + "_sd"] = statistics.stdev(vals) if len(vals) > 1 else 0.0
        taken = [r["models_taken"] for r in mine if r["models_taken"] is not None]
        row["models_taken"] = statistics.fmean(taken) if taken else None
        rows.append(row)
    return rows


def markdown(rows: list[dict], opts) -> str:
    head = (
        f"K = {opts.trainers} trainers x 1 rank (dp: 1 trainer x {opts.trainers} ranks), {opts.epochs} epochs, "
        f"global batch {opts.batch_size}, lr {opts.lr}, rounds every {opts.round} steps on {opts.metric}, "
        "truncation fraction "
        f"{opts.truncation_fraction}, explore {opts.explore}; seeds {opts.seeds}. Mean ± sd over seeds.\n\n"
    )
    lines = [
        "| variant | best test accuracy | mean test accuracy | models taken per job | wall time (s) |",
        "| --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        taken = "–" if r["models_taken"] is None else f"{r['models_taken']:.1f}"
        lines.append(
            f"| {r['label']} | {r['best']:.4f} ± {r['best_sd']:.4f} | {r['mean']:.4f} ± {r['mean_sd']:.4f} "
            f"| {taken} | {r['wall_s']:.1f} ± {r['wall_s_sd']:.1f} |"
        )
    return head + "\n".join(lines) + "\n"


def plot(runs: list[dict], rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    names = [r["variant"] for r in rows]
    for i, r in enumerate(rows):
        left.bar(
            i - 0.2,
            r["best"],
            0.4,
            yerr=r["best_sd"],
            color="tab:blue",
            alpha=0.7,
            label="best trainer" if i == 0 else None,
        )
        left.bar(
            i + 0.2,
            r["mean"],
            0.4,
            yerr=r["mean_sd"],
            color="tab:orange",
            alpha=0.7,
            label="mean over trainers" if i == 0 else None,
        )
        for run in (x for x in runs if x["variant"] == r["variant"]):
            left.plot([i - 0.2], [run["best"]], "k.", ms=4)
            left.plot([i + 0.2], [run["mean"]], "k.", ms=4)
    left.set_xticks(range(len(names)), names)
    left.set_ylabel("held-out (test) accuracy")
    left.set_title("final accuracy (bars: mean over seeds; dots: seeds)")
    low = min(min(x["mean"], x["best"]) for x in runs)
    left.set_ylim(max(0.0, low - 0.1), 1.0)
    left.legend(loc="lower right")
    for v in names:
        curves = [x["best_curve"] for x in runs if x["variant"] == v]
        n = min(len(c) for c in curves)
        right.plot(range(1, n + 1), [statistics.fmean(c[e] for c in curves) for e in range(n)], marker="o", label=v)
    right.set_xlabel("epoch (equal compute: every variant has trained on as many samples)")
    right.set_ylabel("best trainer's held-out accuracy")
    right.set_title("after each epoch (mean over seeds)")
    right.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").partition("\n")[0])
    p.add_argument("--out", default="docs/ltfb", help="where experiment.json, experiment.md and experiment.png go")
    p.add_argument(
        "--work", default=None, help="run directories (default: a temporary directory, removed unless --keep)"
    )
    p.add_argument("--keep", action="store_true", help="keep the run directories")
    p.add_argument("--trainers", type=int, default=4)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--epochs", type=int, default=6)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--round", type=int, default=5, help="steps between tournament rounds")
    p.add_argument("--truncation-fraction", type=float, default=0.25)
    p.add_argument(
        "--metric",
        choices=("accuracy", "loss"),
        default="loss",
        help="tournament metric (default loss: on a tournament set of a few dozen samples accuracy "
        "moves in coarse steps and ties often)",
    )
    p.add_argument("--explore", default="lr,momentum")
    p.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    p.add_argument("--timeout", type=float, default=600, help="seconds one job may take")
    opts = p.parse_args(argv)
    out = Path(opts.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(opts.work) if opts.work else Path(tempfile.mkdtemp(prefix="ltfb-experiment-"))
    load = os.getloadavg()[0]
    t0 = time.perf_counter()
    runs = []
    for seed in opts.seeds:  # seeds outermost: a change in the machine's load spreads over all variants
        for v in opts.variants:
            runs.append(run_one(v, seed, opts, work))
            r = runs[-1]
            print(
                f"{v:12s} seed {seed}: best {r['best']:.4f} mean {r['mean']:.4f} wall {r['wall_s']:.1f} s", flush=True
            )
    rows = summarize(runs)
    table = markdown(rows, opts)
    total = time.perf_counter() - t0
    (out / "experiment.json").write_text(
        json.dumps(
            {
                "options": vars(opts),
                "load_average_at_start": load,
                "total_seconds": total,
                "summary": rows,
                "runs": runs,
            },
            indent=1,
        )
    )
    (out / "experiment.md").write_text(table)
    plot(runs, rows, out / "experiment.png")
    print(
        table + f"\n{len(runs)} jobs in {total:.0f} s (1-minute load average at start {load:.1f}); "
        f"wrote {out}/experiment.json, experiment.md, experiment.png",
        flush=True,
    )
    if not opts.keep and not opts.work:
        import shutil

        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
