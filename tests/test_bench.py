"""`dstore bench`: the report arithmetic on fixed inputs, and `--quick` runs on 1 and 2 ranks whose outputs
(JSON keys, Markdown tables, PNGs) are well formed. No timing is asserted: figures depend on the machine."""

from __future__ import annotations

import json
import os

import pytest
from support.formats import plain_array, plain_values
from support.mpirun import run_mpi

from dstore.tools.bench import layouts, mosaic, report, runner
from dstore.tools.bench.common import Measurement

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _m(name, group, cache, mb, ranks=2, samples=1000):
    # `mb` MB delivered per rank in one second by each rank.
    return Measurement(name, group, cache, [samples] * ranks, [int(mb * 1e6)] * ranks, [1.0] * ranks).to_dict()


def _results(ranks=2, store_mb=8000.0):
    ms = [
        _m(report.RAW_RMA, "limit", "memory", 5000, ranks),
        _m(report.SEQ_READ, "limit", "cold", 1000, ranks, samples=0),
        _m(report.SEQ_READ_FRESH, "limit", "cold", 800, ranks, samples=0),
        _m(report.FOLDER, "baseline", "cold", 100, ranks),
        _m(report.H5PY, "baseline", "warm", 300, ranks),
        _m(report.POP_PRELOAD, "population", "cold", 600, ranks),
        _m(report.STORE_MAIN, "store", "memory", store_mb / ranks, ranks),
        _m(report.STORE_GETS, "store", "memory", 3000 / ranks, ranks),
        _m("store + StoreLoader decode", "decode", "memory", 1, ranks),
    ]
    return {
        "meta": {
            "ranks": ranks,
            "num_samples": 1000,
            "total_bytes": 110_000_000,
            "mean_sample_bytes": 110_000,
            "batch_size": 64,
            "seed": 0,
            "machine": "test",
            "command": "dstore bench",
            "cores": 2,
            "load_average": [0.1, 0.2],
        },
        "measurements": ms,
        "training_view": {
            "compute_seconds": 0.05,
            "store_step_seconds": 0.04,
            "factor": 1.25,
            "loaders": [
                {
                    "name": "store (StoreLoader)",
                    "steps": 10,
                    "wall": 0.52,
                    "wait": 0.01,
                    "au": 0.96,
                    "rank_au": [0.96, 0.97],
                }
            ],
        },
        "growth": [
            {"num_samples": n, "total_bytes": n * 110_000, "store": ms[5], "raw_rma": ms[0]} for n in (100, 1000)
        ],
        "notes": ["a note"],
    }


def test_measurement_rates_and_round_trip():
    m = Measurement("x", "store", "memory", [10, 30], [1_000_000, 3_000_000], [0.5, 2.0])
    assert m.wall == 2.0
    assert m.total_mb_per_s == pytest.approx(2.0)  # 4 MB in the slowest rank's 2 s
    assert m.rank_mb_per_s == pytest.approx([2.0, 1.5])
    assert m.us_per_sample == pytest.approx(2.0 / 40 * 1e6)
    assert Measurement.from_dict(m.to_dict()).to_dict() == m.to_dict()


def test_ratios_against_goals():
    r = {x["key"]: x for x in report.compute_ratios(_results())}
    assert r["store_vs_raw_rma"]["value"] == pytest.approx(8000 / 10000)
    assert r["store_vs_raw_rma"]["met"] is True
    assert r["store_gets_vs_raw_rma"]["value"] == pytest.approx(3000 / 10000)
    assert r["store_gets_vs_raw_rma"]["met"] is False
    assert r["store_vs_h5py_warm"]["value"] == pytest.approx(8000 / 600)
    assert r["store_vs_folder_cold"]["value"] == pytest.approx(40.0)
    assert r["population_vs_seq_cold"]["value"] == pytest.approx(0.6)
    assert r["population_vs_seq_cold"]["met"] is False
    assert r["population_vs_seq_fresh_cold"]["value"] == pytest.approx(0.75)
    assert r["population_vs_seq_fresh_cold"]["met"] is None  # reported, no goal
    assert r["store_au"]["value"] == 0.96 and r["store_au"]["met"] is True


def test_a_smoke_run_judges_no_goal():
    res = _results()
    res["meta"]["num_samples"] = 192  # --quick
    r = {x["key"]: x for x in report.compute_ratios(res)}
    assert r["store_vs_raw_rma"]["value"] == pytest.approx(0.8) and r["store_vs_raw_rma"]["met"] is None
    assert r["store_gets_vs_raw_rma"]["met"] is None and r["store_au"]["met"] is None
    assert not r["store_au"]["judged"] and r["store_au"]["value"] == 0.96
    text = report.markdown(res)
    assert "not judged" in text and "**no**" not in text


def test_missing_measurement_gives_no_ratio():
    res = _results()
    res["measurements"] = [m for m in res["measurements"] if m["name"] != report.H5PY]
    r = {x["key"]: x for x in report.compute_ratios(res)}
    assert r["store_vs_h5py_warm"]["value"] is None and r["store_vs_h5py_warm"]["met"] is None
    assert "| store delivery / warm h5py per-sample (contiguous) | n/a |" in report.markdown(res)


def test_write_outputs_and_collect(tmp_path):
    dirs = []
    for ranks in (1, 2, 4):
        d = tmp_path / f"n{ranks}"
        report.write_outputs(_results(ranks, store_mb=4000.0 * ranks), str(d))
        dirs.append(str(d))
    _check_outputs(dirs[1], ranks=2, real=False)
    paths = report.collect(dirs, str(tmp_path / "all"))
    merged = json.loads((tmp_path / "all" / "scaling.json").read_text())
    assert merged["ranks"] == [1, 2, 4]
    store = next(r for r in merged["readers"] if r["name"] == report.STORE_MAIN)
    assert store["mb_per_s"] == pytest.approx([4000.0, 8000.0, 16000.0])
    md = (tmp_path / "all" / "scaling.md").read_text()
    assert "| reader | cache | 1 rank(s) MB/s | 2 rank(s) MB/s | 4 rank(s) MB/s |" in md
    assert any(p.endswith("scaling.png") for p in paths)
    assert (tmp_path / "all" / "scaling.png").read_bytes().startswith(PNG_MAGIC)


def test_per_sample_copies_hold_the_container_and_are_reused(tmp_path):
    import h5py
    import numpy as np
    import zarr
    from mpi4py import MPI

    from dstore.formats import create_writer, open_container

    src = str(tmp_path / "c.h5")
    rng = np.random.default_rng(0)
    with create_writer(src, "hdf5", encoding="image", class_names=["a", "b"]) as w:
        for i in range(40):
            w.append(rng.integers(0, 255, int(rng.integers(1, 50_000)), dtype=np.uint8), i % 2, f"s{i}")
    with open_container(src) as r:
        offsets, labels, whole = np.asarray(r.offsets), np.asarray(r.labels), r.read_bytes(0, r.total_bytes)
    out = str(tmp_path / "data")
    h5 = layouts.contiguous_hdf5(MPI.COMM_SELF, src, offsets, labels, out)
    zr = layouts.per_sample_zarr(MPI.COMM_SELF, src, offsets, labels, out)
    assert h5.endswith("c" + layouts.CONTIGUOUS_SUFFIX) and zr.endswith("c" + layouts.PER_SAMPLE_ZARR_SUFFIX)
    with h5py.File(h5, "r") as f:
        assert plain_array(f, "data").chunks is None
        assert np.array_equal(plain_values(f, "data"), whole) and np.array_equal(plain_values(f, "offsets"), offsets)
    g = zarr.open_group(zr, mode="r")
    assert plain_array(g, "data").chunks == (layouts.ZARR_CHUNK_BYTES,) and np.array_equal(
        plain_values(g, "data"), whole
    )
    assert layouts.chunk_bytes(h5, "h5py") is None
    before = os.stat(h5).st_mtime_ns
    layouts.contiguous_hdf5(MPI.COMM_SELF, src, offsets, labels, out)
    assert os.stat(h5).st_mtime_ns == before  # current: reused
    layouts.contiguous_hdf5(MPI.COMM_SELF, src, offsets[:-1], labels[:-1], out)  # another container: rewritten
    with h5py.File(h5, "r") as f:
        assert len(plain_values(f, "offsets")) == len(offsets) - 1


def test_mosaic_skipped_with_a_note_without_its_venv(tmp_path, monkeypatch):
    from mpi4py import MPI

    monkeypatch.setattr(mosaic, "DEFAULT_VENV", tmp_path / "absent")
    monkeypatch.delenv("DSTORE_MOSAIC_VENV", raising=False)
    ms, note = mosaic.run_peer(MPI.COMM_SELF, [], str(tmp_path / "w"), seed=0, batch_size=8)
    assert ms == [] and note.startswith("skipped: no Mosaic venv") and "setup_mosaic.sh" in note


def _check_outputs(out, *, ranks, real=True):
    res = json.loads(open(os.path.join(out, "results.json")).read())
    assert set(res) >= {"meta", "measurements", "training_view", "growth", "ratios", "notes"}
    assert res["meta"]["ranks"] == ranks
    for m in res["measurements"]:
        assert set(m) >= {
            "name",
            "group",
            "cache",
            "ranks",
            "samples",
            "bytes",
            "seconds",
            "total_mb_per_s",
            "total_samples_per_s",
            "rank_mb_per_s",
            "us_per_sample",
        }
        assert len(m["seconds"]) == m["ranks"] and all(s >= 0 for s in m["seconds"])
    keys = {r["key"] for r in res["ratios"]}
    assert keys == {
        "store_vs_raw_rma",
        "store_gets_vs_raw_rma",
        "store_vs_h5py_warm",
        "store_vs_folder_cold",
        "population_vs_seq_cold",
        "store_vs_h5py_cold",
        "store_vs_h5py_container_warm",
        "store_gets_vs_h5py_warm",
        "population_vs_seq_fresh_cold",
        "store_au",
    }
    if real:
        names = {(m["name"], m["cache"]) for m in res["measurements"]}
        for want in [
            ("memcpy", "memory"),
            (report.RAW_RMA, "memory"),
            (report.SEQ_READ, "cold"),
            (report.SEQ_READ, "warm"),
            (report.FOLDER, "cold"),
            (report.H5PY, "warm"),
            (report.H5PY, "cold"),
            (report.H5PY_CONTAINER, "warm"),
            (report.ZARR, "cold"),
            (report.ZARR_CONTAINER, "warm"),
            (report.POP_PRELOAD, "cold"),
            ("store population (dynamic)", "warm"),
            (report.STORE_MAIN, "memory"),
            ("store local, prefetch off", "memory"),
            ("store partial, prefetch on", "memory"),
            (report.STORE_GETS, "memory"),
            ("store + StoreLoader decode", "memory"),
        ]:
            assert want in names, want
        assert all(r["value"] is not None for r in res["ratios"]), res["ratios"]
        assert [g["num_samples"] for g in res["growth"]] == [64, 192]
        assert {row["name"] for row in res["training_view"]["loaders"]} == {
            "store (StoreLoader)",
            "DataLoader over files",
            runner.TV_H5PY,
            runner.TV_ZARR,
        }
        for m in res["measurements"]:  # the fair per-sample rows read the copies, the others the containers
            if m["name"] in (report.H5PY, report.ZARR):
                assert m["extra"]["path"].endswith((layouts.CONTIGUOUS_SUFFIX, layouts.PER_SAMPLE_ZARR_SUFFIX))
            if m["name"] == report.H5PY_CONTAINER:
                assert m["extra"]["chunk_bytes"] > 0  # the quick set (21 MB) is written in chunks
    md = open(os.path.join(out, "results.md")).read()
    assert md.startswith(f"# dstore bench: {ranks} rank(s)")
    for heading in ("## Throughput", "## Ratios against the goals", "## Training view"):
        assert heading in md, heading
    assert ("## Cost per sample" in md) == bool(res["growth"])
    table = [line for line in md.splitlines() if line.startswith("| ")]
    assert all(line.endswith("|") for line in table)
    for png in ("throughput.png", "au.png") + (("growth.png",) if res["growth"] else ()):
        with open(os.path.join(out, png), "rb") as fh:
            assert fh.read(8) == PNG_MAGIC, png


@pytest.mark.mpi
@pytest.mark.slow
def test_quick_run_on_1_and_2_ranks(tmp_path):
    data = str(tmp_path / "data")  # generated once, reused by the 2-rank run
    common = ["--quick", "--no-mosaic", "--data-dir", data]
    one, two = str(tmp_path / "n1"), str(tmp_path / "n2")
    res = run_mpi(1, ["dstore", "bench", *common, "--out", one], timeout=150)
    assert "store delivery / raw RMA" in res.stdout
    assert "NOT met" not in res.stdout and "not judged" in res.stdout, res.stdout  # 192 samples judge no goal
    _check_outputs(one, ranks=1)
    run_mpi(2, ["dstore", "bench", *common, "--out", two, "--warm", "--growth", ""], timeout=150)
    _check_outputs(two, ranks=2, real=False)
    res = json.loads(open(os.path.join(two, "results.json")).read())
    assert {m["cache"] for m in res["measurements"]} <= {"warm", "memory"}
    run_mpi(1, ["dstore", "bench", "--collect", one, two, "--out", str(tmp_path / "all")], timeout=60)
    assert (tmp_path / "all" / "scaling.png").read_bytes().startswith(PNG_MAGIC)
    assert "| 1 rank(s) MB/s | 2 rank(s) MB/s |" in (tmp_path / "all" / "scaling.md").read_text()


def test_generated_data_options_and_their_errors():
    from dstore.errors import ConfigError
    from dstore.tools.bench.data import data_tag
    from dstore.tools.cli import build_parser
    from dstore.tools.cmd_bench import _config

    def config(*argv):
        return _config(build_parser().parse_args(["bench", *argv]))

    cfg = config("--count", "100", "--mean-kb", "30", "--sides", "100,200", "--cold-repeat", "2")
    assert (cfg.count, cfg.mean_bytes, cfg.sides, cfg.cold_repeat) == (100, 30_000, (100, 200), 2)
    default = config()
    assert (default.mean_bytes, default.sides, default.cold_repeat, default.train_samples) == (
        110_000,
        (333, 500),
        3,
        None,
    )
    # The default data set keeps the name it had before these options, other sizes get their own.
    assert data_tag(4096, 0) == data_tag(4096, 0, 110_000, (333, 500)) == "4096-s0"
    assert data_tag(4096, 0, 30_000, (100, 200)) == "4096-s0-m30000-100x200"
    for argv, flag in (
        (["--sides", "5,3"], "--sides=5,3"),
        (["--mean-kb", "0"], "--mean-kb=0"),
        (["--mean-kb", "1000"], "--mean-kb=1000 with --sides=333,500"),
        (["--cold-repeat", "0"], "--cold-repeat=0"),
    ):
        with pytest.raises(ConfigError, match=flag):
            config(*argv)
