"""Checking a container end to end (`verify_container`) and summarising it (`container_info`).

Verification is split over the ranks of a communicator in contiguous byte-balanced blocks (the
same blocks the store preloads), each read with a few large reads; the findings are gathered to
every rank, so every rank returns the same report.
"""

from __future__ import annotations

import dataclasses
import os
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from dstore.codec.decode import decode_sample
from dstore.errors import ConfigError, DStoreError, SampleError, shown
from dstore.formats import detect_format, open_container
from dstore.formats.base import crc32
from dstore.order.plan import block_bounds
from dstore.runtime.collective import topology
from dstore.runtime.heartbeat import Heartbeat
from dstore.runtime.units import fmt_rate, fmt_size

READ_SIZE = 64 << 20
"""How many bytes verification reads at once (whole samples; a larger sample is read alone)."""


@dataclasses.dataclass(frozen=True)
class BadSample:
    """One sample that failed a check."""

    index: int
    name: str
    reason: str

    def __str__(self) -> str:  # a name cannot end the line or forge another (an "OK" line)
        return f"sample {self.index} ({shown(self.name)}): {shown(self.reason)}"


@dataclasses.dataclass(frozen=True)
class VerifyReport:
    """What `verify_container` found. `bad` is sorted by index and holds every failing sample."""

    path: str
    num_samples: int
    total_bytes: int
    decoded: bool
    nranks: int
    seconds: float
    bad: tuple[BadSample, ...]
    fields: tuple[str, ...] = ()
    """The extra fields whose checksums were checked (all of the container's)."""

    @property
    def ok(self) -> bool:
        return not self.bad

    def summary(self) -> str:
        """A few lines for people: what was checked, how fast, and every bad sample."""
        checks = (
            "checksums, labels"
            + (", decoding" if self.decoded else "")
            + (f", fields {', '.join(self.fields)}" if self.fields else "")
        )
        rate = self.total_bytes / max(self.seconds, 1e-9)
        lines = [
            f"{self.path}: {self.num_samples} samples, {fmt_size(self.total_bytes)}; checked {checks} "
            f"on {self.nranks} rank(s) in {self.seconds:.2f} s ({fmt_rate(rate)})"
        ]
        if self.ok:
            lines.append("OK: every sample passed")
        else:
            lines.append(f"FAILED: {len(self.bad)} bad sample(s)")
            lines.extend(f"  {b}" for b in self.bad)
        return "\n".join(lines)


def _read_groups(offsets: np.ndarray, start: int, stop: int, read_size: int):
    """Splits samples [start, stop) into runs of about `read_size` bytes: (first, last) pairs."""
    i = start
    while i < stop:
        limit = offsets[i] + read_size
        j = int(np.searchsorted(offsets, limit, side="right")) - 1  # samples [i, j) end within the limit
        j = min(max(j, i + 1), stop)
        yield i, j
        i = j


def _counted(groups, beat):
    """`groups` ((first, last) pairs), each counted on `beat` once the caller has checked it."""
    for first, last in groups:
        yield first, last
        if beat is not None:
            beat.add(last - first)


def _decode_error(data, info, name: str) -> str | None:
    """Why a sample does not decode, or None if it does."""
    try:
        decode_sample(data, info, name=name)
    except SampleError as exc:
        return f"does not decode: {exc}"
    return None


MAX_DECODE_BYTES = 1 << 30
"""A sample larger than this is checksummed piece by piece but not decoded (it would need a buffer
of its whole size; no image of that size is plausible)."""


def _readable_runs(reader, a: int, b: int):
    """(first, last, bytes or None, error or None) covering samples [a, b): one read if it
    succeeds; else the run is halved until each failure is one sample, so one bad chunk marks
    only the samples whose bytes it holds, not everything read with it."""
    try:
        yield a, b, reader.read_range(a, b), None
    except (DStoreError, OSError) as exc:
        if b - a == 1:
            yield a, b, None, exc
            return
        mid = (a + b) // 2
        yield from _readable_runs(reader, a, mid)
        yield from _readable_runs(reader, mid, b)


def _check_large(reader, i: int, read_size: int, decode: bool) -> list[str]:
    """The checks on sample i, larger than `read_size`: its checksum computed over pieces of
    `read_size` bytes (never a buffer of a declared size), then, if `decode`, decoded whole."""
    lo, hi = int(reader.offsets[i]), int(reader.offsets[i + 1])
    crc = 0
    try:
        for at in range(lo, hi, read_size):
            crc = crc32(reader.read_bytes(at, min(hi, at + read_size)), crc)
    except (DStoreError, OSError) as exc:
        return [f"unreadable: {exc}"]
    want = int(reader.checksums[i])
    if crc & 0xFFFFFFFF != want:
        return [f"checksum mismatch: stored {want:#010x}, computed {crc & 0xFFFFFFFF:#010x}"]
    if not decode:
        return []
    if hi - lo > MAX_DECODE_BYTES:
        return [f"not decoded: {hi - lo} bytes is more than {MAX_DECODE_BYTES}"]
    err = _decode_error(reader.read_bytes(lo, hi), reader.info, reader.name(i))
    return [] if err is None else [err]


def _check_block(
    reader, start: int, stop: int, *, decode: bool, read_size: int, pool=None, beat=None
) -> list[BadSample]:
    """Every check on samples [start, stop) of an open reader; decoding runs on `pool` (the
    decoders release the GIL) when one is given; `beat` (a dstore.runtime.heartbeat.Heartbeat) counts them."""
    info, offsets = reader.info, reader.offsets
    nclasses = info.num_classes
    reasons: dict[int, list[str]] = {}
    for i in range(start, stop):
        label = int(reader.labels[i])
        if nclasses and not 0 <= label < nclasses:
            reasons[i] = [f"label {label} is outside [0, {nclasses}) ({nclasses} class names)"]
    for first, last in _counted(_read_groups(offsets, start, stop, read_size), beat):
        if last - first == 1 and int(offsets[last]) - int(offsets[first]) > read_size:
            found = _check_large(reader, first, read_size, decode)
            if found:
                reasons.setdefault(first, []).extend(found)
            continue
        for a, b, buf, exc in _readable_runs(reader, first, last):
            if exc is not None or buf is None:  # (the bytes are None exactly when the read failed)
                for i in range(a, b):
                    reasons.setdefault(i, []).insert(0, f"unreadable: {exc}")
                continue
            view = memoryview(buf)
            base = int(offsets[a])
            to_decode = []
            for i in range(a, b):
                lo, hi = int(offsets[i]) - base, int(offsets[i + 1]) - base
                got = crc32(view[lo:hi]) & 0xFFFFFFFF
                want = int(reader.checksums[i])
                if got != want:
                    reasons.setdefault(i, []).insert(0, f"checksum mismatch: stored {want:#010x}, computed {got:#010x}")
                elif decode:  # bytes that fail their checksum are not worth decoding
                    to_decode.append((i, buf[lo:hi]))
            if to_decode:
                mapper = pool.map if pool is not None else map
                errors = mapper(lambda item: _decode_error(item[1], info, reader.name(item[0])), to_decode)
                for (i, _), err in zip(to_decode, errors):
                    if err is not None:
                        reasons.setdefault(i, []).append(err)
    return [BadSample(i, reader.name(i), "; ".join(r)) for i, r in sorted(reasons.items())]


def verify_container(path, *, comm=None, decode: bool = False, read_size: int = READ_SIZE) -> VerifyReport:
    """Recomputes every sample's checksum, checks every label against the class names and,
    with `decode`, decodes every sample.

    Args:
        path: any container `open_container` accepts.
        comm: an mpi4py communicator to split the work over (collective: every rank calls this);
            None checks everything in this process.
        decode: also decode every sample (slow: it is the full decode cost of the data set).
        read_size: how many bytes each read covers (whole samples; a larger sample is read alone).

    Returns:
        The same VerifyReport on every rank of `comm`.

    Raises:
        FormatError, IncompleteContainerError: the container does not open (structural damage).
    """
    if read_size < 1:
        raise ConfigError(f"read_size={read_size} must be positive")
    rank, size = (0, 1) if comm is None else (comm.Get_rank(), comm.Get_size())
    t0 = time.perf_counter()
    threads = _decode_threads(comm) if decode else 1
    bad: list[BadSample] = []
    with open_container(path, check_labels=False) as reader, ThreadPoolExecutor(threads) as pool:
        _ = reader.source_index  # read and checked on demand only (a store never reads it): here it is checked
        bounds = block_bounds(reader.offsets, size)
        lo, hi = int(bounds[rank]), int(bounds[rank + 1])
        with Heartbeat(
            f"verify{' --decode' if decode else ''} (rank 0's part)", hi - lo, unit="samples", enabled=rank == 0
        ) as beat:
            bad += _check_block(reader, lo, hi, decode=decode, read_size=read_size, pool=pool, beat=beat)
        if rank == 0:  # fields are small (captions, records): one rank reads them all
            bad += _check_fields(reader)
        n, total, fields = reader.num_samples, reader.total_bytes, reader.field_names
    if comm is not None and size > 1:
        bad = [b for part in comm.allgather(bad) for b in part]
        seconds = comm.allreduce(time.perf_counter() - t0, op=_max_op())
    else:
        seconds = time.perf_counter() - t0
    return VerifyReport(
        path=os.fspath(path),
        num_samples=n,
        total_bytes=total,
        decoded=decode,
        nranks=size,
        seconds=seconds,
        bad=tuple(sorted(bad, key=lambda b: b.index)),
        fields=fields,
    )


def _check_fields(reader) -> list[BadSample]:
    """A BadSample per sample and field whose value does not match its checksum."""
    return [
        BadSample(i, reader.name(i), f"field {name!r} does not match its checksum")
        for name in reader.field_names
        for i in reader.field_bad_samples(name)
    ]


def _decode_threads(comm) -> int:
    """Decoding threads per rank: this node's cores shared by the ranks on it."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    if comm is None:
        return max(1, min(cores, 16))
    per_node = topology(comm).local_size  # the machine's real node: cores are per machine
    return max(1, min(cores // per_node, 16))


def _max_op():
    from mpi4py import MPI

    return MPI.MAX


def _distribution(sizes: np.ndarray) -> dict[str, float]:
    if sizes.size == 0:
        return {"min": 0, "mean": 0.0, "median": 0.0, "p95": 0.0, "max": 0}
    return {
        "min": int(sizes.min()),
        "mean": float(sizes.mean()),
        "median": float(np.median(sizes)),
        "p95": float(np.percentile(sizes, 95)),
        "max": int(sizes.max()),
    }


def container_info(path) -> dict:
    """A JSON-compatible summary of a container: format, counts, bytes, encoding, classes with
    per-class counts, and the distribution of sample sizes (min/mean/median/p95/max bytes)."""
    fmt = detect_format(path)
    with open_container(path, check_labels=False) as reader:
        info = reader.info
        labels = reader.labels
        nclasses = info.num_classes
        in_range = (labels >= 0) & (labels < nclasses)
        counts = np.bincount(labels[in_range], minlength=nclasses) if nclasses else np.zeros(0, np.int64)
        result = {
            "path": os.fspath(path),
            "format": fmt,
            "version": info.version,
            "num_samples": info.num_samples,
            "total_bytes": info.total_bytes,
            "encoding": info.encoding,
            "raw_dtype": info.raw_dtype,
            "raw_shape": None if info.raw_shape is None else list(info.raw_shape),
            "source": info.source,
            "num_classes": nclasses,
            "classes": [{"label": k, "name": name, "count": int(counts[k])} for k, name in enumerate(info.class_names)],
            "labels_outside_classes": int((~in_range).sum()) if nclasses else 0,
            "sample_bytes": _distribution(np.diff(reader.offsets)),
            "attrs": info.extra,
            "fields": [{"name": n, "kind": k} for n, k in info.fields],
        }
        if fmt == "sharded":
            result["shards"] = [
                {"path": s.path, "num_samples": s.num_samples, "total_bytes": s.total_bytes} for s in reader.shards
            ]
    return result


def format_info(summary: dict) -> str:
    """`container_info`'s dict as readable text."""
    s = summary
    enc = s["encoding"] + (f" ({s['raw_dtype']}{tuple(s['raw_shape'])})" if s["encoding"] == "raw" else "")
    size = s["sample_bytes"]
    lines = [
        f"{s['path']}  [{s['format']}, version {s['version']}]",
        f"  samples      {s['num_samples']}",
        f"  total bytes  {s['total_bytes']} ({fmt_size(s['total_bytes'])})",
        f"  encoding     {enc}",
        f"  sample bytes min {size['min']}  mean {size['mean']:.1f}  median {size['median']:.1f}  "
        f"p95 {size['p95']:.1f}  max {size['max']}",
    ]
    if s["source"]:
        lines.append(f"  source       {shown(s['source'])}")
    lines.append(f"  classes      {s['num_classes']}")
    names = [shown(c["name"]) for c in s["classes"]]  # a class name cannot forge a line either
    width = max([len(n) for n in names] + [4])
    lines.extend(f"    {c['label']:>4}  {n:<{width}}  {c['count']}" for c, n in zip(s["classes"], names))
    if s["labels_outside_classes"]:
        lines.append(f"  labels outside the class names: {s['labels_outside_classes']}")
    if s.get("fields"):
        lines.append("  fields       " + ", ".join(f"{shown(f['name'])} ({f['kind']})" for f in s["fields"]))
    for shard in s.get("shards", []):
        lines.append(f"  shard {shard['path']}: {shard['num_samples']} samples, {shard['total_bytes']} bytes")
    if s["attrs"]:
        lines.append("  attributes   " + ", ".join(f"{k}={v!r}" for k, v in sorted(s["attrs"].items())))
    return "\n".join(lines)
