"""A heartbeat for batch logs: a plain line when the run has said nothing for a while.

A job's log under Slurm is a file: tqdm's bar (carriage returns) is off there, and between the
start and the first epoch line (start-up, population) or within a long epoch, nothing may be
written for many minutes, which reads as a hang. So while stdout is not a terminal, rank 0 runs a
thread that, after every `every` seconds without a line, writes one plain line saying what the run
is doing and how far it is:

    [heartbeat] epoch 3: step 1200/5004, 412 s in it

The main thread only names the phase (`phase`) and its progress (`progress`: one attribute write
per step); every line the run reports passes through `say`, which resets the silence.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable

from dstore.runtime.units import fmt_seconds


def stdout_is_terminal() -> bool:
    """Whether stdout is a terminal (then the run's own lines show it is alive)."""
    try:
        return os.isatty(sys.stdout.fileno())
    except (AttributeError, OSError, ValueError):
        return False


class Heartbeat:
    """Says one plain line after every `every` seconds without one (a context manager: the thread
    runs inside it). Disabled (`every` <= 0, or `enabled` False) it only passes lines through.

    Args:
        say: how lines are written (rank 0's report).
        every: seconds of silence before a heartbeat line.
        enabled: whether to run the thread (rank 0, stdout not a terminal).
        clock: the time source (tests give their own).
    """

    def __init__(
        self,
        say: Callable[[str], None],
        every: float,
        enabled: bool = True,
        clock: Callable[[], float] = time.monotonic,
    ):
        self._say = say
        self.every = float(every)
        self.enabled = enabled and self.every > 0
        self._clock = clock
        self._name = "start-up"
        self._detail = ""
        self._since = self._last = clock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def say(self, line: str) -> None:
        """Writes a line of the run's (and restarts the silence)."""
        self._last = self._clock()
        self._say(line)

    def phase(self, name: str, detail: str = "") -> None:
        """The run now does `name` (e.g. "start-up: populating the store", "epoch 3")."""
        self._name, self._detail, self._since = name, detail, self._clock()

    def progress(self, detail: str) -> None:
        """How far the phase is (e.g. "step 120/500"); cheap: called every step."""
        self._detail = detail

    def line(self, now: float) -> str | None:
        """The heartbeat line due at time `now`, or None (said less than `every` seconds ago)."""
        if not self.enabled or now - self._last < self.every:
            return None
        detail = f": {self._detail}" if self._detail else ""
        return f"[heartbeat] {self._name}{detail}, {fmt_seconds(now - self._since)} in it"

    def tick(self) -> None:
        """Says the due line, if any (what the thread does every second)."""
        text = self.line(self._clock())
        if text is not None:
            self.say(text)

    def _run(self) -> None:
        while not self._stop.wait(min(1.0, self.every)):
            self.tick()

    def __enter__(self) -> Heartbeat:
        if self.enabled:
            self._thread = threading.Thread(target=self._run, name="dstore-heartbeat", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
