"""One epoch of a StoreLoader: `LoaderEpoch` (the batches as tensors) and `BatchDecode` (one batch in the pool).

`StoreLoader.epoch(e)` iterates a `LoaderEpoch`; its named steps, as the store's `EpochRun` has, are
`issue` (ask the store for its next batches until `ahead` are decoding and hand each to the decode
pool, after a copy out of the store's views when ahead >= 2), `complete` (wait for the oldest
batch's decode: images, labels, ids, padding) and `account` (the epoch's own `stats`). Between
`complete` and `account` the batch moves to the loader's device. It reads the loader's frozen plan
and its decode machinery (dstore.loader.pipeline) and writes nothing into the loader: each batch is
yielded with its `Ready` record (place, ids, timings), which `StoreLoader` records. `close` runs
however the iteration ends (exhausted, abandoned by the caller, or failed): no thread is left
reading a batch's bytes once the store's epoch ends.

All MPI (the store's `next()`) stays on the calling thread; the pool's threads only decode.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import threading
import time

import numpy as np
import torch

from dstore.errors import ConfigError
from dstore.formats.fields import decode_value
from dstore.loader.pipeline import LoaderPlan, Pipeline


class BatchDecode:
    """One batch being decoded: its chunks run in the pool, and the chunk that finishes last
    stacks the batch into one tensor there, so the caller only picks up `result`."""

    def __init__(self, batch, pin: bool = False):
        self.batch = batch
        self.pin = pin
        self.futures = []  # the chunks' futures (to cancel or wait for when abandoned)
        self.result = concurrent.futures.Future()  # -> (images, thread-seconds of decoding)
        self._lock = threading.Lock()
        self._left = 0
        self._secs = 0.0
        self._error = None
        self.parts: list[list[torch.Tensor] | None] = []  # each chunk's tensors (Pipeline.decode_chunk)

    def expect(self, chunks: int) -> None:
        """The number of chunk_done() calls that finish the batch (one for an empty batch)."""
        self.parts = [None] * chunks
        self._left = max(chunks, 1)

    def chunk_done(self, secs: float, error) -> None:
        """Called by each chunk (in its thread) when it ends; the last one finishes the batch."""
        with self._lock:
            self._secs += secs
            if error is not None and self._error is None:
                self._error = error
            self._left -= 1
            if self._left:
                return
        self._finish()

    def _finish(self) -> None:
        if self._error is not None:
            self.result.set_exception(self._error)
            return
        try:
            tensors = []
            for k, part in enumerate(self.parts):
                if part is None:  # a chunk_done() without its part or an error: a bug
                    raise RuntimeError(f"chunk {k} of step {self.batch.step} ended without its samples")
                tensors.extend(part)
            shapes = {tuple(t.shape) for t in tensors}
            if len(shapes) > 1:
                raise ConfigError(mismatch(self.batch.step, shapes))
            images = torch.stack(tensors)
            self.result.set_result((images.pin_memory() if self.pin else images, self._secs))
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            self.result.set_exception(exc)
        self.parts = []


def mismatch(step: int, shapes) -> str:
    """Why the samples of `step`, of these (C, H, W) shapes, make no batch, and the remedy: `channels`
    where their channels differ (a raw source beside an encoded one, or a transform's output), else `size`."""
    listed = sorted(shapes)[:4]
    if len({s[0] for s in shapes if len(s) == 3}) > 1:
        return (
            f"samples of step {step} decode to different channel counts {listed}; pass channels=1 or 3 "
            f"(StoreLoader(channels=...), dstore train --channels) or a transform that makes them equal"
        )
    return f"samples of step {step} decode to different shapes {listed}; pass size=(H, W) or a transform that makes them equal"


@dataclasses.dataclass
class Ready:
    """A decoded batch taken off the queue (on the CPU): what the caller gets, with what the loader
    records of it (its place, ids, padding, fields and timings)."""

    images: torch.Tensor
    labels: torch.Tensor
    ids: np.ndarray  # copies: the store may reuse its arrays once asked for the next batch
    pad: np.ndarray
    epoch: int
    step: int
    decode_seconds: float
    fields: dict = dataclasses.field(default_factory=dict)  # the served fields' values, decoded
    wait_seconds: float = 0.0  # how long the caller waited for it (set by `account`)


class LoaderEpoch:
    """Epoch `e` of a StoreLoader's `store`, decoded by its `pipeline` as its `plan` says, iterated once:
    yields (images, labels, Ready) per batch.

    Nothing happens before the first `next()` (then the store's epoch starts); a closed or failed
    iteration ends in `close`. `stats`: the epoch's totals (batches, wait_seconds, decode_seconds,
    copy_seconds, copy_bytes), its own."""

    def __init__(self, store, plan: LoaderPlan, pipeline: Pipeline, e: int):
        self.store, self.plan, self.pipeline, self.e = store, plan, pipeline, e
        self.pending = collections.deque()  # BatchDecode jobs, oldest first
        self.copying = None  # the copy out of the store's views of the batch fetched last (ahead >= 2)
        self.batches = None  # the store's epoch (a generator of Batch)
        self.stats = {
            "epoch": e,
            "batches": 0,
            "wait_seconds": 0.0,
            "decode_seconds": 0.0,
            "copy_seconds": 0.0,
            "copy_bytes": 0,
        }

    def __iter__(self):
        t_in = time.perf_counter()  # the caller waits from its first next() on
        self.batches = self.store.epoch(self.e)
        try:
            # The first batch alone first: batches queued behind it would only slow its decode.
            self.issue(1)
            while self.pending:
                ready = self.complete()
                self.issue(self.plan.ahead)
                images, labels = self.pipeline.to_device(ready.images, ready.labels)
                ready = self.account(ready, time.perf_counter() - t_in)
                yield images, labels, ready
                t_in = time.perf_counter()
        finally:
            self.close()

    # ------------------------------------------------------------ per batch
    def issue(self, depth: int) -> None:
        """Asks the store for its next batches until `depth` are queued (or the epoch has no more)
        and starts decoding each: straight from the store's views with ahead=1, else after a copy
        out of them, made in the copier thread beside the caller's work on the batch it was given
        (with decode workers that read every sample in place, the request is sent from this thread:
        a hand-off to the copier cost more than the request, 5 us per sample at 24 a batch)."""
        pipe = self.pipeline
        while len(self.pending) < depth:
            if self.copying is not None:  # the store may reuse that batch's views only once copied
                self.copying.result()
                self.copying = None
            if self.batches is None:  # set by __iter__, the only caller
                raise ValueError(f"epoch {self.e} of the loader has not started: nothing is fetched before next()")
            nxt = next(self.batches, None)  # with ahead=1, the views of the batch before are released here
            if nxt is None:
                return
            job = BatchDecode(nxt, pin=self.plan.pin)
            self.pending.append(job)
            if self.plan.ahead == 1 and pipe.workers is None:
                self.submit(job)
            elif pipe.workers is not None and pipe.workers.nothing_to_copy(nxt):
                self.copy_and_submit(job)  # the workers read every sample in place: no copy to hand off
            else:
                self.copying = pipe.copier.submit(self.copy_and_submit, job)

    def submit(self, job: BatchDecode) -> None:
        """Decodes `job.batch` in up to decode_threads chunks in the loader's pool."""
        pipe, batch, threads = self.pipeline, job.batch, self.plan.threads
        n = len(batch.samples)
        ids = batch.ids.tolist()
        cuts = [(n * k) // threads for k in range(threads + 1)]
        spans = [(a, b) for a, b in zip(cuts[:-1], cuts[1:]) if b > a]
        job.expect(len(spans))
        src = getattr(batch, "sources", None)  # a mix (dstore.store.mixed): each entry decodes by its source's encoding
        src = [None] * n if src is None else src.tolist()
        job.futures = [
            pipe.pool.submit(pipe.decode_chunk, job, k, batch.samples[a:b], ids[a:b], src[a:b])
            for k, (a, b) in enumerate(spans)
        ]
        if not spans:  # no samples: nothing will finish it (stacking nothing raises, as it should)
            job.chunk_done(0.0, None)

    def copy_and_submit(self, job: BatchDecode) -> None:
        """In the copier thread: `job`'s samples moved out of the store's views, then submitted to
        the decode threads, or (with workers) into a ring slot and to the workers, `job.result`
        then being the ticket. A failure here is `job.result`'s, so `complete` raises it."""
        try:
            workers = self.pipeline.workers
            if workers is None:
                job.batch = self.own_copy(job.batch)
                self.submit(job)
                return
            self.pipeline.wait_workers()  # raises the start's error
            t0 = time.perf_counter()
            ticket = workers.submit(job.batch)
            job.batch = dataclasses.replace(job.batch, samples=[])  # the store's views are not needed any more
            self.stats["copy_seconds"] += time.perf_counter() - t0
            self.stats["copy_bytes"] += int(ticket.nbytes)
            job.result.set_result(ticket)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller through job.result
            if not job.result.done():
                job.result.set_exception(exc)

    def own_copy(self, batch):
        """`batch` with its samples moved into one read-only buffer of its own, so that the store's
        views (valid only until its next batch) are no longer needed."""
        t0 = time.perf_counter()
        lens = np.fromiter((s.size for s in batch.samples), np.int64, len(batch.samples))
        ends = np.cumsum(lens)
        buf = np.empty(int(ends[-1]) if lens.size else 0, np.uint8)
        if lens.size:
            np.concatenate(batch.samples, out=buf)
        buf.flags.writeable = False
        starts = (ends - lens).tolist()
        samples = [buf[a:b] for a, b in zip(starts, ends.tolist())]
        self.stats["copy_seconds"] += time.perf_counter() - t0
        self.stats["copy_bytes"] += buf.size
        return dataclasses.replace(batch, samples=samples)

    def complete(self) -> Ready:
        """Waits for the oldest batch's decode (raising its error) and takes it off the queue, its
        labels, ids and padding copied before the store is asked for more."""
        job = self.pending.popleft()
        if self.pipeline.workers is None:
            images, secs = job.result.result()
        else:  # the job is off the queue first: its answers are read even when it fails
            images, secs = self.pipeline.from_workers(job.result.result())
        batch = job.batch
        labels = torch.from_numpy(np.array(batch.labels, dtype=np.int64))
        return Ready(
            images, labels, batch.ids.copy(), batch.pad.copy(), batch.epoch, batch.step, secs, self.fields_of(batch)
        )

    def fields_of(self, batch) -> dict:
        """The loader's served fields of `batch` (the store's bytes, dstore.store.fieldstore) decoded by
        kind; {} where the loader asks for none or reads them from storage itself."""
        kinds = self.pipeline.batch_fields
        if not kinds:
            return {}
        held = batch.fields
        if held is None:  # the store was built with fields: every batch carries them
            raise ValueError(f"step {batch.step}: the store's batch carries no fields")
        return {n: [decode_value(k, raw) for raw in held[n]] for n, k in kinds.items()}

    def account(self, ready: Ready, wait: float) -> Ready:
        """A batch about to be yielded counted in the epoch's stats; `ready` with the caller's wait."""
        st = self.stats
        st["batches"] += 1
        st["wait_seconds"] += wait
        st["decode_seconds"] += ready.decode_seconds
        ready.wait_seconds = wait  # `ready` is this epoch's own, made by `complete`
        return ready

    def drain_workers(self) -> None:
        """Reads the answers of the batches the workers still have (NOTE [decode workers] 4: every
        request is answered and read), their errors dropped: the epoch is ending anyway."""
        workers = self.pipeline.workers
        for job in self.pending:
            try:
                ticket = job.result.result()
                workers.collect(ticket)
                workers.release(ticket)
            except Exception:  # noqa: BLE001 - a failed or dead worker's batch: nothing to read
                continue

    # ------------------------------------------------------------ after the last batch
    def close(self) -> None:
        """However the epoch ended (exhausted, abandoned or failed): finishes the copy, drops the
        decodes not started, waits for the running ones (no thread may be left reading a batch's
        bytes, with ahead=1 the store's views, once the store's epoch ends), then ends that epoch."""
        if self.copying is not None:
            concurrent.futures.wait([self.copying])
        futs = [f for job in self.pending for f in job.futures]
        for f in futs:
            f.cancel()
        concurrent.futures.wait(futs)
        if self.pipeline.workers is not None:
            self.drain_workers()
        self.pending.clear()
        if self.batches is not None:  # always: __iter__ sets it before the try whose finally calls this
            self.batches.close()
