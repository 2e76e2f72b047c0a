"""Sizes a user types, checked against the node's memory before any store is built or sample read.

`--memory-budget` is trusted by the stores (it is the user's word for what a rank may hold), so a
budget past what the node has would end in the kernel's OOM killer mid-population; and the
loaders' decoded batches (`--batch-size` x `--image-size` x their read-ahead, plus the decode
threads' images) are not bounded by any budget. Both are refused here, on every rank, naming the
flags.
"""

from __future__ import annotations

from dstore.errors import MemoryBudgetError
from dstore.memory.limits import available_memory, fmt_bytes
from dstore.runtime.collective import agree, topology


def memory_bound_error(
    cfg, *, reserve: int, ranks_on_node: int, available: tuple[int, str]
) -> MemoryBudgetError | None:
    """The error for this rank (not raised), or None: `cfg.memory_budget` per rank, or the loaders'
    `reserve` (dstore.training.budget.loader_reserve), times the node's ranks past what the node has
    `available` ((bytes, what they are))."""
    avail, where = available
    share = avail // max(ranks_on_node, 1)
    if cfg.memory_budget is not None and cfg.memory_budget > share:
        return MemoryBudgetError(
            f"--memory-budget {fmt_bytes(cfg.memory_budget)} per rank x {ranks_on_node} rank(s) on the node is more "
            f"than the node's available memory ({where}); give at most {fmt_bytes(share)}"
        )
    if reserve > share:
        size = "x".join(map(str, cfg.image_size)) if cfg.image_size else "the model's"
        return MemoryBudgetError(
            f"the loaders' decoded batches would take {fmt_bytes(reserve)} per rank (--batch-size {cfg.batch_size}, "
            f"--image-size {size}, --decode-threads {cfg.decode_threads}), x {ranks_on_node} rank(s) on the node more "
            f"than its available memory ({where}); lower --batch-size or --image-size"
        )
    return None


def check_memory_bounds(comm, cfg, reserve: int) -> None:
    """Collective over `comm`: every rank raises MemoryBudgetError if some rank's memory_bound_error
    is not None."""
    exc = memory_bound_error(
        cfg, reserve=reserve, ranks_on_node=topology(comm, emulate=True).local_size, available=available_memory()
    )
    agree(comm, exc)
