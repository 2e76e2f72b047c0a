"""Data from the wild: Hub split layouts, ClassLabel names, and WebDataset shards as users make them
(duplicate members, macOS `._` files, extra fields, a tar cut short). Each is refused naming the
input and the remedy, or ingested as the source's own library reads it, saying what is not stored."""

from __future__ import annotations

import io
import json
import tarfile

import pytest
from support.ingest import ingest_here, png_bytes

from dstore.errors import SampleError
from dstore.formats import open_container
from dstore.ingest.registry import source_type_of

pa = pytest.importorskip("pyarrow", reason="pyarrow is optional (pip install 'dstore-mpi[parquet]')")
import pyarrow.ipc  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

IMAGE = pa.struct([("bytes", pa.binary()), ("path", pa.string())])


def rows_table(first: int, n: int, names=("cat", "dog", "emu"), extra: bool = False):
    """n rows of tiny PNGs (seeds first..first+n-1) with ClassLabel labels seed % 3."""
    images = pa.array([{"bytes": png_bytes(4, k), "path": None} for k in range(first, first + n)], type=IMAGE)
    cols = {"image": images, "label": pa.array([k % 3 for k in range(first, first + n)], type=pa.int64())}
    if extra:
        cols["text"] = pa.array([f"row {k}" for k in range(first, first + n)])
    features = {"image": {"_type": "Image"}, "label": {"names": list(names), "_type": "ClassLabel"}}
    return pa.table(cols).replace_schema_metadata({b"huggingface": json.dumps({"info": {"features": features}})})


def stored(path):
    """[(bytes, label)] of a container, in its order."""
    with open_container(str(path)) as c:
        return [(bytes(c.sample(j)[0]), int(c.sample(j)[1])) for j in range(c.num_samples)]


def test_hub_directory_splits_are_not_mixed(tmp_path):
    hub = tmp_path / "hub"
    (hub / "data").mkdir(parents=True)
    pq.write_table(rows_table(0, 3), hub / "data" / "train-00000-of-00002.parquet")
    pq.write_table(rows_table(3, 2), hub / "data" / "train-00001-of-00002.parquet")
    pq.write_table(rows_table(100, 2), hub / "data" / "test-00000-of-00001.parquet")
    assert source_type_of(str(hub)) == "parquet"
    with pytest.raises(SampleError, match=r"hub: holds the splits train, test; .*--split NAME"):
        ingest_here(hub, tmp_path / "mixed.h5")
    with pytest.raises(SampleError, match=r"no split 'valid'; the splits found: train, test"):
        ingest_here(hub, tmp_path / "v.h5", split="valid")
    report = ingest_here(hub, tmp_path / "train.h5", split="train", keep_order=True)
    assert stored(tmp_path / "train.h5") == [(png_bytes(4, k), k % 3) for k in range(5)]
    assert any("split 'train' of the splits train, test" in n for n in report.notes), report.notes
    with open_container(str(tmp_path / "train.h5")) as c:
        assert c.info.source == f"table {hub} split train (columns image, label)"  # the provenance says which
    ingest_here(hub, tmp_path / "test.h5", split="test", keep_order=True)
    assert stored(tmp_path / "test.h5") == [(png_bytes(4, k), k % 3) for k in (100, 101)]


def test_split_option_on_the_command_line(tmp_path, capsys):
    from dstore.tools.cli import main

    hub = tmp_path / "hub"
    (hub / "test").mkdir(parents=True)
    (hub / "train").mkdir()
    pq.write_table(rows_table(0, 2), hub / "train" / "a.parquet")
    pq.write_table(rows_table(50, 2), hub / "test" / "a.parquet")
    assert main(["ingest", str(hub), str(tmp_path / "t.h5"), "--split", "test", "--keep-order", "--no-progress"]) == 0
    assert stored(tmp_path / "t.h5") == [(png_bytes(4, k), k % 3) for k in (50, 51)]
    assert "split 'test' of the splits train, test" in capsys.readouterr().out


def write_saved_split(directory, table) -> None:
    """One split of a DatasetDict.save_to_disk directory, as datasets writes it (Arrow stream)."""
    directory.mkdir(parents=True)
    with (
        pa.OSFile(str(directory / "data-00000-of-00001.arrow"), "wb") as sink,
        pyarrow.ipc.new_stream(sink, table.schema) as w,
    ):
        w.write_table(table)
    (directory / "state.json").write_text(
        json.dumps({"_data_files": [{"filename": "data-00000-of-00001.arrow"}], "_split": directory.name})
    )
    features = {"image": {"_type": "Image"}, "label": {"names": ["cat", "dog", "emu"], "_type": "ClassLabel"}}
    (directory / "dataset_info.json").write_text(json.dumps({"features": features}))


def test_dataset_dict_saved_to_disk(tmp_path):
    saved = tmp_path / "dd"
    write_saved_split(saved / "train", rows_table(0, 3))
    write_saved_split(saved / "test", rows_table(10, 2))
    (saved / "dataset_dict.json").write_text(json.dumps({"splits": ["train", "test"]}))
    assert source_type_of(str(saved)) == "parquet"
    with pytest.raises(SampleError, match="holds the splits train, test"):
        ingest_here(saved, tmp_path / "x.h5")
    ingest_here(saved, tmp_path / "test.h5", split="test", keep_order=True)
    assert stored(tmp_path / "test.h5") == [(png_bytes(4, k), k % 3) for k in (10, 11)]


def test_classlabel_integers_are_indices_not_names(tmp_path):
    """A ClassLabel whose names look like numbers: the value 0 is the first name, as in datasets."""
    pq.write_table(rows_table(0, 6, names=("1", "2", "3")), tmp_path / "t.parquet")
    ingest_here(tmp_path / "t.parquet", tmp_path / "t.h5", keep_order=True)
    with open_container(str(tmp_path / "t.h5")) as c:
        assert c.info.class_names == ("1", "2", "3")
        assert [int(x) for x in c.labels] == [k % 3 for k in range(6)]
    table = rows_table(0, 2)
    pq.write_table(table.set_column(1, "label", pa.array([0, -1])), tmp_path / "u.parquet")
    with pytest.raises(SampleError, match=r"label -1 is not a class index 0..2 .*no label"):
        ingest_here(tmp_path / "u.parquet", tmp_path / "u.h5")


def test_table_columns_are_stored_as_fields_or_named(tmp_path):
    """Detection style: boxes (a list of lists) and a caption per row come back per sample, in the
    container's seeded order; a timestamp column, which has no JSON form, is named as not stored."""
    import datetime

    table = rows_table(0, 5, extra=True)
    boxes = [[[k, 0.5, 2.0, 3.0]] * (k % 3) for k in range(5)]
    table = table.append_column("boxes", pa.array(boxes, type=pa.list_(pa.list_(pa.float64()))))
    table = table.append_column("when", pa.array([datetime.datetime(2020, 1, 1)] * 5))
    pq.write_table(table, tmp_path / "t.parquet", row_group_size=2)
    report = ingest_here(tmp_path / "t.parquet", tmp_path / "t.h5", seed=1)
    assert (
        "columns: image (image), label (label); fields to store: text, boxes; not stored (no text, bytes or "
        "JSON form): when (timestamp[us])"
    ) in report.notes
    assert "fields stored: text (text), boxes (json)" in report.notes
    with open_container(str(tmp_path / "t.h5")) as c:
        rows = [int(c.name(j).rsplit("#", 1)[1]) for j in range(c.num_samples)]
        assert rows != sorted(rows)
        assert [c.field("text", j) for j in range(5)] == [f"row {k}" for k in rows]
        assert [c.field("boxes", j) for j in range(5)] == [boxes[k] for k in rows]
        assert [bytes(c.sample(j)[0]) for j in range(5)] == [png_bytes(4, k) for k in rows]


def write_tar(path, members) -> None:
    with tarfile.open(path, "w") as tf:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))


def test_webdataset_duplicate_member_is_refused(tmp_path):
    write_tar(
        tmp_path / "d.tar",
        [
            ("a.png", png_bytes(4, 0)),
            ("a.cls", b"0"),
            ("b.png", png_bytes(4, 1)),
            ("b.cls", b"1"),
            ("b.png", png_bytes(4, 2)),
        ],
    )
    with pytest.raises(SampleError, match=r"d.tar: sample 'b' has two members 'b.png' and 'b.png'"):
        ingest_here(tmp_path / "d.tar", tmp_path / "d.h5")
    report = ingest_here(tmp_path / "d.tar", tmp_path / "d.h5", on_error="skip")
    assert report.samples == 1 and report.skipped[0][0].endswith("d.tar:b")


def test_webdataset_macos_members_skipped_and_fields_named(tmp_path):
    write_tar(
        tmp_path / "m.tar",
        [
            ("a.png", png_bytes(4, 0)),
            ("._a.png", b"\0\5\26\7"),
            ("a.cls", b"2"),
            ("a.json", b"{}"),
            ("a.txt", b"hi"),
            ("README", b"x"),
            ("b.png", png_bytes(4, 1)),
            ("b.cls", b"1"),
            ("b.json", b"{}"),
        ],
    )
    report = ingest_here(tmp_path / "m.tar", tmp_path / "m.h5", keep_order=True)
    assert stored(tmp_path / "m.h5") == [(png_bytes(4, 0), 2), (png_bytes(4, 1), 1)]
    assert [p.rsplit(":", 1)[1] for p in report.ignored] == ["._a.png", "README"]
    assert (
        "members: png (image), cls (label); other members, fields to store: json (2 of 2 samples), txt (1 of 2 samples)"
    ) in report.notes
    with open_container(str(tmp_path / "m.h5")) as c:
        assert c.field_names == ("json", "txt") and c.field_bytes("txt", 1) == b""


def test_truncated_tar_names_the_member_and_offset(tmp_path):
    write_tar(
        tmp_path / "full.tar", [m for k in range(3) for m in ((f"s{k}.png", png_bytes(16, k)), (f"s{k}.cls", b"0"))]
    )
    data = (tmp_path / "full.tar").read_bytes()
    (tmp_path / "cut.tar").write_bytes(data[: len(data) // 3])
    with pytest.raises(
        SampleError,
        match=r"cut.tar: truncated: member 's\d.png' needs bytes up to \d+ but the file "
        r"ends at byte \d+",
    ) as err:
        ingest_here(tmp_path / "cut.tar", tmp_path / "c.h5")
    assert "decompress" not in str(err.value)
    (tmp_path / "junk.tar").write_bytes(b"not a tar at all" * 64)
    with pytest.raises(SampleError, match="junk.tar: not a tar file"):
        ingest_here(tmp_path / "junk.tar", tmp_path / "j.h5")


def test_split_file_names_in_datasets_order_read_once(tmp_path):
    """`datasets` takes train-training-3 twice (two of its train patterns match) and drops x.parquet
    (no split): dstore reads it once and lists x.parquet as ignored, saying both."""
    flat = tmp_path / "flat"
    flat.mkdir()
    for k, name in enumerate(["my-train-1", "train_2", "train-training-3", "foo-test", "x"]):
        pq.write_table(rows_table(k, 1), flat / f"{name}.parquet")
    report = ingest_here(flat, tmp_path / "t.h5", split="train", keep_order=True)
    assert stored(tmp_path / "t.h5") == [(png_bytes(4, k), k % 3) for k in (2, 1, 0)]  # datasets' file order
    assert any("train-training-3.parquet); datasets reads their rows twice, dstore once" in n for n in report.notes)
    assert report.ignored == [str(flat / "x.parquet")]
    assert any(n.startswith("1 table file(s) in no split, not read") for n in report.notes)


def test_image_stored_as_a_path_only_is_named(tmp_path):
    table = rows_table(0, 2)
    images = pa.array(
        [{"bytes": png_bytes(4, 0), "path": None}, {"bytes": None, "path": "/elsewhere/b.png"}], type=IMAGE
    )
    pq.write_table(table.set_column(0, "image", images), tmp_path / "p.parquet")
    with pytest.raises(SampleError, match=r"p.parquet#1: no image bytes, only the path '/elsewhere/b.png'"):
        ingest_here(tmp_path / "p.parquet", tmp_path / "p.h5")


def test_a_tar_cut_anywhere_is_refused(tmp_path):
    """Cut at any byte (a member boundary, inside a header, inside data) or with a damaged header,
    a shard is refused naming it; tarfile and webdataset end a shard cut in a header in silence."""
    from dstore.ingest.tar import TarSource

    write_tar(
        tmp_path / "full.tar", [m for k in range(3) for m in ((f"s{k}.png", png_bytes(4, k)), (f"s{k}.cls", b"0"))]
    )
    data = (tmp_path / "full.tar").read_bytes()
    assert len(TarSource(str(tmp_path / "full.tar"))) == 3
    end = data.rindex(b"0") + 512  # after the last member's data block: the end-of-archive blocks
    for cut in sorted({*range(1, end, 97), *range(512, end, 512)}):
        (tmp_path / "cut.tar").write_bytes(data[:cut])
        with pytest.raises(SampleError, match=r"cut.tar: (not a tar file|truncated|damaged)"):
            TarSource(str(tmp_path / "cut.tar"))
    (tmp_path / "bad.tar").write_bytes(data[:2048] + b"x" * 512 + data[2560:])  # s1.png header
    with pytest.raises(
        SampleError,
        match=r"bad.tar: damaged after member 's0.cls': no valid tar header at byte "
        r"offset 2048",
    ):
        TarSource(str(tmp_path / "bad.tar"))


def test_webdataset_directory_splits_are_not_mixed(tmp_path):
    """A Hub WebDataset directory (train-000.tar beside validation-000.tar) is two splits, as
    datasets reads it: one is picked, never both mixed."""
    wds = tmp_path / "wds"
    wds.mkdir()
    write_tar(
        wds / "train-000.tar",
        [("a.png", png_bytes(4, 0)), ("a.cls", b"0"), ("b.png", png_bytes(4, 1)), ("b.cls", b"1")],
    )
    write_tar(wds / "validation-000.tar", [("c.png", png_bytes(4, 2)), ("c.cls", b"1")])
    with pytest.raises(SampleError, match=r"wds: holds the splits train, validation; .*--split NAME"):
        ingest_here(wds, tmp_path / "x.h5")
    report = ingest_here(wds, tmp_path / "v.h5", split="validation", keep_order=True)
    assert stored(tmp_path / "v.h5") == [(png_bytes(4, 2), 1)]
    assert "split 'validation' of the splits train, validation (1 shard(s))" in report.notes
    with pytest.raises(SampleError, match=r"picks a split of a directory"):
        ingest_here(wds / "train-000.tar", tmp_path / "t.h5", split="train")
