"""Faults at the new surfaces (issue 39): one rule for booleans and numbers in every config, labels that
cannot be classes, waits on object storage, a failing iterable on rank 0, own scripts' errors.

Every case ends with the right result or one line, a bound on its time set by its timeout (a hang is a
failure that prints the output), and no process left behind (each command is run to its end)."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
from mpi4py import MPI
from support.formats import one_line_error
from support.mpirun import REPO

from dstore.errors import ConfigError

BOUND_S = 60
"""What any one command of these tests may take before it counts as a hang (they take a few seconds)."""


def dstore(*args, cwd=None, env=None, timeout=BOUND_S) -> subprocess.CompletedProcess:
    """`dstore ARGS` as a separate process (one rank); a hang fails the test with its output."""
    try:
        return subprocess.run([sys.executable, "-m", "dstore.tools", *map(str, args)], capture_output=True, text=True,
                              cwd=cwd or REPO, timeout=timeout, env={**os.environ, **(env or {})})
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"HANG: dstore {' '.join(map(str, args))} did not finish in {timeout}s\n"
                             f"--- stdout ---\n{exc.stdout}\n--- stderr ---\n{exc.stderr}") from None


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """Three small JPEG containers (20 samples each, different seeds) in one folder."""
    from dstore.ingest import ingest

    root = tmp_path_factory.mktemp("c39")
    for name, seed in (("a.h5", 0), ("b.h5", 1), ("c.h5", 2)):
        ingest("synthetic", str(root / name), comm=MPI.COMM_SELF, count=20, seed=seed, progress=False)
    return root


# --- item 2: one rule for booleans, integers and numbers ------------------------------------------------

FALSE_TEXTS = ["false", "no", "0", "off", " False ", 0, np.bool_(False)]


@pytest.mark.parametrize("text", FALSE_TEXTS)
def test_a_false_text_is_false_in_every_config_object(text):
    from dstore.ingest.config import IngestConfig
    from dstore.loader.config import LoaderConfig
    from dstore.store.config import StoreConfig
    from dstore.training.config import TrainConfig

    store = StoreConfig(batch_size=4, drop_last=text, replicate=text, node_views=text).checked(1)
    assert (store.drop_last, store.replicate, store.node_views) == (False, False, False)
    ingest = IngestConfig(overwrite=text, keep_order=text, progress=text, stratify=text).checked()
    assert (ingest.overwrite, ingest.keep_order, ingest.progress, ingest.stratify) == (False,) * 4
    assert LoaderConfig(pin_memory=text).checked().pin_memory is False
    train = TrainConfig(drop_last=text, nesterov=text, deterministic=text, progress=text)
    train.check()
    assert (train.drop_last, train.nesterov, train.deterministic, train.progress) == (False,) * 4


@pytest.mark.parametrize("make", [
    lambda v: __import__("dstore.store.config", fromlist=["x"]).StoreConfig(batch_size=4, drop_last=v).checked(1),
    lambda v: __import__("dstore.ingest.config", fromlist=["x"]).IngestConfig(overwrite=v).checked(),
    lambda v: __import__("dstore.loader.config", fromlist=["x"]).LoaderConfig(pin_memory=v).checked(),
    lambda v: __import__("dstore.training.config", fromlist=["x"]).TrainConfig(nesterov=v).check(),
], ids=["StoreConfig", "IngestConfig", "LoaderConfig", "TrainConfig"])
@pytest.mark.parametrize("bad", ["maybe", 2, 0.0, [], "nein"])
def test_a_value_that_is_no_boolean_is_one_line_naming_the_option(make, bad):
    with pytest.raises(ConfigError, match=r"^(drop_last|overwrite|pin_memory|nesterov)=.* must be a boolean"):
        make(bad)


def test_overwrite_false_as_text_keeps_an_existing_container(small, tmp_path):
    # the red team's case: IngestConfig(overwrite="false") replaced an existing container
    from dstore.formats import ContainerExistsError
    from dstore.ingest import ingest
    from dstore.ingest.config import IngestConfig

    out = tmp_path / "x.h5"
    ingest("synthetic", str(out), comm=MPI.COMM_SELF, count=8, progress=False)
    before = out.read_bytes()
    with pytest.raises(ContainerExistsError):
        ingest("synthetic", str(out), comm=MPI.COMM_SELF, config=IngestConfig(count=4, overwrite="false",
                                                                             progress="no"))
    assert out.read_bytes() == before


def test_drop_last_no_and_replicate_false_as_text_serve_every_sample(small):
    from dstore.store.data_store import DataStore

    path = str(small / "a.h5")  # 20 samples in batches of 8: the last one short
    with DataStore(MPI.COMM_SELF, path, batch_size=8, drop_last="no", replicate="False") as st:
        got = np.concatenate([b.ids for b in st.epoch(0)])
        assert st.config.replicate is False and st.config.drop_last is False
    assert sorted(got.tolist()) == list(range(20))


def test_a_boolean_in_a_config_file_and_an_environment_variable_follow_the_same_rule(tmp_path, monkeypatch):
    from dstore.runtime import rc
    from dstore.tools.cli import build_parser
    from dstore.tools.config_file import read_values

    train = build_parser()._subparsers._group_actions[0].choices["train"]  # type: ignore[union-attr]
    for text, want in (("no", False), ("'false'", False), ("'yes'", True), ("1", True)):
        cfg = tmp_path / "c.yaml"
        cfg.write_text(f"drop_last: {text}\n")
        assert read_values(train, str(cfg))["drop_last"] is want
        monkeypatch.setenv("DSTORE_NODE_VIEWS", text.strip("'"))
        assert rc.NODE_VIEWS.get() is want
    cfg.write_text("drop_last: maybe\n")
    with pytest.raises(ConfigError, match="drop_last='maybe' must be a boolean"):
        read_values(train, str(cfg))


@pytest.mark.parametrize("seed,what", [(-1, "-1"), (2**64, "18446744073709551616"), ("x", "'x'"), (1.5, "1.5"),
                                       (True, "True")])
def test_a_bad_seed_is_one_line_naming_seed_in_every_config(seed, what):
    from dstore.ingest.config import IngestConfig
    from dstore.store.config import StoreConfig
    from dstore.training.config import TrainConfig

    for check in (lambda: StoreConfig(batch_size=4, seed=seed).checked(1), lambda: IngestConfig(seed=seed).checked(),
                  lambda: TrainConfig(seed=seed).check()):
        with pytest.raises(ConfigError, match=rf"^seed={what.replace('.', '[.]')} must be an integer"):
            check()


@pytest.mark.parametrize("seed", ["-1", str(2**64)])
def test_dstore_ingest_with_a_seed_out_of_range_is_one_line(tmp_path, seed):
    res = dstore("ingest", "synthetic", tmp_path / "s.h5", "--count", 4, "--seed", seed)
    one_line_error(res, f"seed={seed}", "[0, 2**63)")
    assert not (tmp_path / "s.h5").exists()


@pytest.mark.parametrize("weight", ["nan", "inf", "-1"])
def test_dstore_train_with_a_weight_nan_or_inf_is_one_line(small, weight):
    res = dstore("train", small / "a.h5:0.7", f"{small / 'b.h5'}:{weight}", "--val", small / "c.h5", "--epochs", 1)
    one_line_error(res, "source 1", "b.h5", "weight")


def test_workers_and_prefetch_beyond_the_machine_are_refused_before_anything_starts(small):
    from dstore.loader.config import LoaderConfig
    from dstore.loader.store_loader import StoreLoader
    from dstore.store.data_store import DataStore
    from dstore.training.config import TrainConfig

    with pytest.raises(ConfigError, match=r"^workers=10000 decode worker processes are more than this machine "
                                          r"allows: at most \d+ \(4 per core of the \d+"):
        LoaderConfig(workers=10**4).checked()
    with pytest.raises(ConfigError, match=r"^decode_workers=10000 decode worker processes"):
        TrainConfig(decode_workers=10**4).check()
    with pytest.raises(ConfigError, match=r"^prefetch=1000000000 must be an integer <= 1024"):
        DataStore(MPI.COMM_SELF, str(small / "a.h5"), batch_size=4, prefetch=10**9)
    for name in ("storage_lookahead", "storage_threads", "population_threads"):
        with pytest.raises(ConfigError, match=rf"^{name}=100000 must be an integer <= 1024"):
            DataStore(MPI.COMM_SELF, str(small / "a.h5"), batch_size=4, **{name: 10**5})
    with DataStore(MPI.COMM_SELF, str(small / "a.h5"), batch_size=4) as st:
        children = _children()
        with pytest.raises(ConfigError, match="^workers=10000"):
            StoreLoader(st, None, size=8, workers=10**4)
        with pytest.raises(ConfigError, match="^ahead=100000 must be an integer <= 1024"):
            StoreLoader(st, None, config=LoaderConfig(ahead=10**5))
        assert _children() == children  # no process started


def _children() -> list[int]:
    """This process's child processes (by /proc)."""
    me = str(os.getpid())
    out = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as fh:
                if fh.read().rsplit(")", 1)[1].split()[1] == me:
                    out.append(int(pid))
        except OSError:
            pass
    return sorted(out)


def test_ingest_config_fields_not_names_is_one_line_naming_fields():
    from dstore.ingest.config import IngestConfig

    for bad in (5, [1, 2], {"a": 1}.keys()):
        with pytest.raises(ConfigError, match="^fields=.* must be None"):
            IngestConfig(fields=bad).checked()
    assert IngestConfig(fields=["txt"]).checked().fields == ["txt"]
