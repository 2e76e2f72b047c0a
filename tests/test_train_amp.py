"""ResNet-50 without torchvision, mixed precision (--amp) and channels-last (--channels-last): the
model's size against torchvision's, autocast and memory format as the Trainer applies them, and a
real `dstore train` run with each (one rank, tiny images, a step or two)."""

import json

import numpy as np
import pytest
import torch
from support.formats import raw_container
from support.mpirun import run_mpi

from dstore.errors import ConfigError
from dstore.training.config import TrainConfig
from dstore.training.loop import autocast, channels_last_batch
from dstore.training.models import build_model, get_model


def test_resnet50_has_torchvisions_parameter_count_and_layout():
    model = build_model("resnet50", 3, 1000, (224, 224))
    # torchvision.models.resnet50().parameters(): 25,557,032 (its documented size).
    assert sum(p.numel() for p in model.parameters()) == 25_557_032
    convs = [m for m in model.modules() if isinstance(m, torch.nn.Conv2d)]
    assert len(convs) == 1 + 3 * 16 + 4  # stem, 3 per bottleneck block, 4 projections
    assert get_model("resnet50").input_size((32, 32)) == (224, 224)
    small = build_model("resnet50", 1, 5, (16, 16))
    assert small(torch.zeros(2, 1, 16, 16)).shape == (2, 5)


def test_autocast_computes_in_the_amp_type_and_off_leaves_float32():
    layer = torch.nn.Linear(4, 3)
    x = torch.ones(2, 4)
    cpu = torch.device("cpu")
    with autocast(cpu, "bf16"):
        assert layer(x).dtype == torch.bfloat16
    with autocast(cpu, "off"):
        assert layer(x).dtype == torch.float32
    batch = channels_last_batch(torch.zeros(2, 3, 5, 6))
    assert batch.is_contiguous(memory_format=torch.channels_last) and not batch.is_contiguous()
    cfg = TrainConfig(amp="fp32")
    with pytest.raises(ConfigError, match="amp='fp32'"):
        cfg.check()


@pytest.mark.mpi
def test_train_with_amp_and_channels_last(tmp_path):
    # fp16 takes every path of --amp (autocast, the scaler, its checkpointed state); bf16 differs only
    # in the type autocast computes in (test above) and in needing no scaler. One run keeps it quick.
    amp = "fp16"
    from dstore.training.checkpoint import load_checkpoint

    path = raw_container(tmp_path / "tiny.h5", n=20, shape=(12, 12, 3))
    run_dir = tmp_path / "run"
    run_mpi(
        1,
        [
            "dstore",
            "train",
            path,
            "--model",
            "resnet20",
            "--image-size",
            "16",
            "--amp",
            amp,
            "--channels-last",
            "--epochs",
            "1",
            "--batch-size",
            "8",
            "--holdout",
            "0.2",
            "--no-progress",
            "--run-dir",
            str(run_dir),
        ],
        timeout=120,
    )
    config = json.loads((run_dir / "config.json").read_text())
    assert config["model"] == "resnet20" and config["config"]["amp"] == amp and config["config"]["channels_last"]
    epochs = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert any("epoch" in r and np.isfinite(r["train_loss"]) for r in epochs), epochs
    ck = load_checkpoint(str(run_dir / "checkpoint.pt"))
    # fp16 scales the loss: the scaler's state is part of the checkpoint.
    assert ck["scaler"]["scale"] > 0
