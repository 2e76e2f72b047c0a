"""Single-process tests of the trainer's pure parts: schedules, split, transforms, models,
checkpoint round trip (weights_only), metrics log."""

import json
import math
import os
import random

import numpy as np
import pytest
import torch

from dstore.errors import ConfigError
from dstore.training.augment import ImageTransform, channel_stats, default_augmentation, resize_to, to_channels
from dstore.training.checkpoint import (
    from_safe,
    load_checkpoint,
    resolve_resume,
    rng_state,
    save_checkpoint,
    set_rng_state,
)
from dstore.training.data import split_ranges
from dstore.training.loop import global_batch_count
from dstore.training.metrics import JsonLog, read_jsonl
from dstore.training.models import build_model, default_model, get_model, model_names
from dstore.training.optim import Schedule, make_optimizer


def test_cosine_schedule_with_warmup():
    s = Schedule("cosine", total=100, warmup=10)
    assert s(0) == pytest.approx(0.1) and s(9) == pytest.approx(1.0)
    assert s(10) == pytest.approx(1.0)
    assert s(55) == pytest.approx(0.5)
    assert s(100) == pytest.approx(0.0, abs=1e-12)
    vals = [s(i) for i in range(10, 101)]
    assert all(a >= b for a, b in zip(vals, vals[1:]))


def test_step_schedule_and_validation():
    s = Schedule("step", total=30, step_every=10, gamma=0.5)
    assert [s(0), s(9), s(10), s(25)] == [1.0, 1.0, 0.5, 0.25]
    with pytest.raises(ConfigError, match="schedule='linear'"):
        Schedule("linear", total=1)
    with pytest.raises(ConfigError, match="lr=0"):
        make_optimizer("sgd", [torch.zeros(1, requires_grad=True)], lr=0)
    with pytest.raises(ConfigError, match="optimizer='rmsprop'"):
        make_optimizer("rmsprop", [torch.zeros(1, requires_grad=True)], lr=0.1)


def test_split_ranges_takes_the_tail():
    assert split_ranges(1797, 0.2) == ((0, 1438), (1438, 1797))
    assert split_ranges(10, 0.0) == ((0, 10), None)
    assert split_ranges(10, 0.01) == ((0, 9), (9, 10))
    with pytest.raises(ConfigError, match="holdout=1.0"):
        split_ranges(10, 1.0)


def test_global_batch_count_last_step_short():
    assert [global_batch_count(10, 4, s) for s in range(3)] == [4, 4, 2]


def test_transform_is_seeded_and_normalises():
    img = np.random.default_rng(0).integers(0, 256, (40, 48, 3), dtype=np.uint8)
    tf = ImageTransform((32, 32), 3, (0.5, 0.5, 0.5), (0.25, 0.25, 0.25), train=True, pad=4, flip=True)
    a = tf(img, np.random.default_rng(5))
    b = tf(img, np.random.default_rng(5))
    assert a.shape == (3, 32, 32) and a.dtype == torch.float32
    assert torch.equal(a, b)
    outs = {tf(img, np.random.default_rng(s)).sum().item() for s in range(20)}
    assert len(outs) > 1  # the augmentation does vary with the rng
    ev = ImageTransform((32, 32), 3, (0.5,) * 3, (0.25,) * 3)
    x = ev(np.full((32, 32, 3), 255, np.uint8))
    assert torch.allclose(x, torch.full_like(x, 2.0))
    with pytest.raises(ConfigError, match="need 3 value"):
        ImageTransform((8, 8), 3, (0.5,), (0.5,))


def test_channel_and_size_helpers():
    grey = np.arange(64, dtype=np.uint8).reshape(8, 8, 1)
    assert to_channels(grey, 3).shape == (8, 8, 3)
    assert to_channels(np.zeros((4, 4, 4), np.uint8), 3).shape == (4, 4, 3)
    assert to_channels(np.full((2, 2, 3), 200, np.uint8), 1)[0, 0, 0] == 200
    assert resize_to(np.zeros((64, 96, 3), np.uint8), (32, 32)).shape == (32, 32, 3)
    assert resize_to(grey, (16, 16)).shape == (16, 16, 1)
    mean, std = channel_stats([np.zeros((2, 2, 1), np.uint8), np.full((2, 2, 1), 255, np.uint8)])
    assert mean == pytest.approx((0.5,)) and std == pytest.approx((0.5,))
    assert default_augmentation((8, 8)) == (0, False) and default_augmentation((32, 32)) == (4, True)


@pytest.mark.parametrize("name", model_names())
def test_models_build_and_run(name):
    # resnet50 is built for 224x224; a small input keeps its forward pass quick (its stem and stages
    # reduce 32x: a 32x32 input ends in one 1x1 cell).
    size = (
        (32, 32)
        if name in ("resnet50", "resnet18")
        else get_model(name).input_size((8, 8) if name == "small_cnn" else (64, 64))
    )
    model = build_model(name, 3, 7, size)
    assert model(torch.zeros(2, 3, *size)).shape == (2, 7)
    assert default_model((8, 8))[0] == "small_cnn" and default_model((64, 48))[0] == "resnet_small"


def test_model_auto_picks_an_imagenet_model_for_photos_under_the_imagenet_recipe():
    # photos of 128 px and up with --augment imagenet: ResNet-18 at 224; without it the small
    # ResNet at 32x32, and the reason says how to get the ImageNet model
    name, why = default_model((375, 500), "imagenet")
    assert name == "resnet18" and get_model(name).input_size((375, 500)) == (224, 224) and "imagenet" in why
    name, why = default_model((375, 500), "auto")
    assert name == "resnet_small" and "--augment imagenet" in why
    assert default_model((64, 64), "imagenet")[0] == "resnet_small"  # too small to crop to 224
    # torchvision's resnet18 has 11,689,512 parameters (3 channels, 1000 classes)
    assert sum(p.numel() for p in build_model("resnet18", 3, 1000, (224, 224)).parameters()) == 11_689_512
    with pytest.raises(ConfigError, match="model='vgg'"):
        get_model("vgg")


def test_checkpoint_round_trip_weights_only(tmp_path):
    model = build_model("small_cnn", 1, 10, (8, 8))
    opt = make_optimizer("adam", model.parameters(), lr=1e-3)
    model(torch.zeros(1, 1, 8, 8)).sum().backward()
    opt.step()
    torch.manual_seed(3)
    np.random.seed(3)
    random.seed(3)
    state = {
        "model": model.state_dict(),
        "optimizer": opt.state_dict(),
        "rng": [rng_state()],
        "store": {"seed": np.int64(1), "position": np.arange(3)},
        "epoch": 2,
    }
    expect = (torch.rand(2), np.random.rand(2), random.random())
    path = save_checkpoint(tmp_path / "ck" / "checkpoint.pt", state)
    assert sorted(p.name for p in (tmp_path / "ck").iterdir()) == ["checkpoint.pt"]  # no temporary left
    back = load_checkpoint(path)
    set_rng_state(back["rng"][0])
    got = (torch.rand(2), np.random.rand(2), random.random())
    assert torch.equal(expect[0], got[0]) and np.array_equal(expect[1], got[1]) and expect[2] == got[2]
    store = from_safe(back["store"])
    assert store["seed"] == 1 and isinstance(store["position"], np.ndarray)
    fresh = build_model("small_cnn", 1, 10, (8, 8))
    fresh.load_state_dict(back["model"])
    assert all(torch.equal(a, b) for a, b in zip(fresh.parameters(), model.parameters()))
    with pytest.raises(ConfigError, match="does not exist"):
        load_checkpoint(tmp_path / "missing.pt")


def test_resolve_resume(tmp_path):
    runs = tmp_path / "runs"
    assert resolve_resume(None, str(runs / "a"), str(runs)) is None
    assert resolve_resume("auto", str(runs / "a"), str(runs)) is None
    (runs / "old").mkdir(parents=True)
    (runs / "old" / "checkpoint.pt").write_bytes(b"x")
    # issue 19: with --run-dir, auto never continues another run's checkpoint
    assert resolve_resume("auto", str(runs / "a"), str(runs)) is None
    assert resolve_resume("auto", None, str(runs)) == str(runs / "old" / "checkpoint.pt")
    (runs / "a").mkdir()
    (runs / "a" / "checkpoint.pt").write_bytes(b"y")
    os.utime(runs / "a" / "checkpoint.pt", (1, 1))  # older, but it is this run's own
    assert resolve_resume("auto", str(runs / "a"), str(runs)) == str(runs / "a" / "checkpoint.pt")
    with pytest.raises(ConfigError, match="no such checkpoint"):
        resolve_resume(str(tmp_path / "nope.pt"), str(runs / "a"), str(runs))


def test_json_log(tmp_path):
    with JsonLog(tmp_path / "m.jsonl") as log:
        log.write({"a": np.float32(1.5), "b": math.nan, "c": [np.int64(2)]})
    assert read_jsonl(tmp_path / "m.jsonl") == [{"a": 1.5, "b": None, "c": [2]}]
    JsonLog(None).write({"x": 1})  # a non-main rank's log writes nothing
    json.loads((tmp_path / "m.jsonl").read_text())


@pytest.mark.mpi
def test_direct_baseline_delivers_what_the_store_does(tmp_path):
    from support.formats import raw_container
    from support.mpirun import REPO, run_mpi

    path = raw_container(tmp_path / "small.h5", n=53, classes=3)
    res = run_mpi(2, ["python", str(REPO / "tests" / "train_scenarios" / "direct_vs_store.py"), path], timeout=60)
    assert json.loads(res.stdout.strip().splitlines()[-1])["ok"] == [True, True], res.stdout


def test_every_train_flag_is_a_config_field():
    from dstore.tools.cli import build_parser
    from dstore.training.run import TrainConfig

    args = build_parser().parse_args(
        ["train", "x.h5", "--image-size", "16x24", "--mean", "0.5,0.4,0.3", "--resume", "auto", "--no-progress"]
    )
    # --json: how the summary is printed; --config/--print-config: where the flags come from; not the run
    dests = set(vars(args)) - {"command", "command_run", "json", "config", "print_config", "command_parser"}
    assert dests <= set(TrainConfig.__dataclass_fields__), dests - set(TrainConfig.__dataclass_fields__)
    assert args.image_size == (16, 24) and args.mean == (0.5, 0.4, 0.3) and args.progress is False
    cfg = TrainConfig(**{k: getattr(args, k) for k in dests})
    cfg.check()
    assert build_parser().parse_args(["train", "--image-size", "32"]).image_size == (32, 32)
    with pytest.raises(ConfigError, match="loader='mmap'"):
        TrainConfig(loader="mmap").check()


def test_direct_cold_only_with_the_direct_loader():
    from dstore.tools.cli import build_parser
    from dstore.training.run import TrainConfig

    parse = build_parser().parse_args
    assert parse(["train", "x.h5"]).direct_cold is False
    args = parse(["train", "x.h5", "--loader", "direct", "--direct-cold"])
    assert args.direct_cold is True
    TrainConfig(data="x.h5", loader="direct", direct_cold=True).check()
    with pytest.raises(ConfigError, match="--direct-cold.*--loader direct.*--loader store"):
        TrainConfig(data="x.h5", loader="store", direct_cold=True).check()


def test_cuda_device_choice_without_a_gpu(monkeypatch):
    # No GPU here: the checks before any CUDA call are what can run. torch seeing none is refused
    # by name; a GPU index past the node's GPUs (a rank too many, or LTFB's job-wide numbering) too.
    import torch
    from mpi4py import MPI

    from dstore.errors import ConfigError
    from dstore.training.dist import init_distributed

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ConfigError, match="no CUDA GPU"):
        init_distributed(MPI.COMM_SELF, "cuda")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    chosen = []

    def set_device(i):  # record the choice, then stop before anything needs a real GPU
        chosen.append(i)
        raise RuntimeError("stop")

    monkeypatch.setattr(torch.cuda, "set_device", set_device)
    with pytest.raises(
        ConfigError, match=r"rank 0 would drive GPU 5 \(its node-local rank in the whole job\) .* only 2 GPU"
    ):
        init_distributed(MPI.COMM_SELF, "cuda", gpu_index=5)
    with pytest.raises(RuntimeError, match="stop"):
        init_distributed(MPI.COMM_SELF, "cuda", gpu_index=1)
    with pytest.raises(RuntimeError, match="stop"):
        init_distributed(MPI.COMM_SELF, "cuda")
    assert chosen == [1, 0]  # the given index, else the node-local rank (0 on COMM_SELF)
