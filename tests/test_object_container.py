"""Containers in object storage (`s3://bucket/c.h5`, a Zarr prefix), read by the store with ranged
requests, against a real S3 server (moto's server mode on a local port; credentials and endpoint
from the environment): a tiered epoch delivers the local container's bytes, every sample once; a
flipped byte is a checksum error naming the sample; an object replaced mid-job is refused; a missing
key is one line naming the URL; `dstore verify` / `info` read s3:// URLs."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from store_scenarios import scenarios
from store_scenarios.object_scenarios import scenario_object_tiered, tiered_epoch
from support import s3 as s3_server

from dstore.errors import ChecksumError, ContainerChangedError
from dstore.formats import ContainerNotFoundError, open_container
from dstore.store.data_store import DataStore

endpoint, s3 = s3_server.endpoint, s3_server.s3  # the test server's fixtures (used by name)
bucket = s3_server.bucket

N = 300  # samples of 0..8,000 bytes: 1.2 MB, 25 steps of BATCH


@pytest.fixture(scope="module")
def local(tmp_path_factory):
    """{format: the local container}: HDF5 (unfiltered, byte-addressable) and Zarr (small chunks, so
    a run of samples spans chunk objects)."""
    d = tmp_path_factory.mktemp("objects")
    return {
        "hdf5": scenarios.make_container(str(d / "c.h5"), n=N, seed=1, large=8000, small=8000),
        "zarr": scenarios.make_container(
            str(d / "c.zarr"), n=N, seed=1, large=8000, small=8000, fmt="zarr", chunk_bytes=200_000
        ),
    }


def upload(fs, path: str, fmt: str) -> str:
    """`path` copied into a new bucket; its URL."""
    b = bucket(fs)
    key = f"{b}/sets/c.h5" if fmt == "hdf5" else f"{b}/sets/c.zarr"
    fs.put(path, key, recursive=fmt == "zarr")
    return f"s3://{key}"


def dstore_here(capsys, *args) -> tuple[int, str, str]:
    """`dstore ARGS` in this process (one rank): (exit code, stdout, stderr)."""
    from dstore.tools.cli import main

    capsys.readouterr()
    code = main([str(a) for a in args])
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.parametrize("fmt", ["hdf5", "zarr"])
def test_a_tiered_epoch_from_s3_delivers_the_local_containers_bytes_once(s3, local, fmt):
    from mpi4py import MPI

    url = upload(s3, local[fmt], fmt)
    stats = scenario_object_tiered(
        MPI.COMM_SELF, url, local[fmt], populations=("preload",) if fmt == "zarr" else ("preload", "stream")
    )
    assert stats["samples_storage"] > 0 and stats["bytes_storage"] > 0  # the tier did read from the object


def test_an_ingest_from_s3_then_a_tiered_epoch_from_s3(s3, tmp_path):
    """The whole round trip on the S3 server: an image folder in a bucket ingested (ranged GETs), the
    container uploaded, a tiered store over its URL: every sample once, with the local container's
    bytes, which are the source files' bytes."""
    from mpi4py import MPI
    from support.ingest import ingest_here, png_bytes

    b = bucket(s3)
    files = {
        f"{c}/{k:03d}.png": png_bytes(48 + (k % 5) * 8, 10 * k + len(c)) for c in ("cat", "dog") for k in range(60)
    }
    s3.pipe({f"{b}/imgs/{rel}": data for rel, data in files.items()})
    ingest_here(f"s3://{b}/imgs", tmp_path / "c.h5")
    with open_container(str(tmp_path / "c.h5")) as c:
        assert c.num_samples == 120
        assert all(bytes(c.sample(i)[0]) == files[c.name(i).split("imgs/")[-1]] for i in range(c.num_samples))
    s3.put(str(tmp_path / "c.h5"), f"{b}/sets/c.h5")
    stats = scenario_object_tiered(
        MPI.COMM_SELF, f"s3://{b}/sets/c.h5", str(tmp_path / "c.h5"), populations=("preload",), storage_lookahead=1
    )
    assert stats["samples_storage"] > 0


@pytest.mark.mpi
def test_two_ranks_each_read_their_tier_from_s3(s3, local):
    """Each rank opens its own connection (credentials and endpoint from the inherited environment)."""
    from support.mpirun import run_mpi

    url = upload(s3, local["hdf5"], "hdf5")
    out = run_mpi(
        2,
        [
            "python",
            "-m",
            "mpi4py",
            str(scenarios.__file__).replace("scenarios.py", "object_scenarios.py"),
            url,
            local["hdf5"],
        ],
        timeout=240,
    )
    assert "OK object_tiered on 2 ranks" in out.stdout


def _flipped(path: str, k: int) -> bytes:
    """The bytes of the HDF5 file `path` with one byte of sample k's data flipped."""
    with open_container(path) as c:
        sample = bytes(c.sample(k)[0])
    blob = bytearray(open(path, "rb").read())
    at = blob.find(sample)
    assert at >= 0 and blob.find(sample, at + 1) < 0 and len(sample) > 100
    blob[at + len(sample) // 2] ^= 0x40
    return bytes(blob)


def test_a_flipped_byte_in_the_object_is_a_checksum_error_naming_the_sample(s3, local, capsys):
    from mpi4py import MPI

    with open_container(local["hdf5"]) as c:
        sizes = np.diff(c.offsets)
        k = int(np.argmax(sizes))
        name = c.name(k)
    b = bucket(s3)
    s3.pipe(f"{b}/bad.h5", _flipped(local["hdf5"], k))
    url = f"s3://{b}/bad.h5"
    with pytest.raises(
        ChecksumError,
        match=rf"^{url}: 1 sample\(s\) read from storage do not match their "
        rf"checksums: {k} \({name}\)",
    ):
        with scenarios._tiered(MPI.COMM_SELF, url, batch_size=scenarios.BATCH, seed=3) as st:
            for _ in st.epoch(0):
                pass
    code, out, err = dstore_here(capsys, "verify", url)
    assert code != 0 and f"{k} ({name})" in out + err, out + err


@pytest.mark.parametrize("fmt", ["hdf5", "zarr"])
def test_an_object_replaced_mid_job_is_refused(s3, local, tmp_path, fmt):
    from mpi4py import MPI

    url = upload(s3, local[fmt], fmt)
    options: dict[str, Any] = {"chunk_bytes": 200_000} if fmt == "zarr" else {}
    other = scenarios.make_container(
        str(tmp_path / ("o.h5" if fmt == "hdf5" else "o.zarr")),
        n=N,
        seed=2,
        large=8000,
        small=8000,
        fmt=fmt,
        **options,
    )
    with open_container(local[fmt]) as ref:
        st = scenarios._tiered(MPI.COMM_SELF, url, batch_size=scenarios.BATCH, seed=3, storage_lookahead=1)
        try:
            it = iter(st.epoch(0))
            next(it)
            key = url[len("s3://") :]
            if fmt == "hdf5":
                s3.pipe(key, open(other, "rb").read())
            else:
                s3.rm(key, recursive=True)
                s3.put(other, key, recursive=True)
            with pytest.raises(
                ContainerChangedError,
                match=rf"^{url}.*: the container changed while this job was "
                "reading it",
            ) as info:
                for b in it:
                    for i, x in zip(b.ids.tolist(), b.samples):
                        assert bytes(memoryview(x).cast("B")) == bytes(ref.sample(i)[0])  # never the other's bytes
            assert "\n" not in str(info.value)
        finally:
            st.close()


def test_an_object_rewritten_with_the_same_bytes_plus_one_is_refused_at_the_next_read(s3, local):
    """Every sample's bytes still match (its checksums cannot tell), but it is another version: the
    reads pinned to the ETag opened refuse it within the lookahead, not at the epoch's end."""
    from mpi4py import MPI

    url = upload(s3, local["hdf5"], "hdf5")
    st = scenarios._tiered(MPI.COMM_SELF, url, batch_size=scenarios.BATCH, seed=3, storage_lookahead=1)
    try:
        it = iter(st.epoch(0))
        next(it)
        s3.pipe(url[len("s3://") :], open(local["hdf5"], "rb").read() + b"\0")
        with pytest.raises(
            ContainerChangedError,
            match=rf"^{url}: the container changed while this job was "
            r"reading it \(another version: its ETag no longer matches\)",
        ):
            for _ in range(3):  # step 2's reads were in flight before the rewrite; step 3's are not
                next(it)
    finally:
        st.close()


def test_a_missing_key_is_one_line_naming_the_url(s3, local, capsys):
    from mpi4py import MPI

    b = bucket(s3)
    for url in (f"s3://{b}/nope.h5", f"s3://{b}/nope.zarr"):
        with pytest.raises(ContainerNotFoundError, match=rf"^{url}: no such container") as info:
            DataStore(MPI.COMM_SELF, url, batch_size=4)
        assert "\n" not in str(info.value)
    code, _, err = dstore_here(capsys, "info", f"s3://{b}/nope.h5")
    errors = [line for line in err.splitlines() if line.startswith("dstore: error")]
    assert code != 0 and errors == [
        f"dstore: error: ContainerNotFoundError: s3://{b}/nope.h5: no such "
        "container (no object at this URL, and no manifest.json or zarr.json "
        "below it; check the bucket and the key)"
    ], err


@pytest.mark.parametrize("fmt", ["hdf5", "zarr"])
def test_verify_and_info_read_an_s3_container(s3, local, fmt, capsys):
    url = upload(s3, local[fmt], fmt)
    code, out, err = dstore_here(capsys, "verify", url)
    assert code == 0 and f"{N} samples" in out, out + err
    remote, here = dstore_here(capsys, "info", url, "--json"), dstore_here(capsys, "info", local[fmt], "--json")
    assert remote[0] == 0, remote[2]
    assert remote[1].replace(url, "PATH") == here[1].replace(local[fmt], "PATH")


def test_a_sharded_container_in_s3_reads_as_the_local_one(s3, tmp_path):
    """A manifest and its shards (HDF5 and Zarr) uploaded under one prefix: the same samples."""
    from dstore.formats import write_manifest

    d = tmp_path / "sharded"
    d.mkdir()
    a = scenarios.make_container(str(d / "a.h5"), n=40, seed=4)
    z = scenarios.make_container(str(d / "b.zarr"), n=30, seed=5, fmt="zarr")
    write_manifest(str(d), [a, z])
    b = bucket(s3)
    s3.put(str(d), f"{b}/sh", recursive=True)
    with open_container(f"s3://{b}/sh") as remote, open_container(str(d)) as here:
        assert remote.num_samples == here.num_samples == 70
        assert all(bytes(remote.sample(i)[0]) == bytes(here.sample(i)[0]) for i in range(70))
        assert remote.changes() is None
        st_sample = bytes(remote.read_range(35, 45))
        assert st_sample == bytes(here.read_range(35, 45))  # a read across the two shards


def test_ingest_to_an_s3_output_is_refused_clearly(s3, tmp_path, capsys):
    """`dstore ingest` writes local containers only: an s3:// output is refused before anything is read."""
    b = bucket(s3)
    code, _, err = dstore_here(capsys, "ingest", "synthetic", f"s3://{b}/out.h5", "--no-progress")
    assert code != 0 and f"output 's3://{b}/out.h5' is a URL; ingest writes a local container" in err, err
    assert not s3.exists(f"{b}/out.h5")


_ = tiered_epoch  # the helper the mpiexec scenario uses, imported here so a rename breaks this module too


def test_dstore_train_reads_an_s3_container(s3, tmp_path, capsys):
    """`dstore train s3://...`: the trainer's stores read the object (the run's checkpoint names the URL)."""
    import json

    from support.formats import raw_container

    raw_container(tmp_path / "digits.h5", n=96, shape=(8, 8, 1), classes=3)
    b = bucket(s3)
    s3.put(str(tmp_path / "digits.h5"), f"{b}/digits.h5")
    url = f"s3://{b}/digits.h5"
    code, out, err = dstore_here(
        capsys,
        "train",
        url,
        "--epochs",
        "1",
        "--batch-size",
        "16",
        "--no-progress",
        "--run-dir",
        tmp_path / "run",
        "--model",
        "small_cnn",
    )
    assert code == 0, out + err
    assert f"samples of {url} with 1 rank(s)" in out and "test accuracy" in out
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert url in json.dumps(config)


def test_a_missing_zarr_chunk_object_is_named_never_zeros(s3, local):
    from dstore.errors import FormatError

    url = upload(s3, local["zarr"], "zarr")
    s3.rm(f"{url[len('s3://') :]}/data/c/1")
    with pytest.raises(
        FormatError,
        match=rf"^{url}/data/c/1: data chunk 1 \(bytes \[200000, 400000\) of data\) is "
        "missing; dstore stores every chunk, so a missing one is damage, never zeros",
    ):
        open_container(url)
