"""The bench over modelled shared storage: every reader's paths routed through a `dstore pfs` mount
(`--storage`), and the training view over a ladder of storage models (`--storage-sweep`)."""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import time

from dstore.runtime.collective import node_comm
from dstore.store.data_store import DataStore
from dstore.tools.bench import training_view
from dstore.tools.bench.report import _plt
from dstore.tools.pfs.model import PfsModel, parse_spec
from dstore.tools.pfs.mount import PfsMount, PfsMountError

DEFAULT_LADDER = (
    "local",
    "pfs:latency=0,iops=unlimited,bandwidth=unlimited",
    "pfs:latency=0.5ms,iops=2000",
    "pfs:latency=2ms,iops=2000",
    "pfs:latency=8ms,iops=2000",
)
"""--storage-sweep's rungs: the local disk; the FUSE file system alone (its own overhead); then a job's
share of a busy Lustre (2,000 ops/s, docs/storage.md) at three latencies."""


def rung_label(spec: str) -> str:
    if spec == "local":
        return "local disk"
    m = parse_spec(spec)
    if m.is_local:
        return "pfs, no delay, no cap"
    iops = "no iops cap" if math.isinf(m.iops) else f"{m.iops:g} ops/s"
    return f"pfs {m.latency * 1e3:g} ms, {iops}"


@dataclasses.dataclass
class Mounted:
    """The mounts of one bench phase, as every rank sees them."""

    model: PfsModel
    roots: list[str]
    mountpoints: list[str]
    stats: list[dict | None] = dataclasses.field(default_factory=list)

    def translate(self, path):
        """The path through the mount of a path under one of the mounted roots (others unchanged)."""
        if path is None:
            return None
        real = os.path.realpath(os.fspath(path))
        for root, mp in zip(self.roots, self.mountpoints):
            rel = os.path.relpath(real, root)
            if not rel.startswith(".."):
                return mp if rel == "." else os.path.join(mp, rel)
        return os.fspath(path)

    def translate_dataset(self, data):
        return dataclasses.replace(
            data,
            container=self.translate(data.container),
            hdf5=self.translate(data.hdf5),
            zarr=self.translate(data.zarr),
            files=None if data.files is None else [self.translate(f) for f in data.files],
            h5py_contiguous=self.translate(data.h5py_contiguous),
            zarr_per_sample=self.translate(data.zarr_per_sample),
        )


def mount_roots(data_dir: str, container: str | None) -> list[str]:
    """The directories to mount: the data directory, and the given container's directory if it is elsewhere."""
    roots = [os.path.realpath(data_dir)]
    if container:
        c = os.path.dirname(os.path.realpath(container))
        if not any(not os.path.relpath(c, r).startswith("..") for r in roots):
            roots.append(c)
    return roots


@contextlib.contextmanager
def mounted(comm, roots: list[str], model: PfsModel):
    """Mounts each root with `model` once per node (the node's first rank runs the file systems, so every
    rank of the node shares one iops and one bandwidth budget, as a node's clients share a file system's
    share), and yields a `Mounted` on every rank. Always unmounts: the first rank waits for every rank
    of its node, then closes. An error while mounting on one node raises on every rank."""
    node = node_comm(comm)  # the machine's real node (never $DSTORE_RANKS_PER_NODE's): one mount per machine
    mounts: list[PfsMount] = []
    info = Mounted(model, list(roots), [])
    ok = False
    try:
        err = None
        if node.Get_rank() == 0:
            try:
                for r in roots:
                    m = PfsMount(r, None, model)
                    m.__enter__()
                    mounts.append(m)
            except Exception as exc:  # noqa: BLE001 - sent to every rank below, then raised everywhere
                err = f"{type(exc).__name__}: {exc}"
        errs = comm.allgather(err)
        bad = [e for e in errs if e]
        if bad:
            raise PfsMountError(f"--storage: mounting the pfs model failed: {bad[0]}")
        info.mountpoints = node.bcast([m.mountpoint for m in mounts], root=0)
        yield info
        ok = True
    finally:
        if ok:  # after an error on this rank, the job is being aborted: no collective that could wait forever
            node.Barrier()
        for m in mounts:
            m.close()
        info.stats = [m.stats for m in mounts]
        node.Free()


def _store_population_and_view(comm, cfg, data, n: int, compute: float):
    """Preload population time (timed across ranks) and the store's training-view row."""
    comm.Barrier()
    t0 = time.perf_counter()
    store = DataStore(
        comm, data.container, batch_size=cfg.batch_size, seed=cfg.seed, population="preload", sample_range=(0, n)
    )
    store.__enter__()
    try:
        pop = comm.allreduce(time.perf_counter() - t0, op=_max())
        row = training_view.run_store(
            comm, store, compute_seconds=compute, epoch=2, num_threads=cfg.decode_threads, size=cfg.decode_size
        )
    finally:
        store.__exit__(None, None, None)
    return pop, row


def _max():
    from mpi4py import MPI

    return MPI.MAX


def training_rows(comm, cfg, data, n: int, compute: float, prog) -> tuple[float, list[dict]]:
    """The training view of the store and of each baseline over `data` (paths as given: local or
    through a mount); returns (the store's population seconds, rows)."""
    pop, store_row = _store_population_and_view(comm, cfg, data, n, compute)
    rows = [store_row]
    rows += training_view.run_baselines(
        comm,
        data,
        n,
        compute_seconds=compute,
        batch_size=cfg.batch_size,
        num_workers=cfg.num_workers,
        seed=cfg.seed,
        decode_size=cfg.decode_size,
    )
    for r in rows:
        r["samples_per_s"] = n / r["wall"] if r["wall"] > 0 else 0.0
        prog.note(
            f"{r['name']}: {r['samples_per_s']:,.0f} samples/s, AU {r['au']:.3f} "
            f"(wall {r['wall']:.2f}s, wait {r['wait']:.2f}s)"
        )
    prog.note(f"store population (preload): {pop:.2f} s")
    return pop, rows


def break_even(pop: float, store_epoch: float, other_epoch: float) -> int | None:
    """Epochs after which the store (population + E x its epoch) is ahead of a loader (E x its epoch);
    None if it never is (the other loader's epoch is no longer than the store's)."""
    if other_epoch <= store_epoch:
        return None
    return max(1, math.ceil(pop / (other_epoch - store_epoch) - 1e-9))


def sweep(comm, cfg, data, data_dir: str, ladder, n: int, compute: float, prog) -> dict:
    """The training view on each rung of `ladder` (specs: `local` or `pfs:...`)."""
    rungs = []
    for spec in ladder:
        label = rung_label(spec)
        prog.start(f"storage sweep: {label}")
        if spec == "local":
            pop, rows = training_rows(comm, cfg, data, n, compute, prog)
            model, stats = None, None
        else:
            model = parse_spec(spec)
            with mounted(comm, mount_roots(data_dir, cfg.container), model) as mnt:
                pop, rows = training_rows(comm, cfg, mnt.translate_dataset(data), n, compute, prog)
            stats = mnt.stats
        store = rows[0]
        others = rows[1:]
        for r in others:
            r["break_even_epochs"] = break_even(pop, store["wall"], r["wall"])
        best = max(others, key=lambda r: r["samples_per_s"]) if others else None
        rungs.append(
            {
                "spec": spec,
                "label": label,
                "model": None if model is None else model.to_dict(),
                "latency_ms": 0.0 if model is None else model.latency * 1e3,
                "population_seconds": pop,
                "loaders": rows,
                "mount_stats": stats,
                "store_vs_best_other": (
                    store["samples_per_s"] / best["samples_per_s"] if best and best["samples_per_s"] > 0 else None
                ),
                "best_other": best["name"] if best else None,
            }
        )
        if best:
            prog.note(f"store / best other ({best['name']}): {rungs[-1]['store_vs_best_other']:.2f}")
    return {"num_samples": n, "compute_seconds": compute, "rungs": rungs}


def sweep_markdown(sw: dict, meta: dict) -> str:
    names = [r["name"] for r in sw["rungs"][0]["loaders"]]
    lines = [
        f"# Training view over modelled storage ({meta['ranks']} rank(s), {sw['num_samples']:,} samples, "
        f"{sw['compute_seconds'] * 1e3:.1f} ms compute per step)",
        "",
        f"Command: `{meta['command']}`  ",
        f"Machine: {meta['machine']}  ",
        f"Date: {meta['date_utc']}",
        "",
        "Training samples/s (AU) of each loader, steady state: the store's population is not in its "
        "epoch and is shown apart. Break-even: epochs after which the store, population included, is "
        "ahead of that loader (- : never, the loader is as fast).",
        "",
        "| storage | " + " | ".join(names) + " | store population | store / best other | break-even epochs |",
        "|---|" + "---:|" * (len(names) + 3),
    ]
    for g in sw["rungs"]:
        cells = [f"{r['samples_per_s']:,.0f} ({r['au']:.2f})" for r in g["loaders"]]
        be = ", ".join(
            f"{'-' if r.get('break_even_epochs') is None else r['break_even_epochs']}" for r in g["loaders"][1:]
        )
        ratio = "n/a" if g["store_vs_best_other"] is None else f"{g['store_vs_best_other']:.2f}x"
        lines.append(
            f"| {g['label']} | " + " | ".join(cells) + f" | {g['population_seconds']:.2f} s | {ratio} | {be} |"
        )
    lines += ["", "Break-even epochs are listed in the order of the loaders after the store.", ""]
    for g in sw["rungs"]:
        for st in g.get("mount_stats") or []:
            if st:
                lines.append(
                    f"- {g['label']}: the mount served {st['ops']:,} operations ({st['reads']:,} reads, "
                    f"{st['opens']:,} opens, {st['stats']:,} stats), {st['read_bytes'] / 1e6:,.0f} MB"
                )
    return "\n".join(lines) + "\n"


def sweep_plot(sw: dict, path: str) -> str:
    plt = _plt()
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4.2))
    labels = [g["label"] for g in sw["rungs"]]
    xs = list(range(len(labels)))
    for k, name in enumerate(r["name"] for r in sw["rungs"][0]["loaders"]):
        style = "o-" if k == 0 else "s--"
        a1.plot(xs, [g["loaders"][k]["samples_per_s"] for g in sw["rungs"]], style, label=name)
        a2.plot(xs, [g["loaders"][k]["au"] for g in sw["rungs"]], style, label=name)
    for ax, yl in ((a1, "training samples/s (all ranks)"), (a2, "AU (compute / wall)")):
        ax.set_xticks(xs, labels, rotation=20, ha="right", fontsize=8)
        ax.set_ylabel(yl)
        ax.set_ylim(bottom=0)
    a2.set_ylim(0, 1.05)
    pops = [g["population_seconds"] for g in sw["rungs"]]
    a1.set_title(
        "samples/s vs storage (store population apart: " + ", ".join(f"{p:.1f}s" for p in pops) + ")", fontsize=8
    )
    a2.set_title("accelerator utilisation vs storage", fontsize=9)
    a1.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
