"""A watchdog over every wait of a rank on another node: a node that stops answering ends the job in
bounded time, with one line naming it, instead of a hang.

    with watch.waiting("gets", owners):   # a few attribute writes; nothing per sample
        arena.wait(requests)

MPI finds some faults itself: a node whose processes die closes its connections, the next get fails
(`CommError`, reported by `lost` with the node's name) and MPICH's launcher ends the job. It finds
none where the other end goes silent (a node that loses power, its link set down, its link crawling):
an RMA get or a collective then waits forever. So every such wait of a store on several hosts is
registered with this rank's `Watchdog`, a thread that looks once every `period` seconds; see NOTE
[ Waits on another node ].
"""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import Literal, TypeVar

from dstore.runtime import job, rc

# NOTE [ Waits on another node ]
#
# A wait that lasts `bound` seconds ($DSTORE_WAIT_BOUND) makes the watchdog thread probe every rank
# on another host: a 1-byte RMA get each (dstore.store.window.Probe), which the target's MPI
# progress engine answers by itself (its progress thread, or any MPI call it is in), so a busy or
# slow rank answers and a dead or cut-off one does not. Then:
#  1. a rank that does not answer within `bound`: its node is named ("no answer from node X") and
#     the job is ended (job.report_and_abort: one line, MPI_Abort; the process exits itself
#     ABORT_WAIT_S later if the abort did not end it: on a node cut off from the launcher it may not);
#  2. every rank answers, but the wait is for gets (which need only the target's progress engine,
#     so they take milliseconds): the link delivers too little ("node X too slow"); the job is ended;
#  3. every rank answers and the wait is for other ranks to arrive (an agreement, a collective,
#     a training step): they are alive and busy, so the wait goes on and is looked at again `bound`
#     seconds later. A slow rank is never mistaken for a dead one: over TCP a get is answered only
#     when the target calls into MPI, so every watchdog thread also calls MPI's progress engine once
#     per look (`probe.progress()`), and a rank that reads its block or computes for minutes without
#     an MPI call (before its store's progress thread starts, or with none) still answers in time.
# So a fault ends the job within 2 x bound + the watchdog's period + the report's delay (at most
# job.error_delay's 7 s, for a rank other than 0) + ABORT_WAIT_S. Every rank of the cut-off node
# meets the same bound from its side (its gets and agreements wait on the others), so its processes
# end too; its launcher proxy ends when mpiexec ends the process it started there (the ssh client,
# or the emulated node's launcher script), see docs/reliability.md.

ABORT_WAIT_S = 5.0
"""Seconds after MPI_Abort was called at which a process still alive ends itself (os._exit): a rank
whose node is cut off from the launcher cannot be ended by it."""

PERIOD_MOST = 1.0
"""The longest pause of the watchdog thread between looks at the wait in progress, in seconds."""

_W = TypeVar("_W", bound="Watchdog")  # start() returns the watchdog itself, of its own class


def span(ranks) -> str:
    """Ranks as short text: `2-3`, `0, 4, 6-7`."""
    ranks = sorted(set(int(r) for r in ranks))
    parts, i = [], 0
    while i < len(ranks):
        j = i
        while j + 1 < len(ranks) and ranks[j + 1] == ranks[j] + 1:
            j += 1
        parts.append(str(ranks[i]) if i == j else f"{ranks[i]}-{ranks[j]}")
        i = j + 1
    return ", ".join(parts)


class _Waiting:
    """The context manager `Watchdog.waiting` returns: registers the wait, and reports a lost node."""

    __slots__ = ("watch", "what", "ranks", "saved")

    def __init__(self, watch: Watchdog, what: str, ranks):
        self.watch, self.what, self.ranks = watch, what, ranks

    def __enter__(self) -> None:
        w = self.watch
        self.saved = w._wait
        w._wait = (time.monotonic(), self.what, self.ranks)

    def __exit__(self, exc_type, exc, tb) -> Literal[False]:
        self.watch._wait = self.saved
        if exc is not None and isinstance(exc, ConnectionError) and self.ranks is not None:
            self.watch.lost(exc, self.ranks)
        return False


class Watchdog:
    """This rank's watchdog over its waits on other nodes (see NOTE [ Waits on another node ]).

    Args:
        rank: this rank in the communicator the probe spans.
        hosts: every rank's host name, indexed by rank.
        probe: answers `silent(ranks, timeout) -> ranks that did not answer`, and `progress()` drives
            this rank's MPI progress (dstore.store.window.Probe).
        bound: seconds (> 0).
        period: seconds between the thread's looks (default: bound / 4, at most PERIOD_MOST).

    Attributes:
        probes: how many times the thread probed the other nodes (a wait that lasted `bound`).
    """

    def __init__(self, rank: int, hosts: list[str], probe, bound: float, *, period: float | None = None):
        self.rank, self.size, self.hosts, self.host = rank, len(hosts), list(hosts), hosts[rank]
        self.bound = float(bound)
        self.period = min(self.bound / 4, PERIOD_MOST) if period is None else float(period)
        self._probe = probe
        self._wait: tuple | None = None  # (since, what, ranks) of the wait in progress, set by `waiting`
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.probes = 0
        self.others = [r for r, h in enumerate(self.hosts) if h != self.host]
        self._far = set(self.others)

    # ---------------------------------------------------------------- the waiting thread's side
    def waiting(self, what: str, ranks=None) -> _Waiting:
        """A context manager around a wait: `what` it waits for (words for the line), `ranks` the
        ranks it waits on (a get's owners; None: any rank, as in a collective)."""
        return _Waiting(self, what, ranks)

    def node(self, ranks) -> str:
        """`ftn2 (ranks 2-3)`: the nodes of `ranks`, each with all its ranks."""
        hosts = []
        for r in sorted(set(int(r) for r in ranks)):
            if self.hosts[r] not in hosts:
                hosts.append(self.hosts[r])
        return ", ".join(f"{h} (ranks {span(r for r, x in enumerate(self.hosts) if x == h)})" for h in hosts)

    def lost(self, exc: BaseException, ranks) -> None:
        """A get to `ranks` failed (`exc`: the connection broke): names the node and ends the job.
        Returns only where the failed ranks are all on this host (the caller raises `exc`)."""
        far = [int(r) for r in set(ranks.tolist() if hasattr(ranks, "tolist") else ranks) if int(r) in self._far]
        if not far:
            return
        # The launcher ends the whole job within a fraction of a second of a node's processes
        # dying, so the line is written at once (ranks staggered by 50 ms, for one copy).
        self._end(
            f"node {self.node(far)} lost: a get from it failed ({exc}): its processes ended or its link broke",
            delay=0.05 * self.rank,
        )

    # ---------------------------------------------------------------- the watchdog thread
    def start(self: _W) -> _W:
        if self._thread is None and self.others:
            self._thread = threading.Thread(target=self._run, name="dstore-watchdog", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        """Stops and joins the thread (safe twice). A probe in progress finishes first (at most `bound`)."""
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join()

    def _run(self) -> None:
        looked: tuple | None = None  # the wait last probed, and when it is next due
        due = 0.0
        while not self._stop.wait(self.period):
            self._probe.progress()  # this rank answers the others' probes even while it computes
            wait = self._wait
            if wait is None:
                continue
            since, what, ranks = wait
            if looked is not wait:
                looked, due = wait, since + self.bound
            if time.monotonic() < due:
                continue
            t0 = time.monotonic()
            silent = self._probe.silent(self.others, self.bound)
            self.probes += 1
            took = time.monotonic() - t0
            if self._wait is not wait or self._stop.is_set():
                continue  # it ended while the probe ran
            waited = time.monotonic() - since
            bound = f"$DSTORE_WAIT_BOUND={self.bound:g} s"
            if silent:
                self._end(
                    f"no answer from node {self.node(silent)} for {waited:.1f} s: {what} waiting, and a "
                    f"1-byte get to each of its ranks unanswered for {took:.1f} s (the node is down, cut "
                    f"off, or its processes stopped); the job is ended ({bound})"
                )
            elif ranks is not None:
                far = [
                    int(r) for r in set(ranks.tolist() if hasattr(ranks, "tolist") else ranks) if int(r) in self._far
                ] or self.others
                self._end(
                    f"no answer from node {self.node(far)} for {waited:.1f} s: {what} waiting, though its "
                    f"ranks answer a 1-byte get (in {took:.2f} s): its link delivers too little; the job "
                    f"is ended ({bound})"
                )
            else:
                due = time.monotonic() + self.bound  # everyone alive and busy: wait on (NOTE, 3)

    def _end(self, msg: str, delay: float | None = None) -> None:
        """Writes the line, ends the job, and this process if the abort cannot (never returns)."""
        code = 1
        guard = threading.Timer(
            (job.error_delay(self.rank) if delay is None else delay) + ABORT_WAIT_S, os._exit, (code,)
        )
        guard.daemon = True
        guard.start()
        try:
            job.report_and_abort(code, msg, host=self.host, delay=delay)
        finally:
            try:
                sys.stderr.flush()
            finally:
                os._exit(code)


# --- the watchdogs of the stores open in this process ---------------------------------------

_lock = threading.Lock()
_active: list[Watchdog] = []


def register(watch: Watchdog) -> None:
    """Makes `watch` the one `current()` gives (the latest opened store's) until `unregister`."""
    with _lock:
        _active.append(watch)


def unregister(watch: Watchdog) -> None:
    with _lock:
        if watch in _active:
            _active.remove(watch)


def current() -> Watchdog | None:
    """The watchdog of the store opened last and still open in this process, or None."""
    return _active[-1] if _active else None


def guarded(what: str):
    """A context manager around a wait for every rank (a collective): the current watchdog's
    `waiting(what)`, or nothing where no store on several hosts is open."""
    watch = current()
    return watch.waiting(what) if watch is not None else NOTHING


class _Nothing:
    __slots__ = ()

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc) -> Literal[False]:
        return False


NOTHING = _Nothing()


def bound_from_env() -> float:
    """$DSTORE_WAIT_BOUND (dstore.runtime.rc): seconds, 0 for no watchdog."""
    return float(rc.WAIT_BOUND.get())


def open_watchdog(comm, probe_factory) -> Watchdog | None:
    """Collective over `comm`: this rank's started, registered Watchdog where `comm`'s ranks are on
    more than one host and rank 0's $DSTORE_WAIT_BOUND is not 0 (the same answer on every rank), else None.

    Args:
        probe_factory: `probe_factory(comm)` makes the probe (collective: dstore.store.window.Probe).
    """
    from mpi4py import MPI

    rows = comm.allgather((MPI.Get_processor_name(), bound_from_env()))
    hosts, bound = [h for h, _ in rows], rows[0][1]
    if len(set(hosts)) == 1 or bound <= 0:
        return None
    watch = Watchdog(comm.Get_rank(), hosts, probe_factory(comm), bound)
    register(watch)
    return watch.start()


def close_watchdog(watch: Watchdog | None, *, free: bool) -> None:
    """Stops `watch` and unregisters it; with `free` (collective) also frees its probe."""
    if watch is None:
        return
    watch.stop()
    unregister(watch)
    if free:
        watch._probe.free()
