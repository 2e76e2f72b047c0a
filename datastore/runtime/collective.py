"""Agreement on failure before a collective step: every rank learns that some rank failed, and raises.

A rank that fails on its own (a truncated chunk in its block, a read error of its storage tier) and
then enters a collective the others are not in, or leaves while they wait in one, hangs the job.
So every collective step of the store is preceded by `agree(comm, exc)`: one small allreduce of a
failure flag (waited for asleep: `wait_asleep`) and, only when some rank failed, an allgather of
the messages; then every rank raises (its own error, or the first failing rank's as the same
type, naming that rank). Errors raised by `agree` are marked `agreed`, so a caller knows every
rank holds one and collective clean-up is safe.

Used by the store (`agree`), ingest (`agree`/`raise_agreed`/`on_root` with its own error types and
IngestError for foreign ones) and the trainer (`on_root`: work done on rank 0 only, its failure raised
on every rank, as ConfigError on the others).

Node topology lives here too: `node_comm` (the ranks of this rank's node, as a communicator) and
`topology` (a `Topology` value: rank, node, rank on the node), each either the machine's real
shared-memory node or, with `emulate=True`, the store's view that $DSTORE_RANKS_PER_NODE can cut
into smaller "nodes" for tests on one machine. mpi4py is imported inside the collectives, so this
module can be imported where MPI must not be initialised.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

from dstore import errors as _errors
from dstore.errors import ConfigError, DStoreError
from dstore.runtime import rc
from dstore.runtime.watchdog import guarded

# NOTE [ Store agreement protocol ]
#
# A DataStore's ranks must never part ways: a rank that raises alone while the others enter a
# collective hangs the job, and ranks that disagree on the plan exchange wrong bytes with exit code
# 0. So every point where ranks could diverge is one collective that every rank reaches:
#  1. Arguments (DataStore.__init__): each rank checks its own, then `agree`: a bad argument on one
#     rank raises on every rank.
#  2. Plan and budget (dstore.store.budget.check_budget): one allgather of each rank's needs, budget
#     and a key: the StoreConfig fields marked agree=True (dstore.store.config) plus the data set's size.
#     A differing key is a ConfigError on every rank; the budget decision (refuse, or which samples
#     stay resident) is computed from the same gathered rows on every rank, so it is the same.
#  3. Windows (dstore.store.populate.populate): allocation, then the fill, each end in `agree`; after an
#     agreed fill failure every rank frees the windows (every rank is there).
#  4. Epochs (DataStore._check_same_epoch): each epoch starts with an allgather of (epoch, first
#     step); ranks in different epochs raise ConfigError on every rank.
#  5. Reads mid-epoch (dstore.store.epoch): a rank whose read fails stops and waits in the `agree` at the
#     epoch's end (EpochRun._finish) or in close(); the others meet it there and every rank raises
#     it. With `fail_fast` the failing rank raises at once instead (its job aborts on it).
#  6. Clean-up (DataStore.__exit__): an error marked agreed (AGREED below) was raised on every rank,
#     so the windows are freed collectively; any other error leaves them to MPI_Finalize.

AGREED = "_dstore_agreed"
"""Attribute set (True) on an exception every rank of the communicator has raised together."""


class RemoteError(DStoreError, RuntimeError):
    """Another rank failed; the message is that rank's error, naming the rank."""


Fallback = Callable[[str], BaseException]
"""What builds the error raised for a failure of a type not kept (an exception class taking a message)."""


_TYPES = {cls.__name__: cls for cls in vars(_errors).values() if isinstance(cls, type) and issubclass(cls, DStoreError)}


def message(exc: BaseException) -> tuple[str, str]:
    """What another rank needs to raise `exc` again: (type name, text)."""
    return type(exc).__name__, str(exc)


def remote_error(name: str, text: str, rank: int, *, types=None, fallback: Fallback = RemoteError) -> BaseException:
    """The error to raise for a failure that happened on rank `rank`: the same type where it is one
    of ours (dstore.errors, or `types`: name -> class), else `fallback` naming the type."""
    cls = (types or {}).get(name) or _TYPES.get(name)
    if cls is None:
        return fallback(f"rank {rank} failed: {name}: {text}")
    return cls(f"{text} (on rank {rank})")


def is_agreed(exc: BaseException) -> bool:
    """True if every rank raised `exc`'s failure together (collective clean-up is then safe)."""
    return bool(getattr(exc, AGREED, False))


def raise_agreed(comm, exc: BaseException | None, *, types=None, fallback: Fallback = RemoteError) -> None:
    """Collective, once every rank knows that some rank failed: every rank raises, the failing rank
    its own `exc`, the others the first failing rank's error (see `remote_error`)."""
    msgs = comm.allgather(None if exc is None else message(exc))
    if exc is None:
        rank, (name, text) = next((r, m) for r, m in enumerate(msgs) if m is not None)
        exc = remote_error(name, text, rank, types=types, fallback=fallback)
    _mark_agreed(exc)
    raise exc


def _mark_agreed(exc: BaseException) -> None:
    try:
        setattr(exc, AGREED, True)
    except AttributeError:  # pragma: no cover - builtin exceptions accept attributes
        pass


SETTLE_FIRST = 20e-6
SETTLE_MOST = 4e-3
"""`wait_asleep`'s first and longest pause between tests of its request, in seconds: the longest adds at
most 4 ms to a collective step (an epoch's start, a population's end), and costs a waiting rank
about 250 wake-ups a second, each a test in MPI's progress engine (~35 us of CPU here under load,
measured: at 1 ms, a rank waiting 40 ms for the other at an epoch's start spent 1.3 ms of CPU)."""


def wait_asleep(req, most: float = SETTLE_MOST) -> None:
    """Completes the MPI request `req` (a nonblocking collective), sleeping between its tests, the
    pauses growing from SETTLE_FIRST to `most`.

    A blocking MPI collective busy-polls while it waits for the last rank (MPICH: a waiting rank
    measured 0.7-1.0 s of CPU per second of wait), so a rank that ends its epoch first spun at 100%
    of a core until the slowest arrived: CPU counted as the rank's own and taken from its decode
    workers. The step's own collective is the one waited for, not a barrier before a blocking one:
    after a barrier, the rank whose test saw it complete first spun in the blocking collective until
    the others' next test (up to SETTLE_MOST each; about 2 ms of CPU per epoch's start on two ranks,
    measured)."""
    pause = SETTLE_FIRST
    while not req.Test():
        time.sleep(pause)
        pause = min(2 * pause, most)


def gather_ints(comm, values) -> list[tuple[int, ...]]:
    """Collective: every rank's `values` (a few ints, as many on every rank), in rank order, waited
    for asleep (`wait_asleep`)."""
    import numpy as np

    send = np.asarray(values, dtype=np.int64).reshape(-1)
    if comm.Get_size() == 1:
        return [tuple(int(v) for v in send)]
    recv = np.empty((comm.Get_size(), send.size), dtype=np.int64)
    with guarded(f"an agreement of {comm.Get_size()} ranks"):  # NOTE [ Waits on another node ]
        wait_asleep(comm.Iallgather(send, recv))
    return [tuple(int(v) for v in row) for row in recv]


def any_rank(comm, flag: bool) -> bool:
    """Collective: whether `flag` is set on any rank of `comm`, waited for asleep (`wait_asleep`)."""
    if comm.Get_size() == 1:
        return bool(flag)
    import numpy as np
    from mpi4py import MPI

    send, recv = np.array([int(bool(flag))], dtype=np.int32), np.zeros(1, dtype=np.int32)
    with guarded(f"an agreement of {comm.Get_size()} ranks"):  # NOTE [ Waits on another node ]
        wait_asleep(comm.Iallreduce(send, recv, op=MPI.MAX))
    return bool(recv[0])


def agree(comm, exc: BaseException | None, *, types=None, fallback: Fallback = RemoteError) -> None:
    """Collective: returns if no rank passes an error, else raises on every rank.

    The failing rank raises its own `exc`; the others raise the first failing rank's error (same
    type where it is one of ours, else `fallback`), chained to nothing local. A rank that arrives
    first waits asleep (`any_rank`), not spinning in an allreduce.
    """
    if not any_rank(comm, exc is not None):
        return
    raise_agreed(comm, exc, types=types, fallback=fallback)


def run_agreed(comm, fn, *args, **kwargs):
    """`fn(*args, **kwargs)` on every rank, then `agree`: a failure on any rank raises on all."""
    exc = None
    out = None
    try:
        out = fn(*args, **kwargs)
    except Exception as e:  # noqa: BLE001 - every rank must learn of it, or they would wait forever
        exc = e
    agree(comm, exc)
    return out


def on_root(comm, fn, *args, types=None, fallback: Fallback = ConfigError, **kwargs):
    """Runs fn(*args, **kwargs) on rank 0 of `comm` and returns its result on every rank (collective:
    one bcast). If it raises, every rank raises, so no rank is left waiting: rank 0 the original
    exception, the others an error naming rank 0, marked agreed like `agree`'s. Anything it raises
    counts, `BaseException` too (a KeyboardInterrupt in a user's iterable, `sys.exit` in it): rank 0
    tells the others before it re-raises, else they would wait in the bcast for ever.

    Args:
        types: None (the trainer's rule): the others raise `fallback` quoting rank 0's error
            ("rank 0 failed: Type: message") whatever its type. A mapping (name -> class, may be
            empty): the others raise the same type where it is one of dstore.errors or in `types`,
            else `fallback` (as `agree`, see `remote_error`).
        fallback: the class raised on the other ranks for a type not kept.
    """
    result, err = None, None
    if comm.Get_rank() == 0:
        try:
            result = fn(*args, **kwargs)
        except BaseException as exc:  # noqa: BLE001 - re-raised on every rank below, KeyboardInterrupt too
            err = exc
    result, failed = comm.bcast((result, None if err is None else message(err)), root=0)
    if failed is None:
        return result
    if err is None:
        name, text = failed
        err = (
            fallback(f"rank 0 failed: {name}: {text}")
            if types is None
            else remote_error(name, text, 0, types=types, fallback=fallback)
        )
    _mark_agreed(err)
    raise err


RANKS_PER_NODE_ENV = rc.RANKS_PER_NODE.name
"""For tests on one machine (dstore.runtime.rc.RANKS_PER_NODE): treat each run of this many consecutive
ranks as one node, so that a single-node job has samples on "other nodes" (served with gets) beside
node peers' (served in place). Honoured only where a caller asks for the store's view (`emulate=True`)."""


def node_comm(comm, *, emulate: bool = False):
    """The ranks of `comm` that share this rank's node, ordered as in `comm` (collective); caller
    frees it.

    A node is the ranks that share memory (`Split_type(COMM_TYPE_SHARED)`): what cores, GPUs, the
    page cache and a mount are shared by. With `emulate` (the store's view: which peers' windows it
    maps, which ranks pool a budget) and $DSTORE_RANKS_PER_NODE=k, the ranks of the same machine are
    further cut into runs of k consecutive ranks, each standing for a node (the way a multi-node job
    is tested on one machine).

    Raises:
        ConfigError: (with `emulate`) $DSTORE_RANKS_PER_NODE is not an integer >= 1.
    """
    from mpi4py import MPI

    node = comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.Get_rank())
    try:
        k = rc.RANKS_PER_NODE.get() if emulate else None
    except ConfigError:
        node.Free()
        raise
    if k is None:
        return node
    try:
        return node.Split(comm.Get_rank() // k, comm.Get_rank())
    finally:
        node.Free()


@dataclasses.dataclass(frozen=True)
class Topology:
    """Where this rank is: in its communicator and on its node (the same view on every rank).

    Attributes:
        rank, size: this rank and the number of ranks in the communicator.
        node, nodes: this rank's node (numbered in the order of their first ranks) and the number of nodes.
        local_rank, local_size: this rank among the ranks of its node, and how many they are.
    """

    rank: int
    size: int
    node: int
    nodes: int
    local_rank: int
    local_size: int

    @property
    def single_node(self) -> bool:
        """True if every rank of the communicator is on this rank's node."""
        return self.nodes == 1


def topology_of(comm, node) -> Topology:
    """This rank's Topology, given its node communicator from `node_comm(comm, ...)` (collective over
    `comm`: one allgather)."""
    firsts = comm.allgather(node.allreduce(comm.Get_rank(), op=_min_op()))
    leaders = sorted(set(firsts))
    return Topology(
        rank=comm.Get_rank(),
        size=comm.Get_size(),
        node=leaders.index(firsts[comm.Get_rank()]),
        nodes=len(leaders),
        local_rank=node.Get_rank(),
        local_size=node.Get_size(),
    )


def topology(comm, *, emulate: bool = False) -> Topology:
    """This rank's Topology in `comm` (collective). The machine's real shared-memory nodes unless
    `emulate` (the store's view, honouring $DSTORE_RANKS_PER_NODE; see `node_comm`)."""
    node = node_comm(comm, emulate=emulate)
    try:
        return topology_of(comm, node)
    finally:
        node.Free()


def _min_op():
    from mpi4py import MPI

    return MPI.MIN


def seen_everywhere(comm, path: str, what: str) -> None:
    """Collective: raises ConfigError on every rank if some rank does not see `path` as rank 0 does
    (there, of the same kind, a file of the same size). A job's shared paths (its data, run directory,
    checkpoints, the data set cache) must be on storage every node sees; one made by rank 0 on its
    node's own /tmp, /dev/shm or local disk is missing on the other nodes, where a rank would fail
    alone with a bare "no such file". Nothing is checked where rank 0 does not see it either (the
    caller's own error names it). One allgather of a few bytes."""
    import os
    import socket
    import stat

    def look():
        try:
            st = os.stat(path)
        except OSError:
            return None
        return ("directory", 0) if stat.S_ISDIR(st.st_mode) else ("file", st.st_size)

    seen = comm.allgather((socket.gethostname(), look()))
    host0, want = seen[0]
    if want is None:
        return
    missing = [(r, host) for r, (host, got) in enumerate(seen) if got != want]
    if missing:
        ranks = ", ".join(str(r) for r, _ in missing[:8]) + (", ..." if len(missing) > 8 else "")
        hosts = sorted({h for _, h in missing})
        err = ConfigError(
            f"{what} {path} is not on storage every node sees: rank(s) {ranks} on "
            f"{', '.join(hosts[:4])}{', ...' if len(hosts) > 4 else ''} do not see it as rank 0 on "
            f"{host0} does; put it on a file system all nodes share (a node's /tmp, /dev/shm or "
            "local disk is its own)"
        )
        _mark_agreed(err)
        raise err
