"""Runtime options: every environment variable the project reads, with its default, its doc and one
parser (as mpi4py's `rc`). Read at the moment of use, so a test or a launcher can set them per job.

Each option is an `Option`: `get()` parses the variable (unset or blank: the default; a bad value:
ConfigError naming the variable, its value and what is allowed), `raw()` gives its text. The table
in docs/guide.md is `python -m dstore.runtime.rc` (a test compares).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from dstore.errors import ConfigError
from dstore.runtime import values


@dataclasses.dataclass(frozen=True)
class Option:
    """One environment variable: its name, kind (`bool`, `int`, `bytes`, `seconds`, `path`), its
    default (text, as a user would write it; None: not set) and what it does."""

    name: str
    kind: str
    default: str | None
    doc: str

    def raw(self) -> str | None:
        """The variable's text, stripped; None where it is unset or blank."""
        text = os.environ.get(self.name, "").strip()
        return text or None

    def get(self) -> Any:
        """The variable parsed (its default where unset or blank; None if that is None too)."""
        text = self.raw()
        if text is None:
            text = self.default
        return None if text is None else parse(self, text)


def parse(option: Option, text: str) -> Any:
    """`text` as `option`'s kind; ConfigError naming the variable if it is not one."""
    kind = option.kind
    if kind == "bool":
        return values.boolean(f"${option.name}", text)  # the one rule of every boolean option
    elif kind == "int":
        return values.integer(f"${option.name}", text, 1)
    elif kind == "bytes":
        from dstore.runtime.units import parse_size  # not dstore.memory, which imports this module

        return parse_size(text, f"${option.name}")
    elif kind == "seconds":
        try:
            value = float(text)
        except ValueError:
            value = -1.0
        if 0 <= value < float("inf"):
            return value
        allowed = "a finite number of seconds >= 0"
    else:  # path
        return os.path.expanduser(text)
    raise ConfigError(f"${option.name}={text!r} must be {allowed}")


MEMORY_BUDGET = Option(
    "DSTORE_MEMORY_BUDGET",
    "bytes",
    None,
    (
        "each rank's memory budget where `memory_budget=` / `--memory-budget` is not given (e.g. `8G`); "
        "unset: 70% of the node's available memory shared by its ranks"
    ),
)
NODE_VIEWS = Option(
    "DSTORE_NODE_VIEWS",
    "bool",
    "1",
    (
        "`0`: a store gets every sample that is not this rank's own, instead of reading its node peers' "
        "windows in place (where `node_views=` is not given)"
    ),
)
PROGRESS_PERIOD = Option(
    "DSTORE_PROGRESS_PERIOD",
    "seconds",
    None,
    (
        "the period of a store's MPI progress thread where `progress_period=` is not given; 0: none; unset: "
        "automatic (0.002 s where a rank is on another node)"
    ),
)
RANKS_PER_NODE = Option(
    "DSTORE_RANKS_PER_NODE",
    "int",
    None,
    (
        "tests on one machine: a store treats each run of this many consecutive ranks as a node (samples of "
        'other "nodes" are then served with gets)'
    ),
)
CACHE = Option("DSTORE_CACHE", "path", "~/.cache/dstore", "where `dstore train` ingests its built-in data sets")
MOSAIC_VENV = Option(
    "DSTORE_MOSAIC_VENV",
    "path",
    None,
    (
        "the virtual environment with mosaicml-streaming that `dstore bench` compares against "
        "(default: the one tools/setup_mosaic.sh makes)"
    ),
)
DALI_PYTHON = Option(
    "DSTORE_DALI_PYTHON",
    "path",
    None,
    (
        "the Python of the virtual environment with NVIDIA DALI that `dstore bench --peers` and "
        "`python -m dstore.tools.measure.loader --dali` compare against (default: the one tools/setup_dali.sh makes)"
    ),
)
PEERS_PYTHON = Option(
    "DSTORE_PEERS_PYTHON",
    "path",
    None,
    (
        "the Python of the virtual environment with the peers' writers (LitData, Mosaic Streaming, webdataset, "
        "datasets) that `python -m dstore.tools.measure.ingest` compares against (default: the one "
        "tools/setup_ingest_peers.sh makes)"
    ),
)
LARGE_TESTS = Option("DSTORE_LARGE_TESTS", "bool", "0", "tests: `1` runs the tests that need 12 GiB of memory")
SCENARIO_TIMEOUT = Option(
    "DSTORE_SCENARIO_TIMEOUT",
    "seconds",
    "100",
    ("tests: seconds before a store scenario dumps its tracebacks and exits (a hang made a failure)"),
)
HEARTBEAT = Option(
    "DSTORE_HEARTBEAT",
    "seconds",
    "30",
    (
        "seconds between the heartbeat lines rank 0 writes during a store's population, `dstore verify` and "
        "`dstore ingest` without a progress bar (where `heartbeat=` is not given); 0: none"
    ),
)
INGEST_CHECKPOINT = Option(
    "DSTORE_INGEST_CHECKPOINT",
    "seconds",
    "10",
    (
        "seconds between the checkpoints of a resumable `dstore ingest` (each makes the written data chunks "
        "durable and logs them in the journal beside the output); 0: after every round"
    ),
)
INGEST_CHUNK_BYTES = Option(
    "DSTORE_INGEST_CHUNK_BYTES",
    "bytes",
    "8MiB",
    (
        "the chunk size of a new container's `data` array: what an ingest writes at once and the unit a resume "
        "keeps (a resumed ingest uses its journal's)"
    ),
)
INGEST_KILL_AT = Option(
    "DSTORE_INGEST_KILL_AT",
    "path",
    None,
    (
        "tests: `SIGNAL:N` (e.g. `SIGKILL:600`): an ingest's writer sends its own process SIGNAL once its journal "
        "has logged N positions of a shard (an interruption at a known point, for the resume tests)"
    ),
)
ALL_RANK_WARNINGS = Option(
    "DSTORE_ALL_RANK_WARNINGS",
    "bool",
    "0",
    ("`1`: every rank of a `dstore` command prints its Python warnings (by default rank 0 alone, once per job)"),
)
NATIVE = Option(
    "DSTORE_NATIVE",
    "bool",
    "1",
    (
        "`0`: the per-sample resize, crop and flip run in numpy instead of the compiled kernels "
        "(dstore.codec.kernels, numba; the same pixels)"
    ),
)
NATIVE_AFTER = Option(
    "DSTORE_NATIVE_AFTER",
    "int",
    "2000",
    (
        "samples of 64x64 px or more a process resizes in numpy before it loads the compiled kernels "
        "(dstore.codec.kernels: loading costs about 1 s of CPU, repaid after about 4,000 224px samples)"
    ),
)
PARTIAL_DECODE = Option(
    "DSTORE_PARTIAL_DECODE",
    "bool",
    "1",
    (
        "`0`: crop-aware decodes (`--augment imagenet`) decode whole JPEGs with simplejpeg instead of "
        "libjpeg-turbo's partial decode (dstore.codec._jpegcrop; the same pixels, each file checked to its end)"
    ),
)
WORKERS_READ = Option(
    "DSTORE_WORKERS_READ",
    "bool",
    "1",
    (
        "`0`: a loader's rank copies each batch's bytes into its decode workers' shared memory, instead of the "
        "workers reading the samples held in the store's windows out of the rank's memory themselves "
        "(dstore.loader.vmread, process_vm_readv, where the system allows it; the same bytes)"
    ),
)
CLUSTER_EVENTS = Option(
    "DSTORE_CLUSTER_EVENTS",
    "path",
    None,
    (
        "set by `dstore cluster run` for its launchers, not by users: the file each node's launcher appends how "
        "its MPI proxy started and ended to, so that a node whose every process was killed is named "
        "(dstore.tools.cluster, NOTE [ A node lost ])"
    ),
)
WAIT_BOUND = Option(
    "DSTORE_WAIT_BOUND",
    "seconds",
    "60",
    (
        "seconds a rank of a store on several hosts waits on another node (its gets, an agreement) before it "
        "asks the node whether it is alive: a node that does not answer in as long, or gets still unanswered, "
        "end the job with one line naming the node (dstore.runtime.watchdog: within 2 x this + 13 s at most; "
        "docs/reliability.md); 0: no watchdog"
    ),
)
OBJECT_TIMEOUT = Option(
    "DSTORE_OBJECT_TIMEOUT",
    "seconds",
    "10",
    (
        "object storage (`s3://`): seconds a request may wait for a connection (a free one of the pool, then the "
        "connect), and then for each answer (each read of the socket), before it counts as failed "
        "(dstore.formats.objects.storage_options); every wait on the store, in every command and in a script's "
        "DataStore, is bounded by it and `DSTORE_OBJECT_TRIES`"
    ),
)
OBJECT_TRIES = Option(
    "DSTORE_OBJECT_TRIES",
    "int",
    "3",
    (
        "object storage: tries of a request that timed out or failed to connect (botocore's, with its backoff: "
        "up to 2^k s), and of a read whose answer stopped mid-way (0.1 s x 2^k), before the error names the URL "
        "and the wait"
    ),
)
OBJECT_CONNECTIONS = Option(
    "DSTORE_OBJECT_CONNECTIONS",
    "int",
    "64",
    (
        "object storage: connections a process keeps to a store (its pool; an ingest's reads in flight are no "
        "more); a request that finds them all busy for `DSTORE_OBJECT_TIMEOUT` seconds counts as failed"
    ),
)
MPICH_NOLOCAL = Option(
    "MPIR_CVAR_NOLOCAL",
    "bool",
    "0",
    ("MPICH's own (read, not set): shared memory forbidden between ranks, so a store runs its progress thread"),
)

OPTIONS = {
    o.name: o
    for o in (
        MEMORY_BUDGET,
        NODE_VIEWS,
        PROGRESS_PERIOD,
        RANKS_PER_NODE,
        CACHE,
        MOSAIC_VENV,
        DALI_PYTHON,
        PEERS_PYTHON,
        LARGE_TESTS,
        SCENARIO_TIMEOUT,
        HEARTBEAT,
        INGEST_CHECKPOINT,
        INGEST_CHUNK_BYTES,
        INGEST_KILL_AT,
        ALL_RANK_WARNINGS,
        NATIVE,
        NATIVE_AFTER,
        PARTIAL_DECODE,
        WORKERS_READ,
        CLUSTER_EVENTS,
        WAIT_BOUND,
        OBJECT_TIMEOUT,
        OBJECT_TRIES,
        OBJECT_CONNECTIONS,
        MPICH_NOLOCAL,
    )
}
"""Every runtime option, by variable name."""


def options_table() -> str:
    """The markdown table of the runtime options that docs/guide.md shows."""
    rows = ["| variable | kind | default | what it does |", "| --- | --- | --- | --- |"]
    for o in OPTIONS.values():
        rows.append(f"| `{o.name}` | {o.kind} | {'unset' if o.default is None else f'`{o.default}`'} | {o.doc} |")
    return "\n".join(rows) + "\n"


if __name__ == "__main__":  # pragma: no cover - prints the docs table
    print(options_table(), end="")
