"""Issue 38's smaller items (docs/reliability.md, "Fidelity round 2"): each the right message or the
right result: a tampered container under `dstore train`, `--val` in another encoding, a local glob
not ending in .tar, the docs' script paths, `--tensorboard` without its package, the I/O line of a
run resumed at its end, and `dstore plan`'s refusal and units."""

from __future__ import annotations

import importlib.util
import io
import re
from pathlib import Path

import numpy as np
import pytest
from support.formats import flip_byte, raw_container
from support.ingest import png_bytes

from dstore.errors import ConfigError
from dstore.formats import create_writer, open_container
from dstore.ingest.registry import source_type_of
from dstore.tools.cli import main
from dstore.training.console import summarize_io
from dstore.training.run import check_val

REPO = Path(__file__).resolve().parents[1]


def _images(path, encoding: str, n: int = 24) -> str:
    from PIL import Image

    rng = np.random.default_rng(1)
    with create_writer(str(path), "hdf5", encoding=encoding, class_names=["a", "b"]) as w:
        for i in range(n):
            buf = io.BytesIO()
            Image.fromarray(rng.integers(0, 256, (20, 24, 3), dtype=np.uint8)).save(buf, encoding.upper())
            w.append(buf.getvalue(), i % 2, f"p{i}.{encoding}", i)
    return str(path)


def test_train_on_a_tampered_container_says_checksum_as_verify_does(tmp_path, capsys):
    path = _images(tmp_path / "t.h5", "jpeg")
    flip_byte(path, 2, within=200)  # in its Huffman tables: decoding it fails (was the first error, not checksum)
    code = main(["train", path, "--run-dir", str(tmp_path / "run"), "--epochs", "1", "--no-progress"])
    err = capsys.readouterr().err
    assert (
        code != 0
        and "ChecksumError" in err
        and "sample(s) read from storage do not match their checksums: 2 " in err
        and "cannot decode" not in err
    ), err
    assert not (tmp_path / "run").exists()


def test_val_in_another_image_encoding_is_taken_and_raw_against_images_says_the_fix(tmp_path):
    jpeg, png = _images(tmp_path / "j.h5", "jpeg"), _images(tmp_path / "p.h5", "png")
    raw = raw_container(tmp_path / "r.h5", n=24, shape=(20, 24, 3), classes=2)
    with open_container(jpeg) as t, open_container(png) as v, open_container(raw) as r:
        from dstore.training.checkpoint import container_identity

        check_val(png, v, jpeg, t, container_identity(t))  # JPEG training, PNG held out: each decodes its own
        with pytest.raises(
            ConfigError,
            match=r"--val .*r\.h5 has encoding 'raw' but .*j\.h5 has 'jpeg'; re-ingest "
            r"the held-out data .*--encoding jpeg\), then --val OUT",
        ):
            check_val(raw, r, jpeg, t, container_identity(t))


def test_a_local_glob_not_ending_in_tar_is_taken_or_named(tmp_path):
    import tarfile

    shards = tmp_path / "shards"
    shards.mkdir()
    for k in range(2):
        with tarfile.open(shards / f"s-{k}.tar", "w") as tf:
            for name, data in ((f"x{k}.png", png_bytes(4, k)), (f"x{k}.cls", b"0")):
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))
    assert source_type_of(str(shards / "*")) == "tar"  # every match a shard
    (shards / "README").write_text("not a shard")
    with pytest.raises(
        ConfigError,
        match=r"is a pattern and matches 3 path\(s\), not all \.tar shards \(first that "
        r"is not: .*README\); .* end it in \.tar \(.*shards/\*\.tar\)",
    ):
        source_type_of(str(shards / "*"))
    with pytest.raises(ConfigError, match="matches no file"):
        source_type_of(str(tmp_path / "nothing" / "*"))
    with pytest.raises(ConfigError, match=r"\{a\.\.b\} pattern of names that do not end in \.tar"):
        source_type_of(str(shards / "s-{0..1}"))


def test_every_script_path_in_the_docs_exists():
    """A command line in the README or docs/ that runs `python some/script.py` names a file of the repo."""
    seen = []
    for doc in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        for path in re.findall(r"python3? ((?:[\w.-]+/)+[\w.-]+\.py)", doc.read_text()):
            seen.append(path)
            assert (REPO / path).is_file(), f"{doc.name}: `python {path}`: no such file (from the repo's root)"
    assert "docs/examples/train_own_script.py" in seen


@pytest.mark.skipif(importlib.util.find_spec("tensorboard") is not None, reason="tensorboard is installed here")
def test_tensorboard_without_its_package_writes_nothing_and_the_same_command_says_it_again(tmp_path, capsys):
    path = raw_container(tmp_path / "r.h5", n=20)
    argv = ["train", path, "--run-dir", str(tmp_path / "run"), "--tensorboard", "--no-progress", "--epochs", "1"]
    for _ in range(2):  # was: the second run refused "already holds a run (config.json)"
        assert main(argv) != 0
        err = capsys.readouterr().err
        assert "--tensorboard needs the tensorboard package: pip install tensorboard" in err, err
        assert not (tmp_path / "run").exists()


def test_no_empty_io_line_when_no_epoch_was_trained():
    for stats in ([{}], [{}, {}]):
        line = summarize_io(stats, "store")
        assert line.startswith("data I/O (store): no epoch trained in this run") and "  " not in line, line


def test_plan_refuses_a_batch_larger_than_the_data_and_prints_three_significant_digits(tmp_path, capsys):
    base = ["plan", "--samples", "400", "--mean-bytes", "2.94KB", "--ranks-per-node", "2"]
    assert main(base + ["--batch-size", "1000"]) != 0
    err = capsys.readouterr().err
    assert "--batch-size=1000 is larger than the data (400 samples)" in err and "--batch-size 400 or less" in err, err
    assert main(base + ["--batch-size", "64"]) == 0
    out = capsys.readouterr().out
    sizes = re.findall(r"(\d+(?:\.\d+)?) (B|kB|MB|GB|TB)\b", out)
    times = re.findall(r"(\d+(?:\.\d+)?) (us|ms|s)\b", out)
    assert sizes and times and "KB" not in out, out
    for number, unit in sizes + times:
        digits = number.replace(".", "").lstrip("0")
        assert number == "0" or (unit == "B" and "." not in number) or len(digits) == 3, (number, unit, out)
