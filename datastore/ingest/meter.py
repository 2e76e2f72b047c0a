"""An ingest's progress on rank 0: a bar on a terminal, plain heartbeat lines in a log.

A 20,000-image ingest under a batch system wrote nothing for 173 s: its bar is for terminals only
(its `\\r` frames make a log file unreadable). Without a bar rank 0 now writes a line every
$DSTORE_HEARTBEAT seconds (30 by default; `ingest(heartbeat=)`), with the samples and bytes written,
the rate, the time so far and the time left.
"""

from __future__ import annotations

from dstore.runtime.heartbeat import Heartbeat


class Meter:
    """Rank 0's progress over the samples of its group's shards (`bounds`: the shards' first positions,
    `mine`: the group's shards, of `shards` in `groups` groups): a tqdm bar (`bar`), or else plain
    heartbeat lines every `period` seconds (dstore.runtime.heartbeat; None: $DSTORE_HEARTBEAT), which a log
    file keeps readable. Totals over all ranks would need the other groups' counts, which only MPI
    (not this thread) could bring: with several groups the line says it is rank 0's share."""

    def __init__(self, bounds, mine, shards: int, groups: int, *, bar: bool, period: float | None, enabled: bool):
        total = int(sum(bounds[s + 1] - bounds[s] for s in mine))
        what = "ingest" if groups == 1 else f"ingest (rank 0's share: {len(mine)} of {shards} shards)"
        self._bar = self._beat = None
        if enabled and bar:
            from tqdm import tqdm

            self._bar = tqdm(total=total, unit="img", mininterval=0.5, desc=what)
        elif enabled:
            self._beat = Heartbeat(what, total, unit="samples", period=period, rates=True)
        self.enabled = self._bar is not None or (self._beat is not None and self._beat.enabled)

    def update(self, n: int, nbytes: int) -> None:
        """Counts a written round: `n` positions of `nbytes` bytes (from the writer thread)."""
        if self._bar is not None:
            self._bar.update(n)
        elif self._beat is not None:
            self._beat.add(n, nbytes)

    def __enter__(self) -> Meter:
        if self._beat is not None:
            self._beat.__enter__()
        return self

    def __exit__(self, *exc) -> bool:
        if self._beat is not None:
            self._beat.__exit__(*exc)
        if self._bar is not None:
            self._bar.close()
        return False
