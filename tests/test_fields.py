"""Extra fields per sample (docs/format.md, "Fields"): written, read back with dstore and with plain
h5py/zarr, carried by sharded manifests, kept by ingest (WebDataset members, ingest_items dicts),
checked by verify; containers without fields read as before."""

from __future__ import annotations

import io
import os
import zlib
from typing import Any, cast

import h5py
import numpy as np
import pytest
import zarr
from mpi4py import MPI
from support.formats import plain_array, plain_values
from support.ingest import clip_shards, png_bytes

from dstore.errors import ChecksumError, ConfigError, FormatError
from dstore.formats import create_writer, open_container, write_manifest
from dstore.ingest import ingest, ingest_items
from dstore.verify import container_info, format_info, verify_container

PATHS = {"hdf5": "c.h5", "zarr": "c.zarr"}
SPECS = {"txt": "text", "boxes": "json", "mask": "bytes"}


def write(path, fmt, n=5, fields=SPECS):
    values = [
        {
            f: v
            for f, v in {"txt": f"caption {k} é", "boxes": {"b": [[k, 1, 2, 3]]}, "mask": bytes([k, 0, 255])}.items()
            if f in fields
        }
        for k in range(n)
    ]
    with create_writer(
        path, fmt, encoding="raw", raw_dtype="uint8", raw_shape=[2], class_names=["a"], fields=fields
    ) as w:
        w.append(b"\x00\x01", 0, "s0", fields=values[0])
        w.extend(
            bytes(range(2, 2 * n)), [2] * (n - 1), [0] * (n - 1), [f"s{k}" for k in range(1, n)], fields=values[1:]
        )
    return values


@pytest.mark.parametrize("fmt", ["hdf5", "zarr"])
def test_fields_round_trip_and_plain_readers(tmp_path, fmt):
    path = str(tmp_path / PATHS[fmt])
    values = write(path, fmt)
    with open_container(path) as c:
        assert c.info.fields == tuple(SPECS.items())
        assert c.fields_of(range(5)) == [{"txt": v["txt"], "boxes": v["boxes"], "mask": v["mask"]} for v in values]
        assert c.field_bytes("txt", 2) == "caption 2 é".encode()
        with pytest.raises(ConfigError, match="no field 'nope'"):
            c.field("nope", 0)
    # Readable without dstore: the layout docs/format.md gives.
    g = h5py.File(path, "r") if fmt == "hdf5" else zarr.open_group(path, mode="r")
    assert [str(x) for x in np.asarray(g.attrs["fields"])] == ["txt:text", "boxes:json", "mask:bytes"]
    off = plain_values(g, "fields/txt/offsets")
    raw = plain_values(g, "fields/txt/data", slice(off[3], off[4])).tobytes()
    assert raw.decode() == values[3]["txt"] and zlib.crc32(raw) == int(plain_values(g, "fields/txt/checksums", 3))
    if isinstance(g, h5py.File):
        g.close()


def test_container_without_fields_reads_as_before(tmp_path):
    path = str(tmp_path / "old.h5")
    with create_writer(path, "hdf5", encoding="raw", raw_dtype="uint8", raw_shape=[1], class_names=["a"]) as w:
        w.append(b"\x07", 0, "s0")
    with h5py.File(path, "r") as f:  # nothing new in the file: an older reader sees what it always saw
        assert "fields" not in f and "fields" not in f.attrs
    with open_container(path) as c:
        assert c.info.fields == () and c.field_names == () and c.sample(0)[0].tobytes() == b"\x07"
        assert c.info.extra == {}
    assert not [line for line in format_info(container_info(path)).splitlines() if line.startswith("  fields")]


def test_writer_refuses_bad_values(tmp_path):
    with pytest.raises(ConfigError, match="kind 'jpeg'"):
        create_writer(str(tmp_path / "a.h5"), encoding="jpeg", class_names=[], fields={"x": "jpeg"})
    with create_writer(
        str(tmp_path / "b.h5"),
        encoding="raw",
        raw_dtype="uint8",
        raw_shape=[1],
        class_names=["a"],
        fields={"txt": "text", "j": "json"},
    ) as w:
        with pytest.raises(ConfigError, match="s0: field 'txt' is not valid text"):
            w.append(b"\x00", 0, "s0", fields={"txt": b"\xff\xfe"})
        with pytest.raises(ConfigError, match="s0: field 'j' is not valid json"):
            w.append(b"\x00", 0, "s0", fields={"j": b"{nope"})
        with pytest.raises(ConfigError, match=r"field\(s\) \['other'\] were not declared"):
            w.append(b"\x00", 0, "s0", fields={"other": b""})
        w.append(b"\x00", 0, "s0", fields={"txt": "ok"})  # nothing of the refused ones was buffered
    with open_container(str(tmp_path / "b.h5")) as c:
        assert c.num_samples == 1 and c.fields_of([0]) == [{"txt": "ok", "j": None}]


@pytest.mark.parametrize("fmt", ["hdf5", "zarr"])
def test_verify_names_a_flipped_byte_in_a_field(tmp_path, fmt):
    path = str(tmp_path / PATHS[fmt])
    write(path, fmt)
    assert verify_container(path).ok
    g = h5py.File(path, "r+") if fmt == "hdf5" else zarr.open_group(path, mode="r+")
    off = plain_values(g, "fields/txt/offsets")
    arr = plain_array(g, "fields/txt/data")
    arr[int(off[3])] = int(np.asarray(arr[int(off[3])])) ^ 0x01
    if isinstance(g, h5py.File):
        g.close()
    report = verify_container(path)
    assert [(b.index, b.name) for b in report.bad] == [(3, "s3")]
    assert "field 'txt' does not match its checksum" in report.summary()
    with open_container(path) as c:
        assert c.field("txt", 2) == "caption 2 é"
        with pytest.raises(ChecksumError, match=r"sample 3 \(s3\): field 'txt'"):
            c.field("txt", 3)


def test_sharded_manifest_carries_fields(tmp_path):
    a, b = str(tmp_path / "a.h5"), str(tmp_path / "b.zarr")
    va, vb = write(a, "hdf5", n=3), write(b, "zarr", n=4)
    m = write_manifest(str(tmp_path / "m.json"), [a, b])
    with open_container(m) as c:
        assert c.field_names == tuple(SPECS)
        assert [c.field("mask", i) for i in range(7)] == [v["mask"] for v in va + vb]
    assert verify_container(m).ok
    other = str(tmp_path / "c.h5")
    write(other, "hdf5", n=2, fields={"txt": "text"})
    with pytest.raises(ConfigError, match="fields"):
        write_manifest(str(tmp_path / "m2.json"), [a, other])


def test_clip_style_webdataset_round_trip(tmp_path):
    """Image + caption + JSON shards written with webdataset's TarWriter: after ingest (seeded order),
    each sample's image and caption are byte for byte what webdataset.WebDataset yields for its key."""
    wds = pytest.importorskip("webdataset", reason="the reference reader: pip install webdataset==1.0.2")
    src = tmp_path / "wds"
    src.mkdir()
    shards = clip_shards(wds, src, 4)
    out = str(tmp_path / "clip.h5")
    report = ingest(str(src), out, comm=MPI.COMM_SELF, progress=False, seed=3)
    assert "fields stored: json (json), txt (text)" in report.notes
    reference = {s["__key__"]: s for s in wds.WebDataset(shards, shardshuffle=False, empty_check=False)}
    with open_container(out) as c:
        assert c.info.extra["ingest_order"] == "seeded"
        keys = [c.name(i).rsplit("/", 1)[1].split(".")[0] for i in range(c.num_samples)]
        assert sorted(keys) == sorted(reference) and keys != sorted(keys)
        for i, key in enumerate(keys):
            ref = reference[key]
            assert bytes(c.sample(i)[0]) == ref["png"]
            assert c.field_bytes("txt", i) == ref["txt"]
            assert c.field_bytes("json", i) == ref.get("json", b"")
    none = str(tmp_path / "none.h5")
    report = ingest(str(src), none, comm=MPI.COMM_SELF, progress=False, fields="none")
    assert "fields found but not stored (--fields): json, txt" in report.notes
    with open_container(none) as c:
        assert c.field_names == ()
    with pytest.raises(ConfigError, match="no field 'caption'"):
        ingest(str(src), str(tmp_path / "x.h5"), comm=MPI.COMM_SELF, progress=False, fields="caption")


@pytest.mark.parametrize("fmt", ["hdf5", "zarr"])
def test_detection_style_items_round_trip(tmp_path, fmt):
    """Image + boxes (JSON) + a caption through ingest_items: each stored sample's fields are its item's."""
    items: list[tuple[Any, ...]] = [
        (png_bytes(4, k), k % 2, f"img{k}.png", {"boxes": [[k, 0, 4, 4]], "note": f"n{k}"}) for k in range(6)
    ]
    items.append((png_bytes(4, 9), 0, "img9.png"))  # no fields: stored missing (None), not empty
    out = str(tmp_path / PATHS[fmt])
    report = ingest_items(iter(items), out, comm=MPI.COMM_SELF, progress=False, fmt=fmt)
    assert "fields stored: boxes (json), note (text)" in report.notes
    with open_container(out) as c:
        for i in range(c.num_samples):
            k = int(c.source_index[i])
            assert bytes(c.sample(i)[0]) == items[k][0]
            want = items[k][3] if len(items[k]) == 4 else {"boxes": None, "note": None}
            assert c.fields_of([i]) == [want]
    assert verify_container(out).ok
    assert "boxes (json), note (text)" in format_info(container_info(out))
    assert os.listdir(tmp_path) == [PATHS[fmt]]  # the spool is gone
    np.testing.assert_array_equal(np.sort(open_container(out).source_index), np.arange(7))


def test_cli_fields_option_info_and_verify(tmp_path, capsys):
    """`dstore ingest --fields txt` stores only that member; `info` lists it; `verify` names a bad one."""
    from dstore.tools.cli import main

    src = tmp_path / "wds"
    src.mkdir()
    from webdataset.writer import TarWriter

    with TarWriter(str(src / "s-0.tar")) as sink:
        for k in range(4):
            sink.write(
                {"__key__": f"k{k}", "png": png_bytes(4, k), "cls": b"0", "txt": f"t{k}".encode(), "json": b"{}"}
            )
    out = str(tmp_path / "o.zarr")
    assert main(["ingest", str(src), out, "--fields", "txt", "--shards", "2", "--no-progress"]) == 0
    said = capsys.readouterr().out
    assert "fields stored: txt (text)" in said and "fields found but not stored (--fields): json" in said
    assert main(["info", out]) == 0
    assert "fields       txt (text)" in capsys.readouterr().out
    with open_container(out) as c:  # a sharded output: each shard carries the field, the manifest lists it
        assert c.field_names == ("txt",)
        assert sorted(cast(str, c.field("txt", i)) for i in range(4)) == ["t0", "t1", "t2", "t3"]  # a text field
        shard = c.shards[1].path
    g = zarr.open_group(shard, mode="r+")
    plain_array(g, "fields/txt/data")[0] = ord("X")
    assert main(["verify", out]) == 1
    said = capsys.readouterr().out
    assert "fields txt" in said and "field 'txt' does not match its checksum" in said


@pytest.mark.parametrize("workers", [0, 1])
def test_store_loader_yields_fields_with_each_batch(tmp_path, workers):
    """StoreLoader(fields=...) over DataStore(fields=...) on one rank, in decode threads and in a
    decode worker: each batch's captions are its own samples' (by last_ids), served by the store."""
    import torch

    from dstore.loader.store_loader import StoreLoader
    from dstore.store.data_store import DataStore

    path = str(tmp_path / "raw.h5")
    with create_writer(
        path,
        "hdf5",
        encoding="raw",
        raw_dtype="uint8",
        raw_shape=[2, 2, 1],
        class_names=["a", "b"],
        fields={"txt": "text", "j": "json"},
    ) as w:
        for k in range(13):
            w.append(bytes([k] * 4), k % 2, f"s{k}", fields={"txt": f"cap {k}", "j": [k]})
    with DataStore(MPI.COMM_SELF, path, batch_size=4, seed=2) as st:
        with pytest.raises(ConfigError, match=r"does not hold field\(s\) \['txt'\].*DataStore\(\.\.\., fields="):
            StoreLoader(st, fields=["txt"])
    with DataStore(MPI.COMM_SELF, path, batch_size=4, seed=2, fields=["txt", "j"]) as st:
        with pytest.raises(ConfigError, match=r"has no field\(s\) \['nope'\]"):
            StoreLoader(st, fields=["nope"])
        with StoreLoader(st, fields=["txt", "j"], workers=workers, size=(2, 2), channels=1) as ld:
            seen = []
            for batch in ld:
                ids = ld.last_ids.tolist()
                assert set(batch) == {"image", "label", "txt", "j"}
                assert batch["txt"] == [f"cap {i}" for i in ids] and batch["j"] == [[i] for i in ids]
                assert torch.equal(batch["image"][:, 0, 0, 0], torch.tensor(ids, dtype=torch.uint8))
                seen += ids
            assert sorted(set(seen)) == list(range(13))
        with StoreLoader(st, fields="txt") as ld:  # only what is asked for
            assert set(next(iter(ld))) == {"image", "label", "txt"}
    with pytest.raises(ConfigError, match=r"has no field\(s\) \['nope'\]"):
        DataStore(MPI.COMM_SELF, path, batch_size=4, fields=["txt", "nope"])


@pytest.mark.mpi
def test_fields_follow_their_samples_on_several_ranks(tmp_path):
    """3 ranks, 2 shards: every sample's caption is its own (the writer rank reads them in write order)."""
    import tarfile

    from support.mpirun import run_mpi

    src = tmp_path / "wds"
    src.mkdir()
    with tarfile.open(src / "a.tar", "w") as tf:
        for k in range(23):
            for ext, data in (("png", png_bytes(4, k)), ("cls", b"0"), ("txt", f"caption {k}".encode())):
                info = tarfile.TarInfo(f"k{k:03d}.{ext}")
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))
    out = tmp_path / "out"
    run_mpi(3, ["dstore", "ingest", str(src), str(out), "--shards", "2", "--no-progress"], timeout=120)
    with open_container(str(out)) as c:
        keys = [int(c.name(i).rsplit("/", 1)[1][1:4]) for i in range(c.num_samples)]
        assert sorted(keys) == list(range(23)) and keys != sorted(keys)
        assert [c.field("txt", i) for i in range(23)] == [f"caption {k}" for k in keys]
        assert [bytes(c.sample(i)[0]) for i in range(23)] == [png_bytes(4, k) for k in keys]


def test_zarr_container_with_fields_is_overwritten_and_reingested_with_them(tmp_path):
    """A Zarr container's `fields` group marks it as ours (overwrite replaces it, before: refused as
    'holds more than a dstore container'); re-ingesting a container keeps its fields."""
    items = [(png_bytes(4, k), 0, f"i{k}.png", {"txt": f"t{k}"}) for k in range(5)]
    out = str(tmp_path / "a.zarr")
    ingest_items(iter(items), out, comm=MPI.COMM_SELF, progress=False, fmt="zarr")
    ingest_items(iter(items), out, comm=MPI.COMM_SELF, progress=False, fmt="zarr", overwrite=True)
    again = str(tmp_path / "b.h5")
    report = ingest(out, again, comm=MPI.COMM_SELF, progress=False, seed=5)
    assert "fields stored: txt (text)" in report.notes
    with open_container(again) as c:
        assert [c.field("txt", i) for i in range(5)] == [f"t{c.name(i)[1]}" for i in range(5)]


def test_hdf5_field_declaring_more_than_it_stores_is_refused(tmp_path):
    path = str(tmp_path / "c.h5")
    write(path, "hdf5")
    with h5py.File(path, "r+") as f:
        del f["fields/txt/data"]
        f.create_dataset("fields/txt/data", shape=(1 << 40,), dtype=np.uint8, chunks=(1 << 16,))
    with open_container(path) as c, pytest.raises(FormatError, match="fields/txt/data.*declares"):
        c.field("txt", 0)


def test_zarr_field_offsets_of_a_wrong_length_are_refused_before_read(tmp_path):
    path = str(tmp_path / "c.zarr")
    write(path, "zarr")
    g = zarr.open_group(path, mode="r+")
    del g["fields/txt/offsets"]
    g.create_array("fields/txt/offsets", shape=(1 << 40,), dtype=np.int64, chunks=(1 << 16,))
    with (
        open_container(path) as c,
        pytest.raises(FormatError, match=r"field 'txt': offsets has shape \(1099511627776,\)"),
    ):
        c.field("txt", 0)
