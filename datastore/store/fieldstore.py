"""The extra fields a DataStore holds and serves with its samples (`DataStore(fields=[...])`): each
rank's block of every asked-for field in a window of its own, a batch's values fetched from their
owners' windows with one-sided gets, as the samples are.

Why a window of their own, not appended to each sample's record: a sample's bytes are checked
against the container's checksums and served as views of the window that holds them, cut at the
container's offsets; fields appended to the records would change every offset, every checksum and
every read of the population, the stream and the storage tier. Held apart, the image path is the
one it was (a store without fields allocates nothing here and does nothing per step), and a
field value, being small (a caption, a JSON record of boxes: ~100 bytes against ~100 KB of image),
is always resident: it is read once at the population, whatever the images' population (preload,
dynamic, stream, replicated or tiered over budget), and counted in the memory budget
(dstore.memory.budget, `StorePlan.field_bytes`).

Layout: the fields' owners are the store's blocks (`StorePlan.bounds`: rank r holds samples
[bounds[r], bounds[r+1]) of every field), whatever the images' layout; rank r's window holds its
block's values of the first field back to back, then the second's, and so on. Each field's offsets
over the served samples (int64[N+1], from 0) are kept once per node in shared memory (as the
samples' index, dstore.store.index), so a rank finds any value's owner and displacement with no
communication: O(N) per node, not per rank.

Integrity: each rank reads its block of each field with one range read, checks every value
against the container's field checksums and the offsets against the node's copy before anything
is served; a mismatch is a ChecksumError naming the container, the sample and the field, raised on
every rank (dstore.runtime.collective.agree). Values are served as bytes (copies: they are small, and
outlive the batch), in the batch's order.
"""

from __future__ import annotations

import contextlib
import zlib
from typing import TYPE_CHECKING

import numpy as np

from dstore.errors import ChecksumError, ConfigError, ContainerChangedError
from dstore.order import plan
from dstore.runtime.collective import agree, node_comm
from dstore.store.window import Arena

if TYPE_CHECKING:
    from dstore.store.storeplan import StorePlan


def check_names(reader, names) -> tuple[str, ...]:
    """`names` as asked of a store over `reader`: ConfigError naming the fields it lacks."""
    names = tuple(names)
    missing = [n for n in names if n not in reader.field_names]
    if missing:
        raise ConfigError(
            f"fields={list(names)}: {reader.path} has no field(s) {missing} "
            f"(its fields: {list(reader.field_names) or 'none'})"
        )
    return names


def block_bytes(offsets: np.ndarray, bounds: np.ndarray) -> np.ndarray:
    """int64[F, P]: each rank's bytes of each field (`offsets` int64[F, N+1]) over blocks `bounds`."""
    return offsets[:, bounds[1:]] - offsets[:, bounds[:-1]]


def step_bytes(offsets: np.ndarray, per_step: int) -> int:
    """An upper bound on one step's field bytes: the `per_step` largest values of each field."""
    return sum(plan.largest_sum(offsets[f], per_step) for f in range(offsets.shape[0]))


def window_place(offsets: np.ndarray, bounds: np.ndarray, ids: np.ndarray) -> tuple[np.ndarray, ...]:
    """Where each field value of samples `ids` lives (pure): (owner, displacement in the owner's
    window, length), each int64[F * b], field by field, the order `fetch` returns them in."""
    owner = np.searchsorted(bounds, ids, side="right") - 1
    per = block_bytes(offsets, bounds)
    base = np.zeros_like(per)
    base[1:] = np.cumsum(per[:-1], axis=0)  # field f starts after the rank's block of fields < f
    first = bounds[owner]
    owners, disps, lens = [], [], []
    for f in range(offsets.shape[0]):
        start = offsets[f, ids]
        owners.append(owner)
        disps.append(base[f, owner] + start - offsets[f, first])
        lens.append(offsets[f, ids + 1] - start)
    return np.concatenate(owners), np.concatenate(disps), np.concatenate(lens)


class ServedFields:
    """The fields `names` of a store's served samples [start, stop): their offsets once per node
    (collective constructor over `comm`, agreed), then (`populate`) each rank's block in a window.

    Args:
        comm: the store's communicator; reader: its ContainerReader.
        start, stop: the served samples; names: the fields (checked: `check_names`).

    Attributes:
        names: the fields, in the order asked; offsets: int64[F, N+1], read-only, node shared;
        missing: bool[F, N], True where a served sample has no value (served as None), node shared.
    """

    def __init__(self, comm, reader, start: int, stop: int, names):
        self.names = tuple(names)
        self.path = str(getattr(reader, "path", "the container"))
        self.start = int(start)
        self._node = node_comm(comm)
        self._index: Arena | None = None
        self.arena: Arena | None = None
        self.segs: dict = {}
        self._bounds = np.zeros(2, np.int64)
        self._buf = np.zeros(0, np.uint8)
        n, f = int(stop) - int(start), len(self.names)
        leader = self._node.Get_rank() == 0
        exc = None
        try:
            self._index = Arena(self._node, 8 * f * (n + 1) + f * n if leader else 0, shared=True)
            if leader:
                out = self._index.local[: 8 * f * (n + 1)].view(np.int64).reshape(f, n + 1)
                gone = self._index.local[8 * f * (n + 1) :].reshape(f, n)
                for k, name in enumerate(self.names):
                    out[k] = reader.field_block(name, int(start), int(stop), data=False)[0]
                    gone[k] = reader.field_missing(name, int(start), int(stop))
        except Exception as e:  # noqa: BLE001 - every rank must learn of it, or they would wait forever
            exc = e
        try:
            agree(comm, exc)
        except BaseException:
            self.free()
            raise
        index = self._index
        assert index is not None  # agreed: every rank's Arena() succeeded
        index.publish()
        whole = index.segment(0)
        offsets = whole[: 8 * f * (n + 1)].view(np.int64).reshape(f, n + 1)
        offsets.flags.writeable = False
        self.offsets = offsets
        missing = whole[8 * f * (n + 1) : 8 * f * (n + 1) + f * n].reshape(f, n).view(bool)
        missing.flags.writeable = False
        self.missing = missing

    def window_bytes(self, bounds: np.ndarray, rank: int) -> int:
        """Bytes of rank's window (its block of every field)."""
        return int(block_bytes(self.offsets, bounds)[:, rank].sum())

    def budget_bytes(self, p: StorePlan) -> int:
        """What the fields cost rank `p.rank` of store plan `p`: its window and a step's buffer (the
        largest values a step can take, counted as dstore.memory.budget.step_bound counts a step's samples)."""
        per_step = -(-p.batch_size // p.size)
        block = p.order_policy.largest_block(p.bounds)
        if block is not None:
            per_step = max(per_step, -(-block // p.steps_per_epoch))
        return self.window_bytes(p.bounds, p.rank) + step_bytes(self.offsets, min(per_step + 1, p.num_samples))

    def populate(self, comm, reader, bounds: np.ndarray, rank: int, node_views: bool) -> int:
        """Collective over `comm`: allocates this rank's window, reads its block of each field from
        `reader` (one range read each) and checks it (module docstring), agrees, publishes, and
        maps the node peers' windows where `node_views`. Returns the bytes read."""
        self._bounds = bounds = np.asarray(bounds, dtype=np.int64)
        lo, hi = int(bounds[rank]), int(bounds[rank + 1])
        exc, nbytes = None, 0
        try:
            self.arena = Arena(comm, self.window_bytes(bounds, rank))
        except Exception as e:  # noqa: BLE001 - as in __init__
            exc = e
        try:
            agree(comm, exc)
        except BaseException:
            self.arena = None  # a rank whose allocation failed has none: a collective free would not match
            raise
        arena = self.arena
        assert arena is not None
        try:
            at = 0
            for k, name in enumerate(self.names):
                off, raw, crcs = reader.field_block(name, self.start + lo, self.start + hi)
                self._check(reader, name, lo, off, raw, crcs, self.offsets[k, lo : hi + 1])
                arena.local[at : at + raw.size] = raw
                at += raw.size
            nbytes = at
        except Exception as e:  # noqa: BLE001 - as in __init__
            exc = e
        try:
            agree(comm, exc)
        except BaseException:
            self.free_windows()
            raise
        arena.publish()
        peers = [rank]
        if node_views:
            node = node_comm(comm, emulate=True)
            try:
                peers = node.allgather(rank)
            finally:
                node.Free()
        self.segs = {
            r: a
            for r, a in arena.map_peers(peers, [self.window_bytes(bounds, r) for r in range(comm.Get_size())]).items()
        }
        return nbytes

    def _check(self, reader, name: str, lo: int, off, raw, crcs, node_off) -> None:
        """ChecksumError naming the sample and the field whose bytes differ from their checksum;
        ContainerChangedError where the block's offsets are not the node's (the file changed)."""
        rel = np.asarray(node_off) - int(node_off[0])
        if not np.array_equal(off, rel):
            raise ContainerChangedError(
                f"{self.path}: field {name!r}: the offsets of samples [{self.start + lo}, "
                f"{self.start + lo + rel.size - 1}] changed since the store opened it; a "
                "container must not be rewritten while a job reads it"
            )
        view = memoryview(raw)
        bad = [i for i in range(crcs.size) if zlib.crc32(view[int(off[i]) : int(off[i + 1])]) != int(crcs[i])]
        if bad:
            i = self.start + lo + bad[0]
            try:
                who = f" ({reader.name(i)})"
            except Exception:  # noqa: BLE001 - the name only decorates the message
                who = ""
            more = f" and {len(bad) - 1} more" if len(bad) > 1 else ""
            raise ChecksumError(
                f"{self.path}: sample {i}{who}{more}: field {name!r} does not match its checksum "
                "(damaged); run `dstore verify` on the container",
                [self.start + lo + b for b in bad],
            )

    @contextlib.contextmanager
    def reading(self):
        """The window's read epoch (Lock_all ... Unlock_all), for `fetch`; not collective."""
        if self.arena is None:
            raise ValueError("the store's fields are not populated")
        with self.arena.reading():
            yield self

    def fetch(self, ids: np.ndarray, rank: int) -> dict[str, list[bytes | None]]:
        """{field: [value of each served sample id, as bytes; None where it has none]}, from the
        owners' windows (in place where this rank maps them, else one get per run of adjacent
        values). Inside `reading()`."""
        arena = self.arena
        if arena is None:
            raise ValueError("the store's fields are not populated")
        ids = np.asarray(ids, dtype=np.int64)
        owner, disp, length = window_place(self.offsets, self._bounds, ids)
        mapped = np.zeros(self._bounds.size - 1, dtype=bool)
        mapped[list(self.segs)] = True
        f = plan.plan_fetch(owner, disp, length, rank, mapped)
        if self._buf.size < f.remote_bytes:
            self._buf = np.empty(f.remote_bytes, np.uint8)
        if f.run_len.size:
            arena.wait(arena.start_gets(self._buf, f.run_owner, f.run_disp, f.run_len, f.run_buf))
        buf, segs = self._buf, self.segs
        vals = [
            bytes((segs[o] if loc else buf)[a : a + n])
            for loc, o, a, n in zip(f.local.tolist(), owner.tolist(), f.start.tolist(), f.length.tolist())
        ]
        b = ids.size
        out: dict[str, list[bytes | None]] = {}
        for k, name in enumerate(self.names):
            got: list[bytes | None] = list(vals[k * b : (k + 1) * b])
            for j in np.flatnonzero(self.missing[k, ids]).tolist():
                got[j] = None
            out[name] = got
        return out

    def free_windows(self) -> None:
        """Collective: frees this rank's field window (safe twice)."""
        self.segs = {}
        arena, self.arena = self.arena, None
        if arena is not None:
            arena.free()

    def free(self) -> None:
        """Collective: the field windows, then the node's offsets (safe twice)."""
        self.free_windows()
        index, self._index = self._index, None
        node, self._node = self._node, None
        if index is not None:
            index.free()
        if node is not None:
            node.Free()

    def abandon(self) -> None:
        """Local: drops the windows unfreed (after an error another rank may not share)."""
        self.arena = self._index = self._node = None
        self.segs = {}
