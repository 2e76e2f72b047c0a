"""One epoch of a DataStore: its figures (`EpochStats`).

`DataStore._epoch` builds one `EpochStats` per epoch and keeps it as `store.stats`; `as_dict()`
gives the plain dict that `gather_stats()`, the trainer's log and the benchmarks write (the same
keys, in the same order, as the fields below).
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass
class EpochStats:
    """This rank's figures for one epoch (see `DataStore`'s `stats` attribute for their meaning)."""

    epoch: int = 0
    rank: int = 0
    size: int = 1
    steps: int = 0
    samples: int = 0
    samples_local: int = 0
    samples_node: int = 0
    samples_remote: int = 0
    pads: int = 0
    bytes_local: int = 0
    bytes_node: int = 0
    bytes_remote: int = 0
    gets: int = 0
    samples_storage: int = 0
    bytes_storage: int = 0
    storage_reads: int = 0
    storage_wait_seconds: float = 0.0
    wait_seconds: float = 0.0
    fetch_seconds: float = 0.0
    get_wait_seconds: float = 0.0
    population_seconds: float = 0.0
    population_bytes: int = 0
    population_MBps: float = 0.0
    epoch_seconds: float = 0.0
    delivered_GBps: float = 0.0

    def as_dict(self) -> dict:
        """The figures as a plain dict (JSON-able), keyed by field name."""
        return dataclasses.asdict(self)

    def set_population(self, pop: dict) -> None:
        """Copies the store's population totals so far (population_seconds/_bytes/_MBps)."""
        for k, v in pop.items():
            setattr(self, k, v)

    def finish(self, seconds: float) -> None:
        """Records the epoch's wall time and the delivery rate it implies."""
        self.epoch_seconds = seconds
        delivered = self.bytes_local + self.bytes_node + self.bytes_remote + self.bytes_storage
        self.delivered_GBps = delivered / 1e9 / seconds if seconds else 0.0
