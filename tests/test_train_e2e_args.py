"""The end-to-end training comparison passes the options after `--` on to every `dstore train` it runs
(argparse alone bound them to nothing: the positional `extra` was consumed, empty, with `container`)."""

from unittest import mock

import pytest

from dstore.tools.bench import train_e2e


def _extra_passed(argv):
    seen = []

    def fake_run_one(*args, **kwargs):
        seen.append(kwargs["extra"])
        raise SystemExit(0)

    with mock.patch.object(train_e2e, "run_one", side_effect=fake_run_one), pytest.raises(SystemExit):
        train_e2e.main(argv)
    return seen[0]


def test_options_after_the_separator_reach_dstore_train(tmp_path):
    argv = [str(tmp_path / "x.h5"), "--rungs", "local", "--out", str(tmp_path), "--",
            "--device", "cuda", "--batch-size", "256"]
    assert _extra_passed(argv) == ["--device", "cuda", "--batch-size", "256"]


def test_no_separator_passes_nothing(tmp_path):
    assert _extra_passed([str(tmp_path / "x.h5"), "--rungs", "local", "--out", str(tmp_path)]) == []
