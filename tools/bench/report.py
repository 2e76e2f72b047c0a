"""The bench's outputs: results JSON, a Markdown report with the ratios against the goals, PNG plots,
and the merge of runs on different rank counts into one scaling table and plot (`--collect`)."""

from __future__ import annotations

import json
import os
from typing import Any

from dstore.tools.bench.common import (
    FOLDER,
    H5PY,
    H5PY_CONTAINER,
    POP_PRELOAD,
    RAW_RMA,
    RAW_RMA_PER_SAMPLE,
    SEQ_READ,
    SEQ_READ_FRESH,
    STORE_GETS,
    STORE_MAIN,
    ZARR,
    ZARR_CONTAINER,
    Measurement,
    fmt_rate,
)

GOALS = (
    # key, description, numerator (name, cache), denominator (name, cache), goal
    ("store_vs_raw_rma", "store delivery / raw RMA", (STORE_MAIN, "memory"), (RAW_RMA, "memory"), 0.70),
    (
        "store_gets_vs_raw_rma",
        "store delivery, gets only (node views off) / raw RMA",
        (STORE_GETS, "memory"),
        (RAW_RMA, "memory"),
        0.70,
    ),
    (
        "store_vs_h5py_warm",
        "store delivery / warm h5py per-sample (contiguous)",
        (STORE_MAIN, "memory"),
        (H5PY, "warm"),
        10.0,
    ),
    (
        "store_vs_folder_cold",
        "store delivery / cold DataLoader over files",
        (STORE_MAIN, "memory"),
        (FOLDER, "cold"),
        5.0,
    ),
    (
        "population_vs_seq_cold",
        "cold preload population / cold sequential read",
        (POP_PRELOAD, "cold"),
        (SEQ_READ, "cold"),
        0.70,
    ),
)
EXTRA_RATIOS = (
    # Reported beside the goals, without one of their own.
    (
        "store_vs_h5py_cold",
        "store delivery / cold h5py per-sample (contiguous)",
        (STORE_MAIN, "memory"),
        (H5PY, "cold"),
        None,
    ),
    (
        "store_vs_h5py_container_warm",
        "store delivery / warm h5py per-sample (container's chunks)",
        (STORE_MAIN, "memory"),
        (H5PY_CONTAINER, "warm"),
        None,
    ),
    (
        "store_gets_vs_h5py_warm",
        "store delivery, gets only (node views off) / warm h5py per-sample (contiguous)",
        (STORE_GETS, "memory"),
        (H5PY, "warm"),
        None,
    ),
    (
        "population_vs_seq_fresh_cold",
        "cold preload population / cold sequential read into new memory",
        (POP_PRELOAD, "cold"),
        (SEQ_READ_FRESH, "cold"),
        None,
    ),
)
AU_GOAL = 0.95
JUDGED_FROM = 1000
"""Samples a run needs before its ratios are judged against the goals: below (`--quick`'s 192, say)
a pass is a few milliseconds of a few batches, and the figures are noise: "not judged"."""


def find(measurements: list[dict], name: str, cache: str) -> dict | None:
    """The measurement dict with this name and cache, or None."""
    for m in measurements:
        if m["name"] == name and m["cache"] == cache:
            return m
    return None


def compute_ratios(results: dict[str, Any]) -> list[dict[str, Any]]:
    """The goal ratios (total MB/s over total MB/s), and the store's AU, from a results dict.

    A ratio whose measurements are missing is reported with value None and met None; in a run of
    fewer than JUDGED_FROM samples every goal has met None and judged False (a smoke run).
    """
    ms = results["measurements"]
    judged = int(results.get("meta", {}).get("num_samples") or 0) >= JUDGED_FROM
    out = []
    for key, desc, (nn, nc), (dn, dc), goal in GOALS + EXTRA_RATIOS:
        num, den = find(ms, nn, nc), find(ms, dn, dc)
        value = None
        if num and den and den["total_mb_per_s"] > 0:
            value = num["total_mb_per_s"] / den["total_mb_per_s"]
        out.append(
            {
                "key": key,
                "description": desc,
                "value": value,
                "goal": goal,
                "judged": judged,
                "met": None if value is None or goal is None or not judged else value >= goal,
            }
        )
    au = None
    for row in results.get("training_view", {}).get("loaders", []):
        if row["name"].startswith("store"):
            au = row["au"]
    out.append(
        {
            "key": "store_au",
            "description": "accelerator utilisation with the store (DLIO view)",
            "value": au,
            "goal": AU_GOAL,
            "judged": judged,
            "met": None if au is None or not judged else au >= AU_GOAL,
        }
    )
    return out


def verdict(ratio: dict, yes: str, no: str) -> str:
    """A ratio against its goal in words: `yes`/`no`, "not judged" in a smoke run (JUDGED_FROM),
    "n/a" where a measurement is missing."""
    if ratio.get("judged") is False and ratio["goal"] is not None:
        return "not judged (a smoke run: too few samples)"
    return "n/a" if ratio["met"] is None else (yes if ratio["met"] else no)


def write_outputs(results: dict[str, Any], out_dir: str, *, plots: bool = True) -> list[str]:
    """Writes results.json, results.md and (if `plots`) PNGs into out_dir; returns the paths."""
    os.makedirs(out_dir, exist_ok=True)
    results["ratios"] = compute_ratios(results)
    paths = [os.path.join(out_dir, "results.json"), os.path.join(out_dir, "results.md")]
    with open(paths[0], "w") as fh:
        json.dump(results, fh, indent=1)
    with open(paths[1], "w") as fh:
        fh.write(markdown(results))
    if plots:
        paths += plot_results(results, out_dir)
    return paths


def _num(x, fmt="{:,.0f}") -> str:
    return "n/a" if x is None else fmt.format(x)


def throughput_table(ms: list[dict]) -> str:
    """One row per measurement; samples/s is left blank where samples are not what was counted."""
    lines = [
        "| reader | group | cache | ranks | samples/s total | MB/s total | MB/s per rank (min-max) | us/sample |",
        "|---|---|---|---:|---:|---:|---:|---:|",
    ]
    for m in ms:
        pr = m["rank_mb_per_s"]
        sps = f"{m['total_samples_per_s']:,.0f}" if sum(m["samples"]) else "-"
        ups = f"{m['us_per_sample']:,.1f}" if sum(m["samples"]) else "-"
        lines.append(
            f"| {m['name']} | {m['group']} | {m['cache']} | {m['ranks']} | {sps} | "
            f"{m['total_mb_per_s']:,.0f} | {min(pr):,.0f}-{max(pr):,.0f} | {ups} |"
        )
    return "\n".join(lines)


def decode_table(ms: list[dict]) -> str:
    lines = [
        "| loader | ranks | threads per rank | samples/s total | samples/s per rank (min-max) "
        "| ms per step (slowest rank) |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for m in ms:
        pr = m["rank_samples_per_s"]
        lines.append(
            f"| {m['name']} | {m['ranks']} | {m['extra'].get('num_threads', '')} | "
            f"{m['total_samples_per_s']:,.0f} | {min(pr):,.0f}-{max(pr):,.0f} | "
            f"{m['extra'].get('seconds_per_step', 0) * 1e3:.1f} |"
        )
    return "\n".join(lines)


def markdown(results: dict[str, Any]) -> str:
    """The report: setup, throughput table, goal ratios, training view, growth, notes."""
    meta = results["meta"]
    out = [
        f"# dstore bench: {meta['ranks']} rank(s), {meta['num_samples']:,} samples "
        f"({meta['total_bytes'] / 1e6:,.0f} MB, mean {meta['mean_sample_bytes'] / 1e3:,.0f} KB)",
        "",
    ]
    out.append(
        f"Machine: {meta.get('machine', '?')}. Global batch {meta['batch_size']}, seed {meta['seed']}. "
        f"Command: `{meta.get('command', '')}`"
    )
    if meta.get("load_average"):
        la = meta["load_average"]
        line = f"Load average at start / end: {la[0]:.1f} / {la[1]:.1f} on {meta.get('cores', '?')} cores"
        if meta.get("busy_cores_at_start") is not None:
            line += f"; cores busy just before the run: {meta['busy_cores_at_start']:.2f}"
        out.append(line + ".")
    if meta.get("storage"):
        st = meta["storage"]
        served = "; ".join(
            f"{x['ops']:,} operations, {x['read_bytes'] / 1e6:,.0f} MB served" for x in st.get("mount_stats") or [] if x
        )
        out.append(
            f"Storage: every reader read through `dstore pfs` ({st['spec']})"
            + (f"; {served}" if served else "")
            + ". Cold and warm passes both pay the model (no page cache on the mount)."
        )
    delivery = [m for m in results["measurements"] if m["group"] != "decode"]
    decode = [m for m in results["measurements"] if m["group"] == "decode"]
    out += ["", "## Throughput (raw bytes delivered)", "", throughput_table(delivery), ""]
    if decode:
        out += [
            "## Decode (reported apart from delivery: JPEG decode through StoreLoader's threads)",
            "",
            decode_table(decode),
            "",
        ]
    out += ["## Ratios against the goals", "", "| ratio | measured | goal | met |", "|---|---:|---:|---|"]
    for r in results.get("ratios") or compute_ratios(results):
        met = verdict(r, "yes", "**no**")
        goal = "-" if r["goal"] is None else f">= {r['goal']:g}"
        out.append(f"| {r['description']} | {_num(r['value'], '{:.2f}')} | {goal} | {met} |")
    tv = results.get("training_view")
    if tv and tv.get("loaders"):
        out += [
            "",
            "## Training view (DLIO method: a fixed sleep per step stands in for compute)",
            "",
            f"Compute per step: {tv['compute_seconds'] * 1e3:.1f} ms "
            f"(= {tv['factor']:g} x the store's fetch+decode time per step, {tv['store_step_seconds'] * 1e3:.1f} ms). "
            f"Each loader decodes the first {tv.get('num_samples', '?')} samples once, shuffled; the DataLoaders "
            f"use {tv.get('num_workers', '?')} worker process(es) per rank and start cold, the store "
            f"{tv.get('decode_threads', '?')} decode thread(s) per rank.",
            "",
            "| loader | steps | wall s | data wait s | first batch s | AU | AU after the first batch |",
            "|---|---:|---:|---:|---:|---:|---:|",
        ]
        for row in tv["loaders"]:
            out.append(
                f"| {row['name']} | {row['steps']} | {row['wall']:.2f} | {row['wait']:.2f} | "
                f"{row.get('first_wait', 0):.2f} | {row['au']:.3f} | {row.get('au_steady', row['au']):.3f} |"
            )
    growth = results.get("growth")
    if growth:
        out += [
            "",
            "## Cost per sample as the data set grows",
            "",
            "| samples | MB | store us/sample | store MB/s | raw RMA us/sample | raw RMA MB/s |",
            "|---:|---:|---:|---:|---:|---:|",
        ]
        for g in growth:
            s, r = g["store"], g["raw_rma"]
            out.append(
                f"| {g['num_samples']:,} | {g['total_bytes'] / 1e6:,.0f} | {s['us_per_sample']:.1f} | "
                f"{s['total_mb_per_s']:,.0f} | {r['us_per_sample']:.1f} | {r['total_mb_per_s']:,.0f} |"
            )
    if results.get("notes"):
        out += ["", "## Notes", ""] + [f"- {n}" for n in results["notes"]]
    return "\n".join(out) + "\n"


# --- plots -------------------------------------------------------------------------------------------

GROUP_COLOURS = {
    "limit": "#7f7f7f",
    "baseline": "#d62728",
    "store": "#1f77b4",
    "population": "#2ca02c",
    "decode": "#9467bd",
}


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_results(results: dict[str, Any], out_dir: str) -> list[str]:
    """throughput.png, au.png (if a training view ran), growth.png (if a growth sweep ran)."""
    plt = _plt()
    paths = []
    ms = [m for m in results["measurements"] if m["group"] != "decode"]
    meta = results["meta"]
    if ms:
        fig, ax = plt.subplots(figsize=(9, 0.32 * len(ms) + 1.5))
        labels = [f"{m['name']} ({m['cache']})" for m in ms]
        vals = [max(m["total_mb_per_s"], 1e-3) for m in ms]
        ax.barh(range(len(ms)), vals, color=[GROUP_COLOURS.get(m["group"], "#333") for m in ms])
        ax.set_yticks(range(len(ms)), labels, fontsize=8)
        ax.invert_yaxis()
        ax.set_xscale("log")
        ax.set_xlabel("MB/s, all ranks together (log scale)")
        ax.set_title(f"Throughput, {meta['ranks']} rank(s), {meta['num_samples']:,} samples")
        for i, v in enumerate(vals):
            ax.text(v, i, " " + fmt_rate(v), va="center", fontsize=7)
        fig.tight_layout()
        paths.append(os.path.join(out_dir, "throughput.png"))
        fig.savefig(paths[-1], dpi=110)
        plt.close(fig)
    tv = results.get("training_view")
    if tv and tv.get("loaders"):
        rows = tv["loaders"]
        fig, ax = plt.subplots(figsize=(7, 0.4 * len(rows) + 1.5))
        ax.barh(
            range(len(rows)),
            [r["au"] for r in rows],
            color=["#1f77b4" if r["name"].startswith("store") else "#d62728" for r in rows],
        )
        ax.set_yticks(range(len(rows)), [r["name"] for r in rows], fontsize=8)
        ax.invert_yaxis()
        ax.axvline(AU_GOAL, color="k", ls="--", lw=1)
        ax.set_xlim(0, 1.05)
        ax.set_xlabel("accelerator utilisation (compute time / wall time)")
        ax.set_title(f"Training view, {tv['compute_seconds'] * 1e3:.0f} ms compute per step, {meta['ranks']} rank(s)")
        fig.tight_layout()
        paths.append(os.path.join(out_dir, "au.png"))
        fig.savefig(paths[-1], dpi=110)
        plt.close(fig)
    growth = results.get("growth")
    if growth:
        fig, ax = plt.subplots(figsize=(6, 4))
        xs = [g["num_samples"] for g in growth]
        ax.plot(xs, [g["store"]["us_per_sample"] for g in growth], "o-", label=STORE_MAIN)
        ax.plot(xs, [g["raw_rma"]["us_per_sample"] for g in growth], "s--", label="raw RMA")
        ax.set_xscale("log")
        ax.set_xticks(xs, [f"{x:,}" for x in xs])
        ax.minorticks_off()
        ax.set_xlabel("samples in the data set")
        ax.set_ylabel("wall time per sample (us, all ranks)")
        ax.set_ylim(bottom=0)
        ax.set_title(f"Cost per sample as the data set grows, {meta['ranks']} rank(s)")
        ax.legend()
        fig.tight_layout()
        paths.append(os.path.join(out_dir, "growth.png"))
        fig.savefig(paths[-1], dpi=110)
        plt.close(fig)
    return paths


# --- merging runs on 1, 2, 4 ranks ---------------------------------------------------------------------

SCALING_READERS = (
    (STORE_MAIN, "memory"),
    (STORE_GETS, "memory"),
    (RAW_RMA, "memory"),
    (RAW_RMA_PER_SAMPLE, "memory"),
    ("memcpy", "memory"),
    (POP_PRELOAD, "cold"),
    (SEQ_READ, "cold"),
    (SEQ_READ_FRESH, "cold"),
    (H5PY, "warm"),
    (H5PY, "cold"),
    (H5PY_CONTAINER, "warm"),
    (FOLDER, "cold"),
    (ZARR, "warm"),
    (ZARR_CONTAINER, "warm"),
)


def collect(result_paths: list[str], out_dir: str, *, plots: bool = True) -> list[str]:
    """Merges results.json files of runs on different rank counts into scaling.json, scaling.md and
    scaling.png in out_dir; returns the paths written.

    Args:
        result_paths: results.json files, or directories holding one.
    """
    runs = sorted(_load_results(result_paths), key=lambda r: r["meta"]["ranks"])
    ranks = [r["meta"]["ranks"] for r in runs]
    table = _scaling_rows(runs)
    au = [{x["key"]: x["value"] for x in (r.get("ratios") or compute_ratios(r))} for r in runs]
    merged = {"ranks": ranks, "readers": table, "ratios": au, "meta": [r["meta"] for r in runs]}
    os.makedirs(out_dir, exist_ok=True)
    paths = [os.path.join(out_dir, "scaling.json"), os.path.join(out_dir, "scaling.md")]
    with open(paths[0], "w") as fh:
        json.dump(merged, fh, indent=1)
    with open(paths[1], "w") as fh:
        fh.write(_scaling_markdown(ranks, table, au))
    if plots and table:
        paths.append(_scaling_plot(ranks, table, os.path.join(out_dir, "scaling.png")))
    return paths


def _load_results(result_paths: list[str]) -> list[dict]:
    runs = []
    for p in result_paths:
        if os.path.isdir(p):
            p = os.path.join(p, "results.json")
        with open(p) as fh:
            runs.append(json.load(fh))
    return runs


def _scaling_rows(runs: list[dict]) -> list[dict]:
    """One row per reader of SCALING_READERS measured in any run: its MB/s and samples/s in each run
    (None where that run lacks it)."""
    table = []
    for name, cache in SCALING_READERS:
        row = {"name": name, "cache": cache, "mb_per_s": [], "samples_per_s": []}
        for r in runs:
            m = find(r["measurements"], name, cache)
            row["mb_per_s"].append(None if m is None else m["total_mb_per_s"])
            row["samples_per_s"].append(None if m is None else m["total_samples_per_s"])
        if any(v is not None for v in row["mb_per_s"]):
            table.append(row)
    return table


def _scaling_markdown(ranks: list[int], table: list[dict], au: list[dict]) -> str:
    """scaling.md: MB/s of each reader, then each ratio, against the rank count."""
    head = "| reader | cache | " + " | ".join(f"{k} rank(s) MB/s" for k in ranks) + " |"
    lines = ["# Scaling over rank counts", "", head, "|---|---|" + "---:|" * len(ranks)]
    for row in table:
        lines.append(f"| {row['name']} | {row['cache']} | " + " | ".join(_num(v) for v in row["mb_per_s"]) + " |")
    lines += ["", "| ratio | " + " | ".join(f"{k} rank(s)" for k in ranks) + " |", "|---|" + "---:|" * len(ranks)]
    keys = [(g[0], g[1]) for g in GOALS + EXTRA_RATIOS] + [("store_au", "store AU")]
    for key, desc in keys:
        lines.append(f"| {desc} | " + " | ".join(_num(a.get(key), "{:.2f}") for a in au) + " |")
    return "\n".join(lines) + "\n"


def _scaling_plot(ranks: list[int], table: list[dict], path: str) -> str:
    """scaling.png: MB/s of each reader against the rank count, log-log."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(10, 4.8))
    for row in table:
        pts = [(k, v) for k, v in zip(ranks, row["mb_per_s"]) if v is not None]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", label=f"{row['name']} ({row['cache']})")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(ranks, [str(k) for k in ranks])
    ax.set_xlabel("ranks")
    ax.set_ylabel("MB/s, all ranks together")
    ax.set_title("Throughput against rank count")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def measurement_dicts(ms: list[Measurement]) -> list[dict]:
    return [m.to_dict() for m in ms]
