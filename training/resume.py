"""Continuing a run from its checkpoint: load it, check it against this run, put its state back.

A checkpoint continues only the run it came from: the same container (checked before any store
exists), and every config field the same but those in CHANGEABLE (how the run computes: threads,
loader, device, precision, logs; each change said in one line) and NOT_COMPARED (where and how this
invocation runs). `--epochs` may change: the schedule is then re-derived for the new total from the
step the checkpoint was taken at. Every refused field is named at once, in one line, with both
values. The checks raise ConfigError before anything is written, so a refused resume leaves the run
directory as it was.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os

from dstore.errors import ConfigError
from dstore.training.checkpoint import (
    CHECKPOINT_NAME,
    check_same_container,
    from_safe,
    load_checkpoint,
    resolve_resume,
    set_rng_state,
)

# What a checkpoint of train() holds besides the model's, optimizer's and scheduler's state.
REQUIRED = ("model", "optimizer", "store", "rng", "epoch", "step_in_epoch", "global_step")

# Config fields that fix the learning rate at every step: the checkpoint's optimizer and scheduler
# state hold their values, so a change would be ignored silently; it is refused instead.
SAME_SCHEDULE = (
    "optimizer",
    "lr",
    "momentum",
    "weight_decay",
    "nesterov",
    "schedule",
    "warmup_epochs",
    "step_epochs",
    "gamma",
)

# Config fields a resumed run must share with the checkpoint's (they fix the batches' order, the
# held-out split and the tournament).
SAME_CONFIG = (
    "batch_size",
    "seed",
    "shuffle",
    "drop_last",
    "holdout",
    "trainers",
    "ltfb_round",
    "ltfb_metric",
    "tournament_fraction",
    "ltfb_strategy",
    "truncation_fraction",
    "explore",
)

# Config fields that fix the model and the pixels it is fed: the checkpoint's weights were learnt
# on them (a convolutional net loads at another input size and trains on in silence).
SAME_INPUT = ("model", "image_size", "augment", "resize", "channels", "mean", "std", "val")

CHANGEABLE = (
    "epochs",
    "loader",
    "files_root",
    "read_threads",
    "direct_cold",
    "population",
    "prefetch",
    "decode_threads",
    "decode_workers",
    "resize_on",
    "memory_budget",
    "overflow",
    "storage_threads",
    "storage_lookahead",
    "cache_dir",
    "deterministic",
    "device",
    "amp",
    "channels_last",
    "checkpoint_every",
    "preempt_signal",
    "tensorboard",
    "log_batches",
)
"""Config fields a resume may change (documented in docs/training.md, 'Resuming'): how the run
computes and what it logs, not which samples it trains on in which order, its model, its input or
its schedule (--epochs re-derives it). A change is said in one line and config.json is rewritten.
Every field in none of these lists must be the checkpoint's (a new field is refused by default)."""

NOT_COMPARED = ("data", "run_dir", "runs_root", "resume", "overwrite", "progress", "heartbeat", "stop_after_steps")
"""Config fields of this invocation only: where it runs and what it resumes (the container is
checked by its identity instead: a moved copy resumes), and what this invocation does (a bar, a
stop after N steps); --resume never takes them from the run's config.json."""


def run_config_path(resume: str, run_dir: str | None, runs_root: str) -> str | None:
    """The config.json of the run `--resume` continues (whose values are the defaults of the flags
    not given), or None where there is none (a new run dir: --resume auto starts fresh there).

    `--resume auto` means `run_dir`'s (or, without it, the directory of the newest
    runs/*/checkpoint.pt); a directory (an LTFB job's) its own; a checkpoint file its directory's,
    or for a trainer's checkpoint of an LTFB job, the job's."""
    if resume == "auto":
        if run_dir is None:
            newest = resolve_resume("auto", None, runs_root)
            if newest is None:
                return None
            run_dir = os.path.dirname(newest)
        folder = run_dir
    elif os.path.isdir(resume):
        folder = resume
    else:
        folder = os.path.dirname(os.path.abspath(resume))
        job = os.path.dirname(folder)
        if os.path.basename(folder).startswith("trainer") and os.path.isfile(os.path.join(job, "config.json")):
            folder = job
    path = os.path.join(folder, "config.json")
    return path if os.path.isfile(path) else None


def missing_run_config(resume: str, run_dir: str | None, runs_root: str) -> str | None:
    """The config.json that the run `--resume` continues should have and has not (its checkpoint is
    there, its config.json is gone), or None: the flags not given cannot be taken from it, and
    defaults in their place would be blamed on the checkpoint (another container) instead."""
    checkpoint = resolve_resume(resume, run_dir, runs_root) if resume == "auto" else resume
    if checkpoint is None or not os.path.exists(checkpoint) or run_config_path(resume, run_dir, runs_root):
        return None
    folder = checkpoint if os.path.isdir(checkpoint) else os.path.dirname(os.path.abspath(checkpoint))
    return os.path.join(folder, "config.json")


def load_for_resume(path: str, container: dict) -> dict:
    """The checkpoint at `path`, refused (ConfigError) unless it holds a whole training state taken
    on the container whose identity is `container` (dstore.training.checkpoint.container_identity)."""
    ck = load_checkpoint(path, required=REQUIRED)
    check_structure(ck, path)
    check_same_container(ck.get("meta", {}).get("container"), container, path)
    return ck


def _bad(path: str, key: str, why: str) -> ConfigError:
    return ConfigError(
        f"resume checkpoint {path}: {key!r} {why} (edited or damaged?); resume an intact checkpoint, or start a new run"
    )


def check_structure(ck: dict, path: str) -> None:
    """Refuses (ConfigError naming the key) a checkpoint whose plain entries are not of the kinds
    train() writes: counters non-negative integers, config, meta and store dicts, one RNG state
    (a dict) per rank. What the model, optimizer and scheduler hold is checked where it is loaded
    (restore)."""
    for key in ("epoch", "step_in_epoch", "global_step"):
        v = ck[key]
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise _bad(path, key, f"is {v!r}, not a non-negative integer")
    for key in ("model", "optimizer", "store", "config", "meta"):
        if key in ck and not isinstance(ck[key], dict):
            raise _bad(path, key, f"is a {type(ck[key]).__name__}, not a dict")
    if ck.get("scheduler") is not None and not isinstance(ck["scheduler"], dict):
        raise _bad(path, "scheduler", f"is a {type(ck['scheduler']).__name__}, not a dict")
    container = ck.get("meta", {}).get("container")
    if container is not None and not isinstance(container, dict):
        raise _bad(path, "meta.container", f"is a {type(container).__name__}, not a dict")
    rngs = ck["rng"]
    if not isinstance(rngs, (list, tuple)) or not rngs or not all(isinstance(r, dict) for r in rngs):
        raise _bad(path, "rng", "is not a list of per-rank RNG states")


@contextlib.contextmanager
def _restoring(path: str, key: str):
    """Turns a failure to put entry `key` of checkpoint `path` back into one ConfigError naming it."""
    try:
        yield
    except Exception as exc:  # noqa: BLE001 - torch and numpy raise many types for state of the wrong shape
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise _bad(path, key, f"cannot be restored: {type(exc).__name__}: {first[:300]}") from None


def plain_config(cfg) -> dict:
    """The config as a checkpoint holds it: a dict of plain values (tuples as lists)."""
    return {k: (list(v) if isinstance(v, tuple) else v) for k, v in dataclasses.asdict(cfg).items()}


def flag_name(field: str) -> str:
    """The `dstore train` option of a TrainConfig field (`batch_size` -> `--batch-size`)."""
    return "--" + field.replace("_", "-")


def config_changes(old: dict, cfg) -> dict[str, tuple]:
    """{field: (the checkpoint's value, this run's)} for every TrainConfig field that differs from
    the checkpoint's config `old` (a field the checkpoint lacks had its default). Values compare
    as a checkpoint holds them (plain_config), so a tuple equals its list."""
    new = plain_config(cfg)
    defaults = plain_config(type(cfg)())
    return {k: (old.get(k, defaults[k]), v) for k, v in new.items() if old.get(k, defaults[k]) != v}


def _why(key: str) -> str:
    if key in SAME_CONFIG:
        return "the batches' order"
    if key in SAME_SCHEDULE:
        return "the learning rate"
    if key in SAME_INPUT:
        return "the model and its input"
    return "what the run computes"


def _show(field: str, value) -> str:
    if value is None:
        return "(not given)"
    if field == "image_size" and isinstance(value, (list, tuple)) and len(value) == 2:
        return f"{value[0]}x{value[1]}"
    if isinstance(value, (list, tuple)):
        return ",".join(str(v) for v in value)
    return str(value)


def check_compatible(ck: dict, cfg, meta: dict, path: str = "the checkpoint") -> list[str]:
    """A checkpoint continues only a run with the same data, model, input, batch order and
    learning-rate schedule; the fields in CHANGEABLE may change (--epochs re-derives the schedule,
    see restore).

    Args:
        ck: the loaded checkpoint.
        cfg: this run's TrainConfig.
        meta: this run's metadata (as written to config.json: "model", "train_samples", ...).
        path: the checkpoint's path, for the messages.

    Returns:
        One line per change applied (empty if none), for the run to report.

    Raises:
        ConfigError: one line naming every flag whose change is refused, each with the checkpoint's
            value and this run's.
    """
    changes = config_changes(ck.get("config", {}), cfg)
    refused = [
        f"{flag_name(k)} {_show(k, was)} (this run: {_show(k, now)}; it fixes {_why(k)})"
        for k, (was, now) in changes.items()
        if k not in CHANGEABLE and k not in NOT_COMPARED
    ]
    saved_meta = ck.get("meta", {})
    refused += [
        f"{key} {saved_meta.get(key)!r} (this run: {meta[key]!r})"
        for key in ("model", "train_samples")
        if saved_meta.get(key) != meta[key] and not any(r.startswith(f"--{key} ") for r in refused)
    ]
    if refused:
        raise ConfigError(
            f"cannot resume {path}: it was made with " + ", ".join(refused) + "; give its values "
            "(or leave those flags out: --resume takes the run's own config.json), or start a new "
            "run (--overwrite, or another --run-dir)"
        )
    applied = []
    if "epochs" in changes:
        was, now = changes["epochs"]
        if now < int(ck["epoch"]):
            raise ConfigError(
                f"cannot resume: the checkpoint is at epoch {int(ck['epoch'])}, past --epochs {now} "
                f"(it was made with --epochs {was}); give --epochs {int(ck['epoch'])} or more"
            )
        applied.append(
            f"--epochs changed from {was} to {now}: the {cfg.schedule} learning-rate schedule is "
            f"re-derived for {now} epochs from the step the checkpoint was taken at"
        )
    other = [
        f"{flag_name(k)} {_show(k, was)} -> {_show(k, now)}"
        for k, (was, now) in changes.items()
        if k in CHANGEABLE and k != "epochs"
    ]
    if other:
        applied.append(
            "changed on resume: " + ", ".join(other) + " (how the run computes or logs, not its data "
            "order, model, input or schedule); config.json now says so, resumes.jsonl keeps the history"
        )
    return applied


def restore(ck: dict, trainer, loader, rank: int, size: int, path: str = "") -> tuple[int, int, int]:
    """Puts the checkpoint's model, optimizer, scheduler, data position and this rank's RNG states
    back; returns (epoch, step in that epoch, global step) where the run continues.

    A checkpoint of another rank count restores every rank's RNGs from rank 0's. An entry that
    cannot be put back is a ConfigError naming it (and `path`)."""
    _load_keeping_schedule(trainer, ck, path)
    with _restoring(path, "store"):
        loader.load_state_dict(from_safe(ck["store"]))
    at = loader.state_dict()
    if (int(at["epoch"]), int(at["step"])) != (int(ck["epoch"]), int(ck["step_in_epoch"])):
        raise _bad(
            path,
            "epoch",
            f"and 'step_in_epoch' ({ck['epoch']}, {ck['step_in_epoch']}) disagree with the "
            f"data position in 'store' (epoch {at['epoch']}, step {at['step']})",
        )
    rngs = ck["rng"]
    with _restoring(path, "rng"):
        set_rng_state(rngs[rank] if len(rngs) == size else rngs[0])
    return int(ck["epoch"]), int(ck["step_in_epoch"]), int(ck["global_step"])


def _load_keeping_schedule(trainer, ck: dict, path: str) -> None:
    """Trainer.load_state_dict(ck) (each entry's failure named), keeping this run's schedule (its total steps follow --epochs).

    LambdaLR.load_state_dict writes the checkpoint's schedule object (its total steps) over this
    run's, so a run resumed with more epochs went on at the old end's learning rate (0 for cosine).
    Everything else of the scheduler (the step count, the base rates LTFB may have changed) is the
    checkpoint's; the optimizer's rate is then set to what the kept schedule gives at that step."""
    sched = trainer.scheduler
    mine = [] if sched is None else [dict(vars(f)) for f in sched.lr_lambdas]
    with _restoring(path, "model"):
        trainer.model.load_state_dict(ck["model"])
    with _restoring(path, "optimizer"):
        trainer.optimizer.load_state_dict(ck["optimizer"])
    if sched is None or ck.get("scheduler") is None:
        return
    with _restoring(path, "scheduler"):
        sched.load_state_dict(ck["scheduler"])
    for f, d in zip(sched.lr_lambdas, mine):
        vars(f).update(d)
    lrs = [base * f(sched.last_epoch) for base, f in zip(sched.base_lrs, sched.lr_lambdas)]
    for group, lr in zip(trainer.optimizer.param_groups, lrs):
        group["lr"] = lr
    sched._last_lr = lrs


def checkpoint_steps(job: str, trainers: int) -> list[int]:
    """The global step each trainer's checkpoint in the LTFB job directory `job` was taken at."""
    return [
        int(load_checkpoint(os.path.join(job, f"trainer{k}", CHECKPOINT_NAME))["global_step"]) for k in range(trainers)
    ]
