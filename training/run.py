"""`train(config, comm)`: a whole data-parallel run (what `dstore train` calls).

Wires the pieces: process group over `comm`, data (built-in cache or a container), input spec,
model, optimizer and schedule, the store (or the direct baseline) feeding StoreLoader, epochs with
held-out evaluation, metrics as JSON lines, checkpoints and resumption.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import math
import os
import random
import sys
import time

import numpy as np

from dstore.collective import on_root
from dstore.errors import ConfigError
from dstore.formats import open_container
from dstore.pagecache import evict
from dstore.store import DataStore
from dstore.torch import StoreLoader
from dstore.training import hparams, ltfb
from dstore.training.augment import ImageTransform, default_augmentation
from dstore.training.checkpoint import (
    CHECKPOINT_NAME,
    check_same_container,
    container_identity,
    from_safe,
    load_checkpoint,
    resolve_job_resume,
    resolve_resume,
    rng_state,
    save_checkpoint,
    set_rng_state,
)
from dstore.training.config import TrainConfig
from dstore.training.data import DirectSource, ensure_builtin, probe_input, split_ranges
from dstore.training.dist import init_distributed
from dstore.training.loop import StepTimer, Trainer, global_batch_count
from dstore.training.metrics import EpochMeter, JsonLog
from dstore.training.models import build_model, default_model, get_model
from dstore.training.optim import Schedule, make_optimizer, make_scheduler


def seed_everything(seed: int, deterministic: bool) -> None:
    """Seeds torch, numpy and random alike on every rank; in deterministic mode also restricts
    torch to deterministic kernels and one intra-op thread (so float sums have one order)."""
    import torch

    torch.manual_seed(seed)
    np.random.seed(seed)
    random.seed(seed)
    if deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)
        torch.set_num_threads(1)
        torch.backends.cudnn.benchmark = False


def _share_cores(node_ranks: int, deterministic: bool) -> None:
    """Gives each rank its share of the node's cores for intra-op threads (unless the user set
    OMP_NUM_THREADS): N ranks each running one thread per core would oversubscribe N-fold."""
    import torch

    if not deterministic and "OMP_NUM_THREADS" not in os.environ:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // node_ranks))


def _say(line: str) -> None:
    # One write per line: under mpiexec, print's separate writes of text and newline from several
    # ranks can interleave.
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def new_run_dir(comm, runs_root: str) -> str:
    """`<runs_root>/<timestamp>-<pid of rank 0>`, the same on every rank."""
    name = time.strftime("%Y%m%d-%H%M%S") + f"-{os.getpid()}" if comm.Get_rank() == 0 else None
    return os.path.join(runs_root, comm.bcast(name, root=0))


def _make_source(cfg: TrainConfig, comm, reader, sample_range, seed: int, drop_last: bool):
    if cfg.loader == "direct":
        return DirectSource(comm, reader, batch_size=cfg.batch_size, seed=seed, drop_last=drop_last,
                            sample_range=sample_range, prefetch=max(1, cfg.prefetch))
    return DataStore(comm, reader, batch_size=cfg.batch_size, seed=seed, shuffle=cfg.shuffle,
                     population=cfg.population, prefetch=cfg.prefetch, drop_last=drop_last,
                     sample_range=sample_range, memory_budget=cfg.memory_budget, overflow=cfg.overflow)


def _transforms(cfg: TrainConfig, spec, input_size):
    pad, flip = default_augmentation(input_size)
    if cfg.augment == "off":
        pad, flip = 0, False
    elif cfg.augment == "on" and pad == 0:
        pad = 1
    # uint8 out of the decode threads, normalised per batch on the device (Trainer(prepare=...))
    common = dict(size=tuple(input_size), channels=spec.channels, mean=spec.mean, std=spec.std, normalize=False)
    return ImageTransform(train=True, pad=pad, flip=flip, **common), ImageTransform(**common)


def _human_bytes(n: float) -> str:
    for unit in ("B", "kB", "MB", "GB"):
        if abs(n) < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} GB"


def _describe(stats: dict) -> str:
    """One readable line of a rank's data I/O figures (the store's last epoch, or the direct
    reader's totals); unknown shapes fall back to key=value."""
    st = stats
    if "samples_local" in st:
        moved = st["bytes_local"] + st.get("bytes_node", 0) + st["bytes_remote"]
        line = (f"epoch {st['epoch']}: {st['samples']} samples ({st['samples_local']} local, "
                f"{st.get('samples_node', 0)} from node peers' memory, {st['samples_remote']} remote, "
                f"{st['pads']} pad), {_human_bytes(moved)}, {_human_bytes(st['bytes_remote'])} of it in "
                f"{st['gets']} gets; fetch {st['fetch_seconds'] * 1e3:.1f} ms, consumer wait "
                f"{st['wait_seconds'] * 1e3:.1f} ms")
        if st.get("samples_storage"):  # data larger than the memory budget: the rest from storage
            line += (f"; from storage {st['samples_storage']} samples, {_human_bytes(st['bytes_storage'])} in "
                     f"{st['storage_reads']} reads (wait {st['storage_wait_seconds'] * 1e3:.1f} ms)")
        if st.get("population_seconds"):
            line += (f"; population {_human_bytes(st['population_bytes'])} in "
                     f"{st['population_seconds'] * 1e3:.1f} ms ({st['population_MBps']:.1f} MB/s)")
        return line
    if "samples_read" in st:
        return (f"whole run: {st['samples_read']} samples read one by one from the file, "
                f"{_human_bytes(st['bytes_read'])} in {st['read_s']:.2f} s")
    return " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in sorted(st.items()))


def train(cfg: TrainConfig, comm, *, say=None) -> dict:
    """Runs a whole training job on `comm` (collective); returns the final metrics on every rank.

    With cfg.trainers > 1, `comm` is split into that many trainers playing an LTFB tournament
    (train_trainers, below); otherwise all of `comm` is one data-parallel trainer.

    Args:
        cfg: the run's configuration.
        comm: the job's MPI communicator (COMM_WORLD, or a sub-communicator).
        say: how rank 0 reports progress lines (default: one flushed write to stdout per line).

    Returns:
        {"test": {...} or None, "epochs": [...per-epoch records...], "run_dir": str,
         "stopped_early": bool, "store_stats": dict}, and with trainers > 1 also "ltfb": {...}.
    """
    cfg.check()
    if cfg.progress is None:  # auto: a bar only on a terminal, so batch logs get no \r frames
        cfg = dataclasses.replace(cfg, progress=_stderr_is_terminal())

    say = say or _say
    if cfg.trainers > 1:
        return train_trainers(cfg, comm, say=say)
    data_path = cfg.data or ensure_builtin(comm, "digits", cfg.cache_dir)
    resume_path = on_root(comm, resolve_resume, cfg.resume, cfg.run_dir, cfg.runs_root)
    # A resumed run without --run-dir continues in the directory of the checkpoint it resumes.
    run_dir = cfg.run_dir or (os.path.dirname(resume_path) if resume_path else new_run_dir(comm, cfg.runs_root))
    return run_trainer(cfg, comm, data_path, run_dir, resume_path=resume_path, say=say)


def run_trainer(cfg: TrainConfig, comm, data_path: str, run_dir: str, *, resume_path: str | None = None,
                say=_say, tournament=None) -> dict:
    """One trainer over `comm` (collective): what train() returns, for data set `data_path`.

    Args:
        tournament: this rank's dstore.training.ltfb.Tournament under LTFB, else None. With one, the
            trainer trains on its part of the training range, plays a round every
            `tournament.every` steps on the part's tail, and shares the node's cores with the
            other trainers' ranks.
    """
    seed_everything(cfg.seed, cfg.deterministic)
    report = say if comm.Get_rank() == 0 else (lambda *a, **k: None)

    with contextlib.ExitStack() as stack:  # closed in reverse: loaders, stores, readers, group
        ctx = stack.enter_context(init_distributed(comm, cfg.device,
                                                   gpu_index=tournament.node_rank if tournament else None))
        _share_cores(tournament.node_ranks if tournament else ctx.local_size, cfg.deterministic)
        reader = stack.enter_context(open_container(data_path))
        container = container_identity(reader)
        ck = None
        if resume_path:  # checked before any store exists or anything is written
            ck = load_checkpoint(resume_path, required=("model", "optimizer", "store", "rng", "epoch",
                                                        "step_in_epoch", "global_step"))
            check_same_container(ck.get("meta", {}).get("container"), container, resume_path)
        val_reader = stack.enter_context(open_container(cfg.val)) if cfg.val else None
        if val_reader is not None and val_reader.info.class_names != reader.info.class_names:
            raise ConfigError(f"--val {cfg.val} has classes {val_reader.info.class_names[:5]}... but {data_path} "
                              f"has {reader.info.class_names[:5]}...; both must have the same class names")
        train_range, held_range = split_ranges(reader.num_samples, 0.0 if cfg.val else cfg.holdout)
        # Measured on the whole training range, so that under LTFB every trainer normalises alike
        # and a model moved between trainers sees the inputs it was trained on.
        spec = probe_input(comm, reader, train_range, channels=cfg.channels, mean=cfg.mean, std=cfg.std)
        ltfb_meta = {}
        if tournament is not None:
            whole = train_range
            train_range, tour_range, dropped = tournament.data(whole)
            ltfb_meta = {"trainer": tournament.trainer, "trainers": tournament.trainers,
                         "ranks_per_trainer": tournament.ranks, "train_range": list(train_range),
                         "tournament_range": list(tour_range), "dropped": dropped}
            report(f"trains on samples [{train_range[0]}, {train_range[1]}) and plays on [{tour_range[0]}, "
                   f"{tour_range[1]}) of the training range [{whole[0]}, {whole[1]})"
                   + (f"; {dropped} sample(s) at its end dropped so that all {tournament.trainers} trainers get "
                      f"equal parts" if dropped else ""))
        name = default_model(spec.image_size) if cfg.model == "auto" else cfg.model
        input_size = tuple(cfg.image_size) if cfg.image_size else get_model(name).input_size(spec.image_size)
        model = build_model(name, spec.channels, spec.num_classes, input_size)
        optimizer = make_optimizer(cfg.optimizer, model.parameters(), lr=cfg.lr, momentum=cfg.momentum,
                                   weight_decay=cfg.weight_decay, nesterov=cfg.nesterov)
        train_src = stack.enter_context(_make_source(cfg, comm, reader, train_range, cfg.seed, cfg.drop_last))
        spe = train_src.steps_per_epoch
        sched = Schedule(cfg.schedule, total=cfg.epochs * spe, warmup=int(round(cfg.warmup_epochs * spe)),
                         step_every=max(1, cfg.step_epochs * spe), gamma=cfg.gamma)
        train_tf, eval_tf = _transforms(cfg, spec, input_size)
        trainer = Trainer(ctx, model, optimizer, make_scheduler(optimizer, sched), prepare=eval_tf.normalize_batch)
        # Resize in the loader: JPEGs then decode at a reduced DCT scale where possible.
        opts = dict(decode_threads=cfg.decode_threads, channels=cfg.channels, size=tuple(input_size))
        if ctx.device.type == "cuda":  # pinned batches, copied on a side stream while the last step runs
            opts.update(pin_memory=True, device=ctx.device)
        loader = stack.enter_context(StoreLoader(train_src, transform=train_tf, **opts))
        eval_loader = None
        if held_range is not None or val_reader is not None:
            eval_src = stack.enter_context(_make_source(cfg, comm, val_reader or reader, held_range,
                                                        cfg.seed + 1, False))
            eval_loader = stack.enter_context(StoreLoader(eval_src, transform=eval_tf, **opts))
        on_step = None
        if tournament is not None:
            tour_src = stack.enter_context(_make_source(cfg, comm, reader, tour_range, cfg.seed + 2, False))
            tour_loader = stack.enter_context(StoreLoader(tour_src, transform=eval_tf, **opts))
            ltfb_meta.update(round_steps=tournament.start(spe), metric=tournament.metric)
            on_step = functools.partial(tournament.after_step, trainer, tour_loader)
        meta = {"model": name, "input_size": list(input_size), "spec": dataclasses.asdict(spec),
                "data": data_path, "container": container,
                "train_samples": train_range[1] - train_range[0], "steps_per_epoch": spe,
                "ranks": ctx.size, **({"ltfb": ltfb_meta} if ltfb_meta else {})}
        return _fit(cfg, ctx, trainer, train_src, loader, eval_loader, run_dir, resume_path, report, meta, on_step,
                    checkpoint=ck)


def _fit(cfg, ctx, trainer, train_src, loader, eval_loader, run_dir, resume_path, report, meta,
         on_step=None, checkpoint=None) -> dict:
    """The epoch loop of train(); split out to keep each function readable.

    `on_step(global_step)`, if given, runs after every optimizer step (LTFB's rounds), before any
    checkpoint of that step, so a checkpoint holds the model the trainer kept.
    """
    import torch

    main = ctx.is_main
    comm = ctx.comm
    ck = checkpoint  # resume_path's, loaded (and its container checked) by run_trainer
    if ck is not None:  # checked before anything is written: a refused resume leaves the run dir as it was
        _check_compatible(ck, cfg, meta)
    if main:
        os.makedirs(run_dir, exist_ok=True)
        with open(os.path.join(run_dir, "config.json"), "w") as fh:
            json.dump({"config": dataclasses.asdict(cfg), **meta}, fh, indent=1, default=str)
    log = JsonLog(os.path.join(run_dir, "metrics.jsonl") if main else None)
    batch_log = JsonLog(os.path.join(run_dir, f"batches.rank{ctx.rank}.jsonl") if cfg.log_batches else None)
    n_train, spe = meta["train_samples"], meta["steps_per_epoch"]
    start_epoch, resume_step, global_step = 0, 0, 0
    if ck is not None:
        trainer.load_state_dict(ck)
        loader.load_state_dict(from_safe(ck["store"]))
        rngs = ck["rng"]
        set_rng_state(rngs[ctx.rank] if len(rngs) == ctx.size else rngs[0])
        start_epoch, resume_step, global_step = int(ck["epoch"]), int(ck["step_in_epoch"]), int(ck["global_step"])
        report(f"resumed from {resume_path} at epoch {start_epoch}, step {int(ck['step_in_epoch'])} "
               f"(global step {global_step})")
    report(f"training {meta['model']} on {n_train} samples of {meta['data']} with {ctx.size} rank(s), "
           f"global batch {cfg.batch_size}, {spe} steps/epoch; run dir {run_dir}")
    steps_this_run = 0
    stopped = False
    history = []

    def checkpoint(epoch, step_in_epoch):
        # (epoch, step_in_epoch) is the next batch the loop has not trained on.
        if step_in_epoch >= spe:
            epoch, step_in_epoch = epoch + 1, 0
        position = loader.state_dict()  # the loader's position after what it yielded (not its read-ahead)
        if (position["epoch"], position["step"]) != (epoch, step_in_epoch):
            raise RuntimeError(f"the loader is at epoch {position['epoch']} step {position['step']}, the loop at "
                               f"epoch {epoch} step {step_in_epoch}")
        state = {**trainer.state_dict(), "store": position,
                 "rng": comm.gather(rng_state(), root=0), "epoch": epoch, "step_in_epoch": step_in_epoch,
                 "global_step": global_step, "config": _plain_config(cfg), "meta": meta}
        if main:
            save_checkpoint(os.path.join(run_dir, CHECKPOINT_NAME), state)
        comm.Barrier()

    for epoch in range(start_epoch, cfg.epochs):
        if cfg.direct_cold:
            _evict_containers(ctx, [meta["data"]] + ([cfg.val] if cfg.val else []))
        meter = EpochMeter()
        timer = StepTimer()
        bar = _bar(cfg, main, spe, epoch)
        step_in_epoch = None
        first_step = resume_step if epoch == start_epoch else 0
        batches = loader.epoch(epoch)
        for k, (images, labels) in enumerate(batches):
            wait = timer.waited()
            step_in_epoch = first_step + k
            ids, pad = loader.last_ids, loader.last_pad
            weights = None if pad is None or not pad.any() else torch.from_numpy((~pad).astype(np.float32))
            count = global_batch_count(n_train, cfg.batch_size, step_in_epoch)
            loss_sum, correct, counted = trainer.train_step(images, labels, count, weights)
            meter.update(loss_sum, correct, counted, wait, timer.done())
            global_step += 1
            steps_this_run += 1
            batch_log.write({"epoch": epoch, "step": step_in_epoch, "ids": ids.tolist()})
            if on_step is not None:
                on_step(global_step)
            if bar is not None:
                bar.update(1)
                bar.set_postfix(loss=f"{loss_sum / max(counted, 1):.3f}")
            if cfg.checkpoint_every and global_step % cfg.checkpoint_every == 0:
                checkpoint(epoch, step_in_epoch + 1)
            if cfg.stop_after_steps and steps_this_run >= cfg.stop_after_steps:
                stopped = True
                break
        getattr(batches, "close", lambda: None)()  # ends the loader's read-ahead if the loop broke out
        if bar is not None:
            bar.close()
        if stopped:
            checkpoint(epoch, step_in_epoch + 1 if step_in_epoch is not None else 0)
            report(f"stopped after {steps_this_run} step(s) at epoch {epoch}; checkpoint in {run_dir}")
            break
        train_m = meter.reduce(comm)
        val_m = trainer.evaluate(eval_loader, 0) if eval_loader is not None else None
        record = {"epoch": epoch, "global_step": global_step,
                  "lr": trainer.optimizer.param_groups[0]["lr"],
                  **{f"train_{k}": v for k, v in train_m.items()},
                  **({f"val_{k}": v for k, v in val_m.items() if k in ("loss", "accuracy", "samples")}
                     if val_m else {})}
        log.write(record)
        history.append(record)
        report(f"epoch {epoch}: loss {train_m['loss']:.4f} acc {train_m['accuracy']:.4f}"
               + (f" | held-out loss {val_m['loss']:.4f} acc {val_m['accuracy']:.4f}" if val_m else "")
               + f" | {train_m['samples_per_s']:.0f} samples/s, data wait {train_m['data_wait_frac']:.1%}")
        checkpoint(epoch + 1, 0)

    test = None
    if not stopped and eval_loader is not None:
        test = trainer.evaluate(eval_loader, 0)
        log.write({"final": True, **{f"test_{k}": v for k, v in test.items()}})
        report(f"test accuracy: {test['accuracy']:.4f} ({test['samples']} held-out samples), "
               f"loss {test['loss']:.4f}")
    stats = getattr(train_src, "stats", None) or {}
    stats = stats.as_dict() if hasattr(stats, "as_dict") else dict(stats)  # the store's EpochStats, or a dict
    all_stats = comm.gather(stats, root=0)
    if main:
        for r, st in enumerate(all_stats):
            report(f"data I/O rank {r} ({cfg.loader}): {_describe(st)}")
        log.write({"final": True, "io_stats": all_stats})
    log.close()
    batch_log.close()
    return {"test": test, "epochs": history, "run_dir": run_dir, "stopped_early": stopped,
            "store_stats": stats}


def _evict_containers(ctx, paths) -> None:
    """--direct-cold: node-local rank 0 drops the containers' pages from its node's page cache
    (one cache per node), and no rank reads before that is done, so the epoch's per-sample reads
    come from storage as they would for data larger than memory."""
    if ctx.local_rank == 0:
        for path in paths:
            evict(path)
    ctx.comm.Barrier()


def _stderr_is_terminal() -> bool:
    try:
        return os.isatty(sys.stderr.fileno())
    except (AttributeError, OSError, ValueError):
        return False


def _bar(cfg, main, total, epoch):
    # cfg.progress: True (--progress: drawn even on a pipe, as under mpiexec where a rank's stderr is
    # a pipe although the user sees a terminal), False, or None: only when stderr is a terminal.
    if cfg.progress is None:
        cfg = dataclasses.replace(cfg, progress=_stderr_is_terminal())
    if not main or not cfg.progress:
        return None
    from tqdm import tqdm

    return tqdm(total=total, desc=f"epoch {epoch}", leave=False, mininterval=0.5)


def _plain_config(cfg: TrainConfig) -> dict:
    return {k: (list(v) if isinstance(v, tuple) else v) for k, v in dataclasses.asdict(cfg).items()}


def _check_compatible(ck: dict, cfg: TrainConfig, meta: dict) -> None:
    """A checkpoint continues only a run with the same data, model, batch size and seed."""
    old = ck.get("config", {})
    defaults = TrainConfig.__dataclass_fields__
    for key in ("batch_size", "seed", "shuffle", "drop_last", "holdout", "trainers", "ltfb_round", "ltfb_metric",
                "tournament_fraction", "ltfb_strategy", "truncation_fraction", "explore"):
        was = old.get(key, defaults[key].default)  # checkpoints made before a field existed had its default
        if was != getattr(cfg, key):
            raise ConfigError(f"cannot resume: the checkpoint was made with {key}={was!r}, "
                              f"this run has {key}={getattr(cfg, key)!r}")
    for key in ("model", "train_samples"):
        if ck.get("meta", {}).get(key) != meta[key]:
            raise ConfigError(f"cannot resume: the checkpoint's {key} is {ck.get('meta', {}).get(key)!r}, "
                              f"this run's is {meta[key]!r}")


# --- a job of several trainers (LTFB) ---------------------------------------------------------

def train_trainers(cfg, world, *, say) -> dict:
    """Runs K = cfg.trainers trainers of M = N / K ranks each on `world`, with a tournament every
    `cfg.ltfb_round` steps (collective over world); returns the trainer's result on every rank.

    Trainer k trains with seed cfg.seed + k in `<run dir>/trainer<k>/`; the tournament log goes to
    `<run dir>/tournament.jsonl`. At the end world rank 0 reports every trainer's test accuracy.

    Returns:
        dstore.training.run.train's dict for this rank's trainer, plus "ltfb": {"trainer", "trainers",
        "ranks_per_trainer", "tournaments", "run_dir", "test_by_trainer": [per trainer: accuracy
        or None], "best_trainer"}.
    """
    main = world.Get_rank() == 0
    ltfb.ranks_per_trainer(world.Get_size(), cfg.trainers)  # before anything else, the same error on every rank
    data_path = cfg.data or ensure_builtin(world, "digits", cfg.cache_dir)
    resumed = on_root(world, resolve_job_resume, cfg.resume, cfg.run_dir, cfg.runs_root, cfg.trainers)
    if resumed is not None:
        steps = on_root(world, _checkpoint_steps, resumed, cfg.trainers)
        if len(set(steps)) != 1:
            raise ConfigError(f"--resume: the trainers' checkpoints in {resumed} are at different global steps "
                              f"{steps}; a tournament resumes only from checkpoints of one step (they are taken at "
                              f"the same steps, so one trainer's save was interrupted: resume an earlier copy)")
    # A resumed job without --run-dir continues in the directory it resumes.
    run_dir = cfg.run_dir or resumed or new_run_dir(world, cfg.runs_root)
    explore = hparams.parse(cfg.explore)
    tournament = ltfb.Tournament(world, cfg.trainers, seed=cfg.seed, metric=cfg.ltfb_metric, every=cfg.ltfb_round,
                            fraction=cfg.tournament_fraction, log_path=os.path.join(run_dir, ltfb.LOG_NAME), say=say,
                            strategy=cfg.ltfb_strategy, truncation=cfg.truncation_fraction, explore=explore)
    k = tournament.trainer
    # With --explore, trainer k starts from its own seeded perturbation of the given values (a resumed
    # trainer then takes the values its checkpoint's optimizer and scheduler state hold).
    given = {"lr": cfg.lr, "weight_decay": cfg.weight_decay, "momentum": cfg.momentum}
    starts = [hparams.initial(given, explore, cfg.seed, j) for j in range(cfg.trainers)]
    mine = dataclasses.replace(cfg, seed=cfg.seed + k, run_dir=os.path.join(run_dir, f"trainer{k}"),
                               progress=cfg.progress and k == 0, **starts[k])  # one progress bar, not K
    if main:
        say(f"LTFB: {cfg.trainers} trainers x {tournament.ranks} rank(s), {cfg.ltfb_strategy} rounds; trainer k "
            f"uses seed {cfg.seed}+k and {run_dir}/trainer<k>/; tournament log {os.path.join(run_dir, ltfb.LOG_NAME)}")
        if explore:
            say("exploring " + ", ".join(explore) + ": trainers start from "
                + "; ".join(f"{j}: {hparams.describe(v, explore)}" for j, v in enumerate(starts)))
    resume_path = None if resumed is None else os.path.join(resumed, f"trainer{k}", CHECKPOINT_NAME)
    comm = tournament.split()
    try:
        result = run_trainer(mine, comm, data_path, mine.run_dir, resume_path=resume_path,
                             say=lambda line: say(f"[trainer {k}] {line}"), tournament=tournament)
    finally:
        comm.Free()
        tournament.close()
    test = result["test"]
    every = world.allgather(None if test is None else (test["accuracy"], test["loss"], test["samples"]))
    by_trainer = [every[j * tournament.ranks] for j in range(cfg.trainers)]
    accuracies = [None if t is None else t[0] for t in by_trainer]
    scored = [j for j, a in enumerate(accuracies) if a is not None and not math.isnan(a)]
    best = max(scored, key=lambda j: accuracies[j]) if scored else None
    if main:
        for j, t in enumerate(by_trainer):
            say(f"trainer {j}: " + ("no test accuracy" if t is None else
                                    f"test accuracy {t[0]:.4f} ({t[2]} held-out samples), loss {t[1]:.4f}"))
        if best is not None:
            say(f"best: trainer {best}, test accuracy {accuracies[best]:.4f} "
                f"(after {tournament.rounds} tournament round(s))")
    return {**result, "ltfb": {"trainer": k, "trainers": cfg.trainers, "ranks_per_trainer": tournament.ranks,
                               "tournaments": tournament.rounds, "run_dir": run_dir,
                               "test_by_trainer": accuracies, "best_trainer": best}}


def _checkpoint_steps(job: str, trainers: int) -> list[int]:
    """The global step each trainer's checkpoint in `job` was taken at."""
    return [int(load_checkpoint(os.path.join(job, f"trainer{k}", CHECKPOINT_NAME))["global_step"])
            for k in range(trainers)]
