"""The PyTorch adapter: a DataStore's batches decoded in a thread pool, one batch ahead, as tensors.

    loader = StoreLoader(store, transform=None, num_threads=2, size=(224, 224))
    for images, labels in loader.epoch(e):   # images: uint8 [b, C, H, W]; labels: int64 [b]
        ...

All MPI stays on the calling thread: the adapter fetches batch k+1 from the store and hands its
samples to the pool, then returns batch k; decoding k+1 overlaps the caller's work on k. A fetched
batch's sample views are released (the store may reuse them) only after their decode finished.
"""

from __future__ import annotations

import concurrent.futures
import time

import numpy as np
import torch

from datastore.decode import decode_sample
from datastore.errors import ConfigError


def _size_pair(size):
    if size is None:
        return None
    if isinstance(size, (int, np.integer)):
        return int(size), int(size)
    try:
        h, w = (int(x) for x in size)
    except (TypeError, ValueError):
        raise ConfigError(f"size={size!r} must be an int or (height, width)") from None
    if h < 1 or w < 1:
        raise ConfigError(f"size={size!r} must be positive")
    return h, w


def resize(arr: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """An HWC uint8 array resized (bilinear) to `size` = (H, W); returned as is if already that size."""
    if arr.shape[:2] == tuple(size):
        return arr
    from PIL import Image

    c = arr.shape[2]
    im = Image.fromarray(arr[:, :, 0] if c == 1 else arr)
    out = np.asarray(im.resize((size[1], size[0]), Image.BILINEAR))
    return out.reshape(size[0], size[1], c)


class StoreLoader:
    """Iterates a DataStore's epochs as (images, labels) tensors.

    Args:
        store: an entered DataStore.
        transform: None, or a callable (HWC uint8 ndarray, numpy Generator) -> CHW tensor or
            ndarray, run per sample in the pool. The array may be a read-only view of the store's
            memory (raw encoding): copy before changing it in place. The generator is seeded from (store seed, epoch,
            sample id), so augmentation is reproducible whatever the thread or rank count.
        num_threads: decode threads.
        channels: 1 or 3 to convert images to; None keeps grey as 1 and the rest as RGB.
        size: (H, W) or an int: resize every decoded image to it (JPEG decodes at the smallest DCT
            scale still at least this large). Without it, all samples of a batch must share a shape.

    Attributes:
        last_ids: int64[b] container ids of the last batch returned.
        last_pad: bool[b], which of them are padding repeats (see datastore.store).
        last_wait_seconds: how long the caller waited for the last batch.
        last_decode_seconds: thread-seconds spent decoding the last batch.
        stats: totals for the current epoch (batches, wait_seconds, decode_seconds).
    """

    def __init__(self, store, transform=None, num_threads: int = 2, channels=None, size=None):
        if isinstance(num_threads, bool) or not isinstance(num_threads, int) or num_threads < 1:
            raise ConfigError(f"num_threads={num_threads!r} must be an integer >= 1")
        if channels not in (None, 1, 3):
            raise ConfigError(f"channels={channels!r} must be None, 1 or 3")
        if transform is not None and not callable(transform):
            raise ConfigError(f"transform={transform!r} must be callable (ndarray, rng) -> tensor")
        self.store = store
        self.transform = transform
        self.channels = channels
        self.size = _size_pair(size)
        self.num_threads = num_threads
        self._pool = concurrent.futures.ThreadPoolExecutor(num_threads, thread_name_prefix="dstore-decode")
        self._epoch = 0
        self.last_ids = np.zeros(0, np.int64)
        self.last_pad = np.zeros(0, bool)
        self.last_wait_seconds = 0.0
        self.last_decode_seconds = 0.0
        self.stats = {}

    def __len__(self) -> int:
        return self.store.steps_per_epoch

    def set_epoch(self, epoch: int) -> None:
        """The epoch the next `iter(loader)` runs."""
        self._epoch = int(epoch)

    def __iter__(self):
        return self.epoch(self._epoch)

    # -------------------------------------------------------------- decoding
    def _decode_one(self, data, sid: int, epoch: int):
        info = self.store.info
        arr = decode_sample(data, info, channels=self.channels, min_size=self.size, name=f"sample {sid}")
        if self.size is not None:
            arr = resize(np.ascontiguousarray(arr), self.size)
        if self.transform is None:
            if not arr.flags.writeable:  # a raw sample viewing the store's memory: copy out of it
                arr = arr.copy()
            return torch.from_numpy(np.ascontiguousarray(arr)).permute(2, 0, 1)
        rng = np.random.default_rng([self.store.seed, epoch, sid])
        out = self.transform(arr, rng)
        return out if isinstance(out, torch.Tensor) else torch.from_numpy(np.ascontiguousarray(out))

    def _decode_chunk(self, samples, ids, epoch):
        t0 = time.perf_counter()
        out = [self._decode_one(s, i, epoch) for s, i in zip(samples, ids)]
        return out, time.perf_counter() - t0

    def _submit(self, batch):
        """Futures decoding `batch` in up to num_threads chunks."""
        n = len(batch.samples)
        ids = batch.ids.tolist()
        cuts = [(n * k) // self.num_threads for k in range(self.num_threads + 1)]
        futs = [self._pool.submit(self._decode_chunk, batch.samples[a:b], ids[a:b], batch.epoch)
                for a, b in zip(cuts[:-1], cuts[1:]) if b > a]
        return batch, futs

    @staticmethod
    def _collect(pending):
        batch, futs = pending
        tensors, secs = [], 0.0
        for f in futs:
            out, s = f.result()
            tensors.extend(out)
            secs += s
        shapes = {tuple(t.shape) for t in tensors}
        if len(shapes) > 1:
            raise ConfigError(f"samples of step {batch.step} decode to different shapes {sorted(shapes)[:4]}; "
                              "pass size=(H, W) or a transform that makes them equal")
        return torch.stack(tensors), torch.from_numpy(np.array(batch.labels, dtype=np.int64)), batch, secs

    def epoch(self, epoch: int):
        """Yields (images, labels) for every step of `epoch` (see the class docstring)."""
        it = self.store.epoch(epoch)
        self.stats = {"epoch": int(epoch), "batches": 0, "wait_seconds": 0.0, "decode_seconds": 0.0}
        first = next(it, None)
        pending = self._submit(first) if first is not None else None
        try:
            while pending is not None:
                t0 = time.perf_counter()
                images, labels, batch, secs = self._collect(pending)
                ids, pad = batch.ids.copy(), batch.pad.copy()
                nxt = next(it, None)  # the decoded batch's views may now be reused by the store
                pending = self._submit(nxt) if nxt is not None else None
                self.last_wait_seconds = time.perf_counter() - t0
                self.last_decode_seconds = secs
                self.last_ids, self.last_pad = ids, pad
                self.stats["batches"] += 1
                self.stats["wait_seconds"] += self.last_wait_seconds
                self.stats["decode_seconds"] += secs
                yield images, labels
        finally:
            if pending is not None:  # abandoned: let the pool finish with the store's views first
                concurrent.futures.wait(pending[1])
            it.close()

    def close(self) -> None:
        """Stops the decode threads. Safe to call twice."""
        self._pool.shutdown(wait=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False
