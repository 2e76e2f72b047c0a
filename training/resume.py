"""Continuing a run from its checkpoint: load it, check it against this run, put its state back.

A checkpoint continues only the run it came from: the same container (checked before any store
exists), the same config fields that fix the order of the batches and the tournament, and the same
model and training-sample count. The checks raise ConfigError before anything is written, so a
refused resume leaves the run directory as it was.
"""

from __future__ import annotations

import dataclasses
import os

from dstore.errors import ConfigError
from dstore.training.checkpoint import (
    CHECKPOINT_NAME,
    check_same_container,
    from_safe,
    load_checkpoint,
    set_rng_state,
)

# What a checkpoint of train() holds besides the model's, optimizer's and scheduler's state.
REQUIRED = ("model", "optimizer", "store", "rng", "epoch", "step_in_epoch", "global_step")

# Config fields a resumed run must share with the checkpoint's (they fix the batches' order, the
# held-out split and the tournament).
SAME_CONFIG = ("batch_size", "seed", "shuffle", "drop_last", "holdout", "trainers", "ltfb_round", "ltfb_metric",
               "tournament_fraction", "ltfb_strategy", "truncation_fraction", "explore")


def load_for_resume(path: str, container: dict) -> dict:
    """The checkpoint at `path`, refused (ConfigError) unless it holds a whole training state taken
    on the container whose identity is `container` (dstore.training.checkpoint.container_identity)."""
    ck = load_checkpoint(path, required=REQUIRED)
    check_same_container(ck.get("meta", {}).get("container"), container, path)
    return ck


def plain_config(cfg) -> dict:
    """The config as a checkpoint holds it: a dict of plain values (tuples as lists)."""
    return {k: (list(v) if isinstance(v, tuple) else v) for k, v in dataclasses.asdict(cfg).items()}


def check_compatible(ck: dict, cfg, meta: dict) -> None:
    """A checkpoint continues only a run with the same data, model, batch size and seed.

    Args:
        ck: the loaded checkpoint.
        cfg: this run's TrainConfig.
        meta: this run's metadata (as written to config.json: "model", "train_samples", ...).
    """
    old = ck.get("config", {})
    defaults = {f.name: f.default for f in dataclasses.fields(cfg)}
    for key in SAME_CONFIG:
        was = old.get(key, defaults[key])  # checkpoints made before a field existed had its default
        if was != getattr(cfg, key):
            raise ConfigError(f"cannot resume: the checkpoint was made with {key}={was!r}, "
                              f"this run has {key}={getattr(cfg, key)!r}")
    for key in ("model", "train_samples"):
        if ck.get("meta", {}).get(key) != meta[key]:
            raise ConfigError(f"cannot resume: the checkpoint's {key} is {ck.get('meta', {}).get(key)!r}, "
                              f"this run's is {meta[key]!r}")


def restore(ck: dict, trainer, loader, rank: int, size: int) -> tuple[int, int, int]:
    """Puts the checkpoint's model, optimizer, scheduler, data position and this rank's RNG states
    back; returns (epoch, step in that epoch, global step) where the run continues.

    A checkpoint of another rank count restores every rank's RNGs from rank 0's."""
    trainer.load_state_dict(ck)
    loader.load_state_dict(from_safe(ck["store"]))
    rngs = ck["rng"]
    set_rng_state(rngs[rank] if len(rngs) == size else rngs[0])
    return int(ck["epoch"]), int(ck["step_in_epoch"]), int(ck["global_step"])


def checkpoint_steps(job: str, trainers: int) -> list[int]:
    """The global step each trainer's checkpoint in the LTFB job directory `job` was taken at."""
    return [int(load_checkpoint(os.path.join(job, f"trainer{k}", CHECKPOINT_NAME))["global_step"])
            for k in range(trainers)]
