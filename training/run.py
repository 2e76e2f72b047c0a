"""`train(config, comm)`: a whole data-parallel run (what `dstore train` calls).

Wires the pieces: process group over `comm`, data (built-in cache or a container), input spec,
model, optimizer and schedule, the store (or the direct baseline) feeding StoreLoader; a
`dstore.training.fit.Fit` then runs the epochs with held-out evaluation, metrics as JSON lines,
checkpoints and resumption. `train_trainers` runs the K trainers of an LTFB job.
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
from typing import Any

import numpy as np
import torch

from dstore.errors import ConfigError
from dstore.formats import open_container
from dstore.formats.base import ContainerReader
from dstore.loader.store_loader import StoreLoader
from dstore.loader.workers import default_workers
from dstore.runtime.collective import on_root, seen_everywhere
from dstore.runtime.preemption import Preemption, parse_signals
from dstore.store.config import options_from
from dstore.store.data_store import DataStore
from dstore.store.mixed import MixedStore
from dstore.training import console, hparams, ltfb
from dstore.training.augment import ImageTransform, default_augmentation
from dstore.training.bounds import check_memory_bounds
from dstore.training.budget import loader_reserve, share_budget
from dstore.training.checkpoint import CHECKPOINT_NAME, container_identity, resolve_job_resume, resolve_resume
from dstore.training.config import TrainConfig
from dstore.training.data import (
    DirectSource,
    FilesSource,
    InputSpec,
    check_mix_flags,
    check_mix_readers,
    ensure_builtin,
    parse_sources,
    probe_input,
    probe_mix_input,
    split_ranges,
)
from dstore.training.dist import init_distributed
from dstore.training.fit import Fit
from dstore.training.heartbeat import Heartbeat, stdout_is_terminal
from dstore.training.holdout import check_held_out
from dstore.training.loop import Trainer
from dstore.training.models import build_model, default_model, get_model
from dstore.training.optim import Schedule, make_optimizer, make_scheduler
from dstore.training.peers import PEER_LOADERS, PeerSource
from dstore.training.resume import checkpoint_steps, load_for_resume
from dstore.training.rundir import claimed_run_dir


def seed_everything(seed: int, deterministic: bool) -> None:
    """Seeds torch, numpy and random alike on every rank; in deterministic mode also restricts
    torch to deterministic kernels and one intra-op thread (so float sums have one order)."""
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
    if not deterministic and "OMP_NUM_THREADS" not in os.environ:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // node_ranks))


def new_run_dir(comm, runs_root: str) -> str:
    """`<runs_root>/<timestamp>-<pid of rank 0>`, the same on every rank."""
    name = time.strftime("%Y%m%d-%H%M%S") + f"-{os.getpid()}" if comm.Get_rank() == 0 else None
    return os.path.join(runs_root, comm.bcast(name, root=0))


def train(cfg: TrainConfig, comm, *, say=None, preemption: Preemption | None = None) -> dict:
    """Runs a whole training job on `comm` (collective); returns the final metrics on every rank.

    With cfg.trainers > 1, `comm` is split into that many trainers playing an LTFB tournament
    (train_trainers, below); otherwise all of `comm` is one data-parallel trainer.

    Args:
        cfg: the run's configuration.
        comm: the job's MPI communicator (COMM_WORLD, or a sub-communicator).
        say: how rank 0 reports progress lines (default: one flushed write to stdout per line).
        preemption: the installed dstore.runtime.preemption.Preemption watching cfg.preempt_signal (the CLI
            installs it first thing, before torch loads); None: train() installs one here, so that
            a signal during start-up (population, ...) is held until the run can stop (exit 75).

    Returns:
        {"test": {...} or None, "epochs": [...per-epoch records...], "run_dir": str,
         "stopped_early": bool, "store_stats": dict}, and with trainers > 1 also "ltfb": {...}.
    """
    cfg.check()
    if preemption is None:
        with Preemption(parse_signals(cfg.preempt_signal)) as watch:
            return train(cfg, comm, say=say, preemption=watch)
    if cfg.progress is None:  # auto: a bar only on a terminal, so batch logs get no \r frames
        cfg = dataclasses.replace(cfg, progress=console.stderr_is_terminal())
    # In a batch log, a line after every cfg.heartbeat s of silence (dstore.training.heartbeat).
    with Heartbeat(
        say or console.say, cfg.heartbeat, enabled=comm.Get_rank() == 0 and not stdout_is_terminal()
    ) as beat:
        return _train(cfg, comm, beat, preemption)


def _train(cfg: TrainConfig, comm, beat: Heartbeat, preemption: Preemption) -> dict:
    """train() once its preemption handlers and heartbeat run."""
    say = beat.say
    if parse_sources(cfg.data):
        check_mix_flags(cfg)
    if cfg.trainers > 1:
        return train_trainers(cfg, comm, say=say, preemption=preemption, beat=beat)
    data_path = cfg.data or ensure_builtin(comm, "digits", cfg.cache_dir)
    resume_path = on_root(comm, resolve_resume, cfg.resume, cfg.run_dir, cfg.runs_root)
    # A resumed run without --run-dir continues in the directory of the checkpoint it resumes.
    run_dir = cfg.run_dir or (os.path.dirname(resume_path) if resume_path else new_run_dir(comm, cfg.runs_root))
    # A run continues only in its own directory: resuming a checkpoint of another one into a
    # directory that holds a run is refused as a new run there would be.
    fresh = resume_path is None or not _same_dir(os.path.dirname(resume_path), run_dir)
    with claimed_run_dir(comm, run_dir, fresh=fresh, replace=cfg.overwrite or cfg.resume == "auto", say=say):
        return run_trainer(cfg, comm, data_path, run_dir, resume_path=resume_path, say=say, watch=preemption, beat=beat)


def _same_dir(a: str, b: str) -> bool:
    return os.path.realpath(a or ".") == os.path.realpath(b or ".")


# --- one trainer ------------------------------------------------------------------------------


@dataclasses.dataclass
class _Data:
    """What one trainer reads: its containers, how their samples divide, the input they hold."""

    reader: ContainerReader  # the training container
    val_reader: ContainerReader | None  # --val's container, or None (then held_range of reader is held out)
    container: dict  # the training container's identity (checkpoints are tied to it)
    train_range: tuple[int, int]
    held_range: tuple[int, int] | None
    spec: InputSpec  # dstore.training.data's InputSpec, measured on the whole training range
    tour_range: tuple[int, int] | None = None  # under LTFB, the trainer's tournament samples
    mix: list | None = None  # a mix's (container, weight) pairs (then reader is its first source's)
    readers: list = dataclasses.field(default_factory=list)  # a mix's readers, one per source


def run_trainer(
    cfg: TrainConfig,
    comm,
    data_path: str | tuple[str, ...],
    run_dir: str,
    *,
    resume_path: str | None = None,
    say=console.say,
    tournament=None,
    watch: Preemption | None = None,
    beat: Heartbeat | None = None,
) -> dict:
    """One trainer over `comm` (collective): what train() returns, for data set `data_path`.

    Builds the process group, data, model, Trainer and loaders (in that order; closed in reverse)
    and runs a dstore.training.fit.Fit over them.

    Args:
        tournament: this rank's dstore.training.ltfb.Tournament under LTFB, else None. With one, the
            trainer trains on its part of the training range, plays a round every
            `tournament.every` steps on the part's tail, and shares the node's cores with the
            other trainers' ranks.
        watch: the job's installed Preemption (train() installs it first thing); None: one is
            installed here, for the run's steps.
        beat: the job's Heartbeat, told each phase (None: no heartbeat).
    """
    beat = beat or Heartbeat(say, 0)
    seed_everything(cfg.seed, cfg.deterministic)
    report = say if comm.Get_rank() == 0 else (lambda *a, **k: None)

    with contextlib.ExitStack() as stack:  # closed in reverse: loaders, stores, readers, group
        ctx = stack.enter_context(
            init_distributed(comm, cfg.device, gpu_index=tournament.node_rank if tournament else None)
        )
        node_ranks = tournament.node_ranks if tournament else ctx.local_size
        _share_cores(node_ranks, cfg.deterministic)
        beat.phase("start-up: opening the data and measuring its input")
        data, ck = _open_data(stack, cfg, comm, data_path, resume_path)
        workers = default_workers(node_ranks) if cfg.decode_workers is None else cfg.decode_workers
        if data.mix and cfg.decode_workers is None and len({r.info.encoding for r in data.readers}) > 1:
            workers = 0  # decode workers take one encoding (dstore.loader.store_loader); threads decode each by its own
        ltfb_meta = _tournament_part(tournament, data, report) if tournament is not None else {}
        name, input_size, why = _input_of(cfg, data.spec)
        report(
            f"model {name} at {input_size[0]}x{input_size[1]} ({why}; images {data.spec.image_size[0]}x"
            f"{data.spec.image_size[1]}, --augment {cfg.augment})"
        )
        reserve = _loader_reserve(cfg, ctx, data, input_size, workers)
        check_memory_bounds(comm, cfg, reserve)  # before the model (sized by the input) or any store exists
        beat.phase("start-up: building the model")
        model, optimizer = _build_model(cfg, name, data.spec, input_size)
        beat.phase(
            "start-up: populating the store" if cfg.loader == "store" else "start-up: opening the sources",
            f"{data.train_range[1] - data.train_range[0]} training samples",
        )
        sources = _open_sources(stack, cfg, ctx, data, reserve)
        train_src = sources[0]
        spe = train_src.steps_per_epoch
        train_tf, eval_tf = build_transforms(cfg, data.spec, input_size)
        trainer = _make_trainer(cfg, ctx, model, optimizer, spe, prepare=eval_tf.normalize_batch)
        beat.phase("start-up: starting the loaders")
        loader, eval_loader, tour_loader = _open_loaders(
            stack, cfg, ctx, sources, input_size, train_tf, eval_tf, workers
        )
        on_step = None
        if tournament is not None:
            ltfb_meta.update(round_steps=tournament.start(spe), metric=tournament.metric)
            on_step = functools.partial(tournament.after_step, trainer, tour_loader)
        meta = {
            "model": name,
            "input_size": list(input_size),
            "spec": dataclasses.asdict(data.spec),
            "data": data_path,
            "container": data.container,
            "train_samples": data.train_range[1] - data.train_range[0],
            "steps_per_epoch": spe,
            "ranks": ctx.size,
            **({"ltfb": ltfb_meta} if ltfb_meta else {}),
        }
        if data.mix:  # the mix, with each source's samples per epoch (dstore.order.mix's counts)
            meta.update(
                data=" ".join(cfg.data or ()),
                mix={
                    "sources": [p for p, _ in data.mix],
                    "weights": [w for _, w in data.mix],
                    "counts": [int(c) for c in train_src.counts],
                },
            )
        # Agreed over the whole job: under LTFB every trainer stops at the same global step.
        if watch is None:
            watch = stack.enter_context(Preemption(parse_signals(cfg.preempt_signal)))
        fit = Fit(
            cfg,
            ctx,
            trainer,
            train_src,
            loader,
            eval_loader,
            run_dir,
            report,
            meta,
            on_step,
            preemption=(watch, tournament.world if tournament else comm),
            resume_path=resume_path,
            resumed=ck,
            beat=beat,
        )
        return fit.run()


def _open_data(
    stack, cfg: TrainConfig, comm, data_path: str | tuple[str, ...], resume_path: str | None
) -> tuple[_Data, dict | None]:
    """Opens the training (and --val) containers on `stack`, loads the checkpoint to resume (checked
    against the container before any store exists or anything is written), splits off the held-out
    range and measures the input; returns (_Data, the checkpoint or None)."""
    mix = parse_sources(cfg.data)
    data = [p for p, _ in mix] if mix else [data_path] if isinstance(data_path, str) else list(data_path)
    for path, what in [(p, "the data set") for p in data] + [
        (cfg.val, "--val"),
        (resume_path, "the checkpoint to resume"),
    ]:
        if path and "://" not in str(path):  # every rank opens them (a URL: object storage, which all see)
            seen_everywhere(comm, str(path), what)
    if mix:
        return _open_mix(stack, cfg, comm, mix, resume_path)
    assert isinstance(data_path, str)  # a tuple of positionals is a mix (parse_sources), opened above
    reader = stack.enter_context(open_container(data_path))
    container = container_identity(reader)
    ck = load_for_resume(resume_path, container) if resume_path else None
    val_reader = None
    if cfg.val:
        val_reader = stack.enter_context(open_container(cfg.val))
        check_val(cfg.val, val_reader, data_path, reader, container)
    train_range, held_range = split_ranges(reader.num_samples, 0.0 if cfg.val else cfg.holdout)
    warning = check_held_out(data_path, reader.info.extra, reader.labels, held_range)  # raises if class-ordered
    if warning and comm.Get_rank() == 0:
        print(warning, file=sys.stderr, flush=True)
    # Measured on the whole training range, so that under LTFB every trainer normalises alike
    # and a model moved between trainers sees the inputs it was trained on.
    spec = probe_input(comm, reader, train_range, channels=cfg.channels, mean=cfg.mean, std=cfg.std)
    return _Data(reader, val_reader, container, train_range, held_range, spec), ck


def _open_mix(stack, cfg: TrainConfig, comm, mix: list, resume_path: str | None) -> tuple[_Data, dict | None]:
    """_open_data for a mix: every source's container (same class list), the checkpoint to resume
    (refused unless made on this mix: the same containers and weights), --val, and the input
    measured on every source as the mix draws them."""
    readers = [stack.enter_context(open_container(path)) for path, _ in mix]
    container = {"mix": [{**container_identity(r), "weight": w} for r, (_, w) in zip(readers, mix)]}
    ck = load_for_resume(resume_path, container) if resume_path else None
    val_reader = stack.enter_context(open_container(cfg.val))
    check_mix_readers(mix, readers, cfg.val, val_reader)
    first = readers[0]
    spec = probe_mix_input(comm, readers, [w for _, w in mix], channels=cfg.channels, mean=cfg.mean, std=cfg.std)
    total = sum(r.num_samples for r in readers)
    return _Data(first, val_reader, container, (0, total), None, spec, mix=mix, readers=readers), ck


def check_val(val_path: str, val_reader, data_path: str, reader, container: dict) -> None:
    """Refuses (ConfigError) a --val container that is the training container itself (held-out
    figures would be training figures) or holds other classes, another encoding or another shape."""
    if container_identity(val_reader)["checksums_sha256"] == container["checksums_sha256"]:
        raise ConfigError(
            f"--val {val_path} holds the same samples as the training container {data_path}: "
            f"held-out figures would be training figures; give a separate container, or no --val "
            f"(then --holdout's tail is held out)"
        )
    v, t = val_reader.info, reader.info
    if v.class_names != t.class_names:
        show = lambda x: f"{list(x[:5])}{'...' if len(x) > 5 else ''}"  # noqa: E731
        raise ConfigError(
            f"--val {val_path} has classes {show(v.class_names)} but {data_path} has "
            f"{show(t.class_names)}; both must have the same classes"
        )
    if v.encoding != "raw" and t.encoding != "raw":
        return  # JPEG, PNG or both ('image'): each loader decodes its own container's samples
    for what, a, b in (
        ("encoding", v.encoding, t.encoding),
        ("sample shape", v.raw_shape, t.raw_shape),
        ("sample dtype", v.raw_dtype, t.raw_dtype),
    ):
        if a != b:
            raise ConfigError(
                f"--val {val_path} has {what} {a!r} but {data_path} has {b!r}; re-ingest the held-out "
                f"data like the training data (dstore ingest {val_path} OUT "
                + (
                    f"--encoding {t.encoding}"
                    if t.encoding != "raw"
                    else f"--encoding raw --resize {'x'.join(map(str, (t.raw_shape or [0, 0])[:2]))}"
                )
                + "), then --val OUT"
            )


def _tournament_part(tournament, data: _Data, report) -> dict:
    """Under LTFB: narrows `data` to this trainer's part of the training range and its tournament
    range; returns the "ltfb" entry of the run's metadata."""
    whole = data.train_range
    train_range, tour_range, dropped = tournament.data(whole)
    data.train_range, data.tour_range = train_range, tour_range
    report(
        f"trains on samples [{train_range[0]}, {train_range[1]}) and plays on [{tour_range[0]}, "
        f"{tour_range[1]}) of the training range [{whole[0]}, {whole[1]})"
        + (
            f"; {dropped} sample(s) at its end dropped so that all {tournament.trainers} trainers get equal parts"
            if dropped
            else ""
        )
    )
    return {
        "trainer": tournament.trainer,
        "trainers": tournament.trainers,
        "ranks_per_trainer": tournament.ranks,
        "train_range": list(train_range),
        "tournament_range": list(tour_range),
        "dropped": dropped,
    }


def _input_of(cfg: TrainConfig, spec) -> tuple[str, tuple[int, int], str]:
    """(model name, input size (H, W), why that model) for the measured input `spec`."""
    if cfg.model == "auto":
        name, why = default_model(spec.image_size, cfg.augment)
        why = f"--model auto: {why}"
    else:
        name, why = cfg.model, f"--model {cfg.model}"
    if cfg.image_size:
        h, w = cfg.image_size
        return name, (h, w), why
    return name, get_model(name).input_size(spec.image_size), why


def _build_model(cfg: TrainConfig, name: str, spec, input_size):
    """(the model, its optimizer) for the measured input `spec` at `input_size`."""
    model = build_model(name, spec.channels, spec.num_classes, input_size)
    optimizer = make_optimizer(
        cfg.optimizer,
        model.parameters(),
        lr=cfg.lr,
        momentum=cfg.momentum,
        weight_decay=cfg.weight_decay,
        nesterov=cfg.nesterov,
    )
    return model, optimizer


def _make_trainer(cfg: TrainConfig, ctx, model, optimizer, steps_per_epoch: int, prepare) -> Trainer:
    """The Trainer, with the learning-rate schedule over cfg.epochs epochs of `steps_per_epoch` steps
    and `prepare` applied to every batch on the device (see dstore.training.loop.Trainer)."""
    spe = steps_per_epoch
    sched = Schedule(
        cfg.schedule,
        total=cfg.epochs * spe,
        warmup=int(round(cfg.warmup_epochs * spe)),
        step_every=max(1, cfg.step_epochs * spe),
        gamma=cfg.gamma,
    )
    return Trainer(
        ctx,
        model,
        optimizer,
        make_scheduler(optimizer, sched),
        prepare=prepare,
        amp=cfg.amp,
        channels_last=cfg.channels_last,
    )


def _make_source(cfg: TrainConfig, comm, reader, sample_range, seed: int, drop_last: bool, train: bool = False):
    if cfg.loader in PEER_LOADERS and train:  # the peer feeds the training; held-out sets come from the container
        return PeerSource(
            comm, reader, loader=cfg.loader, batch_size=cfg.batch_size, seed=seed, sample_range=sample_range
        )
    if cfg.loader == "direct" or cfg.loader in PEER_LOADERS:
        return DirectSource(
            comm,
            reader,
            batch_size=cfg.batch_size,
            seed=seed,
            drop_last=drop_last,
            sample_range=sample_range,
            prefetch=max(1, cfg.prefetch),
        )
    if cfg.loader == "files":
        return FilesSource(
            comm,
            reader,
            root=cfg.files_root,
            read_threads=cfg.read_threads,
            batch_size=cfg.batch_size,
            seed=seed,
            drop_last=drop_last,
            sample_range=sample_range,
            prefetch=max(1, cfg.prefetch),
        )
    # every DataStore argument the run's config has (dstore.store.config.StoreConfig names them)
    store = DataStore(comm, reader, **options_from(cfg, seed=seed, drop_last=drop_last, sample_range=sample_range))
    # A read failing mid-epoch ends the job at once (the CLI aborts on any rank's error): the other
    # ranks wait in a DDP step, not in the store's agreement at the epoch's end.
    store.fail_fast = True
    return store


def _make_mix(cfg: TrainConfig, comm, mix: list) -> MixedStore:
    """The training set of a mix: one DataStore per source (dstore.store.mixed), failing fast as one store does."""
    store = MixedStore(comm, mix, **options_from(cfg, seed=cfg.seed, drop_last=cfg.drop_last))
    for s in store.stores:
        s.fail_fast = True
    return store


def _loader_reserve(cfg: TrainConfig, ctx, data: _Data, input_size, workers: int) -> int:
    """What a rank's loaders hold at most (dstore.training.budget.loader_reserve)."""
    mean_bytes = max(r.total_bytes / max(r.num_samples, 1) for r in (data.readers or [data.reader]))
    return loader_reserve(
        local_batch=-(-cfg.batch_size // ctx.size),
        input_shape=(*input_size, data.spec.channels),
        image_shape=(*data.spec.image_size, data.spec.channels),
        mean_sample_bytes=mean_bytes,
        decode_threads=cfg.decode_threads,
        loaders=2 if data.tour_range is not None else 1,
        workers=workers,
        deferred_resize=bool(workers)
        and cfg.resize == "fast"
        and (cfg.resize_on == "device" or (cfg.resize_on == "auto" and ctx.device.type == "cuda")),
    )


def _open_sources(stack, cfg: TrainConfig, ctx, data: _Data, reserve: int) -> tuple:
    """(training source, held-out source or None, tournament source or None), entered on `stack`.
    Stores populate when entered, so they are built first and share one memory budget per rank
    with the loaders' batches (dstore.training.budget) before any of them populates."""
    comm = ctx.comm
    sources: list[MixedStore | PeerSource | DirectSource | DataStore | None] = [
        _make_mix(cfg, comm, data.mix)
        if data.mix
        else _make_source(cfg, comm, data.reader, data.train_range, cfg.seed, cfg.drop_last, train=True)
    ]
    if data.held_range is not None or data.val_reader is not None:
        sources.append(_make_source(cfg, comm, data.val_reader or data.reader, data.held_range, cfg.seed + 1, False))
    else:
        sources.append(None)
    sources.append(
        None if data.tour_range is None else _make_source(cfg, comm, data.reader, data.tour_range, cfg.seed + 2, False)
    )
    # a mix's source stores share the budget as the other stores do, one part each
    share_budget(
        comm,
        [t for s in sources for t in (s.stores if isinstance(s, MixedStore) else [s])],
        budget=cfg.memory_budget,
        reserve=reserve,
    )
    return tuple(None if s is None else stack.enter_context(s) for s in sources)


def _open_loaders(stack, cfg: TrainConfig, ctx, sources, input_size, train_tf, eval_tf, workers: int):
    """(training loader, held-out loader or None, tournament loader or None) over `sources`
    (_open_sources), entered on `stack`; `train_tf` and `eval_tf` the per-sample transforms. The
    training loader decodes in `workers` processes (0: threads); the others, which run for a
    fraction of the time, in threads, so that a rank does not hold idle worker processes."""
    train_src, eval_src, tour_src = sources
    # Resize in the loader: JPEGs then decode at a reduced DCT scale where possible.
    opts: dict[str, Any] = dict(decode_threads=cfg.decode_threads, channels=cfg.channels, size=tuple(input_size))
    if ctx.device.type == "cuda":  # pinned batches, copied on a side stream while the last step runs
        opts.update(pin_memory=True, device=ctx.device)
    loader = stack.enter_context(
        StoreLoader(
            train_src, transform=train_tf, workers=workers, resize_on=cfg.resize_on if workers else "auto", **opts
        )
    )
    eval_loader = None if eval_src is None else stack.enter_context(StoreLoader(eval_src, transform=eval_tf, **opts))
    tour_loader = None if tour_src is None else stack.enter_context(StoreLoader(tour_src, transform=eval_tf, **opts))
    return loader, eval_loader, tour_loader


def build_transforms(cfg: TrainConfig, spec, input_size):
    """(training transform, evaluation transform) of `--augment` at `input_size`."""
    # uint8 out of the decode threads, normalised per batch on the device (Trainer(prepare=...))
    common: dict[str, Any] = dict(
        size=tuple(input_size), channels=spec.channels, mean=spec.mean, std=spec.std, normalize=False
    )
    if cfg.augment == "imagenet":
        return (
            ImageTransform(train=True, flip=True, recipe="imagenet", resize=cfg.resize, **common),
            ImageTransform(recipe="imagenet", resize=cfg.resize, **common),
        )
    pad, flip = default_augmentation(input_size)
    if cfg.augment == "off":
        pad, flip = 0, False
    elif cfg.augment == "on" and pad == 0:
        pad = 1
    return ImageTransform(train=True, pad=pad, flip=flip, **common), ImageTransform(**common)


# --- a job of several trainers (LTFB) ---------------------------------------------------------


def train_trainers(
    cfg: TrainConfig, world, *, say, preemption: Preemption | None = None, beat: Heartbeat | None = None
) -> dict:
    """Runs K = cfg.trainers trainers of M = N / K ranks each on `world`, with a tournament every
    `cfg.ltfb_round` steps (collective over world); returns the trainer's result on every rank.

    Trainer k trains with seed cfg.seed + k in `<run dir>/trainer<k>/`; the tournament log goes to
    `<run dir>/tournament.jsonl`. At the end world rank 0 reports every trainer's test accuracy.

    Returns:
        dstore.training.run.train's dict for this rank's trainer, plus "ltfb": {"trainer", "trainers",
        "ranks_per_trainer", "tournaments", "run_dir", "test_by_trainer": [per trainer: accuracy
        or None], "best_trainer"}.
    """
    ltfb.ranks_per_trainer(world.Get_size(), cfg.trainers)  # before anything else, the same error on every rank
    data_path = cfg.data or ensure_builtin(world, "digits", cfg.cache_dir)
    resumed = _resumed_job(cfg, world)
    # A resumed job without --run-dir continues in the directory it resumes.
    run_dir = cfg.run_dir or resumed or new_run_dir(world, cfg.runs_root)
    fresh = resumed is None or not _same_dir(resumed, run_dir)
    with claimed_run_dir(world, run_dir, fresh=fresh, replace=cfg.overwrite or cfg.resume == "auto", say=say):
        return _run_job(cfg, world, data_path, resumed, run_dir, say, preemption, beat)


def _run_job(
    cfg: TrainConfig,
    world,
    data_path: str | tuple[str, ...],
    resumed: str | None,
    run_dir: str,
    say,
    preemption: Preemption | None = None,
    beat: Heartbeat | None = None,
) -> dict:
    """train_trainers' job in its claimed run directory `run_dir` (resuming job directory `resumed`)."""
    explore = hparams.parse(cfg.explore)
    tournament = ltfb.Tournament(
        world,
        cfg.trainers,
        seed=cfg.seed,
        metric=cfg.ltfb_metric,
        every=cfg.ltfb_round,
        fraction=cfg.tournament_fraction,
        log_path=os.path.join(run_dir, ltfb.LOG_NAME),
        say=say,
        strategy=cfg.ltfb_strategy,
        truncation=cfg.truncation_fraction,
        explore=explore,
    )
    k = tournament.trainer
    mine, starts = _trainer_config(cfg, k, explore, run_dir)
    if world.Get_rank() == 0:
        _announce_job(cfg, tournament, run_dir, explore, starts, say)
        _write_job_config(cfg, run_dir)
    resume_path = None if resumed is None else os.path.join(resumed, f"trainer{k}", CHECKPOINT_NAME)
    assert mine.run_dir is not None  # _trainer_config gives each trainer its directory
    comm = tournament.split()
    try:
        result = run_trainer(
            mine,
            comm,
            data_path,
            mine.run_dir,
            resume_path=resume_path,
            say=lambda line: say(f"[trainer {k}] {line}"),
            tournament=tournament,
            watch=preemption,
            beat=beat,
        )
    finally:
        comm.Free()
        tournament.close()
    return {**result, "ltfb": _job_result(cfg, world, tournament, result["test"], run_dir, say)}


def _write_job_config(cfg: TrainConfig, run_dir: str) -> None:
    """The job's own config.json (each trainer writes its own in trainer<k>/): what `--resume`
    of the job takes the flags not given from."""
    path = os.path.join(run_dir, "config.json")
    with open(path + ".tmp", "w") as fh:
        json.dump({"config": dataclasses.asdict(cfg), "trainers": cfg.trainers}, fh, indent=1, default=str)
    os.replace(path + ".tmp", path)


def _resumed_job(cfg: TrainConfig, world) -> str | None:
    """The LTFB job directory --resume names (or None), refused unless every trainer's checkpoint in
    it was taken at the same global step."""
    resumed = on_root(world, resolve_job_resume, cfg.resume, cfg.run_dir, cfg.runs_root, cfg.trainers)
    if resumed is not None:
        steps = on_root(world, checkpoint_steps, resumed, cfg.trainers)
        if len(set(steps)) != 1:
            raise ConfigError(
                f"--resume: the trainers' checkpoints in {resumed} are at different global steps "
                f"{steps}; a tournament resumes only from checkpoints of one step (they are taken at "
                f"the same steps, so one trainer's save was interrupted: resume an earlier copy)"
            )
    return resumed


def _trainer_config(cfg: TrainConfig, k: int, explore, run_dir: str) -> tuple[TrainConfig, list[dict]]:
    """(trainer k's config: its seed, run dir and starting hyperparameters; every trainer's starting
    hyperparameters)."""
    # With --explore, trainer k starts from its own seeded perturbation of the given values (a resumed
    # trainer then takes the values its checkpoint's optimizer and scheduler state hold).
    given = {"lr": cfg.lr, "weight_decay": cfg.weight_decay, "momentum": cfg.momentum}
    starts = [hparams.initial(given, explore, cfg.seed, j) for j in range(cfg.trainers)]
    mine = dataclasses.replace(
        cfg,
        seed=cfg.seed + k,
        run_dir=os.path.join(run_dir, f"trainer{k}"),
        progress=cfg.progress and k == 0,
        **starts[k],
    )  # one progress bar, not K
    return mine, starts


def _announce_job(cfg: TrainConfig, tournament, run_dir: str, explore, starts: list[dict], say) -> None:
    """The job's opening lines (on world rank 0): trainers, rounds, where each writes, what each explores."""
    say(
        f"LTFB: {cfg.trainers} trainers x {tournament.ranks} rank(s), {cfg.ltfb_strategy} rounds; trainer k "
        f"uses seed {cfg.seed}+k and {run_dir}/trainer<k>/; tournament log {os.path.join(run_dir, ltfb.LOG_NAME)}"
    )
    if explore:
        say(
            "exploring "
            + ", ".join(explore)
            + ": trainers start from "
            + "; ".join(f"{j}: {hparams.describe(v, explore)}" for j, v in enumerate(starts))
        )


def _job_result(cfg: TrainConfig, world, tournament, test: dict | None, run_dir: str, say) -> dict:
    """Collective over world: every trainer's test result, gathered; world rank 0 reports them and
    the best; returns train_trainers' "ltfb" entry."""
    every = world.allgather(None if test is None else (test["accuracy"], test["loss"], test["samples"]))
    by_trainer = [every[j * tournament.ranks] for j in range(cfg.trainers)]
    accuracies = [None if t is None else t[0] for t in by_trainer]
    scored = {j: a for j, a in enumerate(accuracies) if a is not None and not math.isnan(a)}
    best = max(scored, key=scored.__getitem__) if scored else None
    if world.Get_rank() == 0:
        for j, t in enumerate(by_trainer):
            say(
                f"trainer {j}: "
                + (
                    "no test accuracy"
                    if t is None
                    else f"test accuracy {t[0]:.4f} ({t[2]} held-out samples), loss {t[1]:.4f}"
                )
            )
        if best is not None:
            say(
                f"best: trainer {best}, test accuracy {accuracies[best]:.4f} "
                f"(after {tournament.rounds} tournament round(s))"
            )
    return {
        "trainer": tournament.trainer,
        "trainers": cfg.trainers,
        "ranks_per_trainer": tournament.ranks,
        "tournaments": tournament.rounds,
        "run_dir": run_dir,
        "test_by_trainer": accuracies,
        "best_trainer": best,
    }
