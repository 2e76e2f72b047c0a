"""The data-parallel step and evaluation: a Trainer wrapping a model in DDP over an explicit group.

The Trainer knows nothing of where batches come from; `dstore.training.run` wires it to the store, the
checkpoints and the logs, and LTFB drives several Trainers (one per sub-communicator) the same way.
"""

from __future__ import annotations

import time

from dstore.errors import ConfigError
from dstore.runtime.watchdog import guarded
from dstore.training.metrics import EpochMeter

AMP_DTYPES = {"off": None, "bf16": "bfloat16", "fp16": "float16"}
"""--amp value -> the torch dtype autocast computes in."""


def global_batch_count(num_samples: int, batch_size: int, step: int) -> int:
    """Samples in global step `step` of an epoch over `num_samples` (the last one may be short)."""
    return max(0, min(batch_size, num_samples - step * batch_size))


def autocast(device, amp: str):
    """torch.autocast to `amp`'s type (AMP_DTYPES) on `device`, or a context that does nothing for "off"."""
    import contextlib

    import torch

    if amp == "off":
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=getattr(torch, AMP_DTYPES[amp]))


def channels_last_batch(images):
    """A 4-D batch in channels-last memory format (the same values; other tensors as they are)."""
    import torch

    return images.contiguous(memory_format=torch.channels_last) if images.dim() == 4 else images


class Trainer:
    """One data-parallel model: DDP over `ctx.group`, a loss, an optimizer and its schedule.

    Args:
        ctx: the DistContext (rank, size, device, group).
        model: the torch module (moved to ctx.device here).
        optimizer: built over `model.parameters()`.
        scheduler: stepped once per optimizer step (or None).
        prepare: applied to every batch of images once it is on the device, before the model (e.g.
            ImageTransform.normalize_batch: uint8 in, normalised float32 out); None: as given.
        amp: "off", "bf16" or "fp16": the forward pass (and loss) under torch.autocast to that type;
            fp16 also scales the loss (torch.amp.GradScaler) so small gradients do not flush to zero.
            The weights and the optimizer stay float32.
        channels_last: the model's weights and every input batch in channels-last memory format.
    """

    def __init__(
        self, ctx, model, optimizer, scheduler=None, prepare=None, *, amp: str = "off", channels_last: bool = False
    ):
        import torch
        from torch.nn.parallel import DistributedDataParallel as DDP

        if amp not in AMP_DTYPES:
            raise ConfigError(f"amp={amp!r} is not one of {tuple(AMP_DTYPES)}")
        self.ctx = ctx
        self.amp = amp
        self.channels_last = bool(channels_last)
        self.model = model.to(ctx.device)
        if self.channels_last:
            self.model = self.model.to(memory_format=torch.channels_last)
        # The scaler's state (its scale, the steps since it last grew) is part of a checkpoint.
        self.scaler = torch.amp.GradScaler(ctx.device.type) if amp == "fp16" else None
        ids = [ctx.device.index] if ctx.device.type == "cuda" else None
        self.ddp = DDP(self.model, device_ids=ids, process_group=ctx.group)
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.prepare = prepare

    def train_step(self, images, labels, global_count: int, weights=None) -> tuple[float, int, int]:
        """One optimizer step on this rank's part of a global batch.

        DDP averages gradients over the ranks; the local loss is the sum over local samples times
        size / global_count, so the average is exactly the mean loss over the global batch however
        unevenly it is split (one step on N ranks equals one step on 1 rank with the whole batch).

        Args:
            images: tensor [b, C, H, W]: float, or what `prepare` turns into the model's input.
            labels: int64 tensor [b].
            global_count: samples in the global batch (over all ranks).
            weights: optional float tensor [b] (0 for padding repeats that must not count).

        Returns:
            (summed loss over the counted local samples, correct predictions, counted samples).
        """
        import torch
        import torch.nn.functional as F

        dev = self.ctx.device
        images = self._prepare(images.to(dev, non_blocking=True))
        labels = labels.to(dev, non_blocking=True)
        self.ddp.train()
        with self._autocast():
            logits = self.ddp(images)
            losses = F.cross_entropy(logits.float(), labels, reduction="none")
        if weights is not None:
            weights = weights.to(dev)
            losses = losses * weights
        loss = losses.sum() * (self.ctx.size / max(global_count, 1))
        self.optimizer.zero_grad(set_to_none=True)
        with guarded("a training step's gradient allreduce"):  # NOTE [ Waits on another node ]
            if self.scaler is None:
                loss.backward()
                self.optimizer.step()
            else:
                self.scaler.scale(loss).backward()
                self.scaler.step(self.optimizer)  # skipped where the scaled gradients overflowed
                self.scaler.update()
        if self.scheduler is not None:
            self.scheduler.step()
        with torch.no_grad():
            hit = logits.argmax(1) == labels
            if weights is not None:
                hit = hit & (weights > 0)
            counted = int(labels.numel() if weights is None else int((weights > 0).sum()))
        return float(losses.detach().sum()), int(hit.sum()), counted

    def evaluate(self, loader, epoch: int = 0) -> dict:
        """Loss and accuracy over one pass of `loader` (a StoreLoader; collective over ctx.comm).

        Uses the bare model (no DDP, no gradient traffic), its buffers first made the group's first
        rank's (`sync_buffers`). Padding repeats (`loader.last_pad`) are not counted.
        """
        import torch
        import torch.nn.functional as F

        meter = EpochMeter()
        self.sync_buffers()
        self.model.eval()
        with torch.no_grad():
            for images, labels in loader.epoch(epoch):
                pad = getattr(loader, "last_pad", None)
                keep = torch.from_numpy(~pad) if pad is not None and pad.any() else None
                images, labels = self._prepare(images.to(self.ctx.device)), labels.to(self.ctx.device)
                with self._autocast():
                    logits = self.model(images).float()
                losses = F.cross_entropy(logits, labels, reduction="none")
                hit = logits.argmax(1) == labels
                if keep is not None:
                    keep = keep.to(self.ctx.device)
                    losses, hit = losses[keep], hit[keep]
                meter.update(float(losses.sum()), int(hit.sum()), int(losses.numel()))
        self.model.train()
        return meter.reduce(self.ctx.comm)

    def sync_buffers(self) -> None:
        """Collective over ctx.group: every rank's module buffers (BatchNorm's running statistics)
        become the group's first rank's, as DDP makes them before each training forward pass
        (broadcast_buffers). The last step's forward pass updated each rank's from its own part of
        the batch; evaluated so, every rank would test another model, and a resumed run (every
        rank loads the checkpoint, the first rank's) another again."""
        import torch.distributed as dist

        buffers = [b for b in self.model.buffers() if b.numel()]
        if self.ctx.size < 2 or not buffers:
            return
        for buf in buffers:
            dist.broadcast(buf.data, group=self.ctx.group, group_src=0)

    def _prepare(self, images):
        images = images if self.prepare is None else self.prepare(images)
        return channels_last_batch(images) if self.channels_last else images

    def _autocast(self):
        return autocast(self.ctx.device, self.amp)

    def state_dict(self) -> dict:
        """Model, optimizer, scheduler and (fp16) gradient scaler state (tensors and plain containers)."""
        state = {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": None if self.scheduler is None else self.scheduler.state_dict(),
        }
        if self.scaler is not None:
            state["scaler"] = self.scaler.state_dict()
        return state

    def load_state_dict(self, state: dict) -> None:
        """Restores what state_dict() returned (a checkpoint without a scaler's state starts a fresh scaler)."""
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        if self.scheduler is not None and state.get("scheduler") is not None:
            self.scheduler.load_state_dict(state["scheduler"])
        if self.scaler is not None and state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])


class StepTimer:
    """Splits wall time of a loop into waiting for data and everything else.

    `waited()` is called right after the next batch arrives; `done()` after the step; both return
    the seconds since the previous mark.
    """

    def __init__(self):
        self._mark = time.perf_counter()
        self._start = self._mark

    def waited(self) -> float:
        now = time.perf_counter()
        wait, self._start = now - self._mark, self._mark
        self._mark = now
        return wait

    def done(self) -> float:
        """Seconds from the start of the wait to now (the whole step)."""
        now = time.perf_counter()
        total, self._mark = now - self._start, now
        return total
