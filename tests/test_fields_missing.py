"""Fields keep a missing value apart from an empty one (docs/format.md, "Fields": `fields/<name>/missing`):
a WebDataset sample without a member and a Parquet null read back as None, an empty member or string
as '' (as webdataset and pyarrow give them), in the container (dstore and plain h5py/zarr), through
the store's batches and a re-ingest; containers written before the array read as before; and a
field value that cannot be stored (a caption that is not UTF-8, an empty or bad JSON member) is a bad
sample that follows --on-error."""

from __future__ import annotations

import io
import tarfile

import h5py
import pytest
import zarr
from mpi4py import MPI
from support.formats import plain_values
from support.ingest import png_bytes

from dstore.errors import SampleError
from dstore.formats import create_writer, open_container
from dstore.ingest import ingest

# key -> members besides the PNG and the class: txt b"" is an empty caption, no txt a missing one
SAMPLES = {
    "s0": {"txt": b"", "json": b'{"a": 0}'},
    "s1": {"json": b"[]"},
    "s2": {"txt": b"two"},
    "s3": {"txt": b"three", "json": b"null"},
}


def _shard(path, samples) -> str:
    with tarfile.open(path, "w") as tf:
        for k, (key, members) in enumerate(samples.items()):
            for ext, data in {"png": png_bytes(4, k), "cls": str(k % 2).encode(), **members}.items():
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))
    return str(path)


def _by_key(c) -> dict[str, int]:
    return {c.name(i).rsplit("/", 1)[1].split(".")[0]: i for i in range(c.num_samples)}


@pytest.mark.parametrize("fmt", ["hdf5", "zarr"])
def test_a_missing_member_is_none_and_an_empty_one_is_empty(tmp_path, fmt):
    shard = _shard(tmp_path / "a.tar", SAMPLES)
    out = str(tmp_path / ("c.h5" if fmt == "hdf5" else "c.zarr"))
    ingest(shard, out, comm=MPI.COMM_SELF, progress=False, fmt=fmt)
    with open_container(out) as c:
        at = _by_key(c)
        got = {k: c.fields_of([at[k]])[0] for k in SAMPLES}
        missing = {k: bool(c.field_missing("txt", at[k], at[k] + 1)[0]) for k in SAMPLES}
    assert got == {
        "s0": {"json": {"a": 0}, "txt": ""},
        "s1": {"json": [], "txt": None},
        "s2": {"json": None, "txt": "two"},
        "s3": {"json": None, "txt": "three"},
    }
    assert missing == {"s0": False, "s1": True, "s2": False, "s3": False}
    # the JSON document `null` (s3) is a value; no member (s2) is not: only `missing` tells them apart
    g = h5py.File(out, "r") if fmt == "hdf5" else zarr.open_group(out, mode="r")
    plain = {k: int(plain_values(g, "fields/json/missing", at[k])) for k in SAMPLES}
    assert plain == {"s0": 0, "s1": 0, "s2": 1, "s3": 0}
    off = plain_values(g, "fields/txt/offsets")
    assert all(off[at[k] + 1] == off[at[k]] for k in ("s0", "s1"))  # both hold no bytes
    if isinstance(g, h5py.File):
        g.close()
    # a re-ingest of the container keeps missing missing and empty empty
    again = str(tmp_path / "again.h5")
    ingest(out, again, comm=MPI.COMM_SELF, progress=False, keep_order=True)
    with open_container(again) as c:
        assert [c.field("txt", i) for i in range(4)] == [got[k]["txt"] for k in sorted(at, key=at.__getitem__)]


def test_the_store_serves_none_for_a_missing_value(tmp_path):
    """DataStore(fields=...) and StoreLoader(fields=...): None for missing, '' for empty, each batch."""
    from dstore.loader.store_loader import StoreLoader
    from dstore.store.data_store import DataStore

    path = str(tmp_path / "raw.h5")
    with create_writer(
        path, "hdf5", encoding="raw", raw_dtype="uint8", raw_shape=[1, 1, 1], class_names=["a"], fields={"txt": "text"}
    ) as w:
        for k in range(9):
            w.append(bytes([k]), 0, f"s{k}", fields={"txt": [None, "", f"c{k}"][k % 3]})
    with (
        DataStore(MPI.COMM_SELF, path, batch_size=4, seed=1, fields=["txt"]) as st,
        StoreLoader(st, fields=["txt"], size=(1, 1), channels=1) as ld,
    ):
        seen = {}
        for batch in ld:
            seen.update(zip(ld.last_ids.tolist(), batch["txt"]))
    assert seen == {k: [None, "", f"c{k}"][k % 3] for k in range(9)}


def test_a_container_written_before_the_missing_array_reads_as_before(tmp_path):
    path = str(tmp_path / "old.h5")
    with create_writer(
        path, "hdf5", encoding="raw", raw_dtype="uint8", raw_shape=[1], class_names=["a"], fields={"txt": "text"}
    ) as w:
        w.append(b"\x00", 0, "s0", fields={"txt": ""})
        w.append(b"\x01", 0, "s1", fields={"txt": "x"})
    with h5py.File(path, "r+") as f:
        del f["fields/txt/missing"]
    with open_container(path) as c:
        assert [c.field("txt", i) for i in range(2)] == ["", "x"]
        assert not c.field_missing("txt", 0, 2).any()


def test_parquet_null_is_none_and_an_empty_string_is_empty(tmp_path):
    pa = pytest.importorskip("pyarrow", reason="pyarrow is optional (pip install 'dstore-mpi[parquet]')")
    import pyarrow.parquet as pq

    caps = ["", None, "three", None]
    table = pa.table(
        {
            "image": [png_bytes(4, k) for k in range(4)],
            "label": [0, 1, 0, 1],
            "caption": caps,
            "meta": [{"k": 1}, None, {"k": 3}, {"k": 4}],
        }
    )
    pq.write_table(table, tmp_path / "t.parquet")
    out = str(tmp_path / "t.h5")
    ingest(str(tmp_path / "t.parquet"), out, comm=MPI.COMM_SELF, progress=False, keep_order=True)
    with open_container(out) as c:
        assert [c.field("caption", i) for i in range(4)] == caps  # pyarrow's own values
        assert [c.field("meta", i) for i in range(4)] == [{"k": 1}, None, {"k": 3}, {"k": 4}]
        assert c.field_missing("meta", 0, 4).tolist() == [False, True, False, False]


BAD = {
    "s0": {"txt": b"fine"},
    "s1": {"txt": b"caf\xe9 latin-1"},
    "s2": {"txt": b"ok", "json": b""},
    "s3": {"txt": b"ok", "json": b"{broken"},
    "s4": {"txt": b"last", "json": b"{}"},
}


def test_a_field_that_cannot_be_stored_follows_on_error(tmp_path):
    shard = _shard(tmp_path / "bad.tar", BAD)
    report = ingest(shard, str(tmp_path / "skip.h5"), comm=MPI.COMM_SELF, progress=False, on_error="skip")
    reasons = dict(report.skipped)
    assert sorted(k.rsplit(":", 1)[1].split(".")[0] for k in reasons) == ["s1", "s2", "s3"], reasons
    text = report.summary()
    assert "skipped 3" in text and "field 'txt' is not valid text" in text and "field 'json' is not valid json" in text
    with open_container(str(tmp_path / "skip.h5")) as c:
        assert sorted(_by_key(c)) == ["s0", "s4"]
        assert c.field("txt", _by_key(c)["s4"]) == "last"
    with pytest.raises(SampleError, match=r"bad\.tar:s1.*field 'txt' is not valid text") as err:
        ingest(shard, str(tmp_path / "raise.h5"), comm=MPI.COMM_SELF, progress=False, fields="txt")
    assert "\n" not in str(err.value) and "--fields txt:bytes" in str(err.value)
    assert not (tmp_path / "raise.h5").exists()
    # stored as it is when declared bytes, as the message says
    ingest(shard, str(tmp_path / "bytes.h5"), comm=MPI.COMM_SELF, progress=False, fields="txt:bytes")
    with open_container(str(tmp_path / "bytes.h5")) as c:
        assert c.field("txt", _by_key(c)["s1"]) == b"caf\xe9 latin-1"
