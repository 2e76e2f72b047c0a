"""Agreement on failure before a collective step: every rank learns that some rank failed, and raises.

A rank that fails on its own (a truncated chunk in its block, a read error of its storage tier) and
then enters a collective the others are not in, or leaves while they wait in one, hangs the job.
So every collective step of the store is preceded by `agree(comm, exc)`: one small allreduce of a
failure flag and, only when some rank failed, an allgather of the messages; then every rank raises
(its own error, or the first failing rank's as the same type, naming that rank). Errors raised by
`agree` are marked `agreed`, so a caller knows every rank holds one and collective clean-up is safe.
"""

from __future__ import annotations

from dstore import errors as _errors
from dstore.errors import DStoreError

AGREED = "_dstore_agreed"
"""Attribute set (True) on an exception every rank of the communicator has raised together."""


class RemoteError(DStoreError, RuntimeError):
    """Another rank failed; the message is that rank's error, naming the rank."""


_TYPES = {cls.__name__: cls for cls in vars(_errors).values()
          if isinstance(cls, type) and issubclass(cls, DStoreError)}


def _message(exc: BaseException) -> tuple[str, str]:
    return type(exc).__name__, str(exc)


def _remote(name: str, text: str, rank: int) -> BaseException:
    cls = _TYPES.get(name)
    if cls is None:
        return RemoteError(f"rank {rank} failed: {name}: {text}")
    return cls(f"{text} (on rank {rank})")


def is_agreed(exc: BaseException) -> bool:
    """True if every rank raised `exc`'s failure together (collective clean-up is then safe)."""
    return bool(getattr(exc, AGREED, False))


def agree(comm, exc: BaseException | None) -> None:
    """Collective: returns if no rank passes an error, else raises on every rank.

    The failing rank raises its own `exc`; the others raise the first failing rank's error (same
    type where it is one of ours, else RemoteError), chained to nothing local.
    """
    from mpi4py import MPI

    if not comm.allreduce(exc is not None, op=MPI.LOR):
        return
    msgs = comm.allgather(None if exc is None else _message(exc))
    if exc is None:
        rank, (name, text) = next((r, m) for r, m in enumerate(msgs) if m is not None)
        exc = _remote(name, text, rank)
    try:
        setattr(exc, AGREED, True)
    except AttributeError:  # pragma: no cover - builtin exceptions accept attributes
        pass
    raise exc


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
