"""A light progress thread, so that passive-target gets from this rank's window complete while it computes.

Without shared memory (ranks on other nodes; here `MPIR_CVAR_NOLOCAL=1 UCX_TLS=tcp,self`), MPICH
completes a `Get` only when the target rank calls into MPI. A trainer computing for 200 ms without
an MPI call leaves its peers' gets waiting that long, and for as long as it computes (measured:
a get waited 1.5 s behind 6 steps of 200 ms; docs/reliability.md). MPICH's own asynchronous
progress (`MPIR_CVAR_ASYNC_PROGRESS=1`) busy-polls a core per rank. This thread instead calls
`Iprobe` on the communicator every `period` seconds and sleeps in between: the wait is bounded by
about the period, for a few microseconds of CPU per call. It needs MPI_THREAD_MULTIPLE (mpi4py's
default).
"""

from __future__ import annotations

import threading
from typing import Literal

from dstore.errors import ConfigError

PROBE_TAG = 32767
"""The tag the thread probes for; nothing is ever sent with it (MPI guarantees tags up to 32767)."""


class ProgressThread:
    """Drives this rank's MPI progress engine every `period` seconds while it runs.

    Args:
        comm: a communicator of this rank (probing any communicator drives the whole engine).
        period: seconds between calls (positive).

    Used as a context manager (`with ProgressThread(comm): compute()`); `stop()` is safe twice.
    """

    def __init__(self, comm, period: float = 0.002):
        if not period > 0:
            raise ConfigError(f"period={period!r} must be a positive number of seconds")
        from mpi4py import MPI

        if MPI.Query_thread() != MPI.THREAD_MULTIPLE:
            raise ConfigError(
                "a progress thread needs MPI initialised with MPI_THREAD_MULTIPLE "
                "(mpi4py's default; check mpi4py.rc.thread_level)"
            )
        self._comm, self._period = comm, float(period)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.calls = 0

    def start(self) -> ProgressThread:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="dstore-progress", daemon=True)
            self._thread.start()
        return self

    def _run(self) -> None:
        from mpi4py import MPI

        while not self._stop.wait(self._period):
            self._comm.Iprobe(MPI.ANY_SOURCE, PROBE_TAG)
            self.calls += 1

    def stop(self) -> None:
        """Stops and joins the thread; safe to call twice."""
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join()

    def __enter__(self) -> ProgressThread:
        return self.start()

    def __exit__(self, *exc) -> Literal[False]:
        self.stop()
        return False
