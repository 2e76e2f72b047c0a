"""Pure arithmetic of a parallel ingest: the write order, shard ranges, which ranks write which
shards, and which rank processes which chunk in which round. No MPI here.

The scheme:
- `order[p]` is the source index written at position p (a seeded permutation, or the identity).
- Shard s holds positions `shard_bounds[s]:shard_bounds[s+1]` (balanced by count); one output file
  is one shard.
- Ranks form `min(shards, ranks)` groups, rank r in group r % groups; group g writes the shards s
  with s % groups == g, one after another. So shards a multiple of the ranks means each rank writes
  shards/ranks files alone (no traffic); shards a divisor of the ranks means ranks/shards ranks per
  shard; one shard means every rank feeds rank 0. Other counts work too, less evenly.
- Within a group of m ranks writing positions [lo, hi): chunks of `chunk` positions; in round t,
  group member k processes chunk t*m + k; the group's first rank writes the round's chunks in order.
"""

from __future__ import annotations

import numpy as np

from dstore.errors import ConfigError


def sample_order(num_samples: int, seed: int, keep_order: bool = False) -> np.ndarray:
    """int64[num_samples]: the source index written at each position."""
    if num_samples < 0:
        raise ConfigError(f"num_samples={num_samples} must be non-negative")
    if keep_order:
        return np.arange(num_samples, dtype=np.int64)
    return np.random.default_rng(int(seed)).permutation(num_samples).astype(np.int64)


def stratified_order(labels, seed: int) -> np.ndarray:
    """int64[N]: a seeded random order in which every class is spread evenly, so any contiguous
    block, in particular any tail a trainer holds out, holds each class within about one sample
    (at most two) of its share of the block.

    Class c's n_c samples are shuffled and the k-th gets the key (k + u) / n_c with u uniform in
    [0, 1); the order sorts all samples by key (ties broken by a seeded permutation). The keys of
    class c below any threshold t number floor(t n_c) or one more, whence the bound.
    """
    labels = np.asarray(labels, dtype=np.int64)
    rng = np.random.default_rng([int(seed), 1])  # not sample_order's stream: another permutation
    keys = np.empty(labels.size, dtype=np.float64)
    for c in np.unique(labels):
        ids = np.flatnonzero(labels == c)
        ids = ids[rng.permutation(ids.size)]
        keys[ids] = (np.arange(ids.size) + rng.random(ids.size)) / ids.size
    tie = rng.permutation(labels.size)
    return np.lexsort((tie, keys)).astype(np.int64)


def write_order(num_samples: int, seed: int, *, keep_order: bool = False, label=None) -> tuple[np.ndarray, str]:
    """(the write order, its `ingest_order` name): the source order, a stratified order over the
    labels `label(i)` gives (when `label` is given), or a seeded permutation.

    Raises:
        ConfigError: both keep_order and label (stratify) are asked for.
    """
    if keep_order and label is not None:
        raise ConfigError("stratify=True (--stratify) and keep_order=True (--keep-order) exclude each other")
    if label is not None:
        return stratified_order([label(i) for i in range(num_samples)], seed), "stratified"
    return sample_order(num_samples, seed, keep_order), "source" if keep_order else "seeded"


def shard_bounds(num_samples: int, shards: int) -> np.ndarray:
    """int64[shards+1]: shard s holds positions [b[s], b[s+1]); sizes differ by at most one."""
    if shards < 1:
        raise ConfigError(f"shards={shards} must be at least 1")
    if shards > max(num_samples, 1):
        raise ConfigError(f"shards={shards} is more than the {num_samples} samples to write")
    return (np.arange(shards + 1, dtype=np.int64) * num_samples) // shards


def num_groups(ranks: int, shards: int) -> int:
    """How many writer groups `ranks` ranks form for `shards` shards."""
    if ranks < 1 or shards < 1:
        raise ConfigError(f"ranks={ranks} and shards={shards} must be at least 1")
    return min(ranks, shards)


def group_of(rank: int, ranks: int, shards: int) -> int:
    """The group rank `rank` belongs to."""
    return rank % num_groups(ranks, shards)


def shards_of_group(group: int, ranks: int, shards: int) -> list[int]:
    """The shards group `group` writes, in order."""
    return list(range(group, shards, num_groups(ranks, shards)))


def chunk_bounds(lo: int, hi: int, chunk: int) -> list[tuple[int, int]]:
    """[lo, hi) cut into consecutive chunks of `chunk` positions (the last may be shorter)."""
    if chunk < 1:
        raise ConfigError(f"chunk={chunk} must be at least 1")
    return [(a, min(a + chunk, hi)) for a in range(lo, hi, chunk)]


def rounds(chunks: list[tuple[int, int]], members: int) -> list[list[tuple[int, int]]]:
    """chunks dealt to `members` ranks: rounds[t][k] is member k's chunk in round t ((a, a) if none)."""
    if members < 1:
        raise ConfigError(f"members={members} must be at least 1")
    out = []
    for t in range(0, len(chunks), members):
        part = chunks[t : t + members]
        end = part[-1][1]
        out.append(part + [(end, end)] * (members - len(part)))
    return out


def chunk_size(sample_bytes: int, *, target_bytes: int = 8 << 20, low: int = 16, high: int = 4096) -> int:
    """Samples per chunk so that a chunk is about `target_bytes` (within [low, high] samples)."""
    return int(min(high, max(low, target_bytes // max(1, int(sample_bytes)))))


def group_chunk(positions: int, members: int, sample_bytes: int, *, round_bytes: int = 256 << 20) -> int:
    """Samples per chunk for a group of `members` ranks writing `positions` samples: about 8 MB
    (less for large groups, so a round the writer holds stays under `round_bytes`), and small
    enough that every member gets at least about four chunks (load balance on small data sets)."""
    target = max(1 << 20, min(8 << 20, round_bytes // max(1, members)))
    by_bytes = chunk_size(sample_bytes, target_bytes=target)
    return max(1, min(by_bytes, -(-positions // (4 * max(1, members)))))


def parse_resize(value) -> tuple[int, int] | None:
    """`"HxW"`, `"S"` (square), an int or an (H, W) pair -> (H, W); None stays None.

    Raises:
        ConfigError: naming the value, if it is not of those forms or not positive.
    """
    if value is None:
        return None
    try:
        if isinstance(value, str):
            parts = value.lower().split("x")
            if len(parts) not in (1, 2):
                raise ValueError(value)
            hw = tuple(int(p) for p in parts)
        elif isinstance(value, int):
            hw = (value,)
        else:
            hw = tuple(int(v) for v in value)
        if len(hw) == 1:
            hw = hw * 2
        if len(hw) != 2 or min(hw) < 1:
            raise ValueError(value)
    except (TypeError, ValueError):
        raise ConfigError(f"resize={value!r} is not HxW (e.g. 224x224) with positive sides") from None
    return hw
