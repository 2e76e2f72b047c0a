"""The memory budget: how much a rank may hold, and the error that says how many ranks would fit."""

from __future__ import annotations

import os

import numpy as np

from dstore.order.plan import block_bounds
from dstore.runtime import rc
from dstore.runtime.units import fmt_size, parse_size

ENV_VAR = rc.MEMORY_BUDGET.name
"""Environment variable that overrides the default per-rank budget (bytes, or e.g. `8G`, `512MiB`)."""

SAFE_FRACTION = 0.7
"""Share of the node's MemAvailable the ranks of a node may fill together by default."""


def parse_bytes(text, what: str = "memory_budget") -> int:
    """`text` (an int, or a string like `8G`, `1.5GiB`, `500MB`) as a number of bytes (dstore.runtime.units)."""
    return parse_size(text, what)


def mem_available(meminfo: str = "/proc/meminfo") -> int:
    """The node's MemAvailable in bytes (0 if it cannot be read)."""
    try:
        with open(meminfo) as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


CGROUP_ROOT = "/sys/fs/cgroup"
PROC_CGROUP = "/proc/self/cgroup"
_UNLIMITED = 1 << 60  # cgroup v1 writes "no limit" as a page-rounded 2**63 - 1


def _read_int(path: str):
    try:
        with open(path) as f:
            text = f.read().strip()
    except OSError:
        return None
    if text == "max":
        return _UNLIMITED
    try:
        return int(text)
    except ValueError:
        return None


def _inactive_file(stat_path: str, key: str) -> int:
    try:
        with open(stat_path) as f:
            for line in f:
                name, _, value = line.partition(" ")
                if name == key:
                    return int(value)
    except (OSError, ValueError):
        pass
    return 0


def cgroup_headroom(proc_cgroup: str | None = None, root: str | None = None) -> tuple[int, str] | None:
    """(bytes, which cgroup) this process's memory cgroups still allow, or None if none sets a limit.

    A batch system's memory cap (Slurm `--mem`, a container's limit) is a cgroup limit, v2
    (`memory.max`, `memory.current`) or v1 (`memory.limit_in_bytes`, `memory.usage_in_bytes`),
    set on the job's cgroup or an ancestor: every level from this process's cgroup up to the root
    is read and the tightest kept. Reclaimable page cache (inactive files) counts as free.
    """
    proc_cgroup, root = proc_cgroup or PROC_CGROUP, root or CGROUP_ROOT
    try:
        with open(proc_cgroup) as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    candidates = []  # (dir, limit file, usage file, stat key)
    for line in lines:
        _, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        if controllers == "" and os.path.isfile(os.path.join(root, "cgroup.controllers")):
            base, files = root, ("memory.max", "memory.current", "inactive_file")
        elif "memory" in controllers.split(","):
            base, files = (
                os.path.join(root, "memory"),
                ("memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file"),
            )
        else:
            continue
        parts = [p for p in path.split("/") if p]
        # From this process's cgroup up to the hierarchy's root (inside a container the mount's
        # root is the process's own cgroup, and the path as listed may not exist under it).
        for k in range(len(parts), -1, -1):
            candidates.append((os.path.join(base, *parts[:k]), *files))
    best = None
    for d, limit_file, usage_file, key in candidates:
        limit = _read_int(os.path.join(d, limit_file))
        if limit is None or limit >= _UNLIMITED:
            continue
        usage = _read_int(os.path.join(d, usage_file)) or 0
        free = max(0, limit - usage + _inactive_file(os.path.join(d, "memory.stat"), key))
        if best is None or free < best[0]:
            best = (free, f"cgroup {d} limit {fmt_bytes(limit)}")
    return best


def available_memory() -> tuple[int, str]:
    """(bytes, what they are): what the node has available (MemAvailable, or less if a memory
    cgroup such as a Slurm --mem cap allows less), for bounds checked before work starts."""
    avail = mem_available()
    what = f"MemAvailable {fmt_bytes(avail)}"
    cg = cgroup_headroom()
    if cg is not None and cg[0] < avail:
        avail, what = cg[0], f"{fmt_bytes(cg[0])} left under {cg[1]}"
    return avail, what


def default_budget(ranks_on_node: int) -> tuple[int, str]:
    """(bytes, where it came from): the env var if set, else SAFE_FRACTION of what the node has
    available (MemAvailable, or less if a memory cgroup such as a Slurm --mem cap allows less)
    shared by the node's ranks."""
    env = rc.MEMORY_BUDGET.raw()
    if env is not None:
        return rc.MEMORY_BUDGET.get(), f"${ENV_VAR}={env}"
    avail, what = available_memory()
    return int(avail * SAFE_FRACTION) // max(ranks_on_node, 1), (
        f"default: {SAFE_FRACTION:.0%} of {what} over {ranks_on_node} rank(s) on the node"
    )


fmt_bytes = fmt_size  # the one formatter (dstore.runtime.units): SI, three significant digits


def ranks_needed(offsets: np.ndarray, budget_for_data: int, start: int, limit: int = 1 << 20):
    """The fewest ranks (>= start) whose byte-balanced blocks each fit `budget_for_data`, or None."""
    offsets = np.asarray(offsets, dtype=np.int64)
    sizes = np.diff(offsets)
    if budget_for_data <= 0 or (sizes.size and sizes.max() > budget_for_data):
        return None
    n = max(start, -(-int(offsets[-1]) // budget_for_data))
    for _ in range(64):
        if n > limit:
            return None
        b = block_bounds(offsets, n)
        if int(np.diff(offsets[b]).max(initial=0)) <= budget_for_data:
            return n
        n += max(1, n // 16)
    return None


def budget_message(
    *,
    worst_rank: int,
    need: int,
    data_part: int,
    budget: int,
    source: str,
    total: int,
    nranks: int,
    ranks_per_node: int,
    fitting_ranks,
    what: str,
    replicate: bool = False,
) -> str:
    """The MemoryBudgetError text: what is needed, the budget, and how many ranks/nodes would fit."""
    holder = "the node" if replicate else f"rank {worst_rank}"
    msg = (
        f"{what}: {holder} needs {fmt_bytes(need)} ({fmt_bytes(data_part)} of data, the rest receive "
        f"buffers) but its memory budget is {fmt_bytes(budget)} ({source}); the data set is "
        f"{fmt_bytes(total)} over {nranks} rank(s). "
    )
    if replicate:
        msg += (
            f"A full copy per node needs {fmt_bytes(total)} per node: use replicate=False (each rank "
            f"holds 1/{nranks} of it), nodes with more memory, or raise memory_budget / ${ENV_VAR}."
        )
    elif fitting_ranks is None:
        msg += (
            "No number of ranks fits this budget (one sample, or the receive buffers for one batch, "
            f"are larger than it); raise memory_budget / ${ENV_VAR} or lower batch_size/prefetch."
        )
    else:
        nodes = -(-fitting_ranks // max(ranks_per_node, 1))
        msg += (
            f"It would fit on at least {fitting_ranks} ranks, i.e. {nodes} node(s) at "
            f"{ranks_per_node} rank(s) per node; or raise memory_budget / ${ENV_VAR}."
        )
    return msg


def budget_error(rows, *, offsets: np.ndarray, bufs: int, replicate: bool):
    """The MemoryBudgetError message for gathered per-rank rows, or None if every rank fits.

    Args:
        rows: one (need, data, budget, source, ranks_on_node) per rank, in rank order.
        offsets: the served samples' offsets (for how many ranks would fit).
        bufs: receive-buffer bytes included in each `need`.
        replicate: rows describe node copies (rank 0 of each node holds the data).
    """
    bad = [(need / max(cap, 1), r) for r, (need, _, cap, _, _) in enumerate(rows) if need > cap]
    if not bad:
        return None
    _, worst = max(bad)
    need, data, cap, source, per_node = rows[worst]
    what = (
        "replicate=True: one full copy per node does not fit the node's pooled budget"
        if replicate
        else "the data store does not fit its memory budget"
    )
    fitting = None if replicate else ranks_needed(offsets, cap - bufs, len(rows) + 1)
    return budget_message(
        worst_rank=worst,
        need=need,
        data_part=data,
        budget=cap,
        source=source,
        total=int(offsets[-1]),
        nranks=len(rows),
        ranks_per_node=per_node,
        fitting_ranks=fitting,
        what=what,
        replicate=replicate,
    )
