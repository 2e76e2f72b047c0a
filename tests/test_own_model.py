"""`--model package.module:factory`: a user's own model by import path, under the documented factory
contract (in_channels, num_classes, image_size) -> nn.Module, with an optional `input_size` attribute."""

import json
import os
import subprocess
import sys

import pytest
from support.formats import raw_container
from support.mpirun import REPO

from dstore.errors import ConfigError
from dstore.training.config import TrainConfig
from dstore.training.models import build_model, get_model

FACTORY = '''
import torch
from torch import nn

SEEN = []

def tiny(in_channels, num_classes, image_size):
    """A linear model over the whole image."""
    SEEN.append((in_channels, num_classes, tuple(image_size)))
    return nn.Sequential(nn.Flatten(), nn.Linear(in_channels * image_size[0] * image_size[1], num_classes))

tiny.input_size = lambda hw: (6, 6)

def not_a_module(in_channels, num_classes, image_size):
    return "oops"

def raises(in_channels, num_classes, image_size):
    raise KeyError("no such backbone")

def two_args(in_channels, num_classes):
    return nn.Linear(in_channels, num_classes)

def ten_logits(in_channels, num_classes, image_size):
    return nn.Sequential(nn.Flatten(), nn.Linear(in_channels * image_size[0] * image_size[1], 10))
'''


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    (tmp_path / "my_models.py").write_text(FACTORY)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    sys.modules.pop("my_models", None)


def test_a_factory_by_import_path_gets_the_documented_arguments(user_module):
    import torch

    entry = get_model("my_models:tiny")
    assert entry.input_size((28, 28)) == (6, 6) and entry.description == "A linear model over the whole image."
    model = build_model("my_models:tiny", 3, 5, entry.input_size((28, 28)))
    assert sys.modules["my_models"].SEEN == [(3, 5, (6, 6))]
    assert model(torch.zeros(2, 3, 6, 6)).shape == (2, 5)
    TrainConfig(model="my_models:tiny").check()  # imported and found at check time


@pytest.mark.parametrize(
    "name, says",
    [
        ("no_such_module_xyz:f", "cannot import 'no_such_module_xyz'"),
        ("my_models:missing", "has no attribute 'missing'"),
        ("my_models:SEEN", "is not callable"),
        ("my_models:", "package.module:factory"),
        ("resnet_9000", "nor package.module:factory"),
    ],
)
def test_a_bad_model_name_is_refused_naming_what_is_wrong(user_module, name, says):
    with pytest.raises(ConfigError, match=says.replace("(", r"\(")):
        TrainConfig(model=name).check()


def test_a_factory_that_returns_no_module_is_refused(user_module):
    with pytest.raises(ConfigError, match="not a torch.nn.Module"):
        build_model("my_models:not_a_module", 1, 2, (4, 4))


def test_dstore_train_trains_a_model_given_by_import_path(user_module, tmp_path):
    path = raw_container(tmp_path / "c.h5", shape=(8, 8, 1))
    run_dir = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": f"{user_module}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "dstore.tools",
            "train",
            str(path),
            "--model",
            "my_models:tiny",
            "--epochs",
            "1",
            "--batch-size",
            "8",
            "--run-dir",
            str(run_dir),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
        env=env,
    )
    assert res.returncode == 0, res.stderr
    meta = json.loads((run_dir / "config.json").read_text())
    assert meta["model"] == "my_models:tiny" and meta["input_size"] == [6, 6]


@pytest.mark.parametrize(
    "name, says",
    [
        (
            "my_models:raises",
            r"--model 'my_models:raises': the factory raised KeyError: 'no such backbone' \(called as "
            r"factory\(in_channels=1, num_classes=3, image_size=\(4, 4\)\)\)",
        ),
        (
            "my_models:two_args",
            r"--model 'my_models:two_args': the factory's signature two_args\(in_channels, "
            r"num_classes\) cannot be called as factory\(in_channels, num_classes, image_size\)",
        ),
        (
            "my_models:ten_logits",
            r"--model 'my_models:ten_logits' returns logits of shape \(1, 10\) for one image; "
            r"the data have 3 classes",
        ),
    ],
)
def test_a_factory_that_raises_or_does_not_fit_is_one_line_naming_it(user_module, name, says):
    with pytest.raises(ConfigError, match=says) as info:
        build_model(name, 1, 3, (4, 4))
    assert "\n" not in str(info.value)
