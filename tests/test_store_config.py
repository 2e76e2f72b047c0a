"""StoreConfig, the one source of DataStore's arguments: which ones ranks must agree on, the docs
table of them, and the defect it closed (an argument that changes the resident set, not compared)."""

from __future__ import annotations

import pytest
from store_scenarios import scenarios
from support.mpirun import run_mpi

_THREADS_DIFFER = (
    "import sys, zlib\n"
    "import numpy as np\n"
    "from mpi4py import MPI\n"
    "from dstore.formats import open_container\n"
    "from dstore.store.data_store import DataStore\n"
    "comm, path = MPI.COMM_WORLD, sys.argv[1]\n"
    "r = comm.rank\n"
    "kw = dict(batch_size=16, seed=3, storage_threads=4 if r == 0 else 1)\n"
    "probe = DataStore(comm, path, **kw)\n"
    "budget = probe.tier_overhead() + int(0.39 * int(probe.layout.nbytes.max()))\n"
    "probe.close()\n"
    "ref = open_container(path)\n"
    "try:\n"
    "    with DataStore(comm, path, memory_budget=budget, **kw) as st:\n"
    "        wrong = served = 0\n"
    "        for b in st.epoch(0):\n"
    "            for i, x in zip(b.ids.tolist(), b.samples):\n"
    "                served += 1\n"
    "                wrong += zlib.crc32(x) != zlib.crc32(ref.sample(i)[0])\n"
    "    print(f'\\nrank {r} | served {comm.allreduce(served)} wrong {comm.allreduce(wrong)}', flush=True)\n"
    "except Exception as exc:\n"
    "    print(f'\\nrank {r} | {type(exc).__name__}: {exc}', flush=True)\n"
)


@pytest.mark.mpi
def test_storage_threads_differing_between_ranks_is_refused_on_every_rank(tmp_path):
    # Issue 21: storage_threads counts in the buffers a tiered rank holds, so it changes which
    # samples stay resident; it was not compared across ranks, and with 4 threads on rank 0 and 1
    # on rank 1 (about a third resident) the ranks chose different resident sets and served wrong bytes for
    # about a quarter of the samples with exit code 0. Now every rank raises a ConfigError naming it.
    path = scenarios.make_container(str(tmp_path / "c.h5"), n=4000, seed=2, large=2000, small=2000)
    script = tmp_path / "threads.py"
    script.write_text(_THREADS_DIFFER)
    res = run_mpi(2, ["python", str(script), path], timeout=120)
    out = res.stdout + res.stderr
    said = [x for x in res.stdout.splitlines() if x.startswith("rank ")]
    assert len(said) == 2, out
    for line in said:
        assert "ConfigError" in line and "storage_threads" in line and "differ between ranks" in line, out


def test_every_argument_says_whether_ranks_must_agree_and_the_plan_changing_ones_do():
    import dataclasses

    from dstore.store.config import StoreConfig

    fields = {f.name: f.metadata for f in dataclasses.fields(StoreConfig)}
    assert all(isinstance(m.get("agree"), bool) and m.get("doc") and m.get("values") for m in fields.values())
    agreed = {n for n, m in fields.items() if m["agree"]}
    # what the plan or the resident set is computed from (dstore.order.plan, dstore.order.tiers via the budget's buffers)
    assert {
        "batch_size",
        "seed",
        "shuffle",
        "partial_fraction",
        "population",
        "replicate",
        "prefetch",
        "drop_last",
        "sample_range",
        "overflow",
        "storage_lookahead",
        "storage_threads",
    } <= agreed
    # how a rank reads, or its own budget (gathered, not compared): may differ
    assert not agreed & {"memory_budget", "node_views", "population_threads", "progress_period"}
    from dstore.store.config import arg

    with pytest.raises(TypeError, match="agree"):  # a new field cannot leave it out
        arg(1, values="int", doc="x")  # pyright: ignore[reportCallIssue]


def test_the_guide_shows_the_generated_table_of_options():
    from pathlib import Path

    from dstore.store.config import options_table

    guide = (Path(__file__).resolve().parent.parent / "docs" / "guide.md").read_text()
    assert options_table() in guide, "docs/guide.md: paste `python -m dstore.store.config` under Store options"


def test_datastore_keywords_are_the_config_fields(tmp_path):
    from mpi4py import MPI

    from dstore.errors import ConfigError
    from dstore.store.config import StoreConfig, options_from
    from dstore.store.data_store import DataStore

    path = scenarios.make_container(str(tmp_path / "c.h5"), n=20)
    with pytest.raises(ConfigError, match="unknown argument.*storage_thread\\b"):
        DataStore(MPI.COMM_SELF, path, batch_size=4, storage_thread=2)
    with pytest.raises(ConfigError, match="storage_threads=0 must be an integer >= 1"):
        DataStore(MPI.COMM_SELF, path, StoreConfig(batch_size=4, storage_threads=0))
    with DataStore(MPI.COMM_SELF, path, StoreConfig(batch_size=4, seed=5, sample_range=None)) as st:
        assert st.config.sample_range == (0, 20) and st.config.seed == 5 and st.seed == 5
        assert sum(len(b) for b in st.epoch(0)) == 20

    class Run:  # what the trainer passes: the fields its config shares with StoreConfig, then its own
        batch_size, shuffle, prefetch, lr = 8, "local", 3, 0.1

    assert options_from(Run(), seed=2) == {"batch_size": 8, "shuffle": "local", "prefetch": 3, "seed": 2}
    with pytest.raises(ConfigError, match="not DataStore arguments: lr"):
        options_from(Run(), lr=1)


def test_train_flags_for_the_storage_tier_reach_the_store():
    # a container in object storage needs more reads in flight than a disk: `dstore train
    # --storage-threads 16 --storage-lookahead 8` must be what its stores are built with
    from dstore.store.config import options_from
    from dstore.tools.cli import build_parser
    from dstore.tools.flags import from_args
    from dstore.training.config import TrainConfig
    from dstore.training.resume import CHANGEABLE

    commands = next(a.choices for a in build_parser()._actions if isinstance(a.choices, dict))
    cfg = from_args(TrainConfig, commands["train"].parse_args(["--storage-threads", "16", "--storage-lookahead", "8"]))
    opts = options_from(cfg, seed=1)
    assert opts["storage_threads"] == 16 and opts["storage_lookahead"] == 8
    assert {"storage_threads", "storage_lookahead"} <= set(CHANGEABLE)  # how a run reads, not what it learns
