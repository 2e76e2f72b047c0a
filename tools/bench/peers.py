"""`dstore bench --peers`: the store beside WebDataset and LitData, each read as its users read it,
on local disk and through `dstore pfs` rungs, every loader delivering the same samples' raw bytes.

Per loader and rung one pass of `EPOCHS` epochs as fast as the loader goes (first batch, epoch 0
and the steady epoch, each from the loader's construction; bytes and operations the storage served,
from a fresh mount per pass), then one pass per consumption rate (`--consume`, samples/s per rank):
DLIO's method, the step's compute emulated by a sleep of batch/rate seconds, decode skipped (every
loader hands over the stored JPEG bytes), AU = compute time / wall time of the least utilised rank.
Shuffle quality (tools/bench/shuffle_quality.py) is taken from the labels each loader delivered.

The peers are optional (pyproject's `peers` extra): a loader whose library does not import is
skipped with the reason. Ranks are not synchronised per step (no model): the store's epochs are
collective at their start and end, the peers' not at all.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import time
from collections.abc import Callable
from typing import Any

import numpy as np

# the peers' loaders live with the trainer's (`dstore train --loader webdataset|litdata`), which reads them alike
from dstore.training.peers import SHUFFLE_BUFFER, WDS_BUFFER, LitDataPeer, WebDatasetPeer, missing

__all__ = ["SHUFFLE_BUFFER", "WDS_BUFFER", "LitDataPeer", "WebDatasetPeer", "missing"]

EPOCHS = 2
RATES = (1500, 3000, 6000)


@dataclasses.dataclass
class LoaderSpec:
    """One loader row: `open(comm)` returns an object with `epoch(e)` (batches of (samples,
    labels)) and `close()`; `paths` are the files it reads (evicted before a local pass)."""

    name: str
    open: Callable[[Any], Any]
    paths: list
    collective: bool = False  # its epochs are collective (the store): never cut short on one rank


class _Store:
    def __init__(self, comm, container, population, batch_size, seed):
        # here, not at the top: the peers' DataLoader workers (spawned) unpickle this module's
        # helpers and must not initialise MPI, which dstore.store does
        from dstore.store.data_store import DataStore

        self.store = DataStore(comm, container, batch_size=batch_size, seed=seed, population=population)
        self.store.__enter__()

    def epoch(self, e):
        for b in self.store.epoch(e):
            yield b.samples, b.labels, b.ids

    def close(self):
        self.store.close()


def store_spec(container: str, population: str, batch_size: int, seed: int, label: str = "") -> LoaderSpec:
    from dstore.memory.pagecache import container_files

    return LoaderSpec(
        f"store ({population}){label}",
        lambda comm: _Store(comm, container, population, batch_size, seed),
        container_files(container),
        collective=True,
    )


def wds_spec(shards, workers: int, buffered: bool, batch: int, seed: int, label: str = "") -> LoaderSpec:
    read = "DataPipeline, 1 MiB buffer" if buffered else "WebDataset class as shipped: 8 KiB reads"
    return LoaderSpec(
        f"WebDataset, {workers} workers, {read}{label}",
        lambda comm: WebDatasetPeer(comm, shards, workers, buffered, batch, seed),
        list(shards),
    )


def litdata_spec(path, workers: int, batch: int, seed: int, cache_dir: str, posix: bool, label: str = "") -> LoaderSpec:
    how = "posix reads (LITDATA_POSIX_FAST=0)" if posix else "default (mmap in place)"
    from dstore.tools.bench.common import files_under

    return LoaderSpec(
        f"LitData, {workers} workers, {how}{label}",
        lambda comm: LitDataPeer(comm, path, workers, batch, seed, cache_dir, posix),
        files_under([path]),
    )


def run_pass(
    comm, spec: LoaderSpec, *, rate: float | None = None, epochs: int = EPOCHS, max_seconds: float | None = None
) -> dict:
    """`epochs` epochs of `spec` from its construction, on every rank; with `rate`, a sleep of
    len(batch)/rate after each batch (the emulated step). Returns the job's figures (the slowest
    rank's times, the least utilised rank's AU) and every rank's per-batch labels."""
    comm.Barrier()
    t0 = time.perf_counter()
    first, ends, labels, compute, count, nbytes, cut, err = None, [], [], 0.0, 0, 0, False, None
    computed = []  # compute seconds up to each epoch's end
    try:
        loader = spec.open(comm)
    except Exception as exc:
        if spec.collective:
            raise  # the store: its error ends the job (dstore.tools.cli.abort_on_error)
        return _failed(comm, spec, exc)
    try:
        for e in range(epochs):
            mine = []
            for samples, lab, *_ in loader.epoch(e):
                if first is None:
                    first = time.perf_counter() - t0
                mine.append(np.asarray(lab, dtype=np.int64))
                count += len(samples)
                nbytes += sum(len(s) for s in samples)
                if rate:
                    time.sleep(len(samples) / rate)
                    compute += len(samples) / rate
                if max_seconds and not spec.collective and time.perf_counter() - t0 > max_seconds:
                    cut = True
                    break
            ends.append(time.perf_counter() - t0)
            computed.append(compute)
            labels.append(mine)
            if cut:
                break
    except Exception as exc:
        if spec.collective:
            raise
        err = exc
    finally:
        loader.close()
    if err is not None or any(comm.allgather(False)):
        return _failed(comm, spec, err)
    wall = time.perf_counter() - t0
    rows = comm.allgather((first or wall, ends, count, nbytes, compute, wall, cut, labels, computed))
    steady = [r[1][1] - r[1][0] for r in rows if len(r[1]) > 1 and not r[6]]
    au = [r[4] / r[5] if r[5] > 0 else 0.0 for r in rows]
    return {
        "name": spec.name,
        "rate": rate,
        "first_batch_s": max(r[0] for r in rows),
        "epoch0_s": max(r[1][0] for r in rows),
        "steady_s": max(steady) if steady else None,
        "samples": [r[2] for r in rows],
        "bytes": [r[3] for r in rows],
        "cut_short": any(r[6] for r in rows),
        "seconds": wall,
        "au": min(au) if rate else None,
        "rank_au": au if rate else None,
        "au_steady": min(_steady_au(r) for r in rows) if rate and all(len(r[1]) > 1 for r in rows) else None,
        "labels": [r[7] for r in rows],
    }


def _steady_au(row) -> float:
    """A rank's AU over epoch 1 alone (compute in it over its duration)."""
    ends, computed = row[1], row[8]
    span = ends[1] - ends[0]
    return (computed[1] - computed[0]) / span if span > 0 else 0.0


def _failed(comm, spec: LoaderSpec, exc) -> dict:
    """Collective (the other half of run_pass's failure check): the row of a peer that failed on
    some rank, with the first rank's error (a peer's failure is a result, not the bench's)."""
    msg = None if exc is None else f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    if exc is not None:
        comm.allgather(True)  # meets the healthy ranks' check in run_pass
    msgs = [m for m in comm.allgather(msg) if m]
    return {"name": spec.name, "error": msgs[0] if msgs else "failed on another rank"}


@contextlib.contextmanager
def storage_rung(comm, spec: str, roots):
    """Yields (translate(path), stats list filled at exit) for a `local` or `pfs:...` rung."""
    if spec == "local":
        yield (lambda p: p), []
        return
    from dstore.tools.bench.storage import mounted
    from dstore.tools.pfs.model import parse_spec

    stats: list = []
    with mounted(comm, roots, parse_spec(spec)) as mnt:
        yield mnt.translate, stats
    stats.extend(s for s in mnt.stats if s)


def measure(comm, spec_factory, rung: str, roots, *, rates=RATES, max_seconds=None, prog=None) -> list[dict]:
    """Every loader of `spec_factory(translate)` on one rung: the fast pass and one per rate, each
    through a fresh mount (local: the loader's files evicted from the page cache first)."""
    from dstore.tools.bench.common import evict_on_nodes

    out = []
    names = None
    for k in itertools.count():
        row = None
        for rate in (None, *rates):
            with storage_rung(comm, rung, roots) as (translate, stats):
                specs = spec_factory(translate)
                names = [s.name for s in specs]
                if k >= len(specs):
                    break
                spec = specs[k]
                if rung == "local":
                    evict_on_nodes(comm, spec.paths)
                res = run_pass(comm, spec, rate=rate, max_seconds=max_seconds if rate is None else None)
            if "error" in res:
                row = res
                if prog:
                    prog.note(f"{rung}: {spec.name}: failed: {res['error']}")
                break
            res["storage_ops"] = sum(s.get("ops", 0) for s in stats) if stats else None
            res["storage_reads"] = sum(s.get("reads", 0) for s in stats) if stats else None
            res["storage_bytes"] = sum(s.get("read_bytes", 0) for s in stats) if stats else None
            if rate is None:
                row = res
                row["au_at"] = {}
                if prog:
                    prog.note(
                        f"{rung}: {spec.name}: first batch {res['first_batch_s']:.2f} s, epoch 0 "
                        f"{res['epoch0_s']:.2f} s" + (" (cut short)" if res["cut_short"] else "")
                    )
                if res["cut_short"]:
                    break  # too slow to be worth a rate pass
            else:
                assert row is not None  # the rate-free pass (rate None) comes first and set it
                row["au_at"][rate] = res["au"]
                row.setdefault("au_steady_at", {})[rate] = res["au_steady"]
        if row is None or names is None or k >= len(names):
            break
        out.append(row)
    return out
