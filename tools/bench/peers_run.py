"""`dstore bench --peers`: the order of the run (data, copies, rungs, shuffle quality) and its report
(OUT/peers.json, OUT/peers.md). The measurements are tools/bench/peers.py's."""

from __future__ import annotations

import json
import os
import time
from typing import Any

import numpy as np

from dstore.tools.bench import peer_data, peers
from dstore.tools.bench.common import Progress
from dstore.tools.bench.shuffle_quality import global_batches, ideal_distinct, quality

DEFAULT_RUNGS = ("local", "pfs:latency=2ms,iops=300")
"""The rungs of the issue's measurement: local disk, and a job's small share of a busy file system."""
MAX_SECONDS = 30.0
"""A peer's fast pass stops after this long on each rank (WebDataset as shipped through the model
reads 8 KiB at a time: about 27,000 operations an epoch of 220 MB); its rate is then over what it read."""


def loaders(cfg, pd: peer_data.PeerData, kind: str, translate, ranks: int, skip: dict) -> list:
    """The loader rows over the archives of `kind` (peer_data.ORDERS), paths through `translate`."""
    b, workers = cfg.batch_size, cfg.num_workers
    label = "" if kind == "shuffled" else ", class-sorted archive"
    per_rank = max(1, b // ranks)
    rows = []
    container = pd.container if kind == "shuffled" else pd.sorted_container
    for pop in ("preload", "stream") if kind == "shuffled" else ("preload",):
        rows.append(peers.store_spec(translate(container), pop, b, cfg.seed, label))
    done = set()
    if "webdataset" not in skip:
        shards = [translate(s) for s in pd.tars[kind]]
        for w, buffered in ((0, False), (0, True), (workers, True), (workers, False)):
            if (kind == "sorted" and not buffered) or (w == workers == 0 and (w, buffered) in done):
                continue
            done.add((w, buffered))
            rows.append(peers.wds_spec(shards, w, buffered, per_rank, cfg.seed, label))
    if "litdata" not in skip and pd.litdata[kind]:
        cache = os.path.join(cfg.out, "litdata-cache", kind)
        for posix in (False, True):
            rows.append(
                peers.litdata_spec(translate(pd.litdata[kind]), workers, per_rank, cfg.seed, cache, posix, label)
            )
    return rows


def run(comm, cfg) -> dict:
    """The whole --peers run on every rank; rank 0 writes OUT/peers.{json,md} and returns the results."""
    from dstore.tools.bench.data import container_path, data_tag, load_dataset, prepare_data
    from dstore.tools.bench.runner import machine
    from dstore.tools.bench.storage import mount_roots

    ranks = comm.Get_size()
    rungs = tuple(cfg.peers) or DEFAULT_RUNGS
    prog = Progress(comm, 3 + len(rungs) + bool(cfg.dali))
    skip = {m: r for m in ("webdataset", "litdata") if (r := peers.missing(m))}
    t_start = time.perf_counter()
    load = os.getloadavg()[0]
    prog.start("data")
    data_dir = cfg.data_path
    if cfg.container:
        container = cfg.container
    else:
        prepare_data(
            comm, cfg.count, data_dir, seed=cfg.seed, mean_bytes=cfg.mean_bytes, sides=cfg.sides, progress=prog
        )
        container = container_path(data_dir, data_tag(cfg.count, cfg.seed, cfg.mean_bytes, cfg.sides), "hdf5")
    data = load_dataset(container, None, None)
    classes = int(data.labels.max()) + 1
    prog.start("the peers' copies (tar shards, LitData, class-sorted container)")
    pd = peer_data.prepare(
        comm, container, os.path.join(data_dir, "peers"), seed=cfg.seed, litdata_ok="litdata" not in skip
    )
    for why in skip.values():
        prog.note(f"skipped: {why}")
    roots = mount_roots(data_dir, container)
    results: dict[str, Any] = {"rungs": [], "quality": []}
    for rung in rungs:
        prog.start(f"rung {rung}")
        rows = peers.measure(
            comm,
            lambda tr: loaders(cfg, pd, "shuffled", tr, ranks, skip),
            rung,
            roots,
            rates=cfg.consume,
            max_seconds=MAX_SECONDS,
            prog=prog,
        )
        for r in rows:
            if "labels" in r:
                r["quality"] = quality(global_batches([lab[0] for lab in r.pop("labels")]), classes)
        results["rungs"].append({"spec": rung, "loaders": rows})
    prog.start("shuffle quality over the class-sorted archives (local disk)")
    for spec in loaders(cfg, pd, "sorted", lambda p: p, ranks, skip):
        r = peers.run_pass(comm, spec, epochs=1)
        if "error" not in r:
            r = quality(global_batches([lab[0] for lab in r["labels"]]), classes)
        results["quality"].append({**r, "name": spec.name})
    if cfg.dali:
        prog.start("decode per core: dstore's loader beside DALI's CPU pipeline (local memory)")
        results["decode"] = decode_rows(comm, cfg, container)
        prog.note(results["decode"]["note"])
    results["meta"] = {
        "ranks": comm.Get_size(),
        "num_samples": data.num_samples,
        "total_bytes": data.total_bytes,
        "classes": classes,
        "batch_size": cfg.batch_size,
        "workers": cfg.num_workers,
        "rates": list(cfg.consume),
        "ideal_distinct": ideal_distinct(classes, cfg.batch_size),
        "machine": machine(),
        "command": cfg.command,
        "load_before": load,
        "load_after": os.getloadavg()[0],
        "skipped": skip,
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "bench_seconds": round(time.perf_counter() - t_start, 1),
    }
    if comm.Get_rank() == 0:
        os.makedirs(cfg.out, exist_ok=True)
        with open(os.path.join(cfg.out, "peers.json"), "w") as fh:
            json.dump(results, fh, indent=1, default=_plain)
        text = markdown(results)
        with open(os.path.join(cfg.out, "peers.md"), "w") as fh:
            fh.write(text)
        print(text, flush=True)
    comm.Barrier()
    return results


def decode_rows(comm, cfg, container: str) -> dict:
    """Rank 0 runs `python -m dstore.tools.measure.loader --recipe plain --dali 1 2` on the container in
    a process of its own (the launcher's variables removed: a singleton MPI, not a member of this
    job), every row pinned to its cores; the other ranks sleep meanwhile. Returns {"note", "markdown"}."""
    import subprocess
    import sys

    from dstore.tools.bench import dali
    from dstore.tools.bench.common import quiet_barrier

    result = None
    if comm.Get_rank() == 0:
        why = dali.missing(cfg.dali_python)
        if why is not None:
            result = {"note": f"skipped: {why}", "markdown": ""}
        else:
            md = os.path.join(cfg.out, "peers-dali.md")
            os.makedirs(cfg.out, exist_ok=True)
            cmd = [
                sys.executable,
                "-m",
                "dstore.tools.measure.loader",
                container,
                "--recipe",
                "plain",
                "--threads",
                "--workers",
                "1",
                "2",
                "--dali",
                "1",
                "2",
                "--dali-python",
                dali.find_python(cfg.dali_python),
                "--device",
                "cpu",
                "--no-gil",
                "--batch-size",
                str(cfg.batch_size),
                "--size",
                str(cfg.decode_size),
                "--out",
                os.path.join(cfg.out, "peers-dali.json"),
                "--md",
                md,
            ]
            proc = subprocess.run(cmd, capture_output=True, text=True, env=dali.dali_env(), timeout=3600)
            if proc.returncode != 0:
                tail = (proc.stderr or proc.stdout).strip().splitlines()[-2:]
                result = {
                    "note": f"DALI comparison failed (exit {proc.returncode}): {' | '.join(tail)}",
                    "markdown": "",
                }
            else:
                with open(md) as fh:
                    result = {"note": f"DALI comparison: {md}", "markdown": fh.read()}
    quiet_barrier(comm)
    return comm.bcast(result, root=0)


def _plain(x):
    return x.item() if isinstance(x, np.generic) else str(x)


def _f(x, fmt="{:.2f}") -> str:
    return "-" if x is None else fmt.format(x)


def _au(row: dict, rate) -> str:
    """'AU over both epochs / AU of the steady epoch' at `rate` (JSON keys may be strings)."""

    def get(d):
        return (d or {}).get(rate, (d or {}).get(str(rate)))

    return f"{_f(get(row['au_at']), '{:.2f}')} / {_f(get(row.get('au_steady_at')), '{:.2f}')}"


def markdown(res: dict) -> str:
    meta = res["meta"]
    rates = meta["rates"]
    lines = [
        f"# The store beside WebDataset and LitData ({meta['ranks']} ranks, {meta['num_samples']:,} samples, "
        f"{meta['total_bytes'] / 1e6:,.0f} MB, global batch {meta['batch_size']})",
        "",
        f"Command: `{meta['command']}`  ",
        f"Machine: {meta['machine']}  ",
        f"Date: {meta['date_utc']}, load average {meta['load_before']:.1f} before, {meta['load_after']:.1f} after",
        "",
        "Times from the loader's construction (the store's population included), the slowest rank; steady = "
        "epoch 1; samples/s = all ranks' samples over epoch 0's and epoch 1's time; storage = what the mount "
        "served (local disk: not counted); AU = sleep(batch / rate) per batch over the wall time, the least "
        "utilised rank, decode skipped (raw stored bytes): over both epochs from construction / over the "
        "steady epoch alone.",
        "",
    ]
    for rung in res["rungs"]:
        lines += [
            f"## {rung['spec']}",
            "",
            "| loader | first batch s | epoch 0 s | steady epoch s | storage MB | storage ops | "
            + " | ".join(f"AU @ {r:,}/s" for r in rates)
            + " |",
            "|---|" + "---:|" * (5 + len(rates)),
        ]
        for r in rung["loaders"]:
            if "error" in r:
                lines.append(f"| {r['name']} | failed: {r['error']} |" + " |" * (4 + len(rates)))
                continue
            mb = None if r["storage_bytes"] is None else r["storage_bytes"] / 1e6
            cut = f" (stopped after {MAX_SECONDS:.0f} s)" if r["cut_short"] else ""
            lines.append(
                f"| {r['name']}{cut} | {_f(r['first_batch_s'])} | {_f(r['epoch0_s'])} | {_f(r['steady_s'])} | "
                f"{_f(mb, '{:,.0f}')} | {_f(r['storage_ops'], '{:,}')} | " + " | ".join(_au(r, k) for k in rates) + " |"
            )
        lines.append("")
    lines += [
        "## Shuffle quality",
        "",
        f"Global batches of {meta['batch_size']}; ideal distinct classes {meta['ideal_distinct']:.2f} of "
        f"{meta['classes']}.",
        "",
        "| loader | distinct classes / batch | batches with one class over half | consecutive-batch correlation |",
        "|---|---:|---:|---:|",
    ]
    rows = [(r["name"], r["quality"]) for g in res["rungs"][:1] for r in g["loaders"] if "quality" in r]
    rows += [(q["name"], q) for q in res["quality"] if "error" not in q]
    for name, q in rows:
        lines.append(f"| {name} | {_f(q['distinct'])} | {_f(q['majority'], '{:.0%}')} | {_f(q['correlation'])} |")
    if "decode" in res:
        lines += [
            "",
            "## Decode per core: dstore's loader beside DALI's CPU pipeline",
            "",
            "The plain recipe (decode, resize to the model's size, CHW uint8) from encoded bytes in memory "
            "(`python -m dstore.tools.measure.loader --recipe plain --dali 1 2`).",
            "",
            res["decode"]["markdown"] or res["decode"]["note"],
        ]
    for m, why in meta["skipped"].items():
        lines.append(f"\nSkipped {m}: {why}")
    return "\n".join(lines) + "\n"
