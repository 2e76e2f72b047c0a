"""Preemption: a signal (Slurm's SIGTERM before it kills a job, or `--signal=USR1@120`) asks a
training loop to stop after its current step, and every rank agrees on it before it stops.

    from dstore.runtime.preemption import Preemption

    with Preemption() as preempt:             # SIGTERM and SIGUSR1, handled from here on
        for step, batch in enumerate(loader):
            ...one optimizer step...
            if preempt.agreed(comm):          # collective: one small allreduce per call
                save_checkpoint(...)          # every rank stops after the same step
                sys.exit(PREEMPTED_EXIT)

A signal reaches the ranks at different moments (Slurm signals every task; one rank may be a step
ahead), so a rank never stops on its own flag: `agreed(comm)` takes the maximum over the ranks,
and all stop at the step where the first of them saw it. A second copy of the same signal ends the
process at once, as if no handler were installed (the way out of a loop that no longer steps).
"""

from __future__ import annotations

import os
import signal
from typing import Any

from dstore.errors import ConfigError

PREEMPTED_EXIT = 75
"""Exit code of `dstore train` after a preemption checkpoint (EX_TEMPFAIL of sysexits.h: "try again
later"): a batch script tells it from success (0), an error (1, 2) and a kill (137, 143), and
requeues on it."""

SIGNALS = ("TERM", "USR1", "USR2", "INT")
"""Signals that may ask for a preemption checkpoint, by name without the SIG prefix."""

DEFAULT_SIGNALS = ("TERM", "USR1")


def parse_signals(text: str) -> tuple[str, ...]:
    """`TERM,USR1` (or `SIGTERM`, any case; `none` for no handler) -> ("TERM", "USR1").

    Raises:
        ConfigError: a name that is not one of SIGNALS.
    """
    text = text.strip()
    if text.lower() in ("", "none", "off"):
        return ()
    names = []
    for part in text.split(","):
        name = part.strip().upper().removeprefix("SIG")
        if name not in SIGNALS:
            raise ConfigError(
                f"--preempt-signal {text!r}: {part.strip()!r} is not one of {', '.join(SIGNALS)} (or none)"
            )
        names.append(name)
    return tuple(dict.fromkeys(names))


class Preemption:
    """A flag set by the given signals while installed (a context manager; `install`/`uninstall`).

    Attributes:
        signals: the signal names it handles ("TERM", "USR1", ...).
        received: the name of the first signal received, or None.
    """

    def __init__(self, signals: tuple[str, ...] | str = DEFAULT_SIGNALS):
        self.signals = parse_signals(signals) if isinstance(signals, str) else tuple(signals)
        for name in self.signals:
            if name not in SIGNALS:
                raise ConfigError(f"signal {name!r} is not one of {SIGNALS}")
        self.received: str | None = None
        self._previous: dict[int, Any] = {}  # signal.signal's return: a handler, SIG_DFL/SIG_IGN or None

    @property
    def requested(self) -> bool:
        """True once one of the signals arrived at this process (local: see `agreed`)."""
        return self.received is not None

    def agreed(self, comm) -> bool:
        """Collective over `comm`: True on every rank if a signal arrived at any of them."""
        from mpi4py import MPI

        return bool(comm.allreduce(int(self.requested), op=MPI.MAX))

    def _handle(self, signum, frame) -> None:
        name = signal.Signals(signum).name.removeprefix("SIG")
        if self.received == name:  # the same signal again: stop waiting for the step to end
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        if self.received is None:
            self.received = name

    def install(self) -> Preemption:
        """Handles the signals from now on (main thread only, as Python's signal module allows)."""
        for name in self.signals:
            num = getattr(signal, "SIG" + name)
            self._previous[num] = signal.signal(num, self._handle)
        return self

    def uninstall(self) -> None:
        """Puts back the handlers there were before `install`. Safe twice."""
        previous, self._previous = self._previous, {}
        for num, handler in previous.items():
            signal.signal(num, handler if handler is not None else signal.SIG_DFL)

    def __enter__(self) -> Preemption:
        return self.install()

    def __exit__(self, *exc) -> None:
        self.uninstall()
