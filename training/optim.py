"""Optimizers by name and learning-rate schedules as a pure function of the step."""

from __future__ import annotations

import dataclasses
import math

from dstore.errors import ConfigError

OPTIMIZERS = ("sgd", "adam", "adamw")
SCHEDULES = ("cosine", "step", "constant")


@dataclasses.dataclass(frozen=True)
class Schedule:
    """A learning-rate multiplier per optimizer step.

    Attributes:
        kind: "cosine" (to `final` at `total` steps), "step" (times `gamma` every `step_every`
            steps) or "constant".
        total: steps in the whole run.
        warmup: steps of linear warm-up from 1/warmup to 1 (0: none).
        step_every: for "step".
        gamma: for "step".
        final: cosine's end value, as a fraction of the base rate.
    """

    kind: str = "cosine"
    total: int = 1
    warmup: int = 0
    step_every: int = 1
    gamma: float = 0.1
    final: float = 0.0

    def __post_init__(self):
        if self.kind not in SCHEDULES:
            raise ConfigError(f"schedule={self.kind!r} is not one of {SCHEDULES}")
        if self.total < 1 or self.warmup < 0 or self.step_every < 1:
            raise ConfigError(
                f"schedule needs total>=1, warmup>=0, step_every>=1; got total={self.total}, "
                f"warmup={self.warmup}, step_every={self.step_every}"
            )

    def __call__(self, step: int) -> float:
        """The multiplier of the base learning rate at optimizer step `step` (0-based)."""
        if self.warmup and step < self.warmup:
            return (step + 1) / self.warmup
        if self.kind == "constant":
            return 1.0
        if self.kind == "step":
            return self.gamma ** ((step - self.warmup) // self.step_every)
        span = max(1, self.total - self.warmup)
        t = min(1.0, (step - self.warmup) / span)
        return self.final + (1.0 - self.final) * 0.5 * (1.0 + math.cos(math.pi * t))


def make_optimizer(
    name: str, params, *, lr: float, momentum: float = 0.9, weight_decay: float = 0.0, nesterov: bool = False
):
    """A torch optimizer by name.

    Args:
        name: one of OPTIMIZERS.
        params: the model's parameters.
        lr: base learning rate (> 0).
        momentum: SGD momentum; for Adam(W) it is beta1.
        weight_decay: L2 penalty (sgd, adam) or decoupled decay (adamw).
        nesterov: SGD only.
    """
    import torch

    if lr <= 0:
        raise ConfigError(f"lr={lr} must be > 0")
    if not 0.0 <= momentum < 1.0:
        raise ConfigError(f"momentum={momentum} must be in [0, 1)")
    if weight_decay < 0:
        raise ConfigError(f"weight_decay={weight_decay} must be >= 0")
    if name == "sgd":
        return torch.optim.SGD(
            params, lr=lr, momentum=momentum, weight_decay=weight_decay, nesterov=nesterov and momentum > 0
        )
    if name == "adam":
        return torch.optim.Adam(params, lr=lr, betas=(momentum, 0.999), weight_decay=weight_decay)
    if name == "adamw":
        return torch.optim.AdamW(params, lr=lr, betas=(momentum, 0.999), weight_decay=weight_decay)
    raise ConfigError(f"optimizer={name!r} is not one of {OPTIMIZERS}")


def make_scheduler(optimizer, schedule: Schedule):
    """A LambdaLR stepping `schedule` once per optimizer step (its state_dict holds plain values)."""
    import torch

    return torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
