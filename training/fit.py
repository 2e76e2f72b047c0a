"""One trainer's epoch loop, `Fit`: resume, train each epoch's steps, evaluate, checkpoint, report.

`dstore.training.run.run_trainer` builds the pieces (process group, model, Trainer, data sources
and their StoreLoaders) and hands them to a `Fit`, whose `run()` is, by name:

    start()                        check a checkpoint against this run, write config.json (or, resumed,
                                   resumes.jsonl), open the logs
    resume()                       put a checkpoint's state back (model, optimizer, data position, RNGs)
    for each epoch: run_epoch()
        train_step()               one batch: a weighted optimizer step, the meter, the batch log, LTFB
        after_step()               a checkpoint every cfg.checkpoint_every steps; stop after
                                   cfg.stop_after_steps (checkpointed, the run ends there)
        end_epoch()                reduce the figures, evaluate held-out data, log, report, checkpoint
    finish()                       test on the held-out data, every rank's data-I/O figures, close the logs
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from dstore.errors import DStoreError, OutputError
from dstore.memory.pagecache import evict
from dstore.runtime.collective import agree
from dstore.training.checkpoint import CHECKPOINT_NAME, rng_state, save_checkpoint
from dstore.training.console import progress_bar, summarize_io
from dstore.training.loop import StepTimer, Trainer, global_batch_count
from dstore.training.metrics import CurveLogs, EpochMeter, JsonLog
from dstore.training.resume import check_compatible, config_changes, plain_config, restore


class DivergedError(DStoreError, FloatingPointError):
    """The training loss became NaN or infinite: the run ends (with its last good checkpoint)."""


@dataclasses.dataclass
class Fit:
    """One trainer's run over its built pieces (collective over ctx.comm: every rank runs it).

    Attributes:
        cfg: the run's TrainConfig.
        ctx: the process group (dstore.training.dist), its `comm`, `rank`, `size`, `is_main`.
        trainer: the Trainer (model, optimizer, schedule).
        train_src: the training data source (a DataStore or DirectSource), for its I/O figures.
        loader: the StoreLoader over train_src.
        eval_loader: the held-out data's StoreLoader, or None.
        run_dir: where config.json, metrics.jsonl and the checkpoint go.
        report: how progress lines are shown (a no-op on ranks other than 0).
        meta: the run's metadata for config.json and checkpoints ("model", "data", "train_samples",
            "steps_per_epoch", ...).
        on_step: `on_step(global_step)`, if given, runs after every optimizer step (LTFB's rounds),
            before any checkpoint of that step, so a checkpoint holds the model the trainer kept.
        preemption: (a dstore.runtime.preemption.Preemption, the communicator every rank of the job agrees
            on it over), or None; when a signal arrived, the run stops after the step with a checkpoint.
        resume_path: the checkpoint this run continues, or None.
        resumed: that checkpoint, loaded (and its container checked) by run_trainer.
        global_step: optimizer steps so far, counting those before a resume.
        steps_this_run: optimizer steps of this process (what cfg.stop_after_steps counts).
        stopped: whether the run stopped early (cfg.stop_after_steps, or a preemption).
        preempted: the signal that stopped the run (its name), or None.
        history: the per-epoch records written to metrics.jsonl.
    """

    cfg: Any
    ctx: Any
    trainer: Trainer
    train_src: Any
    loader: Any
    eval_loader: Any
    run_dir: str
    report: Callable[[str], None]
    meta: dict
    on_step: Callable[[int], None] | None = None
    preemption: Any = None
    resume_path: str | None = None
    resumed: dict | None = None
    global_step: int = dataclasses.field(default=0, init=False)
    steps_this_run: int = dataclasses.field(default=0, init=False)
    stopped: bool = dataclasses.field(default=False, init=False)
    preempted: str | None = dataclasses.field(default=None, init=False)
    history: list = dataclasses.field(default_factory=list, init=False)
    log: Any = dataclasses.field(default=None, init=False)
    applied: list = dataclasses.field(default_factory=list, init=False)
    batch_log: Any = dataclasses.field(default=None, init=False)
    curves: Any = dataclasses.field(default=None, init=False)
    beat: Any = None  # the job's dstore.training.heartbeat.Heartbeat, told each phase and step (or None)

    def run(self) -> dict:
        """Trains to cfg.epochs (or cfg.stop_after_steps); returns what dstore.training.run.train does."""
        self.start()
        start_epoch, first_step = self.resume()
        self.report(
            f"training {self.meta['model']} on {self.meta['train_samples']} samples of {self.meta['data']} "
            f"with {self.ctx.size} rank(s), global batch {self.cfg.batch_size}, "
            f"{self.meta['steps_per_epoch']} steps/epoch; run dir {self.run_dir}"
        )
        if self.preempted_at_start():
            return self.finish()
        for epoch in range(start_epoch, self.cfg.epochs):
            if not self.run_epoch(epoch, first_step if epoch == start_epoch else 0):
                break
        return self.finish()

    # ------------------------------------------------------------ before the first step
    def start(self) -> None:
        """Checks a checkpoint to resume against this run (before anything is written: a refused
        resume leaves the run dir as it was), writes config.json and opens the logs."""
        cfg, ctx = self.cfg, self.ctx
        self.applied = (
            []
            if self.resumed is None
            else check_compatible(self.resumed, cfg, self.meta, self.resume_path or "the checkpoint")
        )
        if ctx.is_main:
            os.makedirs(self.run_dir, exist_ok=True)
            self.write_config()
        self.log = JsonLog(os.path.join(self.run_dir, "metrics.jsonl") if ctx.is_main else None)
        self.curves = CurveLogs(self.run_dir if ctx.is_main else None, tensorboard=cfg.tensorboard)
        self.batch_log = JsonLog(
            os.path.join(self.run_dir, f"batches.rank{ctx.rank}.jsonl") if cfg.log_batches else None
        )

    def write_config(self) -> None:
        """config.json: the flags and metadata of what runs now (a resumed run with a changed flag,
        --epochs say, rewrites it: `--resume` takes its defaults from it); a resumed run records
        where it continued and what changed in resumes.jsonl beside it (the history)."""
        path = os.path.join(self.run_dir, "config.json")
        with open(path + ".tmp", "w") as fh:  # then renamed: a kill never leaves half a config.json
            json.dump({"config": dataclasses.asdict(self.cfg), **self.meta}, fh, indent=1, default=str)
        os.replace(path + ".tmp", path)
        if self.resumed is not None:
            changes = config_changes(self.resumed.get("config", {}), self.cfg)
            with JsonLog(os.path.join(self.run_dir, "resumes.jsonl")) as log:
                log.write(
                    {
                        "checkpoint": self.resume_path,
                        "epoch": int(self.resumed["epoch"]),
                        "global_step": int(self.resumed["global_step"]),
                        "changes": {k: list(v) for k, v in changes.items()},
                    }
                )

    def resume(self) -> tuple[int, int]:
        """Restores the checkpoint's state, if any; returns (epoch, step in it) to continue at."""
        if self.resumed is None:
            return 0, 0
        epoch, step, self.global_step = restore(
            self.resumed, self.trainer, self.loader, self.ctx.rank, self.ctx.size, self.resume_path or ""
        )
        self.report(
            f"resumed from {self.resume_path} at epoch {epoch}, step {step} (global step {self.global_step}): "
            f"model, optimizer, learning-rate schedule (lr now "
            f"{self.trainer.optimizer.param_groups[0]['lr']:.4g}), data position and RNG states restored"
        )
        for line in self.applied:
            self.report(line)
        return epoch, step

    def preempted_at_start(self) -> bool:
        """Collective: True (and said) if a preemption signal came during start-up, before the
        first step (the handlers are installed first thing: the signal was held, not lost). The run
        stops with nothing new to checkpoint; the CLI exits 75 as for any preemption."""
        if self.preemption is None:
            return False
        watch, comm = self.preemption
        if not watch.agreed(comm):
            return False
        self.stopped = True
        self.preempted = "SIG" + watch.received if watch.received else "a signal to another rank"
        kept = (
            f"the checkpoint it resumed from ({self.resume_path}) is kept"
            if self.resumed is not None
            else "no checkpoint written"
        )
        self.report(f"stopped by {self.preempted} during start-up, no step yet: {kept}; --resume auto starts it again")
        return True

    # ------------------------------------------------------------ per epoch and step
    def run_epoch(self, epoch: int, first_step: int) -> bool:
        """Trains `epoch` from step `first_step`; False if the run stopped in it (cfg.stop_after_steps)."""
        cfg = self.cfg
        if cfg.direct_cold:
            evict_containers(self.ctx, [self.meta["data"]] + ([cfg.val] if cfg.val else []))
        meter, timer = EpochMeter(), StepTimer()
        spe = self.meta["steps_per_epoch"]
        beat = self.beat
        if beat is not None:
            beat.phase(f"epoch {epoch}", f"step {first_step}/{spe}")
        bar = progress_bar(cfg.progress, self.ctx.is_main, spe, epoch)
        step = None
        batches = self.loader.epoch(epoch)
        for k, (images, labels) in enumerate(batches):
            wait = timer.waited()
            step = first_step + k
            loss_sum, counted = self.train_step(epoch, step, images, labels, meter, timer, wait)
            if beat is not None:
                beat.progress(f"step {step + 1}/{spe}")
            if bar is not None:
                bar.update(1)
                bar.set_postfix(loss=f"{loss_sum / max(counted, 1):.3f}")
            if self.after_step(epoch, step):
                self.stopped = True
                break
        getattr(batches, "close", lambda: None)()  # ends the loader's read-ahead if the loop broke out
        if bar is not None:
            bar.close()
        if self.stopped:
            self.checkpoint(epoch, step + 1 if step is not None else 0)
            why = f" by {self.preempted}" if self.preempted else ""
            self.report(
                f"stopped{why} after {self.steps_this_run} step(s) at epoch {epoch}; checkpoint in {self.run_dir}"
            )
            return False
        self.end_epoch(epoch, meter)
        return True

    def train_step(
        self, epoch: int, step: int, images, labels, meter: EpochMeter, timer: StepTimer, wait: float
    ) -> tuple[float, int]:
        """One optimizer step on the loader's last batch (its padding repeats weighted 0); returns
        (loss sum, samples counted) of this rank's part."""
        ids, pad = self.loader.last_ids, self.loader.last_pad
        weights = None if pad is None or not pad.any() else torch.from_numpy((~pad).astype(np.float32))
        count = global_batch_count(self.meta["train_samples"], self.cfg.batch_size, step)
        loss_sum, correct, counted = self.trainer.train_step(images, labels, count, weights)
        meter.update(loss_sum, correct, counted, wait, timer.done())
        self.global_step += 1
        self.steps_this_run += 1
        self.batch_log.write({"epoch": epoch, "step": step, "ids": ids.tolist()})
        if self.on_step is not None:
            self.on_step(self.global_step)
        return loss_sum, counted

    def after_step(self, epoch: int, step: int) -> bool:
        """The checkpoint policy after step `step` of `epoch`: a checkpoint every cfg.checkpoint_every
        global steps; True when the run stops here (cfg.stop_after_steps steps of this process, or
        a preemption signal that some rank received, agreed over every rank: one small allreduce)."""
        cfg = self.cfg
        # Not at an epoch's last step: that epoch's evaluation, record and checkpoint come first.
        if self.preemption is not None and step + 1 < self.meta["steps_per_epoch"]:
            watch, comm = self.preemption
            if watch.agreed(comm):
                self.preempted = "SIG" + watch.received if watch.received else "a signal to another rank"
                return True
        if cfg.checkpoint_every and self.global_step % cfg.checkpoint_every == 0:
            self.checkpoint(epoch, step + 1)
        return bool(cfg.stop_after_steps and self.steps_this_run >= cfg.stop_after_steps)

    def end_epoch(self, epoch: int, meter: EpochMeter) -> None:
        """After a whole epoch: its figures reduced over the ranks, held-out evaluation, the log
        record and progress line, and a checkpoint at the next epoch's start."""
        if self.beat is not None:
            self.beat.phase(f"epoch {epoch}: held-out evaluation")
        train_m = meter.reduce(self.ctx.comm)
        if train_m["samples"] and not np.isfinite(train_m["loss"]):  # reduced: every rank stops alike
            raise DivergedError(
                f"training diverged: the loss of epoch {epoch} is {train_m['loss']} (global step "
                f"{self.global_step}); the last checkpoint before it is kept in {self.run_dir}; "
                f"lower --lr (now {self.cfg.lr:g}) or add --warmup-epochs"
            )
        val_m = self.trainer.evaluate(self.eval_loader, 0) if self.eval_loader is not None else None
        record = {
            "epoch": epoch,
            "global_step": self.global_step,
            "lr": self.trainer.optimizer.param_groups[0]["lr"],
            **{f"train_{k}": v for k, v in train_m.items()},
            **({f"val_{k}": v for k, v in val_m.items() if k in ("loss", "accuracy", "samples")} if val_m else {}),
        }
        self.log.write(record)
        self.curves.write(record)
        self.history.append(record)
        self.report(
            f"epoch {epoch}: loss {train_m['loss']:.4f} acc {train_m['accuracy']:.4f}"
            + (f" | held-out loss {val_m['loss']:.4f} acc {val_m['accuracy']:.4f}" if val_m else "")
            + f" | {train_m['samples_per_s']:.0f} samples/s, data wait {train_m['data_wait_frac']:.1%}"
        )
        self.checkpoint(epoch + 1, 0)

    def checkpoint(self, epoch: int, step_in_epoch: int) -> None:
        """Collective: saves the run's state at (epoch, step_in_epoch), the next batch the loop has
        not trained on (the main rank writes it; every rank's RNG states go into it)."""
        if step_in_epoch >= self.meta["steps_per_epoch"]:
            epoch, step_in_epoch = epoch + 1, 0
        position = self.loader.state_dict()  # the loader's position after what it yielded (not its read-ahead)
        if (position["epoch"], position["step"]) != (epoch, step_in_epoch):
            raise RuntimeError(
                f"the loader is at epoch {position['epoch']} step {position['step']}, the loop at "
                f"epoch {epoch} step {step_in_epoch}"
            )
        comm = self.ctx.comm
        state = {
            **self.trainer.state_dict(),
            "store": position,
            "rng": comm.gather(rng_state(), root=0),
            "epoch": epoch,
            "step_in_epoch": step_in_epoch,
            "global_step": self.global_step,
            "config": plain_config(self.cfg),
            "meta": self.meta,
        }
        failed = None
        if self.ctx.is_main:
            try:
                save_checkpoint(os.path.join(self.run_dir, CHECKPOINT_NAME), state)
            except OutputError as exc:  # a full disk: every rank ends with the main rank's line
                failed = exc
        agree(comm, failed)

    # ------------------------------------------------------------ after the last step
    def finish(self) -> dict:
        """Tests on the held-out data (unless stopped early), reports every rank's data-I/O figures
        and closes the logs; returns train()'s dict."""
        test = None
        if self.beat is not None:
            self.beat.phase("the end: testing and the data-I/O figures")
        if not self.stopped and self.eval_loader is not None:
            test = self.trainer.evaluate(self.eval_loader, 0)
            self.log.write({"final": True, **{f"test_{k}": v for k, v in test.items()}})
            self.report(
                f"test accuracy: {test['accuracy']:.4f} ({test['samples']} held-out samples), loss {test['loss']:.4f}"
            )
        stats = self.io_stats()
        self.log.close()
        self.curves.close()
        self.batch_log.close()
        return {
            "test": test,
            "epochs": self.history,
            "run_dir": self.run_dir,
            "stopped_early": self.stopped,
            "preempted": self.preempted,
            "store_stats": stats,
        }

    def io_stats(self) -> dict:
        """Collective: this rank's data-I/O figures (the store's last epoch, or the direct reader's
        totals); the main rank reports them over all ranks in one line and logs every rank's."""
        stats = getattr(self.train_src, "stats", None) or {}
        stats = dict(stats) if isinstance(stats, dict) else stats.as_dict()  # a dict, or the store's EpochStats
        all_stats = self.ctx.comm.gather(stats, root=0)
        if self.ctx.is_main:
            self.report(summarize_io(all_stats, self.cfg.loader))  # one line however many ranks
            self.log.write({"final": True, "io_stats": all_stats})
        return stats


def evict_containers(ctx, paths) -> None:
    """--direct-cold: node-local rank 0 drops the containers' pages from its node's page cache
    (one cache per node), and no rank reads before that is done, so the epoch's per-sample reads
    come from storage as they would for data larger than memory."""
    if ctx.local_rank == 0:
        for path in paths:
            evict(path)
    ctx.comm.Barrier()
