"""Looking at a run: metrics.csv beside metrics.jsonl (a resumed run appends under the first
header), TensorBoard events with --tensorboard (where the package is installed), and `dstore plot`
drawing loss, accuracy, samples/s and data wait into a PNG."""

import csv
import importlib.util
import os
import subprocess
import sys

import pytest
from support.formats import raw_container
from support.mpirun import REPO

from dstore.errors import ConfigError
from dstore.training.metrics import CurveLogs
from dstore.training.plot import plot_run

HAS_TB = importlib.util.find_spec("tensorboard") is not None


def test_csv_rows_per_epoch_and_a_resume_appends_under_the_header(tmp_path):
    logs = CurveLogs(str(tmp_path))
    logs.write({"epoch": 0, "global_step": 5, "train_loss": 1.5, "lr": 0.1, "note": "text is left out"})
    logs.close()
    again = CurveLogs(str(tmp_path))  # a resumed run: a new writer over the same file
    again.write({"epoch": 1, "global_step": 10, "lr": 0.05, "train_loss": 0.5, "val_loss": 0.7})
    rows = list(csv.DictReader(open(tmp_path / "metrics.csv", newline="")))
    assert [r["epoch"] for r in rows] == ["0", "1"] and rows[1]["train_loss"] == "0.5"
    assert list(rows[0]) == ["epoch", "global_step", "train_loss", "lr"]  # the first header rules
    assert CurveLogs(None).csv_path is None  # ranks other than the main one write nothing


def test_plot_refuses_what_is_not_a_run(tmp_path):
    with pytest.raises(ConfigError, match="not a dstore run directory"):
        plot_run(str(tmp_path))
    (tmp_path / "metrics.jsonl").write_text('{"final": true, "io_stats": []}\n')
    with pytest.raises(ConfigError, match="no epoch yet"):
        plot_run(str(tmp_path))


def test_a_run_writes_csv_and_tensorboard_and_plot_draws_it(tmp_path):
    pytest.importorskip("matplotlib", reason="dstore plot needs matplotlib (the bench extra)")
    path = raw_container(tmp_path / "c.h5", shape=(8, 8, 1))
    run_dir = tmp_path / "run"
    argv = ["train", str(path), "--epochs", "2", "--batch-size", "8", "--run-dir", str(run_dir)]
    argv += ["--tensorboard"] if HAS_TB else []
    res = subprocess.run(
        [sys.executable, "-m", "dstore.tools", *argv], capture_output=True, text=True, timeout=120, cwd=REPO
    )
    assert res.returncode == 0, res.stderr
    rows = list(csv.DictReader(open(run_dir / "metrics.csv", newline="")))
    assert [r["epoch"] for r in rows] == ["0", "1"] and float(rows[0]["train_samples_per_s"]) > 0
    if HAS_TB:
        events = [f for f in os.listdir(run_dir / "tensorboard") if f.startswith("events.out.tfevents")]
        assert events and (run_dir / "tensorboard" / events[0]).stat().st_size > 0
    res = subprocess.run(
        [sys.executable, "-m", "dstore.tools", "plot", str(run_dir)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert res.returncode == 0, res.stderr
    png = run_dir / "curves.png"
    assert res.stdout.strip() == str(png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000


@pytest.mark.skipif(HAS_TB, reason="tensorboard is installed here: the refusal cannot be shown")
def test_tensorboard_without_the_package_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="pip install tensorboard"):
        CurveLogs(str(tmp_path), tensorboard=True)


def test_plot_skips_a_cut_last_line_and_creates_the_out_folder(tmp_path):
    pytest.importorskip("matplotlib", reason="dstore plot needs matplotlib (the bench extra)")
    rec = '{"epoch": %d, "global_step": %d, "train_loss": 1.0, "train_accuracy": 0.5}\n'
    (tmp_path / "metrics.jsonl").write_text(rec % (0, 4) + rec % (1, 8) + '{"epoch": 2, "global_st')  # killed mid-write
    out = tmp_path / "figures" / "new" / "c.png"
    res = subprocess.run(
        [sys.executable, "-m", "dstore.tools", "plot", str(tmp_path), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == str(out) and out.read_bytes()[:4] == b"\x89PNG"
    assert "skipped its last line, cut short" in res.stderr and f"created the folder {out.parent}" in res.stderr
    (tmp_path / "metrics.jsonl").write_text(rec % (0, 4) + "{oops\n" + rec % (1, 8))  # damage before the end
    with pytest.raises(ConfigError, match=r"metrics.jsonl: line 2 is not JSON"):
        plot_run(str(tmp_path))
