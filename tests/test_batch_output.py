"""What a batch job's log gets: no progress-bar frames (`\\r`) unless asked, one copy of each warning
per job, a heartbeat during long steps, the training's I/O figures as one line over all ranks, one
unit grammar and one formatter, and no silently accepted abbreviation or typo of a flag."""

import io
import json
import os
import re
import subprocess
import sys
import time
from typing import Any

import numpy as np
import pytest
from support.mpirun import REPO, mpiexec

from dstore.memory.limits import fmt_bytes, parse_bytes
from dstore.runtime.heartbeat import Heartbeat, period_from_env
from dstore.runtime.units import fmt_rate, fmt_seconds, fmt_size, parse_byte_rate, parse_duration, parse_size
from dstore.tools.cli import main
from dstore.tools.pfs import parse_bandwidth, parse_time
from dstore.training.console import human_bytes, summarize_io


def _raw_log(argv, env) -> str:
    """`mpiexec -n 2 ARGV > log 2>&1`, as bytes decoded without newline translation (text mode turns
    every \r into \n, so a check for \r on text-mode output could not fail)."""
    cmd = [mpiexec(), "-n", "2", sys.executable, "-m", "dstore.tools", *argv[1:]]
    res = subprocess.run(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        timeout=180,
        cwd=REPO,
        env={**os.environ, "OMP_NUM_THREADS": "1", **env},
    )
    log = res.stdout.decode("utf-8", "replace")
    assert res.returncode == 0, log
    return log


@pytest.mark.mpi
def test_redirected_logs_of_every_command_have_no_frames_and_one_copy_of_a_warning(tmp_path, cache):
    env = {"DSTORE_CACHE": str(cache), "DSTORE_HEARTBEAT": "0.001"}
    out = str(tmp_path / "d.h5")
    logs = {}
    for name, argv in (
        ("ingest", ["ingest", "digits", out]),
        ("verify", ["verify", out, "--decode"]),
        ("info", ["info", out]),
        ("train", ["train", out, "--epochs", "1", "--threads", "1", "--run-dir", str(tmp_path / "r")]),
    ):
        logs[name] = _raw_log(["dstore", *argv], env)
    for name, log in logs.items():
        assert "\r" not in log, (name, repr(log[:300]))
    assert logs["train"].count("--threads is deprecated") == 1, logs["train"]  # not once per rank
    assert "verify --decode (rank 0's part): " in logs["verify"]  # the heartbeat, from rank 0 alone
    assert "(rank 1" not in logs["verify"]
    io_lines = [ln for ln in logs["train"].splitlines() if ln.startswith("data I/O")]
    assert len(io_lines) == 1 and io_lines[0].startswith("data I/O over 2 ranks (store"), io_lines
    final = [json.loads(ln) for ln in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    assert len([r for r in final if "io_stats" in r][0]["io_stats"]) == 2  # the per-rank detail, in JSON


def test_one_unit_grammar_for_sizes_rates_and_times():
    assert parse_size("8G") == parse_bytes("8G") == 8 * 10**9 and parse_size("512MiB") == 512 * 2**20
    assert parse_size("1.5e3") == 1500 and parse_size(4096) == 4096
    assert parse_byte_rate("1G/s") == parse_bandwidth("1G/s") == 1e9  # `--bandwidth 1G/s` was refused
    assert parse_bandwidth("2GiB/s") == 2 * 2**30 and parse_byte_rate("500 MB/s") == 5e8
    assert parse_duration("2ms") == parse_time("2ms") == 0.002 and parse_duration("2min") == 120.0
    for bad in ("8X", "-1", "G"):
        with pytest.raises(ValueError, match="size"):
            parse_size(bad, "size")


def test_one_formatter_prints_si_with_three_digits():
    assert fmt_size(38_000) == "38.0 kB"  # was "0.0 MB" in one place, "37.1 KiB" in another
    assert fmt_size(2_200_000) == fmt_bytes(2_200_000) == human_bytes(2_200_000) == "2.20 MB"
    assert fmt_size(512) == "512 B" and fmt_size(1.5e9) == "1.50 GB" and fmt_size(999_999) == "1.00 MB"
    assert fmt_rate(412e6) == "412 MB/s" and fmt_rate(float("inf")) == "unlimited"
    assert fmt_seconds(0.0034) == "3.40 ms" and fmt_seconds(1.25) == "1.25 s" and fmt_seconds(850e-6) == "850 us"


def test_the_io_summary_is_one_line_of_min_median_max():
    st = {
        "epoch": 2,
        "samples": 700,
        "samples_local": 1,
        "bytes_remote": 1000,
        "gets": 2,
        "fetch_seconds": 0.001,
        "wait_seconds": 0.01,
    }
    ranks = [{**st, "samples": n, "bytes_remote": 1000 * n} for n in (700, 719, 738, 710)]
    line = summarize_io(ranks, "store")
    assert "\n" not in line and line.startswith("data I/O over 4 ranks (store, epoch 2)")
    assert "samples 700 / 710 / 738" in line and "remote 700 kB / 710 kB / 738 kB" in line, line
    # a mix (MixedStore's stats): one group per source, each with its own figures (was an empty line)
    full = {"samples_remote": 0, "pads": 0, "bytes_local": 0}  # the rest of a store's EpochStats
    mixes = [{"epoch": 2, "sources": [{**r, **full, "samples": r["samples"] // 2}, {}]} for r in ranks]
    line = summarize_io(mixes, "store")
    assert "\n" not in line and "source 0: samples 350 / 355 / 369" in line and "source 1: no epoch yet" in line, line
    one = summarize_io(mixes[:1], "store")
    assert one.startswith("data I/O (store): source 0: epoch 2: 350 samples") and "source 1: no epoch yet" in one, one


def test_a_heartbeat_writes_plain_lines_while_a_step_runs(monkeypatch):
    out = io.StringIO()
    with Heartbeat("verify", 10, unit="samples", period=0.01, out=out) as beat:
        beat.add(4)
        time.sleep(0.2)
    lines = out.getvalue().splitlines()
    assert lines and lines[-1].startswith("verify: 4 of 10 samples (40%) after ") and "\r" not in out.getvalue()
    quiet = io.StringIO()
    with Heartbeat("verify", 10, period=0.01, out=quiet, enabled=False):
        time.sleep(0.05)
    assert quiet.getvalue() == ""
    monkeypatch.setenv("DSTORE_HEARTBEAT", "120")
    assert period_from_env() == 120
    monkeypatch.delenv("DSTORE_HEARTBEAT")
    assert period_from_env() == 30


INGEST_LINE = (
    r"^ingest: (\d+) of 60 samples \(\d+%\), [\d.]+ [kMG]?B, \d+ samples/s \([\d.]+ [kMG]?B/s\) "
    r"after [\d.]+ s(, about [\d.]+ [um]?s left)?$"
)


def _parsed(line: str) -> re.Match[str]:
    found = re.match(INGEST_LINE, line)
    assert found is not None, line
    return found


@pytest.mark.parametrize("how", ["argument", "environment"])
def test_an_ingest_without_its_bar_writes_heartbeat_lines(tmp_path, capsys, monkeypatch, how):
    """A 20k-image ingest wrote nothing for 173 s where stderr was not a terminal: without its bar,
    rank 0 now writes plain lines (samples, bytes, rate, elapsed, time left) every `heartbeat`
    seconds, or $DSTORE_HEARTBEAT's."""
    from mpi4py import MPI

    from dstore.ingest import ingest

    kw: dict[str, Any] = {"heartbeat": 0.02} if how == "argument" else {}
    if how == "environment":
        monkeypatch.setenv("DSTORE_HEARTBEAT", "0.02")
    report = ingest("synthetic", str(tmp_path / "x.h5"), comm=MPI.COMM_SELF, count=60, progress=False, **kw)
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.startswith("ingest")]
    assert lines and "\r" not in err, err
    done = [int(_parsed(ln).group(1)) for ln in lines]  # every line parses
    assert done == sorted(done) and done[-1] <= report.samples == 60, lines
    # a bar instead (a terminal, or --progress), or 0: no heartbeat lines
    ingest("synthetic", str(tmp_path / "y.h5"), comm=MPI.COMM_SELF, count=60, progress=False, heartbeat=0)
    assert "ingest:" not in capsys.readouterr().err


def test_a_heartbeat_with_rates_says_bytes_rate_and_time_left():
    beat = Heartbeat("ingest", 1000, unit="samples", period=60, rates=True)
    with beat:
        beat.add(250, 25_000_000)
        beat._t0 -= 10.0  # as if started 10 s ago
        line = beat.line()
    assert re.match(
        r"^ingest: 250 of 1000 samples \(25%\), 25.0 MB, 2[45] samples/s \(2.[45]\d? MB/s\) after "
        r"10.0 s, about 3\d.\d s left$",
        line,
    ), line


@pytest.mark.parametrize(
    "argv, says",
    [
        (["train", "--epoch", "3"], "--epoch: did you mean --epochs?"),  # a prefix was taken for --epochs
        (["train", "--batchsize", "8"], "--batchsize: did you mean --batch-size?"),
        (["ingest", "a", "b", "--no-progres"], "--no-progres: did you mean --no-progress?"),
    ],
)
def test_no_abbreviations_and_a_suggestion_for_a_typo(capsys, argv, says):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    assert says in capsys.readouterr().err


def test_an_ingest_log_has_no_bar_unless_asked(tmp_path):
    out = tmp_path / "x.h5"
    np.save(tmp_path / "x.npy", np.zeros((20, 4, 4), dtype=np.uint8))
    for flag, frames in (([], False), (["--progress"], True)):
        res = subprocess.run(
            [sys.executable, "-m", "dstore.tools", "ingest", str(tmp_path / "x.npy"), str(out), "--overwrite", *flag],
            capture_output=True,
            timeout=120,
        )  # bytes: \r kept
        assert res.returncode == 0, res.stderr
        assert (b"\r" in res.stderr) == frames, res.stderr


def test_an_ingest_heartbeat_of_several_shard_groups_says_whose_share_it_is(capsys):
    """A group's writer sees only its group's shards (the others' counts would need MPI from the beat's
    thread): each writing rank's line names the rank and its share, and counts that share's samples only."""
    import numpy as np

    from dstore.ingest.meter import Meter

    with Meter(
        np.array([0, 30, 60, 90]), [1], shards=3, groups=3, bar=False, period=0.01, enabled=True, rank=1
    ) as meter:
        meter.update(10, 1000)
        time.sleep(0.1)
    line = capsys.readouterr().err.splitlines()[-1]
    assert line.startswith("ingest [rank 1: 1 of 3 shards]: 10 of 30 samples (33%), 1.00 kB, "), line
    with Meter(np.array([0, 30]), [0], shards=1, groups=1, bar=False, period=0.01, enabled=False) as quiet:
        quiet.update(10, 1000)
        time.sleep(0.05)
    assert capsys.readouterr().err == "" and not quiet.enabled
