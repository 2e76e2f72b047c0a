"""A heartbeat: one plain line every so often while a long step runs (a population, a verify), so
a batch log shows that the job is alive and how far it got, without progress-bar `\\r` frames.

    with Heartbeat("verify", total=n, unit="samples", enabled=rank == 0) as beat:
        for piece in work:
            ...
            beat.add(len(piece))

prints, on stderr, `verify: 12000 of 50000 samples (24%) after 55.0 s` every `period` seconds
(default 30 s; $DSTORE_HEARTBEAT: seconds, 0 for none), and nothing for a
step that ends before the first period. With `rates=True` (an ingest) the line also has the bytes
done (`beat.add(n, nbytes)`), the rate since the start and the time left at that rate:
`ingest: 12000 of 50000 samples (24%), 1.32 GB, 218 samples/s (24.0 MB/s) after 55.0 s, about 174 s left`.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Literal

from dstore.runtime import rc
from dstore.runtime.units import fmt_rate, fmt_seconds, fmt_size


def period_from_env() -> float:
    """Seconds between beats: $DSTORE_HEARTBEAT (dstore.runtime.rc), 30 by default, 0 for none."""
    return float(rc.HEARTBEAT.get())


class Heartbeat:
    """A thread that writes how far a step got, every `period` seconds, until the step ends.

    Args:
        what: the step's name, the line's start.
        total: the amount of work (None: the line says only how long it has run).
        unit: what `total` counts.
        enabled: False makes it do nothing (ranks other than the one that reports).
        period: seconds between lines (default: period_from_env()); 0 or less: none.
        out: where the lines go (default: stderr).
        rates: the line also gives the bytes done, the rate and the time left (see the module docstring).
    """

    def __init__(
        self,
        what: str,
        total: int | None = None,
        *,
        unit: str = "",
        enabled: bool = True,
        period: float | None = None,
        out=None,
        rates: bool = False,
    ):
        self.what, self.total, self.unit = what, total, unit
        self.period = period_from_env() if period is None else float(period)
        self.enabled = enabled and self.period > 0
        self.rates = rates
        self.done = 0
        self.nbytes = 0
        self._out = out
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._t0 = 0.0

    def add(self, n: int, nbytes: int = 0) -> None:
        """Counts `n` more units done, of `nbytes` bytes (from the working thread; int adds under the GIL)."""
        self.done += n
        self.nbytes += nbytes

    def line(self) -> str:
        """What a beat writes now."""
        elapsed = time.perf_counter() - self._t0
        if self.total is None:
            return f"{self.what}: still running after {elapsed:.1f} s"
        done = self.done  # one read: the working thread adds beside this one
        pct = f" ({100.0 * done / self.total:.0f}%)" if self.total else ""
        unit = f" {self.unit}" if self.unit else ""
        if not self.rates:
            return f"{self.what}: {done} of {self.total}{unit}{pct} after {elapsed:.1f} s"
        rate = done / elapsed if elapsed > 0 else 0.0
        left = f", about {fmt_seconds((self.total - done) / rate)} left" if rate > 0 and done < self.total else ""
        return (
            f"{self.what}: {done} of {self.total}{unit}{pct}, {fmt_size(self.nbytes)}, {rate:.0f}{unit}/s "
            f"({fmt_rate(self.nbytes / elapsed if elapsed > 0 else 0.0)}) after {elapsed:.1f} s{left}"
        )

    def _run(self) -> None:
        while not self._stop.wait(self.period):
            out = self._out or sys.stderr
            try:
                out.write(self.line() + "\n")  # one write per line: ranks' lines never interleave mid-line
                out.flush()
            except (OSError, ValueError):  # a closed stream: the beat is not worth an error
                return

    def __enter__(self) -> Heartbeat:
        self._t0 = time.perf_counter()
        if self.enabled:
            self._thread = threading.Thread(target=self._run, name="dstore-heartbeat", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc) -> Literal[False]:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        return False
