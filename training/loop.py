"""The data-parallel step and evaluation: a Trainer wrapping a model in DDP over an explicit group.

The Trainer knows nothing of where batches come from; `dstore.training.run` wires it to the store, the
checkpoints and the logs, and LTFB drives several Trainers (one per sub-communicator) the same way.
"""

from __future__ import annotations

import time

from dstore.training.metrics import EpochMeter


def global_batch_count(num_samples: int, batch_size: int, step: int) -> int:
    """Samples in global step `step` of an epoch over `num_samples` (the last one may be short)."""
    return max(0, min(batch_size, num_samples - step * batch_size))


class Trainer:
    """One data-parallel model: DDP over `ctx.group`, a loss, an optimizer and its schedule.

    Args:
        ctx: the DistContext (rank, size, device, group).
        model: the torch module (moved to ctx.device here).
        optimizer: built over `model.parameters()`.
        scheduler: stepped once per optimizer step (or None).
        prepare: applied to every batch of images once it is on the device, before the model (e.g.
            ImageTransform.normalize_batch: uint8 in, normalised float32 out); None: as given.
    """

    def __init__(self, ctx, model, optimizer, scheduler=None, prepare=None):
        from torch.nn.parallel import DistributedDataParallel as DDP

        self.ctx = ctx
        self.model = model.to(ctx.device)
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
        logits = self.ddp(images)
        losses = F.cross_entropy(logits, labels, reduction="none")
        if weights is not None:
            weights = weights.to(dev)
            losses = losses * weights
        loss = losses.sum() * (self.ctx.size / max(global_count, 1))
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()
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

        Uses the bare model (no DDP, no gradient traffic). Padding repeats (`loader.last_pad`) are
        not counted.
        """
        import torch
        import torch.nn.functional as F

        meter = EpochMeter()
        self.model.eval()
        with torch.no_grad():
            for images, labels in loader.epoch(epoch):
                pad = getattr(loader, "last_pad", None)
                keep = torch.from_numpy(~pad) if pad is not None and pad.any() else None
                images, labels = self._prepare(images.to(self.ctx.device)), labels.to(self.ctx.device)
                logits = self.model(images)
                losses = F.cross_entropy(logits, labels, reduction="none")
                hit = logits.argmax(1) == labels
                if keep is not None:
                    keep = keep.to(self.ctx.device)
                    losses, hit = losses[keep], hit[keep]
                meter.update(float(losses.sum()), int(hit.sum()), int(losses.numel()))
        self.model.train()
        return meter.reduce(self.ctx.comm)

    def _prepare(self, images):
        return images if self.prepare is None else self.prepare(images)

    def state_dict(self) -> dict:
        """Model, optimizer and scheduler state (tensors and plain containers)."""
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                "scheduler": None if self.scheduler is None else self.scheduler.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        """Restores what state_dict() returned."""
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        if self.scheduler is not None and state.get("scheduler") is not None:
            self.scheduler.load_state_dict(state["scheduler"])


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
