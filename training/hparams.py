"""LTFB's hyperparameter exploration (`--explore lr,weight_decay,momentum`), as pure functions.

A trainer's hyperparameters live in its state: the base learning rate in the scheduler's `base_lrs`
(and the optimizer's `initial_lr`), weight decay and momentum (SGD) or beta1 (Adam) in the
optimizer's param groups. So they travel with the weights and the optimizer state when a model is
exchanged, and a checkpoint keeps them. `get` reads them from a Trainer.state_dict(), `put` writes
new values into a copy of one (the learning rate in effect is scaled with the base, so the schedule
continues from where it is).

Trainer k starts from `initial(values, names, seed, k)`: each explored value times a seeded
log-uniform factor in [1/INIT_SPREAD, INIT_SPREAD]. A trainer that takes another's model in a
round then multiplies the received values by `perturb(...)`'s seeded factor, one of FACTORS per
value (as population-based training does); a trainer that keeps its own model keeps its values.
Momentum is explored through 1 - momentum, so it stays below 1.
"""

from __future__ import annotations

import copy

import numpy as np

from dstore.errors import ConfigError

EXPLORABLE = ("lr", "weight_decay", "momentum")
INIT_SPREAD = 3.0
FACTORS = (0.8, 1.25)
_MAX_MOMENTUM = 0.999


def parse(text: str | list | tuple | None) -> tuple[str, ...]:
    """`--explore lr,momentum` -> ("lr", "momentum"); None or "" -> (); names are checked."""
    if not text:
        return ()
    names = tuple(n.strip() for n in (text.split(",") if isinstance(text, str) else text))
    bad = [n for n in names if n not in EXPLORABLE]
    if bad or len(set(names)) != len(names) or not names:
        raise ConfigError(
            f"--explore {','.join(names)!r}: give distinct names from {EXPLORABLE}, comma-separated"
            + (f" ({bad} not among them)" if bad else "")
        )
    return names


def check(names: tuple[str, ...], values: dict) -> None:
    """Every explored value must be one a multiplicative perturbation can move (> 0)."""
    for n in names:
        v = values[n]
        if n == "momentum" and not 0.0 <= v < 1.0:
            raise ConfigError(f"--explore momentum needs --momentum in [0, 1), not {v}")
        if n != "momentum" and not v > 0.0:
            flag = "--" + n.replace("_", "-")
            raise ConfigError(f"--explore {n} needs {flag} > 0 (perturbations multiply it), not {v}")


def _scale(name: str, value: float, factor: float) -> float:
    if name == "momentum":  # moved through 1 - momentum: stays in [0, 1)
        return float(min(_MAX_MOMENTUM, max(0.0, 1.0 - (1.0 - value) * factor)))
    return float(value * factor)


def initial(values: dict, names: tuple[str, ...], seed: int, trainer: int) -> dict:
    """Trainer `trainer`'s starting values: each explored one times a seeded log-uniform factor."""
    rng = np.random.default_rng([int(seed), int(trainer), 0x1E])
    out = dict(values)
    # One draw per name in EXPLORABLE order, so exploring one more name does not move the others.
    draws = {n: float(rng.uniform(-1.0, 1.0)) for n in EXPLORABLE}
    for n in names:
        out[n] = _scale(n, values[n], INIT_SPREAD ** draws[n])
    return out


def perturb(values: dict, names: tuple[str, ...], seed: int, round_index: int, trainer: int) -> dict:
    """The values a trainer continues with after taking another's model in round `round_index`."""
    rng = np.random.default_rng([int(seed), int(round_index), int(trainer), 0xE7])
    picks = {n: FACTORS[int(rng.integers(len(FACTORS)))] for n in EXPLORABLE}
    out = dict(values)
    for n in names:
        out[n] = _scale(n, values[n], picks[n])
    return out


def get(state: dict) -> dict:
    """{"lr", "weight_decay", "momentum"} of a Trainer.state_dict() (its first param group)."""
    group = state["optimizer"]["param_groups"][0]
    sched = state.get("scheduler")
    lr = sched["base_lrs"][0] if sched and sched.get("base_lrs") else group.get("initial_lr", group["lr"])
    momentum = group["betas"][0] if "betas" in group else group.get("momentum", 0.0)
    return {"lr": float(lr), "weight_decay": float(group.get("weight_decay", 0.0)), "momentum": float(momentum)}


def put(state: dict, values: dict) -> dict:
    """A copy of `state` (tensors shared, containers copied) holding `values` as its hyperparameters.

    The learning rate in effect is scaled by new base / old base, so a schedule continues at the
    same point with the new base.
    """
    old = get(state)
    optimizer = dict(state["optimizer"])
    optimizer["param_groups"] = [copy.copy(g) for g in optimizer["param_groups"]]
    sched = copy.copy(state.get("scheduler"))
    ratio = values["lr"] / old["lr"] if old["lr"] > 0 else 1.0
    for i, g in enumerate(optimizer["param_groups"]):
        g["lr"] = g["lr"] * ratio
        if "initial_lr" in g:  # the first group's base is the value itself, not old x ratio (rounding)
            g["initial_lr"] = values["lr"] if i == 0 else g["initial_lr"] * ratio
        g["weight_decay"] = values["weight_decay"]
        if "betas" in g:
            g["betas"] = (values["momentum"], *tuple(g["betas"])[1:])
        elif "momentum" in g:
            g["momentum"] = values["momentum"]
    if sched:
        for key in ("base_lrs", "_last_lr"):
            if sched.get(key) is not None:
                sched[key] = [v * ratio for v in sched[key]]
        if sched.get("base_lrs"):
            sched["base_lrs"][0] = values["lr"]
    return {**state, "optimizer": optimizer, "scheduler": sched}


def describe(values: dict, names: tuple[str, ...]) -> str:
    """`lr=0.0031 momentum=0.87` for the explored names."""
    return " ".join(f"{n}={values[n]:.3g}" for n in names)
