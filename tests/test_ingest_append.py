"""Incremental ingest (issue 36, item 2): `--append-to` adds a source's samples after a container's,
extends its class map without renumbering, refuses or skips duplicates (by name, by bytes), keeps
checksums and verify whole, and swaps atomically (a reader that was open detects the change); a
store epoch over the result serves every sample once. Also `--dry-run` (item 4) and the progress
lines a batch log gets from every writing rank."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
from support.ingest import ingest_here, small_jpegs
from support.mpirun import REPO, run_mpi

from dstore.errors import ConfigError, ContainerChangedError, SampleError
from dstore.formats import open_container


@pytest.fixture(scope="module")
def sets(tmp_path_factory):
    """`old`: 60 JPEGs in classes class000..class002; `new`: 20 in class002 (other names) and class003."""
    base = tmp_path_factory.mktemp("append")
    small_jpegs(str(base / "old"), 60, seed=1, num_classes=3)
    small_jpegs(str(base / "gen"), 40, seed=2, num_classes=4)
    for cls in ("class002", "class003"):
        os.makedirs(base / "new" / cls)
        for f in sorted(os.listdir(base / "gen" / cls)):
            shutil.copy(base / "gen" / cls / f, base / "new" / cls / f"new-{f}")
    return base


def _samples(path):
    with open_container(str(path)) as r:
        return (
            [r.name(i) for i in range(r.num_samples)],
            np.asarray(r.labels),
            np.asarray(r.checksums),
            list(r.info.class_names),
            r.read_range(0, r.num_samples),
        )


def _verified(path):
    from mpi4py import MPI

    from dstore.verify import verify_container

    report = verify_container(str(path), comm=MPI.COMM_SELF)
    assert report.ok, report.summary()


@pytest.mark.parametrize(("name", "shards"), [("c.h5", 1), ("c.zarr", 1), ("cdir", 2)])
def test_append_a_new_class_extends_the_class_map_and_keeps_the_old_samples(sets, tmp_path, name, shards):
    out = tmp_path / name
    ingest_here(sets / "old", out, shards=shards, fmt="zarr" if name.endswith(".zarr") else "hdf5")
    names0, labels0, crcs0, classes0, data0 = _samples(out)
    report = ingest_here(sets / "new", None, append_to=str(out), seed=4)
    assert report.samples == 20 and any("classes added: class003" in n for n in report.notes), report.notes
    names, labels, crcs, classes, data = _samples(out)
    assert classes == classes0 + ["class003"]  # extended, never renumbered
    assert names[:60] == names0 and np.array_equal(labels[:60], labels0) and np.array_equal(crcs[:60], crcs0)
    assert np.array_equal(data[: data0.size], data0)
    new = dict(zip(names[60:], labels[60:]))
    assert sorted(new) == sorted(f"{c}/new-{f}" for c in ("class002", "class003") for f in os.listdir(sets / "gen" / c))
    assert all(v == (2 if k.startswith("class002") else 3) for k, v in new.items())
    with open_container(str(out)) as r:
        history = json.loads(r.info.extra["ingest_appends"])
        assert history == [
            {
                "source": str(sets / "new"),
                "seed": 4,
                "first_sample": 60,
                "samples": 20,
                "classes_added": ["class003"],
                "order_before": "seeded",
            }
        ]
        assert r.info.extra["ingest_order"] == "appended"
        from dstore.training.holdout import check_held_out

        with pytest.raises(ConfigError, match="written in appended order, and its tail held out"):
            check_held_out(str(out), r.info.extra, r.labels, (60, 80))  # a tail of the new samples only
        for i in range(60, 80):  # the appended bytes are the files'
            c, f = r.name(i).split("/")
            assert r.sample(i)[0].tobytes() == (sets / "new" / c / f).read_bytes()
    _verified(out)
    if shards > 1:
        assert sorted(os.listdir(out)) == [
            "manifest.json",
            "shard-00000-of-00002.h5",
            "shard-00001-of-00002.h5",
            "shard-append1-00000-of-00001.h5",
        ]


def test_duplicates_by_name_and_by_bytes_are_refused_or_skipped(sets, tmp_path):
    out = tmp_path / "c.h5"
    ingest_here(sets / "old", out)
    same_bytes = tmp_path / "same_bytes"
    shutil.copytree(sets / "new", same_bytes)
    shutil.copy(sets / "old" / "class000" / "0000000.jpg", same_bytes / "class002" / "renamed.jpg")
    with pytest.raises(
        SampleError,
        match=r"renamed\.jpg: a duplicate: the same bytes as stored sample \d+ "
        r"\(class000/0000000\.jpg\)",
    ):
        ingest_here(same_bytes, None, append_to=str(out))
    both = tmp_path / "both"
    shutil.copytree(same_bytes, both)
    os.makedirs(both / "class001")
    shutil.copy(sets / "old" / "class001" / "0000001.jpg", both / "class001" / "0000001.jpg")  # a stored name
    shutil.copy(sets / "gen" / "class001" / "0000001.jpg", both / "class001" / "fresh.jpg")
    with pytest.raises(SampleError, match=r"class001/0000001\.jpg: a duplicate: stored sample \d+ .* has its name"):
        ingest_here(both, None, append_to=str(out))
    assert len(_samples(out)[0]) == 60  # a refused append leaves the container as it was
    report = ingest_here(both, None, append_to=str(out), duplicates="skip")
    assert report.samples == 21
    assert "left out as already stored: 1 by name, 1 by content (the same bytes)" in report.notes
    names = _samples(out)[0]
    assert "class002/renamed.jpg" not in names and "class001/fresh.jpg" in names and len(names) == 81
    _verified(out)


def test_refusals_another_encoding_shards_of_one_file_and_nothing_new(sets, tmp_path):
    out = tmp_path / "c.h5"
    ingest_here(sets / "old", out)
    with pytest.raises(ConfigError, match="the container's encoding is 'jpeg'"):
        ingest_here(sets / "new", None, append_to=str(out), resize="8x8")
    with pytest.raises(ConfigError, match="writes one file"):
        ingest_here(sets / "new", None, append_to=str(out), shards=2)
    with pytest.raises(ConfigError, match="must be it or None"):
        ingest_here(sets / "new", tmp_path / "other.h5", append_to=str(out))
    with pytest.raises(SampleError, match="nothing to append"):
        ingest_here(sets / "old", None, append_to=str(out), duplicates="skip")


def test_a_reader_open_during_an_append_detects_the_change_and_a_resumed_training_state_is_refused(sets, tmp_path):
    from mpi4py import MPI

    from dstore.store.data_store import DataStore

    for out, shards in ((tmp_path / "c.h5", 1), (tmp_path / "cdir", 2)):
        ingest_here(sets / "old", out, shards=shards)
        reader = open_container(str(out))
        first = reader.read_range(0, reader.num_samples).copy()
        with DataStore(MPI.COMM_SELF, str(out), batch_size=8, seed=1) as st:
            next(iter(st.epoch(0)))
            state = st.state_dict()
        ingest_here(sets / "new", None, append_to=str(out))
        with pytest.raises(ContainerChangedError, match="changed while this job was reading it"):
            reader.check_unchanged()
        assert np.array_equal(reader.read_range(0, reader.num_samples), first)  # the old bytes, never a mix
        reader.close()
        with (
            DataStore(MPI.COMM_SELF, str(out), batch_size=8, seed=1) as st,
            pytest.raises(ConfigError, match="num_samples"),
        ):
            st.load_state_dict(state)  # a run started on the smaller set does not continue on the larger


@pytest.mark.mpi
@pytest.mark.parametrize("shards", [1, 2])
def test_a_store_epoch_over_an_appended_container_serves_every_sample_once(sets, tmp_path, shards):
    from mpi4py import MPI
    from store_scenarios import scenarios

    out = tmp_path / ("c.h5" if shards == 1 else "cdir")
    ingest_here(sets / "old", out, shards=shards)
    ingest_here(sets / "new", None, append_to=str(out))
    scenarios.scenario_exactly_once(MPI.COMM_SELF, str(out))
    res = run_mpi(2, ["python", "-m", "store_scenarios.scenarios", str(out), "exactly_once"], timeout=300)
    assert "OK exactly_once on 2 ranks" in res.stdout


@pytest.mark.mpi
def test_append_on_two_ranks_with_a_new_shard(sets, tmp_path):
    out = tmp_path / "cdir"
    ingest_here(sets / "old", out, shards=2)
    res = run_mpi(
        2, ["dstore", "ingest", str(sets / "new"), "--append-to", str(out), "--shards", "2", "--no-progress", "--json"]
    )
    assert json.loads(res.stdout)["samples"] == 20
    names, labels, _, classes, _ = _samples(out)
    assert len(names) == 80 and classes[-1] == "class003" and set(labels[60:].tolist()) == {2, 3}
    _verified(out)


def _cli(*args, env=None):
    return subprocess.run(
        [sys.executable, "-m", "dstore.tools", "ingest", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})},
    )


def test_dry_run_lists_counts_and_sizes_and_writes_nothing(sets, tmp_path):
    before = sorted(os.listdir(tmp_path))
    res = _cli(sets / "old", tmp_path / "out", "--shards", "2", "--dry-run", "--json")
    assert res.returncode == 0, res.stderr
    plan = json.loads(res.stdout)
    files = [os.path.join(r, f) for r, _, fs in os.walk(sets / "old") for f in fs]
    assert plan["samples"] == 60 and plan["bytes"] == sum(os.path.getsize(f) for f in files) and plan["bytes_exact"]
    assert plan["classes"] == [["class000", 20], ["class001", 20], ["class002", 20]]
    assert [n for _, n in plan["shards"]] == [30, 30] and plan["encoding"] == "jpeg" and plan["fields"] == []
    text = _cli(sets / "old", tmp_path / "out.h5", "--dry-run").stdout
    assert "dry run: nothing written" in text and "60 samples" in text and "3 classes" in text
    ingest_here(sets / "old", tmp_path / "c.h5")
    before = sorted(os.listdir(tmp_path))
    text = _cli(sets / "new", "--append-to", tmp_path / "c.h5", "--dry-run").stdout
    assert "20 new samples after the old ones; classes added: class003" in text, text
    assert sorted(os.listdir(tmp_path)) == before  # nothing written, not even a journal or a lock


@pytest.mark.mpi
def test_progress_lines_name_each_writing_rank_with_rate_and_time_left(tmp_path):
    res = run_mpi(
        2,
        ["dstore", "ingest", "synthetic", str(tmp_path / "out"), "--shards", "2", "--count", "400", "--no-progress"],
        env={"DSTORE_HEARTBEAT": "0.02", "DSTORE_INGEST_CHUNK_BYTES": "64KiB"},
    )
    for rank in (0, 1):
        lines = [x for x in res.stderr.splitlines() if x.startswith(f"ingest [rank {rank}: 1 of 2 shards]: ")]
        assert lines, res.stderr
        assert " of 200 samples (" in lines[-1] and "samples/s" in lines[-1] and " after " in lines[-1], lines[-1]
