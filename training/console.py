"""What a training run shows its user: progress lines, an epoch's progress bar, a rank's data-I/O line."""

from __future__ import annotations

import os
import sys

from tqdm import tqdm

from dstore.runtime.units import fmt_rate, fmt_seconds, fmt_size


def say(line: str) -> None:
    """Writes `line` to stdout and flushes it (how rank 0 reports progress by default)."""
    # One write per line: under mpiexec, print's separate writes of text and newline from several
    # ranks can interleave.
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def stderr_is_terminal() -> bool:
    """Whether stderr (where the progress bar draws) is a terminal."""
    try:
        return os.isatty(sys.stderr.fileno())
    except (AttributeError, OSError, ValueError):
        return False


def progress_bar(progress: bool | None, main: bool, total: int, epoch: int):
    """A tqdm bar of `total` steps for `epoch` on the main rank, or None.

    Args:
        progress: True (--progress: drawn even on a pipe, as under mpiexec where a rank's stderr is
            a pipe although the user sees a terminal), False, or None: only when stderr is a terminal.
        main: whether this is the rank that draws (never on the others).
    """
    if progress is None:
        progress = stderr_is_terminal()
    if not main or not progress:
        return None
    return tqdm(total=total, desc=f"epoch {epoch}", leave=False, mininterval=0.5)


human_bytes = fmt_size  # the one formatter (dstore.runtime.units)


def describe_io(stats: dict) -> str:
    """One readable line of a rank's data I/O figures (the store's last epoch, or the direct
    reader's totals); unknown shapes fall back to key=value."""
    if "samples_local" in stats:
        return _describe_store(stats)
    if "sources" in stats:  # a mix (MixedStore): each source's store, its own figures
        return "; ".join(
            f"source {k}: {describe_io(st) if st else 'no epoch yet'}" for k, st in enumerate(stats["sources"])
        )
    if "samples_read" in stats:
        how = (
            f"from their own files, {stats['read_threads']} at once"
            if "read_threads" in stats
            else "one by one from the file"
        )
        return (
            f"whole run: {stats['samples_read']} samples read {how}, "
            f"{human_bytes(stats['bytes_read'])} in {stats['read_s']:.2f} s"
        )
    return " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in sorted(stats.items()))


def _describe_store(st: dict) -> str:
    """describe_io's line for a DataStore's epoch figures (EpochStats.as_dict())."""
    moved = st["bytes_local"] + st.get("bytes_node", 0) + st["bytes_remote"]
    line = (
        f"epoch {st['epoch']}: {st['samples']} samples ({st['samples_local']} local, "
        f"{st.get('samples_node', 0)} from node peers' memory, {st['samples_remote']} remote, "
        f"{st['pads']} pad), {human_bytes(moved)}, {human_bytes(st['bytes_remote'])} of it in "
        f"{st['gets']} gets; fetch {st['fetch_seconds'] * 1e3:.1f} ms, consumer wait "
        f"{st['wait_seconds'] * 1e3:.1f} ms"
    )
    if st.get("samples_storage"):  # data larger than the memory budget: the rest from storage
        line += (
            f"; from storage {st['samples_storage']} samples, {human_bytes(st['bytes_storage'])} in "
            f"{st['storage_reads']} reads (wait {st['storage_wait_seconds'] * 1e3:.1f} ms)"
        )
    if st.get("population_seconds"):
        line += (
            f"; population {human_bytes(st['population_bytes'])} in "
            f"{st['population_seconds'] * 1e3:.1f} ms ({fmt_rate(st['population_MBps'] * 1e6)})"
        )
    return line


# What the one-line summary over the ranks shows, per shape of a rank's figures: (label, the
# figure from a rank's dict, how it is printed).
_STORE_FIGURES = (
    ("samples", lambda st: st["samples"], str),
    ("remote", lambda st: st["bytes_remote"], fmt_size),
    ("gets", lambda st: st["gets"], str),
    ("fetch", lambda st: st["fetch_seconds"], fmt_seconds),
    ("consumer wait", lambda st: st["wait_seconds"], fmt_seconds),
    ("from storage", lambda st: st.get("bytes_storage", 0), fmt_size),
    ("population", lambda st: st.get("population_seconds", 0.0), fmt_seconds),
)
_READ_FIGURES = (
    ("samples read", lambda st: st["samples_read"], str),
    ("bytes", lambda st: st["bytes_read"], fmt_size),
    ("read time", lambda st: st["read_s"], fmt_seconds),
)


def summarize_io(all_stats: list[dict], loader: str) -> str:
    """One line of every rank's data I/O figures (dstore train's last line before it ends): min /
    median / max over the ranks of each figure, so 64 ranks still make one line (the per-rank
    figures go to metrics.jsonl). One rank: describe_io's line. No figures (a run resumed at its
    end trains no epoch): a line that says so, not an empty one."""
    if not any(all_stats):
        return (
            f"data I/O ({loader}): no epoch trained in this run (it resumed at the run's end); the "
            "earlier epochs' figures are in metrics.jsonl (io_stats)"
        )
    if len(all_stats) == 1:
        return f"data I/O ({loader}): {describe_io(all_stats[0])}"
    first = all_stats[0]
    if "sources" in first:  # a mix (MixedStore): one group of figures per source
        body = "; ".join(
            f"source {k}: {_over_ranks([st['sources'][k] for st in all_stats]) or 'no epoch yet'}"
            for k in range(len(first["sources"]))
        )
    else:
        body = _over_ranks(all_stats)
    where = f", epoch {first['epoch']}" if "epoch" in first else ""
    return (
        f"data I/O over {len(all_stats)} ranks ({loader}{where}), min / median / max per rank: {body} "
        f"(each rank's figures: metrics.jsonl, io_stats)"
    )


def _over_ranks(all_stats: list[dict]) -> str:
    """ "label min / median / max, ..." over the ranks' figures of one store (or reader)."""
    first = all_stats[0]
    figures = _STORE_FIGURES if "samples_local" in first else _READ_FIGURES if "samples_read" in first else ()
    parts = []
    for label, get, show in figures:
        try:
            values = sorted(get(st) for st in all_stats)
        except KeyError:
            continue
        if label in ("from storage", "population") and not values[-1]:
            continue  # nothing read from storage / no population in this epoch: not worth a column
        median = values[(len(values) - 1) // 2]  # the lower median: one rank's own figure
        parts.append(f"{label} {show(values[0])} / {show(median)} / {show(values[-1])}")
    return ", ".join(parts)
