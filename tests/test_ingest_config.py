"""IngestConfig: ingest()'s arguments validated in one place, the keyword and config forms alike.
In-process on COMM_SELF."""

import dataclasses

import numpy as np
import pytest
from mpi4py import MPI

from dstore.errors import ConfigError
from dstore.formats import open_container
from dstore.ingest import ingest
from dstore.ingest.config import IngestConfig


@pytest.mark.parametrize(
    "name, value, message",
    [
        ("fmt", "tiff", "fmt='tiff' is not one of"),
        ("on_error", "ignore", "on_error='ignore' is not one of"),
        ("shards", 0, r"shards=0 \(--shards\) must be an integer in \[1, 99999\]"),
        ("count", 0, "count=0 must be a positive integer or None"),
        ("resize", "0x4", "'0x4'"),
    ],
)
def test_a_bad_argument_is_one_line_naming_it(name, value, message):
    with pytest.raises(ConfigError, match=message) as err:
        IngestConfig(**{name: value}).checked()
    assert "\n" not in str(err.value) and (name in str(err.value) or name == "resize")


def test_checked_normalises_and_every_field_is_documented():
    assert IngestConfig(resize="4x6").checked().resize == (4, 6)
    assert all(f.metadata["doc"] for f in dataclasses.fields(IngestConfig))


def test_keywords_and_a_config_write_the_same_container(tmp_path):
    a = ingest("digits", str(tmp_path / "a.h5"), comm=MPI.COMM_SELF, count=12, seed=3, progress=False)
    b = ingest(
        "digits", str(tmp_path / "b.h5"), comm=MPI.COMM_SELF, config=IngestConfig(count=12, seed=3, progress=False)
    )
    assert a.samples == b.samples == 12
    ra, rb = open_container(str(tmp_path / "a.h5")), open_container(str(tmp_path / "b.h5"))
    assert np.array_equal(ra.labels, rb.labels)
    assert all(bytes(ra.sample(i)[0]) == bytes(rb.sample(i)[0]) for i in range(12))
    with pytest.raises(ConfigError, match=r"IngestConfig or keywords, not both \(shards, count\)"):
        ingest("digits", str(tmp_path / "c"), comm=MPI.COMM_SELF, shards=2, count=5, config=IngestConfig())
    with pytest.raises(ConfigError, match=r"^shards=0 \(--shards\)"):
        ingest("digits", str(tmp_path / "d.h5"), comm=MPI.COMM_SELF, config=IngestConfig(shards=0))
    with pytest.raises(ConfigError, match="suffix of the other format but fmt='zarr'"):
        ingest("digits", str(tmp_path / "e.h5"), comm=MPI.COMM_SELF, config=IngestConfig(fmt="zarr"))


def test_the_format_follows_the_outputs_name_unless_given(tmp_path):
    """As `dstore ingest` does: x.zarr is written as Zarr, anything else as HDF5; an explicit fmt wins,
    and one that contradicts the suffix is refused (above)."""
    ingest("digits", str(tmp_path / "a.zarr"), comm=MPI.COMM_SELF, count=6, progress=False)
    ingest("digits", str(tmp_path / "b.h5"), comm=MPI.COMM_SELF, count=6, progress=False)
    ingest("digits", str(tmp_path / "c"), comm=MPI.COMM_SELF, count=6, progress=False)
    ingest("digits", str(tmp_path / "d"), comm=MPI.COMM_SELF, count=6, progress=False, fmt="zarr")
    assert (tmp_path / "a.zarr" / "zarr.json").is_file() and (tmp_path / "d" / "zarr.json").is_file()
    assert (tmp_path / "b.h5").read_bytes()[:8] == (tmp_path / "c").read_bytes()[:8] == b"\x89HDF\r\n\x1a\n"
    for name in ("a.zarr", "b.h5", "c", "d"):
        with open_container(str(tmp_path / name)) as r:
            assert len(r) == 6
