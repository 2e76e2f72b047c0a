"""Resumable ingest (issue 36, item 1): an ingest interrupted half way (SIGKILL, SIGTERM, a bad sample
under on_error="raise") leaves a journal beside its output; the same command again writes only what
is missing, and the container equals an uninterrupted ingest's in every array and attribute. A
changed source or option is refused in one line naming it; a half-written output is never opened."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from support.ingest import ingest_here, small_jpegs
from support.mpirun import REPO, run_mpi

from dstore.errors import ConfigError, ContainerNotFoundError, IncompleteContainerError, SampleError
from dstore.formats import open_container
from dstore.ingest import plan
from dstore.ingest.journal import Journal, journal_dir

N = 240
SMALL = {"DSTORE_INGEST_CHUNK_BYTES": "16KiB", "DSTORE_INGEST_CHECKPOINT": "0"}
"""A checkpoint per round and 16 KiB chunks: the small test sets have durable chunks half way."""


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("resume") / "images"
    small_jpegs(str(root), N, seed=3, num_classes=4)
    return str(root)


@pytest.fixture
def small_chunks(monkeypatch):
    for k, v in SMALL.items():
        monkeypatch.setenv(k, v)


def same_container(a: str, b: str, *, same_id: bool = True) -> None:
    """Every array, name, field and attribute of containers `a` and `b` equal (sharded: shard by shard);
    the `ingest_id` attribute too where `same_id` (a digest of the source's files as the first run saw them)."""
    with open_container(a) as x, open_container(b) as y:
        if same_id:
            assert x.info == y.info
        else:
            assert x.info.extra.pop("ingest_id") != y.info.extra.pop("ingest_id")
            assert x.info == y.info
        for key in ("offsets", "labels", "checksums", "source_index"):
            assert np.array_equal(getattr(x, key), getattr(y, key)), key
        assert [x.name(i) for i in range(x.num_samples)] == [y.name(i) for i in range(y.num_samples)]
        assert np.array_equal(x.read_range(0, x.num_samples), y.read_range(0, y.num_samples))
        for sx, sy in zip(getattr(x, "shards", ()), getattr(y, "shards", ())):
            assert sx.info == sy.info  # ingest_id too: a resumed ingest keeps its id, the fingerprint's digest


def cli(*args, env=None, check=True):
    cmd = [sys.executable, "-m", "dstore.tools", "ingest", *map(str, args), "--no-progress"]
    res = subprocess.run(
        cmd,
        capture_output=True,
        text=True,
        timeout=180,
        env={**os.environ, "PYTHONPATH": str(REPO), **SMALL, **(env or {})},
    )
    if check:
        assert res.returncode == 0, res.stderr
    return res


def journaled_positions(output: str, shards: int) -> int:
    journal = Journal.load(journal_dir(output))
    assert journal is not None, f"no journal beside {output}"
    return journal.positions_done(shards)


CASES = [
    ("out.h5", 1, "SIGKILL"),
    ("out.h5", 1, "SIGTERM"),
    ("outdir", 3, "SIGKILL"),
    ("outdir", 3, "SIGTERM"),
    ("out.zarr", 1, "SIGKILL"),
]


@pytest.mark.parametrize(("name", "shards", "sig"), CASES, ids=[f"{n}-{s}-{g}" for n, s, g in CASES])
def test_killed_half_way_then_resumed_equals_an_uninterrupted_ingest(folder, tmp_path, small_chunks, name, shards, sig):
    ref = tmp_path / ("ref" + os.path.splitext(name)[1])
    ingest_here(folder, ref, shards=shards, fmt="zarr" if name.endswith(".zarr") else "hdf5")
    out = tmp_path / name
    first = cli(
        folder, out, "--shards", shards, env={"DSTORE_INGEST_KILL_AT": f"{sig}:{N // 2 // shards}"}, check=False
    )
    assert first.returncode == (137 if sig == "SIGKILL" else 143) or first.returncode < 0, first.stderr
    done = journaled_positions(str(out), shards)
    assert 0 < done < N, done
    with pytest.raises((ContainerNotFoundError, IncompleteContainerError), match="interrupted"):  # never a container
        open_container(str(out))
    command = "verify" if sig == "SIGKILL" else "info"
    refused = subprocess.run(
        [sys.executable, "-m", "dstore.tools", command, str(out)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert refused.returncode != 0 and "its ingest was interrupted" in refused.stderr, refused.stderr
    assert "Traceback" not in refused.stderr
    second = cli(folder, out, "--shards", shards, "--json")
    report = json.loads(second.stdout)
    assert report["samples"] == N and any("resumed an interrupted ingest" in n for n in report["notes"]), report
    same_container(str(ref), str(out))
    assert not os.path.exists(journal_dir(out))  # gone once the container is complete
    assert sorted(os.listdir(tmp_path)) == sorted([ref.name, name])  # no lock, temporary or journal left


def test_a_bad_sample_under_raise_keeps_the_part_before_it_and_a_fixed_file_resumes(tmp_path, small_chunks):
    root = tmp_path / "images"
    small_jpegs(str(root), N, seed=4, num_classes=3)
    files = sorted(os.path.relpath(os.path.join(r, f), root) for r, _, fs in os.walk(root) for f in fs)
    bad = files[int(plan.sample_order(N, 0)[int(N * 0.7)])]  # written at position 0.7 N
    good = (root / bad).read_bytes()
    (root / bad).write_bytes(good[: len(good) // 3])  # truncated: a bad sample
    with pytest.raises(SampleError, match=bad.split("/")[-1]):
        ingest_here(root, tmp_path / "out.h5")
    done = journaled_positions(str(tmp_path / "out.h5"), 1)
    assert 0 < done <= int(N * 0.7)
    (root / bad).write_bytes(good)  # a file not written yet may change: it is read when its turn comes
    report = ingest_here(root, tmp_path / "out.h5")
    assert report.samples == N and any("resumed" in n for n in report.notes)
    ingest_here(root, tmp_path / "ref.h5")
    # The id is the digest of the files as the first run found them: the replaced file was older then.
    same_container(str(tmp_path / "ref.h5"), str(tmp_path / "out.h5"), same_id=False)


def _interrupted(tmp_path, n=N):
    """A folder and an ingest of it stopped at 0.7 N by a bad sample: (root, output, the bad file)."""
    root = tmp_path / "images"
    small_jpegs(str(root), n, seed=5, num_classes=3)
    files = sorted(os.path.relpath(os.path.join(r, f), root) for r, _, fs in os.walk(root) for f in fs)
    bad = files[int(plan.sample_order(n, 0)[int(n * 0.7)])]
    (root / bad).write_bytes(b"not a jpeg")
    with pytest.raises(SampleError):
        ingest_here(root, tmp_path / "out.h5")
    return root, tmp_path / "out.h5", files


def test_changed_options_and_source_are_refused_naming_what_changed(tmp_path, small_chunks):
    root, out, files = _interrupted(tmp_path)
    with pytest.raises(ConfigError, match=r"options changed: seed 0 -> 1.*--restart"):
        ingest_here(root, out, seed=1)
    with pytest.raises(ConfigError, match=r"options changed: keep_order False -> True"):
        ingest_here(root, out, keep_order=True)
    written = files[int(plan.sample_order(N, 0)[0])]  # position 0: durable
    os.utime(root / written, ns=(1, 1))
    with pytest.raises(ConfigError, match=rf"the source changed: .*{written.split('/')[-1]} modification time changed"):
        ingest_here(root, out)
    small_jpegs(str(tmp_path / "more"), 1, seed=9)
    os.rename(tmp_path / "more" / "class000" / "0000000.jpg", root / "class000" / "extra.jpg")
    with pytest.raises(ConfigError, match=r"the source changed: 1 sample\(s\) added \(e\.g\. class000/extra\.jpg\)"):
        ingest_here(root, out)
    assert os.path.isdir(journal_dir(out))  # a refusal keeps the journal
    os.remove(root / "class000" / "extra.jpg")
    report = ingest_here(root, out, resume=False, on_error="skip")  # --restart: from zero
    assert report.samples == N - 1 and not any("resumed" in n for n in report.notes)


def test_resume_true_needs_a_journal_and_on_error_may_change(tmp_path, small_chunks):
    small_jpegs(str(tmp_path / "a"), 30, seed=1)
    with pytest.raises(ConfigError, match="no interrupted ingest of .* to resume"):
        ingest_here(tmp_path / "a", tmp_path / "a.h5", resume=True)
    root, out, _ = _interrupted(tmp_path)
    report = ingest_here(root, out, resume=True, on_error="skip")  # the rerun after a bad sample
    assert report.samples == N - 1 and len(report.skipped) == 1 and any("resumed" in n for n in report.notes)


def test_a_torn_durable_chunk_is_written_again(tmp_path, small_chunks):
    """A checkpoint whose bytes do not read back (a chunk lost to a crash) ends the kept prefix there."""
    root, out, _ = _interrupted(tmp_path)
    journal = Journal.load(journal_dir(out))
    state = None if journal is None else journal.state(0)
    assert state is not None
    with open(state.tmp, "r+b") as f:  # damage the third durable chunk in the temporary
        f.seek(int(state.locators[2]) + 100)
        f.write(b"\0" * 64)
    report = ingest_here(root, out, on_error="skip")
    assert report.samples == N - 1 and any("resumed" in n for n in report.notes)
    ingest_here(root, tmp_path / "ref.h5", on_error="skip")
    same_container(str(tmp_path / "ref.h5"), str(out))


MPI_CASES = [("out.h5", 1, "SIGKILL"), ("outdir", 2, "SIGTERM")]


@pytest.mark.mpi
@pytest.mark.parametrize(("name", "shards", "sig"), MPI_CASES, ids=[f"{n}-{g}" for n, _, g in MPI_CASES])
def test_two_ranks_killed_then_resumed_on_two_ranks(folder, tmp_path, name, shards, sig):
    ref = tmp_path / "ref.h5"
    ingest_here(folder, ref, shards=shards)
    out = tmp_path / name
    args = ["dstore", "ingest", folder, str(out), "--shards", str(shards), "--no-progress"]
    first = run_mpi(2, args, env={**SMALL, "DSTORE_INGEST_KILL_AT": f"{sig}:{N // 2 // shards}"}, check=False)
    assert first.returncode != 0
    done = journaled_positions(str(out), shards)
    assert 0 < done < N, (done, first.stderr)
    second = run_mpi(2, args + ["--json"], env=SMALL)
    assert any("resumed" in n for n in json.loads(second.stdout)["notes"])
    same_container(str(ref), str(out))
    assert not os.path.exists(journal_dir(out))


def test_a_full_disk_keeps_the_durable_part_and_the_same_command_resumes_once_there_is_room(
    folder, tmp_path, small_chunks
):
    import subprocess as sp

    from support.fixtures import tmpfs

    with tmpfs(tmp_path / "disk", "size=400k") as disk:
        res = cli(folder, disk / "out.h5", check=False)
        assert res.returncode != 0 and "No space left on device" in res.stderr and "Traceback" not in res.stderr, (
            res.stderr
        )
        done = journaled_positions(str(disk / "out.h5"), 1)
        assert 0 < done < N, done
        sp.run(["mount", "-o", "remount,size=4m", str(disk)], check=True)  # room again
        report = json.loads(cli(folder, disk / "out.h5", "--json").stdout)
        assert any("resumed" in n for n in report["notes"]), report
        ingest_here(folder, tmp_path / "ref.h5")
        same_container(str(tmp_path / "ref.h5"), str(disk / "out.h5"))
        assert sorted(os.listdir(disk)) == ["out.h5"]
