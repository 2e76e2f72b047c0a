"""`dstore pfs` refuses what would wedge it, before FUSE is asked for anything (issue 19, failure 8):
a mountpoint at, inside or above its source, a non-empty mountpoint, a wait no signal could end.

No FUSE needed: the CLI runs with a PATH without fusermount3, so even a regression cannot mount."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from support.formats import one_line_error

from dstore.errors import ConfigError
from dstore.tools.pfs.model import MAX_DELAY_S, Model, PfsModel
from dstore.tools.pfs.mount import PfsMountError, check_mountpoint

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _pfs(*args, cwd=ROOT):
    """`dstore pfs ARGS` where fusermount3 cannot be found (a mount cannot happen)."""
    env = {**os.environ, "PATH": os.path.dirname(sys.executable), "PYTHONPATH": ROOT}
    return subprocess.run(
        [sys.executable, "-m", "dstore.tools", "pfs", *map(str, args)],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.fixture()
def src(tmp_path):
    s = tmp_path / "src"
    (s / "sub").mkdir(parents=True)
    (s / "x.bin").write_bytes(b"x")
    return s


@pytest.mark.parametrize(
    "where, why", [("same", "is SOURCE itself"), ("inside", "is inside SOURCE"), ("above", "holds SOURCE")]
)
def test_a_mountpoint_at_inside_or_above_its_source_is_refused(src, tmp_path, where, why):
    mp = {"same": src, "inside": src / "sub", "above": tmp_path}[where]
    with pytest.raises(PfsMountError, match=why):
        check_mountpoint(str(mp), str(src))
    one_line_error(_pfs(src, mp), "MOUNTPOINT", str(mp), why)


def test_a_mountpoint_through_a_symlink_into_its_source_is_refused(src, tmp_path):
    (tmp_path / "link").symlink_to(src / "sub")
    one_line_error(_pfs(src, tmp_path / "link"), "is inside SOURCE")


def test_a_non_empty_mountpoint_is_refused(src, tmp_path):
    mp = tmp_path / "full"
    mp.mkdir()
    (mp / "mine.txt").write_text("keep")
    with pytest.raises(PfsMountError, match="is not empty"):
        check_mountpoint(str(mp))
    one_line_error(_pfs(src, mp), str(mp), "is not empty")
    assert (mp / "mine.txt").read_text() == "keep"


@pytest.mark.parametrize("flag", ["--latency", "--open-latency", "--burst"])
def test_a_duration_past_the_bound_is_refused_naming_the_flag(src, tmp_path, flag):
    mp = tmp_path / "mnt"
    mp.mkdir()
    one_line_error(_pfs(src, mp, flag, "1000000s"), flag, "1000000s", f"at most {MAX_DELAY_S:g}s")
    with pytest.raises(ConfigError, match="latency"):
        PfsModel(latency=MAX_DELAY_S + 1)


def test_no_request_waits_longer_than_the_bound():
    """A starved bucket (1 op/s, 100 requests at once) makes no request wait past MAX_DELAY_S."""
    waits = []
    model = Model(PfsModel(latency=1.0, iops=1.0, burst=0.0), clock=lambda: 0.0, sleep=waits.append)
    for _ in range(100):
        model.charge_read(4096)
    assert max(waits) == MAX_DELAY_S and min(waits) > 0


def test_relative_stats_json_is_the_callers(tmp_path):
    from dstore.tools.pfs.fs import stats_path

    os.chdir(tmp_path)
    try:
        assert stats_path("rel.json") == str(tmp_path / "rel.json") and stats_path(None) is None
    finally:
        os.chdir(ROOT)
