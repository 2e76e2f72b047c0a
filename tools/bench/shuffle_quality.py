"""How well a loader mixes classes, from the labels it delivered: pure functions, no I/O.

A global batch is step s of every rank together (what one optimizer step averages over in
data-parallel training). For a well shuffled epoch of C equally frequent classes a batch of B
holds about C * (1 - (1 - 1/C)^B) distinct classes, almost never one class over half the batch,
and consecutive batches' class counts are uncorrelated.
"""

from __future__ import annotations

import numpy as np


def global_batches(per_rank: list[list[np.ndarray]]) -> list[np.ndarray]:
    """Step s of every rank, concatenated, for the steps every rank delivered."""
    steps = min((len(b) for b in per_rank), default=0)
    return [np.concatenate([b[s] for b in per_rank]) for s in range(steps)]


def quality(batches: list[np.ndarray], num_classes: int) -> dict:
    """{distinct: mean distinct classes per batch, majority: share of batches with one class over
    half, correlation: mean Pearson r of consecutive batches' class counts, batches, batch_size}."""
    batches = [np.asarray(b, dtype=np.int64) for b in batches if len(b)]
    if not batches:
        return {"distinct": None, "majority": None, "correlation": None, "batches": 0, "batch_size": 0}
    counts = np.stack([np.bincount(b, minlength=num_classes)[:num_classes] for b in batches])
    sizes = np.array([b.size for b in batches])
    rs = []
    for a, b in zip(counts[:-1], counts[1:]):
        if a.std() > 0 and b.std() > 0:
            rs.append(float(np.corrcoef(a, b)[0, 1]))
    return {
        "distinct": float((counts > 0).sum(axis=1).mean()),
        "majority": float((counts.max(axis=1) * 2 > sizes).mean()),
        "correlation": float(np.mean(rs)) if rs else None,
        "batches": len(batches),
        "batch_size": int(np.median(sizes)),
    }


def ideal_distinct(num_classes: int, batch: int) -> float:
    """Expected distinct classes in a uniformly random batch of `batch` from `num_classes` equal classes."""
    return num_classes * (1.0 - (1.0 - 1.0 / num_classes) ** batch)
