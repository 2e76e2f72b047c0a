"""The storage tier's reader: byte ranges of a container read in a thread pool, ahead of need.

Each worker thread opens its own reader of the container (file descriptors and chunk-file caches
are not shared between threads), unless the job's own reader may be shared (its
`concurrent_reads`: positioned reads of one descriptor; opening the container again costs storage
requests, three per thread on HDF5), and the backends read with `os.preadv`, which releases the GIL,
so reads overlap each other, decoding and the training step. The store submits a step's coalesced
runs (dstore.order.tiers.plan_storage) a bounded number of steps ahead and waits for them when the
step is consumed. Every read is counted, and the byte ranges read in the current epoch are kept so
that a test can check that no byte was read twice.
"""

from __future__ import annotations

import collections
import concurrent.futures
import functools
import itertools
import threading

import numpy as np

from dstore.errors import ContainerChangedError
from dstore.formats import open_container
from dstore.formats.base import identities_differ
from dstore.order import tiers


class StorageReader:
    """Reads byte ranges of `path`'s data in `threads` threads.

    Args:
        path: the container (anything dstore.formats.open_container opens).
        threads: worker threads (>= 1).
        identity: the container's identity when the job opened it (ContainerReader.opened_identity):
            a thread whose reader opens other files fails with ContainerChangedError instead of
            reading them. None: not checked.
        shared: the job's open reader of `path`: every thread reads with it where its
            `concurrent_reads` allows (the very files the job opened; never closed here), else
            ignored.

    Attributes:
        reads, bytes: read calls and bytes read since construction.
        epoch_ranges: (lo, hi) data byte ranges read since the last `new_epoch()`.
    """

    def __init__(self, path, threads: int = 4, identity: tuple | None = None, shared=None):
        self.path = path
        self.identity = identity
        self._shared = shared if getattr(shared, "concurrent_reads", False) else None
        self._pool: concurrent.futures.ThreadPoolExecutor | None = concurrent.futures.ThreadPoolExecutor(
            max(1, int(threads)), thread_name_prefix="dstore-storage"
        )
        self._local = threading.local()
        self._readers = []
        self._lock = threading.Lock()
        self.reads = 0
        self.bytes = 0
        self.epoch_ranges = []

    def _reader(self):
        if self._shared is not None:
            return self._shared
        r = getattr(self._local, "reader", None)
        if r is None:
            r = open_container(self.path, index=False)  # byte ranges only: no index per thread
            with self._lock:
                self._readers.append(r)
            change = identities_differ(self.identity, r.opened_identity) if self.identity else None
            if change:  # the job's index describes the files it opened first, not these
                raise ContainerChangedError(
                    f"{self.path}: the container changed while this job was reading it "
                    f"({change}); a container must not be rewritten while a job reads it"
                )
            self._local.reader = r
        return r

    def _read(self, lo: int, hi: int, out: np.ndarray, check=None) -> None:
        self._reader().read_bytes(lo, hi, out=out)
        if check is not None:  # here, in the reading thread: crc32 releases the GIL
            check(out)
        with self._lock:
            self.reads += 1
            self.bytes += hi - lo
            self.epoch_ranges.append((lo, hi))

    def new_epoch(self) -> None:
        with self._lock:
            self.epoch_ranges = []

    def submit(self, buf: np.ndarray, byte_lo, byte_hi, buf_start, checks=None) -> list:
        """Starts one read per range: data bytes ``[byte_lo[i], byte_hi[i])`` into ``buf`` at
        ``buf_start[i]``, then ``checks[i](view)`` on the bytes read, in the same thread (None: no
        check). Returns the futures (complete them with `wait`)."""
        out = []
        pool = self._pool
        if pool is None:
            raise ValueError("the StorageReader is closed")
        checks = checks if checks is not None else itertools.repeat(None)
        for lo, hi, b, check in zip(
            np.asarray(byte_lo).tolist(), np.asarray(byte_hi).tolist(), np.asarray(buf_start).tolist(), checks
        ):
            if hi > lo:
                out.append(pool.submit(self._read, lo, hi, buf[b : b + hi - lo], check))
        return out

    @staticmethod
    def wait(futures: list) -> None:
        """Waits for every future, then raises the first one's error if any failed (so no read is
        left writing into a buffer the caller is about to reuse)."""
        if not futures:
            return
        concurrent.futures.wait(futures)
        for f in futures:
            exc = f.exception()
            if exc is not None:
                raise exc

    def close(self) -> None:
        """Ends the threads and closes their readers. Safe twice."""
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
        with self._lock:
            readers, self._readers = self._readers, []
        for r in readers:
            r.close()


def step_sums(values: np.ndarray, ptr: np.ndarray) -> np.ndarray:
    """The sum of ``values[ptr[s]:ptr[s + 1]]`` for each step s (int64[len(ptr) - 1]).

    Not `np.add.reduceat`: a step may be empty (a mix's source has no entry in some of the mix's
    steps, dstore.store.mixed), where reduceat gives the next entry's value, or fails past the end."""
    csum = np.zeros(len(values) + 1, dtype=np.int64)
    np.cumsum(values, out=csum[1:])
    ptr = np.asarray(ptr, dtype=np.int64)
    return csum[ptr[1:]] - csum[ptr[:-1]]


def _readonly(a: np.ndarray) -> np.ndarray:
    v = a.view()
    v.flags.writeable = False
    return v


class StorageEpoch:
    """One rank's storage tier over one epoch (from step `first` on): which entries of its schedule
    are read from storage, their reads issued `lookahead` steps ahead into a ring of
    `lookahead + 1` buffers (exactly sized for the epoch), and a copy of each sample the schedule
    delivers twice (a pad repeating a non-resident sample) so that no byte is read twice.

    Args:
        reader: the StorageReader.
        sched: the rank's plan.Schedule for the epoch.
        first: the first step served.
        resident: bool[N], the resident samples.
        offsets: int64[N+1] of the served samples; `base` is the data byte of sample 0.
        lookahead: steps in flight beyond the one consumed.
        bufs: the previous epoch's buffers, reused when large enough.
        checks: a dstore.formats.integrity.SampleChecks of the served samples: each read's samples are
            checked against their CRC32s in the thread that read them (None: not checked).

    Attributes:
        from_storage: bool[M], schedule entries served by this tier (read, or a copy of a read).
        bufs: the buffers (keep them for the next epoch).
    """

    def __init__(
        self,
        reader: StorageReader,
        sched,
        first: int,
        resident: np.ndarray,
        offsets: np.ndarray,
        base: int,
        lookahead: int,
        bufs: list,
        checks=None,
    ):
        self._tiers = tiers
        self.reader, self.sched, self.offsets, self.base = reader, sched, offsets, int(base)
        self.checks = checks
        # The tier's plan is per entry of the epoch (O(N/P)): a schedule computed on lookup
        # (dstore.order.plan.Derived) is built here once.
        self.ids = ids = np.asarray(sched.ids, dtype=np.int64)
        start = int(sched.ptr[first])
        idx = np.nonzero(~resident[ids])[0]
        idx = idx[idx >= start]
        self.from_storage = np.zeros(ids.size, dtype=bool)
        self.from_storage[idx] = True
        uniq, firsts, counts = np.unique(ids[idx], return_index=True, return_counts=True)
        self.read_entry = np.zeros(ids.size, dtype=bool)  # the first occurrence: read from storage
        self.read_entry[idx[firsts]] = True
        self._twice = set(uniq[counts > 1].tolist())
        self._copies = {}
        rb = np.where(self.read_entry, offsets[ids + 1] - offsets[ids], 0)  # no int64[N] of sizes
        need = int(step_sums(rb, sched.ptr)[first:].max(initial=0))
        n = lookahead + 1
        if len(bufs) != n or bufs[0].size < need:
            bufs = [np.empty(need, dtype=np.uint8) for _ in range(n)]
        self.bufs = bufs
        self._ro = [_readonly(b) for b in bufs]
        self._steps = list(range(first, sched.steps))
        self._k = 0
        self._pending = collections.deque()
        reader.new_epoch()
        while self._k < len(self._steps) and self._k < n:
            self._issue(self._k % n)

    def _issue(self, slot: int) -> None:
        s = self._steps[self._k]
        self._k += 1
        sl = self.sched.step(s)
        p = self._tiers.plan_storage(self.ids[sl], self.read_entry[sl], self.offsets)
        checks = (
            None
            if self.checks is None
            else [
                functools.partial(self.checks.run, lo=lo, hi=hi) for lo, hi in zip(p.run_lo.tolist(), p.run_hi.tolist())
            ]
        )
        futs = self.reader.submit(
            self.bufs[slot], self.base + self.offsets[p.run_lo], self.base + self.offsets[p.run_hi], p.run_buf, checks
        )
        self._pending.append((s, slot, p, futs))

    def take(self, s: int):
        """Waits for step `s`'s reads; returns (views, bytes read, reads): views[j] is entry j's
        bytes where it comes from this tier, else None."""
        s0, slot, p, futs = self._pending[0]
        if s0 != s:
            raise RuntimeError(f"storage tier: step {s} taken, step {s0} was next")
        try:
            self.reader.wait(futs)
        finally:
            self._slot = slot
        self._pending.popleft()
        sl = self.sched.step(s)
        ids = self.ids[sl].tolist()
        buf = self._ro[slot]
        views: list[np.ndarray | None] = [None] * len(ids)
        for j, (i, on, e) in enumerate(zip(ids, self.from_storage[sl].tolist(), p.entry.tolist())):
            if not on:
                continue
            if e >= 0:
                views[j] = v = buf[e : e + int(self.offsets[i + 1] - self.offsets[i])]
                if i in self._twice:
                    self._copies[i] = _readonly(v.copy())
            else:
                views[j] = self._copies[i]
        return views, p.nbytes, int(p.run_lo.size)

    def release(self) -> None:
        """The consumer gave back the last step taken: its buffer takes the next step's reads."""
        if self._k < len(self._steps):
            self._issue(self._slot)

    def close(self) -> None:
        """Completes every read in flight (their buffers are about to be reused), errors ignored."""
        for _, _, _, futs in self._pending:
            concurrent.futures.wait(futs)
        self._pending.clear()
