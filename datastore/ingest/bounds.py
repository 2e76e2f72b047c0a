"""What an ingest holds in memory, checked against the node's before any sample is read.

`dstore ingest imgs r.h5 --resize 100000x100000` grew to 23 GB and was ended by the kernel's OOM
killer (leaving a temporary and a lock file): nothing bounded a decoded sample. A group's writer
holds two rounds of its members' chunks (the one being written and the one received) and its own
chunk being processed; every other rank its chunk and the one it sends. The estimate below counts
those (a chunk is at least one sample) for the ranks of the most loaded node.
"""

from __future__ import annotations

from dstore.errors import MemoryBudgetError
from dstore.ingest import plan
from dstore.memory.limits import available_memory, fmt_bytes


def ingest_need(*, sample_bytes: int, positions: int, ranks: int, shards: int, ranks_on_node: int) -> tuple[int, int]:
    """(bytes a node holds at most, samples a writing rank holds) for an ingest of `positions`
    samples per shard (the largest shard) of `sample_bytes` each, by `ranks` ranks into `shards`
    shards, `ranks_on_node` of them on the node."""
    groups = plan.num_groups(ranks, shards)
    members = -(-ranks // groups)
    chunk = plan.group_chunk(max(positions, 1), members, sample_bytes)
    writer, other = (2 * members + 3) * chunk, 3 * chunk
    writers = min(groups, ranks_on_node)
    return (writers * writer + (ranks_on_node - writers) * other) * sample_bytes, writer


def check_ingest_memory(
    *, sample_bytes: int, positions: int, ranks: int, shards: int, ranks_on_node: int, what: str
) -> MemoryBudgetError | None:
    """The error (not raised: the caller agrees on it over the job) if the ingest would hold more
    than the node has available, else None. `what` names the stored sample (e.g. `--resize 10x10`:
    a decoded 10x10x3 uint8 image)."""
    need, held = ingest_need(
        sample_bytes=sample_bytes, positions=positions, ranks=ranks, shards=shards, ranks_on_node=ranks_on_node
    )
    avail, where = available_memory()
    if need <= avail:
        return None
    return MemoryBudgetError(
        f"{what} is {fmt_bytes(sample_bytes)} per sample, and this ingest would hold about {fmt_bytes(need)} on a "
        f"node ({held} samples on a writing rank, {ranks_on_node} rank(s) on the node), more than the node's "
        f"available memory ({where}); store smaller samples (a smaller --resize) or run fewer ranks per node"
    )
