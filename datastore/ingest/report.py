"""What an ingest reports: IngestReport (the same on every rank) and IngestError (another rank's failure)."""

from __future__ import annotations

import dataclasses

from dstore.errors import DStoreError
from dstore.runtime.units import fmt_rate, fmt_size


class IngestError(DStoreError, RuntimeError):
    """Another rank failed during ingest; the message is that rank's error."""


@dataclasses.dataclass
class IngestReport:
    """What an ingest did (the same on every rank).

    Attributes:
        output: the container's path (the manifest's directory or file when sharded).
        samples: samples written.
        bytes: sample bytes written.
        seconds: wall time from the start (source listing included) to the finished container.
        skipped: (location, reason) of every sample or folder left out under on_error="skip".
        ignored: paths not taken as samples on purpose (non-image files, hidden files).
        notes: remarks from the source (e.g. labels defaulted to 0).
        shards: the shard files (just `output` when not sharded).
        encoding: the container's encoding.
        num_classes: number of classes.
        ranks: MPI ranks that took part.
        fmt: `hdf5` or `zarr`.
    """

    output: str
    samples: int
    bytes: int
    seconds: float
    skipped: list[tuple[str, str]]
    ignored: list[str]
    notes: list[str]
    shards: list[str]
    encoding: str
    num_classes: int
    ranks: int
    fmt: str

    @property
    def mb_per_s(self) -> float:
        """Sample bytes written per second, in MB (10**6 bytes)."""
        return self.bytes / 1e6 / self.seconds if self.seconds > 0 else float("inf")

    @property
    def files_per_s(self) -> float:
        """Samples written per second."""
        return self.samples / self.seconds if self.seconds > 0 else float("inf")

    def summary(self, max_listed: int = 50) -> str:
        """A human-readable summary; lists up to `max_listed` skipped samples with their reasons."""
        lines = [
            f"wrote {self.samples} samples ({fmt_size(self.bytes)}, {self.encoding}, "
            f"{self.num_classes} classes) to {self.output}"
            + (f" in {len(self.shards)} shards" if len(self.shards) > 1 else ""),
            f"{self.seconds:.2f} s on {self.ranks} rank(s): {fmt_rate(self.mb_per_s * 1e6)}, "
            f"{self.files_per_s:.0f} files/s",
        ]
        lines += [f"note: {n}" for n in self.notes]
        if self.ignored:
            lines.append(f"ignored {len(self.ignored)} non-image or hidden file(s), e.g. {self.ignored[0]}")
        if self.skipped:
            lines.append(f"skipped {len(self.skipped)}:")
            lines += [f"  {where}: {reason}" for where, reason in self.skipped[:max_listed]]
            if len(self.skipped) > max_listed:
                lines.append(f"  ... and {len(self.skipped) - max_listed} more")
        return "\n".join(lines)
