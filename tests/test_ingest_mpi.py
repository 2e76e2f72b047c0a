"""`dstore ingest` under real `mpiexec -n N`: the same container content on 1, 2 and 4 ranks, both
backends, shards, error policies ending the whole job, CIFAR and synthetic sources."""

import json
import os
import zlib

import numpy as np
import pytest
from support.ingest import add_bad, check_container_against_folder, leftovers, listing, make_mixed_folder, write_cifar10
from support.mpirun import run_mpi

from dstore.formats import open_container
from dstore.ingest import open_source
from dstore.ingest.plan import group_chunk, sample_order

pytestmark = pytest.mark.mpi


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    root = tmp_path_factory.mktemp("mpi_mixed") / "images"
    make_mixed_folder(str(root), jpegs=30, pngs=14)
    return str(root)


def ingest_cli(nprocs, *args, check=True):
    return run_mpi(nprocs, ["dstore", "ingest", *map(str, args), "--no-progress", "--json"], timeout=120, check=check)


def verify(path):
    from mpi4py import MPI

    from dstore.verify import verify_container

    report = verify_container(str(path), comm=MPI.COMM_SELF)
    assert report.ok, report.summary()


@pytest.mark.parametrize("nprocs", [1, 2, 4])
def test_folder_same_container_on_any_number_of_ranks(mixed, tmp_path, nprocs):
    out = tmp_path / "out.h5"
    result = ingest_cli(nprocs, mixed, out, "--seed", 7)
    report = json.loads(result.stdout)
    assert report["samples"] == 44 and report["ranks"] == nprocs and report["encoding"] == "image"
    check_container_against_folder(str(out), mixed, expect_encoding="image")
    with open_container(str(out)) as c:
        # The write order is the seeded permutation, whatever the number of ranks.
        assert np.array_equal(c.source_index, sample_order(44, 7))
    verify(out)


@pytest.mark.parametrize("nprocs, shards, fmt", [(2, 4, "hdf5"), (4, 2, "zarr"), (2, 3, "hdf5")])
def test_shards_written_in_parallel_with_a_manifest(mixed, tmp_path, nprocs, shards, fmt):
    out = tmp_path / "sharded"
    ingest_cli(nprocs, mixed, out, "--shards", shards, "--format", fmt)
    assert sorted(os.listdir(out)) == ["manifest.json"] + [
        f"shard-{s:05d}-of-{shards:05d}.{'h5' if fmt == 'hdf5' else 'zarr'}" for s in range(shards)
    ]
    check_container_against_folder(str(out), mixed)
    with open_container(str(out)) as c:
        assert np.array_equal(c.source_index, sample_order(44, 0))
    verify(out)


def test_zarr_single_file_two_ranks(mixed, tmp_path):
    out = tmp_path / "out.zarr"
    ingest_cli(2, mixed, out)
    check_container_against_folder(str(out), mixed)
    verify(out)


def test_a_bad_file_on_any_rank_ends_the_job_with_its_path_and_leaves_nothing(mixed, tmp_path):
    import shutil

    root = tmp_path / "images"
    shutil.copytree(mixed, root)
    path, word = add_bad(str(root), "truncated_jpeg")
    # Pick a seed that puts the bad file in a chunk a rank other than the writer (rank 0) processes.
    n, i = 45, [name for name, _ in listing(str(root))].index(os.path.relpath(path, root))
    chunk = group_chunk(n, 4, open_source(str(root)).estimated_sample_bytes)
    seed = next(s for s in range(100) if (int(np.flatnonzero(sample_order(n, s) == i)[0]) // chunk) % 4 != 0)
    result = ingest_cli(4, root, tmp_path / "out.h5", "--seed", seed, check=False)
    assert result.returncode != 0 and path in result.stderr and word in result.stderr, (
        result.returncode,
        result.stdout,
        result.stderr,
    )
    assert leftovers(str(tmp_path)) == []
    result = ingest_cli(2, root, tmp_path / "sh", "--shards", 2, check=False)
    assert result.returncode != 0 and path in result.stderr, (result.returncode, result.stdout, result.stderr)
    assert not os.path.exists(tmp_path / "sh" / "manifest.json")
    assert leftovers(str(tmp_path)) == [] and (not (tmp_path / "sh").exists() or not os.listdir(tmp_path / "sh"))


def test_skip_lists_every_bad_file_across_ranks(mixed, tmp_path):
    import shutil

    root = tmp_path / "images"
    shutil.copytree(mixed, root)
    bad = dict(
        add_bad(str(root), k)
        for k in (
            "undecodable",
            "truncated_jpeg",
            "truncated_png",
            "empty_file",
            "not_an_image",
            "broken_link",
            "empty_class",
        )
    )
    result = ingest_cli(2, root, tmp_path / "out.h5", "--on-error", "skip")
    report = json.loads(result.stdout)
    skipped = dict(report["skipped"])
    assert set(skipped) == set(bad)
    assert all(word in skipped[p] for p, word in bad.items())
    assert report["samples"] == 44
    check_container_against_folder(str(tmp_path / "out.h5"), str(root), exclude=bad, check_index=False)
    text = run_mpi(
        1, ["dstore", "ingest", str(root), str(tmp_path / "t.h5"), "--on-error", "skip", "--no-progress"]
    ).stdout
    assert "skipped 7:" in text and all(p in text for p in bad)


def test_cifar_and_synthetic_two_ranks(tmp_path):
    batches = write_cifar10(str(tmp_path / "cifar"), per_batch=30, batches=3)
    ingest_cli(2, tmp_path / "cifar", tmp_path / "c.zarr")
    with open_container(str(tmp_path / "c.zarr")) as c:
        assert c.num_samples == 90 and c.info.raw_shape == (32, 32, 3)
        # Raw samples too: the checksums the processing ranks sent are CRC32 of the stored bytes.
        assert all(int(c.checksums[j]) == zlib.crc32(c.sample(j)[0].data) for j in range(90))
        labels = sum((b[b"labels"] for b in batches), [])
        assert c.labels.tolist() == [labels[i] for i in c.source_index]
        data = np.concatenate([b[b"data"] for b in batches])
        assert all(
            np.array_equal(
                c.sample(j)[0], data[int(c.source_index[j])].reshape(3, 32, 32).transpose(1, 2, 0).reshape(-1)
            )
            for j in range(90)
        )
    verify(tmp_path / "c.zarr")

    ingest_cli(
        2,
        "synthetic",
        tmp_path / "s.h5",
        "--count",
        16,
        "--seed",
        3,
        "--mean-bytes",
        3000,
        "--min-side",
        48,
        "-O",
        "max_side=64",
    )
    from dstore.ingest.synthetic import SyntheticSource

    src = SyntheticSource(16, seed=3, mean_bytes=3000, min_side=48, max_side=64)
    with open_container(str(tmp_path / "s.h5")) as c:
        assert c.info.encoding == "jpeg"
        for j in range(16):
            i = int(c.source_index[j])
            assert bytes(c.sample(j)[0]) == src.load(i) and c.name(j) == src.name(i)


def test_library_raises_the_same_error_on_every_rank_instead_of_hanging(mixed, tmp_path):
    import shutil

    root = tmp_path / "images"
    shutil.copytree(mixed, root)
    path, _ = add_bad(str(root), "undecodable")
    scenarios = [
        {"source": str(root), "output": str(tmp_path / "sh"), "shards": 3},  # a group per rank
        {"source": str(root), "output": str(tmp_path / "one.zarr"), "fmt": "zarr"},
        {"source": str(root), "output": str(tmp_path / "ok.h5"), "on_error": "skip"},
    ]
    results = tmp_path / "results"
    results.mkdir()
    run_mpi(
        3,
        [
            "python",
            os.path.join(os.path.dirname(__file__), "ingest_library_run.py"),
            str(results),
            *map(json.dumps, scenarios),
        ],
        timeout=120,
    )
    per_rank = [[json.loads(line) for line in (results / f"rank{r}.jsonl").read_text().splitlines()] for r in range(3)]
    for lines in per_rank:
        assert len(lines) == 3, lines
        for failed in lines[:2]:
            assert not failed["ok"] and failed["type"] == "SampleError" and path in failed["message"], failed
        assert lines[2]["ok"] and lines[2]["samples"] == 44, lines[2]
    assert not (tmp_path / "sh").exists() or os.listdir(tmp_path / "sh") == []
    assert leftovers(str(tmp_path)) == ["ok.h5"]
