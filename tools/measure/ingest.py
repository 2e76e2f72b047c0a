"""Ingest throughput beside the peers' writers: the same ImageNet-like JPEGs (a class folder, and the
same samples as WebDataset tar shards), read from local disk or through `dstore pfs`, written by
`dstore ingest` (HDF5 on 1 and P ranks; sharded HDF5, Zarr, and HDF5 in the source's order with
--keep-order) and by LitData `optimize`, Mosaic Streaming `MDSWriter`, webdataset `ShardWriter` and
Hugging Face `datasets` (`from_generator` + `save_to_disk`), each peer with as many worker processes
as dstore has ranks.

    python -m dstore.tools.measure.ingest --count 20000 --pfs-count 2000 --parallel 1 2
    python -m dstore.tools.measure.ingest --count 200 --writers dstore --storage local   # a smoke run

Per run: files/s, MB/s (JPEG bytes of the input per second), CPU per file (user + system of the
whole process tree: the launcher, mpiexec and its ranks, a peer's worker pool; from wait4, so every
reaped descendant counts), peak memory (the largest sum of RSS over the tree, sampled every 50 ms)
and the largest single process's RSS. Before every run the input files' pages are evicted from the
page cache (posix_fadvise DONTNEED, the per-file form of `echo 1 > /proc/sys/vm/drop_caches`, which
would also empty the other users' caches) and dirty pages are written out (sync); the run ends when
its process exits (what it left dirty is written out afterwards, untimed, and reported). Through
pfs (read-only) the inputs are read through the mount and the outputs go to local disk. Writers run
in alternating order (forward, then reversed, group by group), so a drift in the machine's load does
not favour one. Every writer's output is checked to hold all the samples.

The peers run in their own venv (`--peers-python`, $DSTORE_PEERS_PYTHON or .cache/venv-peers;
tools/setup_ingest_peers.sh) through tools/measure/ingest_peer.py; a peer that cannot import there is
a row saying why. Outputs (under --out-dir, default bench-out/ingest): ingest.json, ingest.md and,
with matplotlib, ingest.png.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import random
import shutil
import subprocess
import sys
import tarfile
import threading
import time
from pathlib import Path

from dstore.errors import ConfigError
from dstore.runtime import rc
from dstore.tools.bench.peer_data import done, mark

REPO = Path(__file__).resolve().parents[2]
PEER_SCRIPT = Path(__file__).with_name("ingest_peer.py")
DEFAULT_PEERS_VENV = REPO / ".cache" / "venv-peers"
OWN_WRITERS = ("dstore-hdf5", "dstore-sharded", "dstore-zarr", "dstore-keep-order")
PEER_WRITERS = ("litdata", "mosaic", "webdataset", "hf")
WRITERS = OWN_WRITERS + PEER_WRITERS
LABELS = {
    "dstore-hdf5": "dstore ingest (HDF5)",
    "dstore-sharded": "dstore ingest (HDF5, one shard per rank)",
    "dstore-zarr": "dstore ingest (Zarr)",
    "dstore-keep-order": "dstore ingest (HDF5, --keep-order)",
    "litdata": "LitData optimize",
    "mosaic": "Mosaic MDSWriter",
    "webdataset": "webdataset ShardWriter",
    "hf": "HF datasets from_generator + save_to_disk",
}
SAMPLE_PERIOD = 0.05


# --- inputs ----------------------------------------------------------------------------------------


class _Part:
    """Who-am-I for one of `size` processes making the image folder (generate_image_folder's comm)."""

    def __init__(self, rank: int, size: int):
        self.rank, self.size = rank, size

    def Get_rank(self) -> int:
        return self.rank

    def Get_size(self) -> int:
        return self.size

    def allgather(self, value):
        return [value]


def _generate(args) -> None:
    from dstore.ingest.synthetic import generate_image_folder

    root, count, rank, size = args
    generate_image_folder(root, count, comm=_Part(rank, size))


def listing(folder: str) -> tuple[list[str], list[tuple[str, int]]]:
    """(class names, [(file, label)]) of an image folder, in sorted order."""
    classes = sorted(d for d in os.listdir(folder) if os.path.isdir(os.path.join(folder, d)))
    files = [
        (os.path.join(folder, c, n), k)
        for k, c in enumerate(classes)
        for n in sorted(os.listdir(os.path.join(folder, c)))
        if n.endswith(".jpg")
    ]
    return classes, files


def image_folder(root: str, count: int, processes: int) -> str:
    """root/images-COUNT: the project's synthetic ImageNet-like JPEGs (dstore.ingest.synthetic: ~110
    KB, sides 333-500), made once in `processes` processes and reused."""
    import multiprocessing

    folder = os.path.join(root, f"images-{count}")
    key = f"synthetic seed 0 count {count}"
    if not done(folder, key):
        shutil.rmtree(folder, ignore_errors=True)
        if processes == 1 or count < 1000:  # a pool's start costs more than it saves
            _generate((folder, count, 0, 1))
        else:
            with multiprocessing.get_context("spawn").Pool(processes) as pool:
                pool.map(_generate, [(folder, count, r, processes) for r in range(processes)])
        mark(folder, key)
    return folder


def tar_shards(folder: str, per_shard: int, seed: int = 0) -> str:
    """FOLDER.wds: the folder's samples shuffled once with `seed` into tar shards of `per_shard`
    samples (members KEY.jpg and KEY.cls, as webdataset writes them), made once and reused."""
    out = folder + f".wds{per_shard}"
    key = f"{folder} shuffled seed {seed}"
    if done(out, key):
        return out
    _, files = listing(folder)
    random.Random(seed).shuffle(files)
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    for s, lo in enumerate(range(0, len(files), per_shard)):
        with tarfile.open(os.path.join(out, f"shard-{s:05d}.tar"), "w", format=tarfile.USTAR_FORMAT) as tar:
            for i, (path, label) in enumerate(files[lo : lo + per_shard], lo):
                key_i = f"{i:08d}"
                tar.add(path, arcname=key_i + ".jpg")
                info = tarfile.TarInfo(key_i + ".cls")
                payload = str(label).encode()
                info.size = len(payload)
                tar.addfile(info, io.BytesIO(payload))
    mark(out, key)
    return out


def shards_of(tars: str) -> list[str]:
    return sorted(os.path.join(tars, n) for n in os.listdir(tars) if n.endswith(".tar"))


def evict(paths) -> None:
    """sync, then drop the page-cache pages of every file under `paths` (files or directories)."""
    os.sync()
    for top in paths:
        walk = [(top, [], [""])] if os.path.isfile(top) else os.walk(top)
        for d, _dirs, names in walk:
            for n in names:
                try:
                    fd = os.open(os.path.join(d, n), os.O_RDONLY)
                except OSError:
                    continue
                try:
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                finally:
                    os.close(fd)


# --- one run ---------------------------------------------------------------------------------------


def _tree(root: int) -> list[int]:
    """`root` and its descendants now (from /proc's parent ids)."""
    parent = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as fh:
                    parent[int(d)] = int(fh.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    out, todo = [], [root]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += [c for c, pp in parent.items() if pp == p]
    return out


def _rss(pids: list[int]) -> int:
    page, total = os.sysconf("SC_PAGE_SIZE"), 0
    for p in pids:
        try:
            with open(f"/proc/{p}/statm") as fh:
                total += int(fh.read().split()[1]) * page
        except (OSError, IndexError, ValueError):
            continue
    return total


def measure_command(cmd: list[str], env: dict | None = None, timeout: float = 3600) -> dict:
    """Runs `cmd` and returns its exit code, wall seconds, the CPU seconds of its process tree (wait4:
    the process and every descendant it reaped), its peak tree RSS (sampled every SAMPLE_PERIOD) and
    its largest single process's RSS, and what it printed."""
    peak, texts = [0], {}
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, start_new_session=True)
    done = threading.Event()

    def sample():
        while not done.wait(SAMPLE_PERIOD):
            peak[0] = max(peak[0], _rss(_tree(proc.pid)))

    def read(name, stream):
        texts[name] = stream.read().decode(errors="replace")

    threads = [
        threading.Thread(target=read, args=("stdout", proc.stdout), daemon=True),
        threading.Thread(target=read, args=("stderr", proc.stderr), daemon=True),
        threading.Thread(target=sample, daemon=True),
    ]
    for t in threads:
        t.start()
    try:
        status, ru = _wait4(proc.pid, t0 + timeout)
    finally:
        done.set()
    secs = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    for t in threads:
        t.join()
    return {
        "rc": proc.returncode,
        "seconds": secs,
        "cpu_seconds": ru.ru_utime + ru.ru_stime,
        "peak_tree_rss": peak[0],
        "max_process_rss": ru.ru_maxrss * 1024,
        "stdout": texts.get("stdout", ""),
        "stderr": texts.get("stderr", ""),
    }


def _wait4(pid: int, deadline: float):
    """(status, rusage) of `pid` once it exits (os.wait4), its process group killed at `deadline`."""
    while True:
        got, status, ru = os.wait4(pid, os.WNOHANG)
        if got == pid:
            return status, ru
        if time.perf_counter() > deadline:
            os.killpg(pid, 9)
            _, status, ru = os.wait4(pid, 0)
            return status, ru
        time.sleep(0.02)


# --- the writers -----------------------------------------------------------------------------------


def peers_python(explicit: str | None = None) -> str | None:
    """The peers' venv interpreter: `explicit`, $DSTORE_PEERS_PYTHON, or .cache/venv-peers; None if absent."""
    for cand in (explicit, rc.PEERS_PYTHON.get(), DEFAULT_PEERS_VENV / "bin" / "python"):
        if cand and os.path.exists(cand):
            return str(cand)
    return None


def _clean_env() -> dict:
    """This environment less MPI's launcher variables (a child must not think it is a rank) and PYTHONPATH."""
    return {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PMI_", "PMIX_", "MPI", "HYDRA_", "OMPI_")) and k != "PYTHONPATH"
    }


def peer_versions(python: str | None) -> dict:
    """Each peer: {"version": ...} or {"missing": why}."""
    if python is None:
        why = (
            f"no peers venv (tools/setup_ingest_peers.sh makes {os.path.relpath(DEFAULT_PEERS_VENV, REPO)}; "
            "or set DSTORE_PEERS_PYTHON / --peers-python)"
        )
        return {w: {"missing": why} for w in PEER_WRITERS}
    proc = subprocess.run(
        [python, str(PEER_SCRIPT), "--check"], capture_output=True, text=True, env=_clean_env(), timeout=600
    )
    if proc.returncode != 0:
        tail = " | ".join((proc.stderr or proc.stdout).strip().splitlines()[-2:])
        return {w: {"missing": f"{python} {PEER_SCRIPT.name} --check failed: {tail}"} for w in PEER_WRITERS}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def dstore_command(writer: str, kind: str, src: str, out: str, parallel: int) -> list[str]:
    """`dstore ingest` as a user types it (under `mpiexec -n P` for P > 1 ranks)."""
    cmd = [sys.executable, "-m", "dstore.tools", "ingest"]
    cmd += [os.path.join(src, "*.tar"), out, "--source-type", "tar"] if kind == "tars" else [src, out]
    if writer == "dstore-zarr":
        cmd += ["--format", "zarr"]
    if writer == "dstore-sharded":
        cmd += ["--shards", str(parallel)]
    if writer == "dstore-keep-order":  # the source's order: files read as they lie, not in the seeded order
        cmd += ["--keep-order"]
    cmd += ["--no-progress", "--json"]
    return (["mpiexec", "-n", str(parallel)] if parallel > 1 else []) + cmd


def _output_path(writer: str, work: str) -> str:
    return os.path.join(work, {"dstore-hdf5": "out.h5", "dstore-zarr": "out.zarr"}.get(writer, "out"))


def _du(path: str) -> int:
    if os.path.isfile(path):
        return os.path.getsize(path)
    return sum(os.path.getsize(os.path.join(d, n)) for d, _, ns in os.walk(path) for n in ns)


def _written(writer: str, out: str, res: dict) -> tuple[int, str, int]:
    """(samples the output holds, writer version, bytes written)."""
    if writer in OWN_WRITERS:
        from importlib.metadata import version

        from dstore.formats import open_container

        with open_container(out) as r:
            return r.num_samples, f"dstore {version('dstore-mpi')}", _du(out)
    line = json.loads(res["stdout"].strip().splitlines()[-1])
    return int(line["samples"]), line["version"], int(line["bytes_written"]) + _du(out + ".hf-cache")


def run_one(
    writer: str,
    kind: str,
    src: str,
    local_src: str,
    work: str,
    parallel: int,
    *,
    expect: int,
    peers_py: str | None,
    job: str,
    timeout: float,
) -> dict:
    """One writer over one input: evict the inputs, run it, check it wrote `expect` samples, remove its output."""
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    out = _output_path(writer, work)
    if writer in OWN_WRITERS:
        cmd, env = dstore_command(writer, kind, src, out, parallel), None
    else:
        if peers_py is None:
            raise ConfigError(f"{writer}: no peers venv (--peers-python)")
        cmd = [peers_py, str(PEER_SCRIPT), writer, "--job", job, "--out", out, "--workers", str(parallel)]
        # LitData's scratch folders (default /tmp/chunks, /tmp/data) inside the run's, removed with it
        env = dict(
            _clean_env(),
            DATA_OPTIMIZER_CACHE_FOLDER=os.path.join(work, "lit-chunks"),
            DATA_OPTIMIZER_DATA_CACHE_FOLDER=os.path.join(work, "lit-data"),
        )
    evict([local_src])
    load = os.getloadavg()[0]
    res = measure_command(cmd, env=env, timeout=timeout)
    t0 = time.perf_counter()
    os.sync()
    row = {
        "writer": writer,
        "parallel": parallel,
        "load": load,
        "sync_after_s": time.perf_counter() - t0,
        "command": " ".join(cmd),
        **{k: res[k] for k in ("seconds", "cpu_seconds", "peak_tree_rss", "max_process_rss")},
    }
    try:
        if res["rc"] != 0:
            tail = " | ".join((res["stderr"] or res["stdout"]).strip().splitlines()[-3:])
            row["error"] = f"exit {res['rc']}: {tail}"[:600]
            return row
        n, version, written = _written(writer, out, res)
        row.update(samples=n, version=version, bytes_written=written)
        if n != expect:
            row["error"] = f"wrote {n} samples, the input has {expect}"
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return row


# --- the plan --------------------------------------------------------------------------------------


def input_sets(args, data: str) -> dict:
    """{(storage, kind): (folder or tar directory, samples, JPEG bytes, classes, items)} (local paths)."""
    cores = min(2, len(os.sched_getaffinity(0)))
    sets = {}
    for storage in args.storage:
        count = args.count if storage == "local" else args.pfs_count
        folder = image_folder(data, count, cores)
        classes, files = listing(folder)
        jpeg = sum(os.path.getsize(p) for p, _ in files)
        for kind in args.inputs:
            src = folder if kind == "folder" else tar_shards(folder, min(args.shard_samples, -(-count // 4)))
            sets[(storage, kind)] = (src, count, jpeg, classes, files)
    return sets


def _job(path: str, kind: str, src: str, classes, files) -> str:
    """The peers' job file: the files with their labels, or the tar shards (paths as the peer reads them)."""
    items = [[p, k] for p, k in files] if kind == "folder" else shards_of(src)
    with open(path, "w") as fh:
        json.dump({"kind": kind, "items": items, "classes": classes}, fh)
    return path


def measure(args) -> dict:
    from dstore.tools.pfs import parse_spec, pfs_mount

    root = os.path.abspath(args.out_dir)
    data, work = os.path.abspath(args.data_dir or os.path.join(root, "data")), os.path.join(root, "work")
    os.makedirs(data, exist_ok=True)
    os.makedirs(root, exist_ok=True)
    sets = input_sets(args, data)
    peers_py = peers_python(args.peers_python)
    wanted_peers = [w for w in args.writers if w in PEER_WRITERS]
    versions = peer_versions(peers_py) if wanted_peers else {}
    res = {
        "args": vars(args),
        "uptime_before": _uptime(),
        "cores": len(os.sched_getaffinity(0)),
        "drop_caches": "per file (posix_fadvise DONTNEED on every input file before every run)",
        "peers_python": peers_py,
        "peers": versions,
        "inputs": {},
        "rows": [],
    }
    group = 0
    for (storage, kind), (src, count, jpeg, classes, files) in sets.items():
        res["inputs"][f"{storage}/{kind}"] = {
            "path": src,
            "samples": count,
            "jpeg_bytes": jpeg,
            "input_bytes": _du(src),
        }
        mount = pfs_mount(data, model=parse_spec(args.pfs)) if storage == "pfs" else None
        with mount if mount is not None else contextlib.nullcontext():
            read_src = mount.translate(src) if mount is not None else src
            read_files = [(mount.translate(p), k) for p, k in files] if mount is not None else files
            job = _job(os.path.join(root, "job.json"), kind, read_src, classes, read_files)
            for parallel in args.parallel:
                order = [w for w in args.writers if not (w == "dstore-sharded" and parallel == 1)]
                order = order if group % 2 == 0 else order[::-1]
                group += 1
                for writer in order:
                    base = {
                        "storage": storage,
                        "input": kind,
                        "writer": writer,
                        "parallel": parallel,
                        "files": count,
                        "jpeg_bytes": jpeg,
                    }
                    if writer in PEER_WRITERS and "missing" in versions.get(writer, {}):
                        res["rows"].append({**base, "skipped": versions[writer]["missing"]})
                        continue
                    row = run_one(
                        writer,
                        kind,
                        read_src,
                        src,
                        work,
                        parallel,
                        expect=count,
                        peers_py=peers_py,
                        job=job,
                        timeout=args.timeout,
                    )
                    res["rows"].append({**base, **row})
                    print(summary_line(res["rows"][-1]), flush=True)
        if mount is not None:
            res["inputs"][f"{storage}/{kind}"]["pfs_stats"] = mount.stats
    res["uptime_after"] = _uptime()
    return res


def _uptime() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "load average: " + ", ".join(f"{v:.2f}" for v in os.getloadavg())


# --- the report ------------------------------------------------------------------------------------

COLUMNS = (
    ("files_per_s_per_process", "files/s per process", True),
    ("mb_per_s_per_process", "MB/s per process", True),
    ("cpu_ms_per_file", "CPU ms/file", False),
    ("peak_tree_rss_mb", "peak memory MB", False),
)
"""The columns the verdict ranks: (key, name, higher is better). Per process: per rank or peer worker,
i.e. per core where each has one."""


def derive(row: dict) -> dict:
    """The row's figures per file and per process (rows that did not run are returned as they are)."""
    if "seconds" not in row or "error" in row:
        return row
    n, p, s = row["files"], row["parallel"], row["seconds"]
    return {
        **row,
        "files_per_s": n / s,
        "mb_per_s": row["jpeg_bytes"] / 1e6 / s,
        "files_per_s_per_process": n / s / p,
        "mb_per_s_per_process": row["jpeg_bytes"] / 1e6 / s / p,
        "cpu_ms_per_file": 1e3 * row["cpu_seconds"] / n,
        "peak_tree_rss_mb": row["peak_tree_rss"] / 1e6,
        "max_process_rss_mb": row["max_process_rss"] / 1e6,
    }


def summary_line(row: dict) -> str:
    r = derive(row)
    head = f"{r['storage']}/{r['input']} {r['writer']} x{r['parallel']}"
    if "skipped" in r:
        return f"{head}: skipped: {r['skipped']}"
    if "error" in r:
        return f"{head}: FAILED: {r['error']}"
    return (
        f"{head}: {r['files_per_s']:,.0f} files/s, {r['mb_per_s']:,.1f} MB/s, {r['cpu_ms_per_file']:.2f} CPU ms/file, "
        f"peak {r['peak_tree_rss_mb']:,.0f} MB (load {r['load']:.1f})"
    )


def verdicts(rows: list[dict]) -> list[dict]:
    """Per (storage, input, parallel) and column: the leader and where dstore's best stands."""
    out = []
    groups: dict = {}
    for r in rows:
        if "files_per_s" in r:
            groups.setdefault((r["storage"], r["input"], r["parallel"]), []).append(r)
    for (storage, kind, p), rs in groups.items():
        for key, name, higher in COLUMNS:
            ranked = sorted(rs, key=lambda r: r[key], reverse=higher)
            mine = [r for r in ranked if r["writer"] in OWN_WRITERS]
            if not mine:
                continue
            best = mine[0]
            place = ranked.index(best) + 1
            out.append(
                {
                    "storage": storage,
                    "input": kind,
                    "parallel": p,
                    "column": name,
                    "leader": ranked[0]["writer"],
                    "dstore_writer": best["writer"],
                    "dstore_place": place,
                    "of": len(ranked),
                    "dstore_over_leader": best[key] / ranked[0][key] if ranked[0][key] else None,
                }
            )
    return out


def _f(v, fmt: str) -> str:
    return format(v, fmt) if v is not None else "n/a"


def markdown(res: dict) -> str:
    a = res["args"]
    rows = [derive(r) for r in res["rows"]]
    where = {"local": f"{a['count']:,} files on local disk", "pfs": f"{a['pfs_count']:,} through `{a['pfs']}`"}
    lines = [
        f"Ingest throughput: {'; '.join(where[s] for s in a['storage'])}; {res['cores']} core(s); "
        f"before: `{res['uptime_before']}`; after: `{res['uptime_after']}`.",
        f"Page cache: {res['drop_caches']}.",
        "",
    ]
    for key, info in res["inputs"].items():
        lines.append(
            f"- input {key}: {info['samples']:,} samples, {info['jpeg_bytes'] / 1e6:,.0f} MB of JPEG, "
            f"{info['input_bytes'] / 1e6:,.0f} MB on disk ({info['path']})"
        )
    lines += [
        "",
        "| storage | input | writer | processes | files/s | files/s per process | MB/s | CPU ms/file "
        "| peak memory MB (tree) | largest process MB | written MB | load |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in sorted(rows, key=lambda r: (r["storage"], r["input"], r["parallel"], WRITERS.index(r["writer"]))):
        head = f"| {r['storage']} | {r['input']} | {LABELS[r['writer']]} | {r['parallel']} |"
        if "files_per_s" not in r:
            why = r.get("skipped") and f"skipped: {r['skipped']}" or f"failed: {r.get('error')}"
            lines.append(f"{head} {why} | | | | | | | |")
            continue
        lines.append(
            f"{head} {r['files_per_s']:,.0f} | {r['files_per_s_per_process']:,.0f} | {r['mb_per_s']:,.1f} | "
            f"{r['cpu_ms_per_file']:.2f} | {r['peak_tree_rss_mb']:,.0f} | {r['max_process_rss_mb']:,.0f} | "
            f"{r['bytes_written'] / 1e6:,.0f} | {r['load']:.1f} |"
        )
    lines += [
        "",
        "| storage | input | processes | column | leader | dstore's best | place | dstore / leader |",
        "|---|---|---:|---|---|---|---:|---:|",
    ]
    for v in verdicts(rows):
        lines.append(
            f"| {v['storage']} | {v['input']} | {v['parallel']} | {v['column']} | {LABELS[v['leader']]} | "
            f"{LABELS[v['dstore_writer']]} | {v['dstore_place']} of {v['of']} | "
            f"{_f(v['dstore_over_leader'], '.2f')} |"
        )
    versions = sorted({r["version"] for r in rows if r.get("version")})
    return "\n".join(lines + ["", "versions: " + "; ".join(versions), ""])


def plot(res: dict, path: str) -> bool:
    """Files/s per process, one panel per storage/input (False without matplotlib)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    rows = [derive(r) for r in res["rows"] if "files_per_s" in derive(r)]
    panels = sorted({(r["storage"], r["input"]) for r in rows})
    if not panels:
        return False
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4), squeeze=False)
    for ax, (storage, kind) in zip(axes[0], panels):
        mine = [r for r in rows if (r["storage"], r["input"]) == (storage, kind)]
        ps = sorted({r["parallel"] for r in mine})
        names = [w for w in WRITERS if any(r["writer"] == w for r in mine)]
        width = 0.8 / max(1, len(ps))
        for j, p in enumerate(ps):
            vals = [
                next((r["files_per_s_per_process"] for r in mine if r["writer"] == w and r["parallel"] == p), 0)
                for w in names
            ]
            ax.bar([i + j * width for i in range(len(names))], vals, width, label=f"{p} process(es)")
        ax.set_xticks([i + width * (len(ps) - 1) / 2 for i in range(len(names))], names, rotation=30, ha="right")
        ax.set_title(f"{storage}, {kind}")
        ax.set_ylabel("files/s per process")
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


def main(argv=None) -> int:
    try:
        return _main(argv)
    except ConfigError as exc:  # one line, as the dstore CLI's errors
        print(f"measure.ingest: error: ConfigError: {exc}", file=sys.stderr)
        return 2


def _main(argv=None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m dstore.tools.measure.ingest",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--count", type=int, default=20000, help="JPEGs of the local input (synthetic, made once)")
    p.add_argument("--pfs-count", type=int, default=None, help="JPEGs of the input read through pfs (default --count)")
    p.add_argument("--shard-samples", type=int, default=1000, help="samples per tar shard of the WebDataset input")
    p.add_argument("--storage", nargs="+", choices=("local", "pfs"), default=["local", "pfs"])
    p.add_argument("--inputs", nargs="+", choices=("folder", "tars"), default=["folder", "tars"])
    p.add_argument("--parallel", type=int, nargs="+", default=[1, 2], help="dstore ranks = peer worker processes")
    p.add_argument(
        "--writers",
        nargs="+",
        default=list(WRITERS),
        help=f"any of {', '.join(WRITERS)}; 'dstore' for dstore's three, 'peers' for the four peers",
    )
    p.add_argument("--pfs", default="pfs:latency=2ms,iops=300", help="the pfs model (docs/storage.md)")
    p.add_argument(
        "--peers-python",
        default=None,
        help="the peers' venv python (default $DSTORE_PEERS_PYTHON or "
        ".cache/venv-peers/bin/python; tools/setup_ingest_peers.sh)",
    )
    p.add_argument("--timeout", type=float, default=1800, help="seconds before one run is killed")
    p.add_argument("--out-dir", default="bench-out/ingest", help="the outputs and the runs' scratch (work/)")
    p.add_argument("--data-dir", default=None, help="where the inputs are made once and reused (default OUT_DIR/data)")
    args = p.parse_args(argv)
    writers = []
    for w in args.writers:
        expanded = {"dstore": list(OWN_WRITERS), "peers": list(PEER_WRITERS)}.get(w, [w])
        for x in expanded:
            if x not in WRITERS:
                raise ConfigError(f"--writers: {x!r} is not one of {', '.join(WRITERS)}, dstore, peers")
            if x not in writers:
                writers.append(x)
    args.writers = writers
    args.pfs_count = args.pfs_count or args.count
    if args.count < 1 or args.pfs_count < 1 or args.shard_samples < 1 or min(args.parallel) < 1:
        raise ConfigError("--count, --pfs-count, --shard-samples and --parallel must be at least 1")
    if "pfs" in args.storage:
        from dstore.tools.pfs import fuse_available

        why = fuse_available()
        if why is not None:
            raise ConfigError(f"--storage pfs: {why} (run with --storage local)")
    res = measure(args)
    res["rows"] = [derive(r) for r in res["rows"]]
    res["verdicts"] = verdicts(res["rows"])
    text = markdown(res)
    print(text)
    base = os.path.join(args.out_dir, "ingest")
    with open(base + ".json", "w") as fh:
        json.dump(res, fh, indent=1)
    with open(base + ".md", "w") as fh:
        fh.write(text)
    if plot(res, base + ".png"):
        print(f"wrote {base}.json, {base}.md, {base}.png")
    else:
        print(f"wrote {base}.json, {base}.md (no matplotlib: no plot)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
