"""`verify_container` / `dstore verify` find every damaged sample by index and name (on 1 and 2
ranks), `container_info` / `dstore info` summarise a container, and docs/format.md's snippets run."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from support.formats import BACKENDS, build, flip_byte, image_bytes, random_samples, write_samples
from support.mpirun import REPO, run_mpi

from dstore.errors import IncompleteContainerError
from dstore.formats import open_container
from dstore.verify import BadSample, container_info, format_info, verify_container

SAMPLES = random_samples(30, seed=3)
BAD = 18  # the sample the corruption tests damage
BAD_NAME = SAMPLES[BAD][2]


def dstore(*args, check=False):
    return subprocess.run(
        [sys.executable, "-m", "dstore.tools", *map(str, args)],
        capture_output=True,
        text=True,
        cwd=REPO,
        check=check,
        timeout=120,
    )


@pytest.mark.parametrize("backend", BACKENDS)
def test_flipped_byte_is_found_by_index_and_name(tmp_path, backend):
    path = build(tmp_path, backend, SAMPLES, chunk_bytes=1024)
    assert verify_container(path).ok
    flip_byte(path, BAD, within=5)
    report = verify_container(path, read_size=4096)  # several reads, so the run boundaries are crossed
    assert not report.ok
    assert [(b.index, b.name) for b in report.bad] == [(BAD, BAD_NAME)]
    assert "checksum mismatch" in report.bad[0].reason
    assert f"sample {BAD} ({BAD_NAME})" in report.summary()


@pytest.mark.parametrize("fmt", ["hdf5", "zarr"])
def test_a_wrong_caller_checksum_is_stored_as_given_and_found_by_verify(tmp_path, fmt):
    # A writer trusts a checksum its caller vouches for (ingest's processing ranks send theirs);
    # verify is what catches a wrong one, by index and name, whether it came through append or extend.
    from dstore.formats import checksum, create_writer

    samples = SAMPLES[:12]
    path = tmp_path / f"c.{'h5' if fmt == 'hdf5' else 'zarr'}"
    crcs = [checksum(d) for d, *_ in samples]
    crcs[3] ^= 1
    crcs[9] = (crcs[9] + 12345) & 0xFFFFFFFF
    with create_writer(path, fmt, encoding="jpeg", class_names=("a", "b", "c"), chunk_bytes=1024) as w:
        for j, (data, label, name, src) in enumerate(samples[:6]):
            w.append(data, label, name, src, checksum=crcs[j])
        rest = samples[6:]
        w.extend(
            b"".join(d for d, *_ in rest),
            [len(d) for d, *_ in rest],
            [x[1] for x in rest],
            [x[2] for x in rest],
            [x[3] for x in rest],
            checksums=crcs[6:],
        )
    with open_container(str(path)) as r:
        assert r.checksums.tolist() == crcs
    report = verify_container(str(path))
    assert [(b.index, b.name) for b in report.bad] == [(3, samples[3][2]), (9, samples[9][2])]
    assert all("checksum mismatch" in b.reason for b in report.bad)


def test_cli_verify_exit_codes(tmp_path):
    path = write_samples(tmp_path / "c.h5", "hdf5", SAMPLES)
    ok = dstore("verify", path)
    assert ok.returncode == 0, ok.stderr
    assert "OK" in ok.stdout
    flip_byte(path, BAD)
    res = dstore("verify", path)
    assert res.returncode == 1
    assert f"sample {BAD} ({BAD_NAME}): checksum mismatch" in res.stdout


@pytest.mark.mpi
def test_verify_under_mpiexec_finds_the_same_sample(tmp_path):
    # The damaged sample lies in rank 1's block; rank 0 must still report it (gathered to all).
    path = build(tmp_path, "sharded-hdf5", SAMPLES, shards=2)
    flip_byte(path, 25)
    flip_byte(path, 2)
    res = run_mpi(2, ["dstore", "verify", path], timeout=120, check=False)
    assert res.returncode != 0, res.stdout + res.stderr
    assert "on 2 rank(s)" in res.stdout
    for i in (2, 25):
        assert f"sample {i} ({SAMPLES[i][2]}): checksum mismatch" in res.stdout
    assert res.stdout.count("checksum mismatch") == 2  # printed once, by rank 0


@pytest.mark.mpi
def test_verify_collective_report_is_the_same_on_every_rank(tmp_path):
    path = write_samples(tmp_path / "c.zarr", "zarr", SAMPLES, chunk_bytes=512)
    flip_byte(path, BAD)
    raw = write_samples(
        tmp_path / "raw.h5",
        "hdf5",
        [(bytes(4), 0, f"r{i}", i) for i in range(9)] + [(b"x", 0, "short", 9)],
        encoding="raw",
        raw_dtype="uint8",
        raw_shape=(2, 2),
        class_names=("z",),
    )
    script = tmp_path / "check.py"
    script.write_text(
        "import sys\n"
        "from mpi4py import MPI\n"
        "from dstore.verify import verify_container\n"
        "comm = MPI.COMM_WORLD\n"
        f"r = verify_container({path!r}, comm=comm, read_size=1000)\n"
        "reports = comm.allgather([(b.index, b.name) for b in r.bad])\n"
        f"assert all(x == [({BAD}, {BAD_NAME!r})] for x in reports), reports\n"
        "assert r.nranks == comm.size\n"
        f"d = verify_container({raw!r}, comm=comm, decode=True)\n"
        "assert [(b.index, b.name) for b in d.bad] == [(9, 'short')], d.bad\n"
        # One write per rank, so unbuffered ranks' lines cannot interleave mid-line.
        "sys.stdout.write(f'rank {comm.rank} ok\\n')\n"
    )
    res = run_mpi(3, ["python", str(script)], timeout=120)
    assert sorted(line for line in res.stdout.splitlines() if line.endswith(" ok")) == [
        "rank 0 ok",
        "rank 1 ok",
        "rank 2 ok",
    ], res.stdout


def test_label_out_of_range_and_decode_failures(tmp_path):
    samples = [
        (image_bytes("png", 0), 0, "a.png", 0),
        (image_bytes("jpeg", 1), 1, "b.jpg", 1),
        (b"not an image", 1, "c.png", 2),
        (image_bytes("png", 3), 5, "d.png", 3),
    ]
    path = write_samples(tmp_path / "img.zarr", "zarr", samples, encoding="image", class_names=("x", "y"))
    report = verify_container(path)
    assert [(b.index, b.name) for b in report.bad] == [(3, "d.png")]
    assert "label 5 is outside [0, 2)" in report.bad[0].reason
    report = verify_container(path, decode=True)
    assert [b.index for b in report.bad] == [2, 3]
    assert "does not decode" in report.bad[0].reason and report.decoded
    res = dstore("verify", path, "--decode")
    assert res.returncode == 1 and "sample 2 (c.png): does not decode" in res.stdout


def test_raw_decode_checks_sizes(tmp_path):
    good = np.zeros((2, 2), np.uint16).tobytes()
    path = write_samples(
        tmp_path / "raw.h5",
        "hdf5",
        [(good, 0, "g", 0), (good[:-2], 0, "short", 1)],
        encoding="raw",
        raw_dtype="uint16",
        raw_shape=(2, 2),
        class_names=("z",),
    )
    report = verify_container(path, decode=True)
    assert report.bad == (BadSample(1, "short", report.bad[0].reason),)
    assert "6 bytes, expected 8" in report.bad[0].reason


def test_structural_damage_is_an_error_not_a_report(tmp_path):
    path = write_samples(tmp_path / "c.h5", "hdf5", SAMPLES)
    import h5py

    with h5py.File(path, "r+", locking=False) as f:
        del f.attrs["complete"]
    with pytest.raises(IncompleteContainerError):
        verify_container(path)
    res = dstore("verify", path)
    assert res.returncode == 1 and "IncompleteContainerError" in res.stderr and path in res.stderr


def test_container_info(tmp_path):
    path = build(tmp_path, "sharded-zarr", SAMPLES, shards=2)
    info = container_info(path)
    sizes = np.array([len(s[0]) for s in SAMPLES])
    assert info["format"] == "sharded" and info["num_samples"] == 30 and info["total_bytes"] == sizes.sum()
    assert [c["count"] for c in info["classes"]] == [10, 10, 10]
    assert info["sample_bytes"]["min"] == 0 and info["sample_bytes"]["max"] == sizes.max()
    assert info["sample_bytes"]["median"] == pytest.approx(np.median(sizes))
    assert info["sample_bytes"]["p95"] == pytest.approx(np.percentile(sizes, 95))
    assert len(info["shards"]) == 2
    text = format_info(info)
    assert "samples      30" in text and re.search(r"2\s+c\s+10", text)
    res = dstore("info", path, "--json", check=True)
    assert json.loads(res.stdout) == json.loads(json.dumps(info))
    assert "encoding     jpeg" in dstore("info", path, check=True).stdout


def test_empty_container_info_and_verify(tmp_path):
    path = write_samples(tmp_path / "e.h5", "hdf5", [])
    assert verify_container(path).ok
    assert container_info(path)["sample_bytes"]["max"] == 0


def _doc_snippets() -> dict[str, str]:
    """docs/format.md's python code blocks that start with a `# snippet: NAME` line."""
    text = (REPO / "docs" / "format.md").read_text()
    blocks = re.findall(r"```python\n(# snippet: (\S+)\n.*?)```", text, flags=re.S)
    return {name: code for code, name in blocks}


@pytest.mark.parametrize("snippet,fmt", [("h5py", "hdf5"), ("zarr", "zarr")])
def test_format_doc_snippets_read_containers(tmp_path, snippet, fmt):
    """The 'read it without dstore' snippets of docs/format.md, run on real containers."""
    snippets = _doc_snippets()
    assert {"h5py", "zarr", "manifest"} <= set(snippets)
    path = write_samples(tmp_path / ("c.h5" if fmt == "hdf5" else "c.zarr"), fmt, SAMPLES)
    scope = {"path": path}
    exec(compile(snippets[snippet], f"docs/format.md:{snippet}", "exec"), scope)
    assert scope["sample"] == SAMPLES[4][0] and scope["label"] == SAMPLES[4][1] and scope["name"] == SAMPLES[4][2]
    assert scope["ok"] is True


def test_format_doc_manifest_snippet(tmp_path):
    path = build(tmp_path, "sharded-hdf5", SAMPLES, shards=3)
    scope = {"path": str(Path(path) / "manifest.json")}
    exec(compile(_doc_snippets()["manifest"], "docs/format.md:manifest", "exec"), scope)
    assert scope["total"] == len(SAMPLES)
    with open_container(path) as r:
        assert scope["paths"] == [s.path for s in r.shards]
