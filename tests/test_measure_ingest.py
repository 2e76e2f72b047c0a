"""`python -m dstore.tools.measure.ingest` (ingest throughput beside the peers' writers): a tiny run
with dstore alone writes its JSON and Markdown with one row per writer and rank count, every output
checked to hold all the samples; missing peers are rows that say why; the tar shards the tool packs
read back (by the peers' reader) as the folder's samples. Shapes only, never timings."""

import json
import os

from dstore.tools.measure import ingest, ingest_peer

COUNT = 24


def test_a_tiny_run_of_dstore_alone_writes_rows_verdicts_and_tables(tmp_path, monkeypatch):
    monkeypatch.setenv("DSTORE_PEERS_PYTHON", str(tmp_path / "nowhere" / "python"))
    monkeypatch.setattr(ingest, "DEFAULT_PEERS_VENV", tmp_path / "also-nowhere")
    out = tmp_path / "out"
    rc = ingest.main(
        [
            "--count",
            str(COUNT),
            "--storage",
            "local",
            "--inputs",
            "folder",
            "--parallel",
            "1",
            "--writers",
            "dstore-hdf5",
            "webdataset",
            "--out-dir",
            str(out),
        ]
    )
    assert rc == 0
    res = json.loads((out / "ingest.json").read_text())
    rows = {(r["input"], r["writer"]): r for r in res["rows"]}
    assert set(rows) == {("folder", w) for w in ("dstore-hdf5", "webdataset")}
    for kind in ("folder",):
        r = rows[(kind, "dstore-hdf5")]
        assert "error" not in r and r["samples"] == COUNT and r["files"] == COUNT and r["parallel"] == 1
        for key in (
            "files_per_s",
            "mb_per_s",
            "files_per_s_per_process",
            "cpu_ms_per_file",
            "peak_tree_rss_mb",
            "max_process_rss_mb",
            "bytes_written",
        ):
            assert r[key] > 0, key
        assert r["jpeg_bytes"] == res["inputs"][f"local/{kind}"]["jpeg_bytes"] > COUNT * 1000
        assert "no peers venv" in rows[(kind, "webdataset")]["skipped"]
    assert {(v["input"], v["column"]) for v in res["verdicts"]} == {("folder", name) for _, name, _ in ingest.COLUMNS}
    md = (out / "ingest.md").read_text()
    assert "| local | folder | dstore ingest (HDF5) | 1 |" in md and "skipped: no peers venv" in md
    assert not (out / "work").exists()  # every writer's output removed after its run


def test_the_peers_tar_reader_gives_back_the_packed_samples(tmp_path):
    folder = ingest.image_folder(str(tmp_path), 12, 1)
    classes, files = ingest.listing(folder)
    tars = ingest.shards_of(ingest.tar_shards(folder, 5))
    assert len(tars) == 3 and classes == [
        "class000",
        "class001",
        "class002",
        "class003",
        "class004",
        "class005",
        "class006",
        "class007",
        "class008",
        "class009",
    ]
    got = list(ingest_peer.samples("tars", tars))
    want = {}
    for path, label in files:
        with open(path, "rb") as fh:
            want[fh.read()] = label
    assert len(got) == 12 and {image: label for _, image, label in got} == want
    key, image, label = list(ingest_peer.samples("folder", files[:2]))[1]
    assert (key, label) == (os.path.splitext(os.path.basename(files[1][0]))[0], files[1][1])
    assert image == open(files[1][0], "rb").read()
    assert [len(p) for p in ingest_peer.parts(list(range(7)), 2)] == [3, 4]
