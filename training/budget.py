"""One memory budget per rank for the whole trainer: its stores (training, held-out, LTFB's tournament
set) and its loaders' decoded batches share `--memory-budget`, instead of each store taking all of it.

The stores are built unpopulated, `share_budget` gives each a part (`DataStore.limit_memory`), and they
populate when entered. Where everything fits, each store gets what it needs to hold all its samples
plus a share of the slack in proportion; where not, each gets the buffers it cannot do without plus a
share of the rest in proportion to what it would still need, so the stores hold about the same
fraction of their samples resident and serve the rest from storage (`overflow="serve"`).
"""

from __future__ import annotations

from dstore.errors import MemoryBudgetError
from dstore.memory.capacity import LOADER_AHEAD, loader_reserve  # noqa: F401 - the trainer's, kept here by name
from dstore.memory.limits import default_budget, fmt_bytes
from dstore.runtime.collective import agree, topology
from dstore.store.data_store import DataStore


def share_budget(comm, stores, *, budget: int | None, reserve: int = 0) -> list[int] | None:
    """Collective over `comm`: divides this rank's budget (`budget`, else the store's default:
    $DSTORE_MEMORY_BUDGET or 70% of the node's available memory over its ranks) less `reserve`
    between the unpopulated DataStores among `stores` (None and other sources are skipped).
    Returns the budgets given (None when there is no store). Raises MemoryBudgetError on every
    rank if some rank's budget cannot hold even the stores' buffers."""
    stores = [s for s in stores if isinstance(s, DataStore)]
    if not stores:
        return None
    total, source = (
        (int(budget), "--memory-budget")
        if budget is not None
        else default_budget(topology(comm, emulate=True).local_size)
    )
    needs = [s.memory_needs() for s in stores]
    avail = total - int(reserve)
    exc = None
    floor = sum(least for _, least in needs)
    if avail < floor and sum(full for full, _ in needs) > avail:
        exc = MemoryBudgetError(
            f"rank {comm.Get_rank()}: the memory budget {fmt_bytes(total)} ({source}) less "
            f"{fmt_bytes(reserve)} for the loaders' batches leaves {fmt_bytes(avail)}, but the trainer's "
            f"{len(stores)} store(s) need {fmt_bytes(floor)} of buffers even with nothing resident; raise "
            f"--memory-budget or lower --batch-size/--prefetch"
        )
    agree(comm, exc)
    budgets = _divide(avail, needs)
    for store, b in zip(stores, budgets):
        store.limit_memory(
            b,
            f"its part, {fmt_bytes(b)}, of the trainer's {fmt_bytes(total)} ({source}) shared by "
            f"{len(stores)} store(s) and {fmt_bytes(reserve)} for the loaders' batches",
        )
    return budgets


def _divide(avail: int, needs: list[tuple[int, int]]) -> list[int]:
    """Each store's part of `avail`: its full need plus a proportional share of the slack when all
    fit, else its least need plus a share of the rest in proportion to what it still lacks."""
    full = sum(f for f, _ in needs)
    if full <= avail:
        return [f + (avail - full) * f // max(full, 1) for f, _ in needs]
    extra = [max(f - least, 0) for f, least in needs]
    rest = avail - sum(least for _, least in needs)
    return [min(f, least + rest * e // max(sum(extra), 1)) for (f, least), e in zip(needs, extra)]
