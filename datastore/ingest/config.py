"""`IngestConfig`: ingest()'s keyword arguments (everything but the source, the output, the
communicator and the source's own options), each with its default and its doc, on the pattern of
dstore.store.config.StoreConfig.

`ingest(source, output, shards=4, ...)` builds one from its keywords; `ingest(source, output,
config=IngestConfig(...))` takes one. `checked()` validates what needs no source (ConfigError naming
the argument and its value; the re-encode's bounds are checked with the source, in
dstore.ingest.process.resolve_target, and `heartbeat` by dstore.runtime.heartbeat). Every rank
checks the same arguments before any collective step, so every rank refuses alike.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import numpy as np

from dstore.errors import ConfigError
from dstore.formats import FORMATS
from dstore.ingest import plan
from dstore.ingest.process import ON_ERROR
from dstore.runtime import values

DUPLICATES = ("raise", "skip")
"""Values of `duplicates`: what an append does with a sample the container already holds."""

MAX_SHARDS = 99_999
"""The most shards an ingest writes (`shard-00000-of-99999`)."""


def arg(default: Any, *, doc: str) -> Any:
    """An IngestConfig field: its default and `doc` (what it does)."""
    return dataclasses.field(default=default, metadata={"doc": doc})


@dataclasses.dataclass(frozen=True)
class IngestConfig:
    """ingest()'s arguments; see dstore.ingest.run.ingest for each one's meaning in full."""

    fmt: str | None = arg(None, doc="`hdf5` or `zarr`; None: `zarr` where the output's name ends in .zarr, else `hdf5`")
    shards: int = arg(1, doc="number of shard files (dstore.ingest.plan: which ranks write which)")
    seed: int = arg(0, doc="seed of the write order (for `synthetic`, also of the generated images)")
    keep_order: bool = arg(False, doc="write in source order instead of a seeded random order")
    encoding: str | None = arg(None, doc="stored encoding; None keeps the source's (process.resolve_target)")
    resize: Any = arg(None, doc="`HxW` (or (H, W)) to store decoded, resized pixels (implies encoding `raw`)")
    on_error: str = arg("raise", doc="`raise` (stop at the first bad sample, nothing left behind) or `skip`")
    count: int | None = arg(None, doc="use only the first `count` source samples (`synthetic`: how many to make)")
    progress: bool = arg(True, doc="a progress bar on rank 0; False: plain heartbeat lines instead")
    overwrite: bool = arg(False, doc="replace an existing container")
    reencode_max_side: int | None = arg(None, doc="re-encode images whose longer side is over this many px")
    reencode_quality: int | None = arg(None, doc="the JPEG quality of the re-encode (default 90)")
    stratify: bool = arg(False, doc="a seeded order with every class spread evenly (plan.stratified_order)")
    heartbeat: float | None = arg(
        None, doc="seconds between plain progress lines without a bar (None: $DSTORE_HEARTBEAT)"
    )
    fields: Any = arg(None, doc='the extra fields per sample to store (None: every one the source has; "none": none)')
    resume: bool | None = arg(
        None,
        doc="None: continue an interrupted ingest of the output if its journal is there, "
        "else start; True: continue one (refused if there is none); False: discard "
        "any and start over (`--resume`, `--restart`)",
    )
    append_to: str | None = arg(
        None,
        doc="an existing container to add the source's samples to (`--append-to`; "
        "dstore.ingest.append); the output is then that container",
    )
    duplicates: str = arg(
        "raise",
        doc="an appended sample already stored (same name, or same bytes): `raise` or `skip` it (`--duplicates`)",
    )

    def checked(self) -> IngestConfig:
        """This config validated (ConfigError naming the argument and its value) and `resize`
        normalised to (H, W) or None."""
        self = dataclasses.replace(self, **values.typed(self))  # every bool and number by one rule
        if self.fmt is not None and self.fmt not in FORMATS:
            raise ConfigError(f"fmt={self.fmt!r} is not one of {sorted(FORMATS)}")
        if self.on_error not in ON_ERROR:
            raise ConfigError(f"on_error={self.on_error!r} is not one of {ON_ERROR}")
        shards = self.shards
        if not isinstance(shards, (int, np.integer)) or not 1 <= shards <= MAX_SHARDS:
            raise ConfigError(
                f"shards={shards!r} (--shards) must be an integer in [1, {MAX_SHARDS}] (shard names have five digits)"
            )
        if self.duplicates not in DUPLICATES:
            raise ConfigError(f"duplicates={self.duplicates!r} is not one of {DUPLICATES}")
        if self.resume not in (None, True, False):
            raise ConfigError(f"resume={self.resume!r} must be None, True or False")
        count = self.count
        if count is not None and (not isinstance(count, (int, np.integer)) or count < 1):
            raise ConfigError(f"count={count!r} must be a positive integer or None")
        fields = self.fields
        if not (
            fields is None
            or isinstance(fields, str)
            or (isinstance(fields, (list, tuple)) and all(isinstance(f, str) for f in fields))
        ):
            raise ConfigError(
                f"fields={fields!r} must be None (every field), 'none', or field names (a list of str "
                f"or one comma-separated str)"
            )
        return dataclasses.replace(self, seed=values.seed("seed", self.seed), resize=plan.parse_resize(self.resize))


def field_names() -> list[str]:
    """IngestConfig's field names, in order (ingest()'s keywords that are not the source's)."""
    return [f.name for f in dataclasses.fields(IngestConfig)]


def format_for(fmt: str | None, output) -> str:
    """The container format of an ingest into `output`: `fmt`, or where it is None, `zarr` for a name
    ending in .zarr and `hdf5` otherwise (the same rule for ingest() and `dstore ingest`)."""
    if fmt is not None:
        return fmt
    return "zarr" if os.fspath(output or "").rstrip("/").lower().endswith(".zarr") else "hdf5"
