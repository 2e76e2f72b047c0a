"""`dstore bench --storage` / `--storage-sweep`: option checks, the sweep's arithmetic and outputs, and one
tiny sweep under mpiexec through real mounts (skipped without FUSE). No timing is asserted."""

from __future__ import annotations

import json
import os

import pytest
from support.mpirun import run_mpi

from dstore.errors import ConfigError
from dstore.tools.bench import storage
from dstore.tools.pfs import fuse_available, parse_spec
from dstore.tools.pfs.mount import pfs_mountpoints

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _config(*argv):
    from dstore.tools.cli import build_parser
    from dstore.tools.cmd_bench import _config as config

    return config(build_parser().parse_args(["bench", *argv]))


@pytest.mark.skipif(fuse_available() is not None, reason=f"needs FUSE: {fuse_available()}")
def test_storage_options_parse_and_name_bad_keys():
    cfg = _config("--storage", "pfs:latency=2ms,iops=2000,bandwidth=1GB/s")
    assert cfg.storage is not None
    assert (cfg.storage.latency, cfg.storage.iops, cfg.storage.bandwidth) == (2e-3, 2000, 1e9)
    one = _config("--storage", "pfs:iops=300").storage
    assert one is not None and one.iops == 300
    assert _config("--storage-sweep").storage_sweep == storage.DEFAULT_LADDER
    assert _config("--storage-sweep", "local", "pfs:latency=8ms").storage_sweep == ("local", "pfs:latency=8ms")
    with pytest.raises(ConfigError, match="'iosp=3' is not KEY=VALUE"):
        _config("--storage", "pfs:iosp=3")
    with pytest.raises(ConfigError, match="bandwidth='5GB'"):
        _config("--storage-sweep", "local", "pfs:bandwidth=5GB")
    with pytest.raises(ConfigError, match="give one"):
        _config("--storage", "pfs", "--storage-sweep")


def test_break_even_epochs():
    # population 10 s; the store's epoch 20 s, the other's 30 s: ahead after 1 epoch (10 + 20 < 30)
    assert storage.break_even(10.0, 20.0, 30.0) == 1
    assert storage.break_even(25.0, 20.0, 30.0) == 3  # 25 + 3 x 20 = 85 < 90, while 25 + 2 x 20 = 65 > 60
    assert storage.break_even(5.0, 20.0, 20.0) is None
    assert storage.break_even(5.0, 20.0, 15.0) is None


def test_rung_labels_and_translate(tmp_path):
    assert storage.rung_label("local") == "local disk"
    assert storage.rung_label("pfs:latency=0,iops=unlimited,bandwidth=unlimited") == "pfs, no delay, no cap"
    assert storage.rung_label("pfs:latency=2ms,iops=2000") == "pfs 2 ms, 2000 ops/s"
    root = tmp_path / "data"
    (root / "sub").mkdir(parents=True)
    other = tmp_path / "elsewhere"
    other.mkdir()
    roots = storage.mount_roots(str(root), str(other / "x.h5"))
    assert roots == [os.path.realpath(root), os.path.realpath(other)]
    assert storage.mount_roots(str(root), str(root / "sub" / "x.h5")) == [os.path.realpath(root)]
    m = storage.Mounted(parse_spec("pfs"), roots, ["/mnt/a", "/mnt/b"])
    assert m.translate(root / "sub" / "f.jpg") == "/mnt/a/sub/f.jpg"
    assert m.translate(root) == "/mnt/a"
    assert m.translate(other / "x.h5") == "/mnt/b/x.h5"
    assert m.translate("/somewhere/else") == "/somewhere/else"
    assert m.translate(None) is None


@pytest.mark.mpi
@pytest.mark.slow
@pytest.mark.skipif(fuse_available() is not None, reason=f"needs FUSE: {fuse_available()}")
def test_tiny_sweep_on_two_ranks_through_real_mounts(tmp_path):
    out = tmp_path / "out"
    run_mpi(
        2,
        [
            "dstore",
            "bench",
            "--storage-sweep",
            "local",
            "pfs:latency=1ms,iops=3000",
            "--count",
            "48",
            "--train-samples",
            "32",
            "--batch-size",
            "16",
            "--workers",
            "1",
            "--no-mosaic",
            "--out",
            str(out),
        ],
        timeout=240,
    )
    res = json.loads((out / "storage-sweep.json").read_text())
    rungs = res["storage_sweep"]["rungs"]
    assert [r["spec"] for r in rungs] == ["local", "pfs:latency=1ms,iops=3000"]
    assert rungs[0]["model"] is None and rungs[1]["model"]["iops"] == 3000
    names = [r["name"] for r in rungs[1]["loaders"]]
    assert names[0].startswith("store") and "DataLoader over files" in names
    st = rungs[1]["mount_stats"][0]
    assert st["reads"] > 0 and st["opens"] >= 32  # the files loader opened every file through the mount
    assert rungs[0]["mount_stats"] is None
    md = (out / "storage-sweep.md").read_text()
    assert "| local disk |" in md and "| pfs 1 ms, 3000 ops/s |" in md and "break-even" in md
    assert (out / "storage-sweep.png").read_bytes().startswith(PNG_MAGIC)
    assert pfs_mountpoints(out / "data") == []  # the bench unmounted what it mounted
