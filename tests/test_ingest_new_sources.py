"""The sources of issue 23: a flat folder with a labels CSV, WebDataset tar shards, Parquet files and
a Hugging Face `datasets` directory, and `ingest_items` over any iterable. Each round-trips byte for
byte against the files it came from, with the labels they name; bad items are named and
skippable; under `mpiexec -n 2` the container is the single-process one; and one trains."""

import csv
import io
import json
import os
import tarfile
import zlib

import numpy as np
import pytest
from mpi4py import MPI
from support.ingest import digit_png, ingest_here, small_jpegs
from support.mpirun import run_mpi

from dstore.errors import ConfigError, SampleError
from dstore.formats import open_container
from dstore.ingest import ingest_items
from dstore.ingest.registry import source_type_of

SELF = MPI.COMM_SELF


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """A flat folder of 18 JPEGs and 6 grey PNGs, and (file name, class name) for each."""
    root = tmp_path_factory.mktemp("flat")
    staged = root / "staged"
    paths = small_jpegs(str(staged), 18, seed=7)
    flat = root / "flat"
    flat.mkdir()
    rows = []
    for p in paths:
        name = os.path.basename(p)
        os.rename(p, flat / name)
        rows.append((name, "cat" if int(name[:-4]) % 3 == 0 else "dog" if int(name[:-4]) % 3 == 1 else "emu"))
    for i in range(6):
        (flat / f"d{i}.png").write_bytes(digit_png(i))
        rows.append((f"d{i}.png", "dog"))
    return flat, rows


def check_round_trip(path, expect: dict, class_names) -> None:
    """Every sample's bytes are the expected item's, its checksum their CRC32, its label the named
    class; every item is there once."""
    with open_container(str(path)) as c:
        assert c.info.class_names == tuple(class_names)
        assert c.num_samples == len(expect)
        seen = set()
        for j in range(c.num_samples):
            data, label = c.sample(j)
            want, want_class = expect[c.name(j)]
            assert bytes(data) == want, c.name(j)
            assert int(c.checksums[j]) == zlib.crc32(want)
            assert c.info.class_names[label] == want_class, (c.name(j), label)
            seen.add(c.name(j))
        assert len(seen) == len(expect)
        assert c.info.extra["ingest_order"] == "seeded"


def write_csv(path, rows, header=True):
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        if header:
            w.writerow(["path", "label"])
        w.writerows(rows)


def test_flat_folder_with_labels_csv(files, tmp_path):
    flat, rows = files
    write_csv(tmp_path / "labels.csv", rows)
    report = ingest_here(flat, tmp_path / "a.h5", labels=str(tmp_path / "labels.csv"))
    assert report.samples == 24 and report.encoding == "image"
    check_round_trip(tmp_path / "a.h5", {n: ((flat / n).read_bytes(), c) for n, c in rows}, ("cat", "dog", "emu"))
    # Integer labels are class indices; a missing file is a bad sample, named, and skippable.
    numbered = [(n, str(k % 4)) for k, (n, _) in enumerate(rows[:8])] + [("gone.jpg", "1")]
    write_csv(tmp_path / "n.csv", numbered, header=False)
    with pytest.raises(SampleError, match="gone.jpg: cannot read"):
        ingest_here(flat, tmp_path / "n.h5", labels=str(tmp_path / "n.csv"))
    report = ingest_here(flat, tmp_path / "n.h5", labels=str(tmp_path / "n.csv"), on_error="skip")
    assert [os.path.basename(p) for p, _ in report.skipped] == ["gone.jpg"]
    check_round_trip(tmp_path / "n.h5", {n: ((flat / n).read_bytes(), c) for n, c in numbered[:8]}, "0123")
    write_csv(tmp_path / "bad.csv", [("a.jpg",)], header=False)
    with pytest.raises(SampleError, match="row 1 is not path,label"):
        ingest_here(flat, tmp_path / "b.h5", labels=str(tmp_path / "bad.csv"))


def make_shards(files, directory, per_shard=10, extra=()):
    """WebDataset shards of the flat folder's files: key.<ext> + key.cls (class index) + key.json."""
    flat, rows = files
    classes = sorted({c for _, c in rows})
    os.makedirs(directory, exist_ok=True)
    expect = {}
    for s in range(0, len(rows), per_shard):
        shard = os.path.join(directory, f"shard-{s // per_shard:06d}.tar")
        with tarfile.open(shard, "w") as tf:
            for k, (name, cls) in enumerate(rows[s : s + per_shard]):
                key = f"sample{s + k:05d}"
                ext = name.rsplit(".", 1)[1]
                members = [
                    (f"{key}.{ext}", (flat / name).read_bytes()),
                    (f"{key}.cls", str(classes.index(cls)).encode()),
                    (f"{key}.json", json.dumps({"file": name}).encode()),
                ]
                for member, data in members:
                    info = tarfile.TarInfo(member)
                    info.size = len(data)
                    tf.addfile(info, io.BytesIO(data))
                expect[f"{os.path.basename(shard)}/{key}.{ext}"] = ((flat / name).read_bytes(), cls)
            for member, data in extra if s == 0 else ():
                info = tarfile.TarInfo(member)
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))
    return expect, classes


def test_webdataset_shards_read_in_place(files, tmp_path):
    shards = tmp_path / "shards"
    expect, classes = make_shards(files, str(shards), extra=[("orphan.json", b"{}")])
    assert source_type_of(str(shards)) == "tar"
    with pytest.raises(SampleError, match=r"orphan: sample has no image member \(jpg;png\)"):
        ingest_here(shards, tmp_path / "t.h5", image_key="jpg;png")
    report = ingest_here(
        str(shards / "shard-{000000..000002}.tar"),
        tmp_path / "t.h5",
        image_key="jpg;png",
        on_error="skip",
        classes=classes,
    )
    assert len(report.skipped) == 1 and "orphan" in report.skipped[0][0]
    check_round_trip(tmp_path / "t.h5", expect, classes)
    with tarfile.open(tmp_path / "z.tar.gz", "w:gz") as tf:
        tf.add(str(shards / "shard-000000.tar"), arcname="x.jpg")
    with pytest.raises(SampleError, match="gzip-compressed tar.*decompress it first"):
        ingest_here(tmp_path / "z.tar.gz", tmp_path / "z.h5")  # recognised as a shard, refused with the reason


def test_parquet_and_datasets_directory(files, tmp_path):
    pa = pytest.importorskip("pyarrow", reason="pyarrow is optional (pip install 'dstore-mpi[parquet]')")
    import pyarrow.ipc
    import pyarrow.parquet as pq

    flat, rows = files
    classes = ["cat", "dog", "emu"]
    image_type = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    images = pa.array([{"bytes": (flat / n).read_bytes(), "path": n} for n, _ in rows], type=image_type)
    labels = pa.array([classes.index(c) for _, c in rows], type=pa.int64())
    features = {"image": {"_type": "Image"}, "label": {"names": classes, "_type": "ClassLabel"}}
    meta = {b"huggingface": json.dumps({"info": {"features": features}}).encode()}
    table = pa.table({"image": images, "label": labels}).replace_schema_metadata(meta)
    (tmp_path / "hub" / "data").mkdir(parents=True)
    pq.write_table(table.slice(0, 15), tmp_path / "hub" / "data" / "train-00000-of-00002.parquet", row_group_size=4)
    pq.write_table(table.slice(15), tmp_path / "hub" / "data" / "train-00001-of-00002.parquet", row_group_size=4)
    assert source_type_of(str(tmp_path / "hub")) == "parquet"
    ingest_here(tmp_path / "hub", tmp_path / "p.h5")
    names = [f"train-0000{k // 15}-of-00002.parquet#{k % 15}" for k in range(len(rows))]
    expect = {names[k]: ((flat / n).read_bytes(), c) for k, (n, c) in enumerate(rows)}
    check_round_trip(tmp_path / "p.h5", expect, classes)

    # A `datasets` save_to_disk directory: Arrow stream files, state.json, dataset_info.json.
    disk = tmp_path / "disk"
    disk.mkdir()
    plain = pa.table({"img": pa.array([(flat / n).read_bytes() for n, _ in rows]), "y": labels})
    with (
        pa.OSFile(str(disk / "data-00000-of-00001.arrow"), "wb") as sink,
        pyarrow.ipc.new_stream(sink, plain.schema) as w,
    ):
        w.write_table(plain)
    (disk / "state.json").write_text(json.dumps({"_data_files": [{"filename": "data-00000-of-00001.arrow"}]}))
    (disk / "dataset_info.json").write_text(json.dumps({"features": {"y": features["label"]}}))
    ingest_here(disk, tmp_path / "d.zarr", fmt="zarr", image_column="img", label_column="y")
    expect = {f"data-00000-of-00001.arrow#{k}": ((flat / n).read_bytes(), c) for k, (n, c) in enumerate(rows)}
    check_round_trip(tmp_path / "d.zarr", expect, classes)
    with pytest.raises(SampleError, match="no column 'image'"):
        ingest_here(disk, tmp_path / "e.h5")
    holes = pa.table({"image": pa.array([(flat / rows[0][0]).read_bytes(), None, b"junk"]), "label": [0, 1, None]})
    pq.write_table(holes, tmp_path / "holes.parquet")
    with pytest.raises(SampleError, match="holes.parquet: the label column 'label' has empty"):
        ingest_here(tmp_path / "holes.parquet", tmp_path / "h.h5")
    pq.write_table(holes.set_column(1, "label", pa.array([0, 1, 1])), tmp_path / "holes.parquet")
    report = ingest_here(tmp_path / "holes.parquet", tmp_path / "h.h5", on_error="skip")
    reasons = dict(report.skipped)
    assert report.samples == 1 and "no image bytes" in reasons[str(tmp_path / "holes.parquet") + "#1"]
    assert "not a valid image" in reasons[str(tmp_path / "holes.parquet") + "#2"], reasons


def test_ingest_items_from_any_iterable(files, tmp_path):
    flat, rows = files
    items = (((flat / n).read_bytes(), c, n) for n, c in rows)
    report = ingest_items(items, str(tmp_path / "i.h5"), comm=SELF, progress=False, seed=3)
    assert report.samples == 24
    check_round_trip(tmp_path / "i.h5", {n: ((flat / n).read_bytes(), c) for n, c in rows}, ("cat", "dog", "emu"))
    assert not [p for p in os.listdir(tmp_path) if "spool" in p]  # the spool is gone
    bad = [
        ((flat / rows[0][0]).read_bytes(), 0, "ok"),
        ("text, not bytes", 1, "wrong-type"),
        (b"junk", 1, "junk"),
        "not a triple",
    ]
    with pytest.raises(SampleError, match="wrong-type: its data is str"):
        ingest_items(iter(bad), str(tmp_path / "b.h5"), comm=SELF, progress=False)
    report = ingest_items(iter(bad), str(tmp_path / "b.h5"), comm=SELF, progress=False, on_error="skip")
    assert report.samples == 1 and len(report.skipped) == 3
    assert any("junk" in p for p, _ in report.skipped) and any("item 3" in p for p, _ in report.skipped)
    assert not [p for p in os.listdir(tmp_path) if "spool" in p]
    with pytest.raises(ConfigError, match="needs labels"):
        ingest_here(flat, tmp_path / "c.h5", source_type="list")


ITEMS_RUN = """
import sys
from mpi4py import MPI
from dstore.ingest import ingest_items
flat, out = sys.argv[1], sys.argv[2]
rows = [line.split(",") for line in open(sys.argv[3]).read().split()]
items = ((open(f"{flat}/{n}", "rb").read(), c, n) for n, c in rows) if MPI.COMM_WORLD.rank == 0 else None
ingest_items(items, out, shards=2, seed=5, progress=False)
"""


@pytest.mark.mpi
def test_two_ranks_give_the_single_process_containers_and_train(files, tmp_path):
    flat, rows = files
    write_csv(tmp_path / "labels.csv", rows, header=False)
    expect, classes = make_shards(files, str(tmp_path / "shards"))
    (tmp_path / "items.py").write_text(ITEMS_RUN)
    (tmp_path / "classes.txt").write_text("\n".join(classes) + "\n")
    run_mpi(
        2,
        [
            "dstore",
            "ingest",
            str(tmp_path / "shards"),
            str(tmp_path / "t2"),
            "--shards",
            "2",
            "--seed",
            "5",
            "--tar-image-key",
            "jpg;png",
            "--classes",
            str(tmp_path / "classes.txt"),
            "--no-progress",
        ],
        timeout=120,
    )
    run_mpi(
        2,
        [
            "dstore",
            "ingest",
            str(flat),
            str(tmp_path / "l2.h5"),
            "--labels",
            str(tmp_path / "labels.csv"),
            "--seed",
            "5",
            "--no-progress",
        ],
        timeout=120,
    )
    run_mpi(
        2,
        ["python", str(tmp_path / "items.py"), str(flat), str(tmp_path / "i2"), str(tmp_path / "labels.csv")],
        timeout=120,
    )
    ingest_here(tmp_path / "shards", tmp_path / "t1.h5", seed=5, image_key="jpg;png", classes=classes)
    ingest_here(flat, tmp_path / "l1.h5", seed=5, labels=str(tmp_path / "labels.csv"))
    ingest_items(
        (((flat / n).read_bytes(), c, n) for n, c in rows), str(tmp_path / "i1.h5"), comm=SELF, progress=False, seed=5
    )
    pairs = [("t2", "t1.h5"), ("l2.h5", "l1.h5"), ("i2", "i1.h5")]
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:  # optional: the other sources still run
        pa = pq = None
    if pa is not None and pq is not None:
        table = pa.table({"image": [(flat / n).read_bytes() for n, _ in rows], "label": [c for _, c in rows]})
        pq.write_table(table, tmp_path / "rows.parquet", row_group_size=5)
        run_mpi(
            2,
            [
                "dstore",
                "ingest",
                str(tmp_path / "rows.parquet"),
                str(tmp_path / "p2.h5"),
                "--seed",
                "5",
                "--no-progress",
            ],
            timeout=120,
        )
        ingest_here(tmp_path / "rows.parquet", tmp_path / "p1.h5", seed=5)
        pairs.append(("p2.h5", "p1.h5"))
    for two, one in pairs:
        with open_container(str(tmp_path / two)) as a, open_container(str(tmp_path / one)) as b:
            assert a.num_samples == b.num_samples == 24
            assert [a.name(j) for j in range(24)] == [b.name(j) for j in range(24)]
            assert np.array_equal(a.checksums, b.checksums) and np.array_equal(a.labels, b.labels)
    check_round_trip(tmp_path / "t2", expect, classes)
    run_dir = tmp_path / "run"
    run_mpi(
        2,
        [
            "dstore",
            "train",
            str(tmp_path / "t2"),
            "--epochs",
            "1",
            "--batch-size",
            "8",
            "--image-size",
            "16",
            "--model",
            "small_cnn",
            "--no-progress",
            "--run-dir",
            str(run_dir),
        ],
        timeout=120,
    )
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert any(r.get("epoch") == 0 and np.isfinite(r["train_loss"]) for r in records), records
