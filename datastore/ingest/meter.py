"""An ingest's progress: a bar on a terminal (rank 0), plain heartbeat lines in a log (every writing rank).

A 20,000-image ingest under a batch system wrote nothing for 173 s: its bar is for terminals only
(its `\\r` frames make a log file unreadable). Without a bar, the first rank of each writer group
(rank 0 alone when one file is written) writes a line every $DSTORE_HEARTBEAT seconds (30 by
default; `ingest(heartbeat=)`), naming the rank and its shards, with the samples and bytes written
of its total, the rate, the time so far and the time left:
`ingest [rank 1: 2 of 4 shards]: 1200 of 2500 samples (48%), 132 MB, 218 samples/s (24.0 MB/s) after 5.5 s, about 6 s left`.
"""

from __future__ import annotations

from typing import Literal

from dstore.runtime.heartbeat import Heartbeat


class Meter:
    """A group writer's progress over the samples of its group's shards (`bounds`: the shards' first
    positions, `mine`: the group's shards, of `shards` in `groups` groups; `rank`: this rank): a tqdm
    bar (`bar`, on `bar_rank` only), or else plain heartbeat lines every `period` seconds
    (dstore.runtime.heartbeat; None: $DSTORE_HEARTBEAT), which a log file keeps readable. Each group's
    writer reports its own share (totals over all ranks would need the other groups' counts, which only
    MPI, not this thread, could bring), so a log has a line per writing rank."""

    def __init__(
        self,
        bounds,
        mine,
        shards: int,
        groups: int,
        *,
        bar: bool,
        period: float | None,
        enabled: bool,
        rank: int = 0,
        bar_rank: bool = True,
    ):
        total = int(sum(bounds[s + 1] - bounds[s] for s in mine))
        what = "ingest" if groups == 1 else f"ingest [rank {rank}: {len(mine)} of {shards} shards]"
        self._bar = self._beat = None
        if enabled and bar and bar_rank:
            from tqdm import tqdm

            self._bar = tqdm(total=total, unit="img", mininterval=0.5, desc=what)
        elif enabled and not bar:
            self._beat = Heartbeat(what, total, unit="samples", period=period, rates=True)
        self.enabled = self._bar is not None or (self._beat is not None and self._beat.enabled)

    def already(self, n: int) -> None:
        """`n` positions a resumed ingest had written before: taken off the total (the rate and the
        time left are of this run's work)."""
        if self._bar is not None:
            self._bar.total -= n
            self._bar.refresh()
        elif self._beat is not None and self._beat.total is not None:
            self._beat.total -= n

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

    def __exit__(self, *exc) -> Literal[False]:
        if self._beat is not None:
            self._beat.__exit__(*exc)
        if self._bar is not None:
            self._bar.close()
        return False
