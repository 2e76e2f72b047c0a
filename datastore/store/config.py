"""`StoreConfig`: the one source of DataStore's arguments, each with its default, its doc and
whether every rank must pass the same value.

An argument that changes the plan (who owns what, which rank takes which sample when) or the
resident set (which samples a tiered rank keeps in its window) must be equal on every rank, or
the ranks exchange wrong bytes with no error; the budget's allgather compares exactly the fields
marked `agree=True` (see NOTE [ Store agreement protocol ] in dstore.runtime.collective). Each field must
say which it is (`arg` has no default for `agree`), so a new argument cannot be left out of the
check by omission. The same fields give DataStore's keywords, the table of options in
docs/guide.md (`python -m dstore.store.config` prints it; a test compares) and the trainer's wiring.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from dstore.errors import ConfigError
from dstore.memory.limits import parse_bytes
from dstore.order import policy, shuffle, tiers
from dstore.runtime import rc, values


def arg(default: Any = dataclasses.MISSING, *, agree: bool, values: str, doc: str) -> Any:
    """A StoreConfig field: `agree` (ranks must pass the same value), `values` (the allowed values
    and the default, as the docs show them) and `doc` (what it does, one sentence or a few)."""
    return dataclasses.field(default=default, metadata={"agree": agree, "values": values, "doc": doc})


@dataclasses.dataclass(frozen=True)
class StoreConfig:
    """DataStore's arguments (everything but the communicator and the container).

    `DataStore(comm, container, batch_size=64, ...)` builds one from its keywords;
    `DataStore(comm, container, config)` takes one. `checked(nranks)` returns it validated and
    normalised (what the store keeps as `store.config`).
    """

    batch_size: int = arg(
        agree=True,
        values="int >= ranks",
        doc=("the **global** batch size; rank r takes its contiguous slice of each global batch"),
    )
    seed: int = arg(
        0, agree=True, values="int in [0, 2**63) (0)", doc="seed of every shuffle (and of the resident set)"
    )
    shuffle: str = arg(
        "global",
        agree=True,
        values="`global` (default), `local`, `partial`",
        doc=(
            "one global permutation per epoch (independent of the rank count); each rank shuffles only what it "
            "owns (no traffic); `local` plus a fraction `partial_fraction` of samples exchanged"
        ),
    )
    partial_fraction: float = arg(
        0.25, agree=True, values="float in [0, 1] (0.25)", doc="fraction of slots exchanged per epoch under `partial`"
    )
    population: str = arg(
        "preload",
        agree=True,
        values="`preload` (default), `dynamic`, `stream`",
        doc=(
            "read each rank's block before training (large reads, several in flight, page faults taken in a "
            "thread beside them); or read what epoch 0 needs as it goes (under `global` a sample's owner is the "
            "rank that takes it in epoch 0; a job resumed past epoch 0's start reads everything first); or the "
            "preload's reads in a thread while the first epoch is served, its first batch read by the ranks that "
            "deliver it (dstore.store.stream; tiered or replicated: a preload)"
        ),
    )
    replicate: bool = arg(
        False,
        agree=True,
        values="bool",
        doc=(
            "one full copy per node in shared memory (no gets at all); `MemoryBudgetError` if a copy does not fit "
            "the node's pooled budget; always preloaded"
        ),
    )
    prefetch: int = arg(
        2,
        agree=True,
        values="int in [0, 1024] (2)",
        doc=(
            "batches whose gets are in flight ahead of the one you work on (their receive buffers count in the budget)"
        ),
    )
    drop_last: bool = arg(
        False,
        agree=True,
        values="bool",
        doc=("drop the short last batch (else it is served short; a rank with nothing gets one flagged pad)"),
    )
    sample_range: tuple[int, int] | None = arg(
        None, agree=True, values="(start, stop)", doc="serve a contiguous subset (train / held-out split)"
    )
    fields: tuple[str, ...] = arg(
        (),
        agree=True,
        values="field names (none)",
        doc=(
            'the container\'s extra fields (docs/format.md, "Fields") the store holds and serves with each '
            "sample: each rank keeps its block's values in a window of its own (counted in the budget, always "
            "resident) and a batch's values come from their owners' windows with the batch (`Batch.fields`, "
            "`StoreLoader(fields=)`); checked against the container's field checksums when read"
        ),
    )
    memory_budget: int | str | None = arg(
        None,
        agree=False,
        values='bytes or "8G"',
        doc=(
            "per-rank budget; default 70% of available memory (or of what the job's memory cgroup, e.g. a Slurm "
            "`--mem` cap, still allows, if less) shared by the node's ranks, or `$DSTORE_MEMORY_BUDGET`"
        ),
    )
    node_views: bool | None = arg(
        None,
        agree=False,
        values="bool (on)",
        doc=(
            "samples of other ranks on the same node are read in place from their window (MPI-4 "
            "`Win_shared_query`; no get, no copy); off, or `DSTORE_NODE_VIEWS=0`: gets for everything not this "
            "rank's own"
        ),
    )
    overflow: str = arg(
        "serve",
        agree=True,
        values="`serve` (default), `error`",
        doc=(
            "data larger than the budget: keep what fits in memory (a seeded random subset of each rank's share) "
            "and read the rest from the container, ahead of need, by the rank that needs it; rank 0 warns once "
            "with the resident fraction and the bytes per epoch read from storage. `error`: refuse with "
            "`MemoryBudgetError` (CLI `--overflow error`). Order, exactly-once and resumption are the same "
            "either way"
        ),
    )
    storage_lookahead: int = arg(
        4,
        agree=True,
        values="int in [0, 1024] (4)",
        doc=(
            "with overflow served: steps whose storage reads are in flight ahead (their buffers count in the "
            "budget, so in the resident set)"
        ),
    )
    storage_threads: int = arg(
        4,
        agree=True,
        values="int in [1, 1024] (4)",
        doc=(
            "with overflow served: the threads that read from storage: with the job's own reader where it allows "
            "concurrent reads (HDF5), else each with a reader of its own (a sharded container's readers hold its "
            "index, counted in the budget; Zarr readers hold none); from object storage, the requests in flight"
        ),
    )
    population_threads: int = arg(
        4,
        agree=False,
        values="int in [1, 1024] (4)",
        doc=(
            "reads in flight while a preload fills the windows (4 MiB pieces, one container reader per thread); "
            "1: one stream of 32 MiB reads. Pays on shared file systems, where one stream of reads waits a round "
            "trip per request"
        ),
    )
    progress_period: float | None = arg(
        None,
        agree=False,
        values="float (auto)",
        doc=(
            "seconds between the calls of a thread that drives this rank's MPI progress while it holds windows, so "
            "other nodes' gets from it complete while it computes; auto: 0.002 where a rank is on another node "
            "(or `MPIR_CVAR_NOLOCAL` is set), else none; 0: off; `$DSTORE_PROGRESS_PERIOD`"
        ),
    )

    @classmethod
    def from_options(cls, options: dict[str, Any]) -> StoreConfig:
        """A StoreConfig from keyword arguments; an unknown name is a ConfigError naming it."""
        unknown = sorted(set(options) - set(field_names()))
        if unknown:
            raise ConfigError(
                f"DataStore got unknown argument(s) {', '.join(unknown)}; known: {', '.join(field_names())}"
            )
        if "batch_size" not in options:
            raise ConfigError("DataStore needs batch_size (the global batch size)")
        return cls(**options)

    def checked(self, nranks: int) -> StoreConfig:
        """This config validated (ConfigError naming the argument and what is allowed) and
        normalised: plain ints/floats/bools, node_views and progress_period resolved from the
        environment, memory_budget in bytes."""
        self = dataclasses.replace(self, **values.typed(self))  # every bool and number by one rule
        batch_size = _positive_int("batch_size", self.batch_size)
        if batch_size < nranks:
            raise ConfigError(
                f"batch_size={self.batch_size} is the global batch size and must be >= the number of ranks ({nranks})"
            )
        policy.policy(self.shuffle)  # ConfigError naming the policies
        if self.population not in tiers.POPULATIONS:
            raise ConfigError(f"population={self.population!r} is not one of {tiers.POPULATIONS}")
        most = values.MAX_BUFFERS
        return dataclasses.replace(
            self,
            batch_size=batch_size,
            seed=shuffle.check_seed(self.seed),
            partial_fraction=shuffle.check_fraction(self.partial_fraction),
            prefetch=_positive_int("prefetch", self.prefetch, 0, most),
            memory_budget=None if self.memory_budget is None else parse_bytes(self.memory_budget),
            node_views=rc.NODE_VIEWS.get() if self.node_views is None else self.node_views,
            overflow=tiers.check_overflow(self.overflow),
            storage_lookahead=_positive_int("storage_lookahead", self.storage_lookahead, 0, most),
            storage_threads=_positive_int("storage_threads", self.storage_threads, 1, most),
            population_threads=_positive_int("population_threads", self.population_threads, 1, most),
            progress_period=_progress_period(self.progress_period),
            fields=_field_names(self.fields),
        )

    def agreed(self) -> tuple[tuple[str, Any], ...]:
        """(name, value) of every field ranks must agree on, in field order (compare `checked()` ones)."""
        return tuple((f.name, getattr(self, f.name)) for f in dataclasses.fields(self) if f.metadata["agree"])


def field_names() -> list[str]:
    """StoreConfig's field names, in order (DataStore's keywords)."""
    return [f.name for f in dataclasses.fields(StoreConfig)]


def options_from(source: Any, **given: Any) -> dict[str, Any]:
    """DataStore's keywords taken from `source` (e.g. the trainer's TrainConfig): every StoreConfig
    field that `source` has as an attribute of the same name, then `given` (which win)."""
    opts = {name: getattr(source, name) for name in field_names() if hasattr(source, name)}
    unknown = sorted(set(given) - set(field_names()))
    if unknown:
        raise ConfigError(f"not DataStore arguments: {', '.join(unknown)}")
    return {**opts, **given}


def _positive_int(name: str, value: Any, minimum: int = 1, maximum: int | None = None) -> int:
    why = " (each one a buffer or a thread)" if maximum is not None else ""
    return values.integer(name, value, minimum, maximum, why=why)


def _field_names(value: Any) -> tuple[str, ...]:
    """The fields argument as a tuple of distinct names (a single name may be given as a str)."""
    names = (value,) if isinstance(value, str) else tuple(value or ())
    if any(not isinstance(n, str) or not n for n in names) or len(set(names)) != len(names):
        raise ConfigError(f"fields={value!r} must be distinct field names (str), e.g. ['txt', 'json']")
    return names


def _progress_period(value: Any) -> float | None:
    """The progress_period argument checked (None: auto, unless $DSTORE_PROGRESS_PERIOD sets it)."""
    where = "progress_period"
    if value is None:
        return rc.PROGRESS_PERIOD.get()
    try:
        period = float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{where}={value!r} must be a number of seconds (0: no progress thread)") from None
    if not period >= 0 or period == float("inf"):
        raise ConfigError(f"{where}={value!r} must be a finite number of seconds >= 0 (0: no progress thread)")
    return period


def options_table() -> str:
    """The markdown table of DataStore's options that docs/guide.md shows (one row per field)."""
    rows = ["| option | values | ranks must agree | what it does |", "| --- | --- | --- | --- |"]
    for f in dataclasses.fields(StoreConfig):
        m = f.metadata
        rows.append(f"| `{f.name}` | {m['values']} | {'yes' if m['agree'] else 'no'} | {m['doc']} |")
    return "\n".join(rows) + "\n"


if __name__ == "__main__":  # pragma: no cover - prints the docs table
    print(options_table(), end="")
