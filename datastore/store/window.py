"""The only module that touches `MPI.Win`: allocate an arena, read epochs, batched gets, free; and
the watchdog's liveness probe (`Probe`).

An `Arena` is one collective window of raw bytes per rank (`MPI.Win.Allocate`, which lets the
MPI library place it in shared memory), or one node-wide segment (`MPI.Win.Allocate_shared`) that
every rank of the node maps. Its lifetime is explicit: `free()` (collective) is safe to call twice,
and `reading()` wraps `Lock_all`/`Unlock_all` in try/finally.
"""

from __future__ import annotations

import contextlib
from typing import Any, cast

import numpy as np
from mpi4py import MPI

from dstore.errors import DStoreError
from dstore.runtime.progress import PROBE_TAG


def _bytes_of(mem) -> np.ndarray:
    """A uint8 array over an mpi4py buffer (a window's memory), no copy. (cast: mpi4py's stubs type
    its buffer with __buffer__, which numpy's stubs accept as a buffer on Python 3.12+ only.)"""
    return np.frombuffer(cast(Any, mem), dtype=np.uint8)


class Arena:
    """A window of `nbytes` bytes on each rank of `comm` (collective constructor).

    Args:
        comm: the communicator the window spans.
        nbytes: this rank's size in bytes (may be 0, and may differ between ranks).
        shared: allocate with `Win.Allocate_shared`; `comm` must then be a shared-memory (node)
            communicator, and `segment(r)` maps rank r's part directly.

    Attributes:
        local: uint8 array over this rank's own bytes (writable: this is where population writes).
    """

    def __init__(self, comm, nbytes: int, *, shared: bool = False):
        self.comm = comm
        self.rank = comm.Get_rank()
        self.shared = shared
        alloc = MPI.Win.Allocate_shared if shared else MPI.Win.Allocate
        self._win: MPI.Win | None = alloc(int(nbytes), 1, comm=comm)
        self.local = _bytes_of(self._win.tomemory()) if nbytes else np.zeros(0, np.uint8)
        self._reading = False

    @property
    def closed(self) -> bool:
        return self._win is None

    def live(self) -> MPI.Win:
        """The window, or ValueError once `free()` has freed it."""
        if self._win is None:
            raise ValueError("arena is freed")
        return self._win

    def segment(self, rank: int) -> np.ndarray:
        """Rank's bytes of a shared arena, mapped into this process (no copy)."""
        if not self.shared:
            raise TypeError("segment() needs an arena allocated with shared=True")
        buf, _ = self.live().Shared_query(rank)
        return _bytes_of(buf)

    def publish(self) -> None:
        """Makes this rank's local writes visible to the others, through gets and through mapped
        peers (`map_peers`): memory sync, a barrier, and a sync again so that this rank's loads see
        the others' writes (collective). Call after population and before anyone reads."""
        self._sync()
        self.comm.Barrier()
        self._sync()

    def sync(self) -> None:
        """Memory sync of this rank's window (not collective): its local writes made visible to the
        others, their writes to its loads; inside or outside a `reading()` epoch. Paired with a
        message between the ranks (dstore.store.stream's exchange), as `publish` pairs it with a barrier."""
        if self._reading:
            self.live().Sync()
        else:
            self._sync()

    def _sync(self) -> None:
        win = self.live()
        win.Lock_all(MPI.MODE_NOCHECK)
        try:
            win.Sync()
        finally:
            win.Unlock_all()

    def map_peers(self, ranks, nbytes) -> dict:
        """The windows of `ranks` (ranks of `comm` on this node), mapped into this process where the
        MPI library placed them in shared memory, so their bytes are read with no copy and no get.

        MPI 4 lets `Win_shared_query` ask this of a `Win.Allocate` window (MPICH places such a
        window in node shared memory). A rank the library cannot map (another node, a library
        without the feature, or a size that disagrees with `nbytes`) is left out, and its bytes
        come with gets as before. Not collective.

        Args:
            ranks: ranks of `comm` that share this rank's node.
            nbytes: every rank's window size in bytes, indexed by rank.

        Returns:
            {rank: uint8 array over that rank's window}; valid until `free()`.
        """
        out = {}
        win = self.live()
        for r in ranks:
            r = int(r)
            if r == self.rank:
                out[r] = self.local
                continue
            want = int(nbytes[r])
            if want == 0:
                out[r] = np.zeros(0, np.uint8)
                continue
            try:
                buf, _unit = win.Shared_query(r)
            except MPI.Exception:
                continue
            if buf is None:
                continue
            arr = _bytes_of(buf)
            if arr.size == want:
                out[r] = arr
        return out

    @contextlib.contextmanager
    def reading(self):
        """A passive-target read epoch on all ranks (`Lock_all` ... `Unlock_all`, always unlocked).

        Not collective: each rank opens and closes its own epoch.
        """
        win = self.live()
        win.Lock_all(MPI.MODE_NOCHECK)
        self._reading = True
        try:
            yield self
        finally:
            self._reading = False
            win.Unlock_all()

    def start_gets(self, buf: np.ndarray, owners, disps, lengths, bufstarts) -> list:
        """Starts one `Rget` per run: `lengths[i]` bytes of rank `owners[i]`'s window at `disps[i]`
        into `buf[bufstarts[i]:]`. Returns the requests (complete them with `wait`).

        Must be called inside `reading()`.
        """
        win = self.live()
        mv = buf.data  # memoryview(buf) (numpy's stubs give ndarray __buffer__ on Python 3.12+ only)
        byte = MPI.BYTE
        try:
            return [
                win.Rget(mv[b : b + n], o, (d, n, byte))
                for o, d, n, b in zip(owners.tolist(), disps.tolist(), lengths.tolist(), bufstarts.tolist())
            ]
        except MPI.Exception as exc:
            raise _comm_error(exc) from exc

    @staticmethod
    def wait(requests: list) -> None:
        """Completes requests from `start_gets`.

        Raises:
            CommError: a get failed (its owner's process ended or its connection broke).
        """
        if requests:
            try:
                MPI.Request.Waitall(requests)
            except MPI.Exception as exc:
                raise _comm_error(exc) from exc

    def free(self) -> None:
        """Frees the window (collective over `comm`). Safe to call twice."""
        win, self._win = self._win, None
        self.local = np.zeros(0, np.uint8)
        if win is not None:
            win.Free()


class Probe:
    """A window of 8 bytes per rank, read by one thread (dstore.runtime.watchdog) to learn whether
    other ranks still answer: a get is completed by the target's MPI progress engine alone (its
    progress thread, or any MPI call it is in), so an unanswered one means a dead or unreachable
    process, not a busy one. Collective constructor and `free()` (safe twice); the read epoch is
    open for the probe's whole life.
    """

    def __init__(self, comm):
        self.comm = comm
        self._win: MPI.Win | None = MPI.Win.Allocate(8, 1, comm=comm)
        self._win.Lock_all(MPI.MODE_NOCHECK)
        self._kept: list = []  # buffers of gets never answered: MPI may still write into them

    def silent(self, ranks, timeout: float, pause: float = 0.01) -> list[int]:
        """The ranks of `ranks` whose 1-byte get is not answered within `timeout` seconds (not
        collective; from any one thread at a time)."""
        import time

        win = self._win
        if win is None:
            raise ValueError("probe is freed")
        ranks = [int(r) for r in ranks]
        bufs = [np.zeros(1, np.uint8) for _ in ranks]
        reqs = [win.Rget(b, r, (0, 1, MPI.BYTE)) for b, r in zip(bufs, ranks)]
        done = [False] * len(reqs)
        end = time.monotonic() + timeout
        while True:
            for i, req in enumerate(reqs):
                if not done[i]:
                    done[i] = bool(req.Test())
            if all(done) or time.monotonic() > end:
                break
            time.sleep(pause)
        self._kept.extend(b for b, d in zip(bufs, done) if not d)
        return [r for r, d in zip(ranks, done) if not d]

    def progress(self) -> None:
        """One call into MPI's progress engine (not collective): this rank answers the others' probes
        (and gets from its windows) while its own thread computes or reads without calling MPI."""
        self.comm.Iprobe(MPI.ANY_SOURCE, PROBE_TAG)

    def free(self) -> None:
        """Ends the read epoch and frees the window (collective over `comm`). Safe to call twice."""
        win, self._win = self._win, None
        if win is not None:
            win.Unlock_all()
            win.Free()


class CommError(DStoreError, ConnectionError):
    """An MPI call on another rank's window failed (its process ended, its connection broke)."""


def _comm_error(exc: MPI.Exception) -> CommError:
    """Our error for MPI's: the last line of its error stack, which says what broke."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    return CommError(lines[-1] if lines else str(exc))


def allreduce_min(comm, value):
    """The minimum of `value` over `comm` (a small helper so the store reads without MPI names)."""
    return comm.allreduce(value, op=MPI.MIN)
