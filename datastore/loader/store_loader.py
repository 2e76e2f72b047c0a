"""The PyTorch adapter: a DataStore's batches decoded in a thread pool, `ahead` batches ahead, as tensors.

    loader = StoreLoader(store, transform=None, decode_threads=2, size=(224, 224), ahead=2)
    for epoch in range(start, epochs):
        loader.set_epoch(epoch)
        for images, labels in loader:          # images: uint8 [b, C, H, W]; labels: int64 [b]
            ...
        state = loader.state_dict()            # the position after what it has yielded: resumable

`StoreLoader` is a `torch.utils.data.IterableDataset` whose items are whole batches, so
`DataLoader(loader, batch_size=None)` (num_workers=0) also works. DataLoader's worker processes
are refused: they would fork a process that holds MPI windows after MPI_Init. The loader's own
`workers=N` decodes in N exec'd processes that never touch MPI, fed whole batches through shared
memory (dstore.loader.workers, NOTE [decode workers]): the rank then holds the GIL per batch, not per sample.

All MPI stays on the calling thread: before returning batch k the adapter fetches batches up to
k + ahead from the store and hands their samples to the pool, so their decoding overlaps the
caller's work on k, and a batch that decodes slowly is absorbed by the ones queued behind it.
The decode thread that finishes a batch last also stacks it into one tensor, so the caller's
wait is only picking up finished batches and asking the store for the next ones. Each epoch is a
`dstore.loader.epoch.LoaderEpoch`, with these steps by name (issue, complete, account, close).

A store's sample views are valid only until its next batch is requested. With ``ahead=1`` the
adapter decodes straight from them (no copy) and asks for the next batch only once their decode
finished. With ``ahead >= 2`` each fetched batch's bytes are first copied into one private buffer
of that batch, in a thread beside the caller's work (one pass over its bytes, about 1% of
decoding them; see `stats["copy_seconds"]`); the store moves on once that copy is done.
"""

from __future__ import annotations

import inspect
import pickle
import sys
import warnings
from collections.abc import Callable, Generator
from typing import Any

import numpy as np
import torch
import torch.utils.data

from dstore.errors import ConfigError
from dstore.loader.config import LoaderConfig, size_pair
from dstore.loader.epoch import LoaderEpoch
from dstore.loader.pipeline import LoaderPlan, Pipeline, StoreFields
from dstore.loader.transform import SplitTransform
from dstore.order import policy


class seeded:  # lower case: used like a function, transform=seeded(fn)
    """Marks `fn(array, rng) -> tensor` as a seeded transform: the loader calls it with a numpy
    Generator seeded from (store seed, epoch, sample id), so augmentation is the same whatever
    the thread or rank count, and resumes exactly. A plain one-argument transform (torchvision
    style, `fn(array)`) draws from its own RNG instead and is not reproducible across threads.

    Without this wrapper a callable is still taken as seeded when its second positional parameter
    is required or named `rng` (the loader's original form, e.g. dstore.training.augment.ImageTransform).
    """

    def __init__(self, fn):
        if not callable(fn):
            raise ConfigError(f"seeded({fn!r}): the transform must be callable (array, rng) -> tensor")
        self.fn = fn

    def __call__(self, arr, rng):
        return self.fn(arr, rng)

    def __repr__(self):
        return f"seeded({self.fn!r})"


def _takes_rng(fn) -> bool:
    """True if `fn` is the seeded (array, rng) form: wrapped in `seeded`, or two required positionals."""
    if isinstance(fn, seeded):
        return True
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):  # a builtin or C callable without a signature: the plain form
        return False
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if len(positional) < 2:
        return False
    second = positional[1]
    return second.default is second.empty or second.name == "rng"


def decode_channels(channels, transform) -> int | None:
    """The channels a StoreLoader decodes encoded images to (decided here, once per loader): its
    `channels` where given; else None (each image's own: grey 1, colour 3) for a transform with a
    `channels` attribute, which converts every image itself (ImageTransform, the trainer's); else 3,
    as torchvision's folder loader (`convert("RGB")`): a grey image in a colour set comes out RGB,
    and a grey-only set too unless `channels=1` says so. Raw samples keep their stored shape."""
    if channels is not None:
        return channels
    if transform is not None and getattr(transform, "channels", None) in (1, 3):
        return None
    return 3


_KEYWORD_DEFAULTS = {
    "decode_threads": None,
    "channels": None,
    "size": None,
    "ahead": 2,
    "pin_memory": False,
    "device": None,
    "workers": None,
    "batch_ops": "auto",
    "resize_on": "auto",
    "fields": None,
}
"""StoreLoader's keyword defaults: a keyword that differs was passed (refused beside a LoaderConfig)."""


def _is_default(value, default) -> bool:
    """Whether a keyword's value is its default (compared by value only for ints, bools and strings:
    a size or field list may be an array, whose == is not a truth value)."""
    return value is default or (type(value) is type(default) and isinstance(value, (int, str)) and value == default)


class StoreLoader(torch.utils.data.IterableDataset):
    """Iterates a DataStore's epochs as (images, labels) tensors, as a PyTorch data loader does.

    `iter(loader)` runs the epoch set with `set_epoch` (then the next one), `len(loader)` is the
    steps per epoch, and `state_dict()` / `load_state_dict()` save and restore the position after
    the last batch it yielded (as Mosaic's StreamingDataLoader and torchdata's StatefulDataLoader
    do): the store itself may be up to `ahead` batches further on, which the state leaves out.

    Args:
        store: an entered DataStore (or dstore.training.data.DirectSource).
        transform: None, or a per-sample callable run in the decode threads on the HWC uint8
            ndarray, returning a CHW tensor or an ndarray: either one-argument (torchvision style,
            `fn(array)`) or seeded (`seeded(fn)` with `fn(array, rng)`: a numpy Generator seeded
            from (store seed, epoch, sample id), so augmentation is reproducible whatever the
            thread or rank count; a transform with a true `keyed` attribute, as ImageTransform,
            gets a `dstore.loader.draws.KeyedDraws` of that key instead). The array may be a read-only
            view of the sample's bytes (raw encoding): copy before changing it in place. What the
            loader uses beyond the call, each part optional, is `dstore.loader.transform.SplitTransform`.
        decode_threads: decode threads (`num_threads` is its deprecated old name).
        channels: 1 or 3 to convert encoded images to. None: 3 (RGB, grey images too, as
            torchvision's folder loader), or each image's own (grey 1, colour 3) for a transform
            with a `channels` attribute, which converts them itself (`decode_channels`). A grey-only
            set stays grey with `channels=1`. Raw samples keep their stored shape.
        size: (H, W) or an int: resize every decoded image to it (JPEG decodes at 1/2, 1/4 or 1/8
            where that is still at least this large, dstore.codec.decode.dct_scale). Without it, all
            samples of a batch must share a shape.
        ahead: batches decoding ahead of the one returned (>= 1). 1 decodes straight from the
            store's views (no copy) but lets one slow batch show as waiting; >= 2 copies each
            fetched batch's bytes once (see the module docstring).
        pin_memory: stack each batch into page-locked memory (in the decode thread), so a copy to
            the GPU can be asynchronous. Without a CUDA device it warns and is ignored, as
            DataLoader does.
        device: None, or where batches are delivered (e.g. "cuda", "cuda:1"): copied with
            non_blocking=True on a side CUDA stream that the caller's stream then waits for, so
            the copy overlaps the GPU work still queued from the previous step.
        workers: None or 0: decode in `decode_threads` threads; N: in N worker processes
            (dstore.loader.workers). Needs the batch's shape (`size`, or a transform with `size` and
            `channels`) and `transform` None or split into `sample_part`/`batch_part` (ImageTransform).
            Batches are bit-identical to the threads'.
        batch_ops: with workers, where the transform's batch part runs: "device" (tensor ops on
            the batch's device, the CPU without one), "worker" (in the workers, on each sample),
            or "auto" (device on a GPU, else worker).
        resize_on: with workers and a transform that can defer its resize and crop (ImageTransform:
            `sample_part(defer_resize=True)`, `resize_batch`): "device" runs them as one batch op
            on the batch's device (the CPU without one), the workers then only decode and cut out
            the part to resize, into a batch buffer of `transform.canvas()` (4x the pixels);
            "worker" in the workers; "auto" (the default): device on a GPU, else worker. The
            pixels are the same either way (dstore.codec.resize).
        fields: None, or names of the container's extra fields (docs/format.md, "Fields"): each
            batch is then a dict {"image": images, "label": labels, name: [value per sample]}
            (str for text, the parsed document for JSON, bytes). A DataStore must hold them
            (`DataStore(..., fields=[...])`): its batches carry them from their owners' windows
            (dstore.store.fieldstore), with decode workers too. A source that holds none
            (dstore.training.data.DirectSource, which reads its samples from storage anyway)
            has them read from storage for each batch (dstore.loader.pipeline.StoreFields).
        config: a dstore.loader.config.LoaderConfig instead of the keywords above (not both); the
            validated, normalised arguments are kept as `config` either way.

    A transform whose `resizes` attribute is true (ImageTransform) makes the one resize itself:
    the loader then decodes at a DCT scale at least `size` (or the transform's size) and hands the
    image over as it is, without resizing it first.

    Attributes:
        last_ids: int64[b] container ids of the last batch returned.
        last_pad: bool[b], which of them are padding repeats (see dstore.store.data_store).
        last_wait_seconds: how long the caller waited for the last batch.
        last_decode_seconds: thread-seconds spent decoding the last batch.
        stats: totals for the current epoch (batches, wait_seconds, decode_seconds, and
            copy_seconds / copy_bytes: the copies out of the store's views when ahead >= 2; with
            decode workers, of the samples they do not read in place: NOTE [decode workers] 3).
    """

    def __init__(
        self,
        store,
        transform: SplitTransform | Callable[..., Any] | None = None,
        decode_threads: int | None = None,
        channels=None,
        size=None,
        ahead: int = 2,
        *,
        pin_memory: bool = False,
        device=None,
        num_threads: int | None = None,
        workers: int | None = None,
        batch_ops: str = "auto",
        resize_on: str = "auto",
        fields=None,
        config: LoaderConfig | None = None,
    ):
        if num_threads is not None:
            if decode_threads is not None:
                raise ConfigError("give decode_threads only (num_threads is its deprecated old name), not both")
            warnings.warn(
                "StoreLoader(num_threads=) is deprecated: use decode_threads=", DeprecationWarning, stacklevel=2
            )
            decode_threads = num_threads
        given = {
            "decode_threads": decode_threads,
            "channels": channels,
            "size": size,
            "ahead": ahead,
            "pin_memory": pin_memory,
            "device": device,
            "workers": workers,
            "batch_ops": batch_ops,
            "resize_on": resize_on,
            "fields": fields,
        }
        if config is None:
            config = LoaderConfig(**{k: v for k, v in given.items() if not (k == "decode_threads" and v is None)})
        else:
            passed = [k for k, v in given.items() if not _is_default(v, _KEYWORD_DEFAULTS[k])]
            if passed:
                raise ConfigError(f"StoreLoader takes a LoaderConfig or keywords, not both ({', '.join(passed)})")
        cfg = config.checked()
        self.config = cfg
        if transform is not None and not callable(transform):
            raise ConfigError(
                f"transform={transform!r} must be callable: fn(array) -> tensor, or seeded(fn) with fn(array, rng)"
            )
        self.device = cfg.device
        pin_memory = cfg.pin_memory
        if pin_memory and not torch.cuda.is_available():
            warnings.warn(
                "StoreLoader(pin_memory=True): no CUDA device here, so memory is not pinned", UserWarning, stacklevel=2
            )
            pin_memory = False
        self.pin_memory = bool(pin_memory)
        on_gpu = self.device is not None and self.device.type == "cuda"
        self.store = store
        if hasattr(store, "before_free"):  # a store closed first ends this loader's epoch before freeing
            store.before_free(self._end_epoch)
        self.transform: Any = transform  # its optional parts are looked up by name (dstore.loader.transform)
        self.channels = cfg.channels
        self.size = cfg.size
        self.decode_threads = cfg.decode_threads
        self.ahead = cfg.ahead
        self.batch_ops = cfg.batch_ops
        self.resize_on = cfg.resize_on
        # a transform that resizes itself gets the decoded image: one resize, not two
        resizes = transform is not None and bool(getattr(transform, "resizes", False))
        self.plan = LoaderPlan(
            channels=decode_channels(cfg.channels, transform),
            size=cfg.size,
            hint=size_pair(self.transform.size, "transform.size") if cfg.size is None and resizes else cfg.size,
            seeded=transform is not None and _takes_rng(transform),
            resizes=resizes,
            ahead=cfg.ahead,
            threads=cfg.decode_threads,
            device=cfg.device,
            pin=self.pin_memory,
        )
        self._fields, field_kinds = _field_source(store, cfg.fields)
        self._field_names = tuple(field_kinds)
        procs = self._make_workers(cfg.workers, on_gpu)
        if procs is None and cfg.resize_on == "device":
            raise ConfigError("resize_on='device' needs decode workers (workers=N): decode threads resize each sample")
        self._pipeline = Pipeline(self.plan, store, transform, procs, {} if self._fields is not None else field_kinds)
        self._epoch = 0
        # (epoch, step) after the last batch yielded (recorded by _recorded); None: the store's own position
        self._pos: tuple[int, int] | None = None
        self._active = None  # the open epoch's generator (over a LoaderEpoch)
        # An epoch whose every batch was yielded before the state this loader was loaded from was
        # taken, but whose iteration had not ended: its next `iter` yields nothing (see state_dict).
        self._ended: int | None = None
        self._closed = False
        self.last_ids = np.zeros(0, np.int64)
        self.last_pad = np.zeros(0, bool)
        self.last_fields: dict = {}  # the last batch's values of the served fields (decoded)
        self.last_wait_seconds = 0.0
        self.last_decode_seconds = 0.0
        self.stats = {}

    def _make_workers(self, workers, on_gpu: bool):
        """None (decode threads) or the DecodeWorkers of `workers` processes, not yet started."""
        if workers is None or workers == 0:  # checked by LoaderConfig.checked
            return None
        tf = self.transform
        if tf is not None and not (hasattr(tf, "sample_part") and hasattr(tf, "batch_part")):
            raise ConfigError(
                f"workers={workers} needs transform=None or one split into sample_part and batch_part "
                f"(dstore.training.augment.ImageTransform), not {tf!r}: use workers=0 (decode threads)"
            )
        size = tuple(tf.size) if tf is not None else self.size
        info = self.store.info
        infos = getattr(self.store, "infos", [info])  # a mix (dstore.store.mixed): one per source
        if any(
            (i.encoding, i.raw_dtype, i.raw_shape) != (info.encoding, info.raw_dtype, info.raw_shape) for i in infos
        ):
            raise ConfigError(
                f"workers={workers}: the mix's sources have different encodings "
                f"({', '.join(i.encoding for i in infos)}); decode them in threads (workers=0)"
            )
        channels = tf.channels if tf is not None else self.channels
        if channels is None and info.encoding == "raw":
            channels = 1 if len(info.raw_shape) == 2 else int(info.raw_shape[-1])
        elif channels is None:
            channels = self.plan.channels
        if size is None or channels is None:
            raise ConfigError(
                f"workers={workers} needs the batch's shape: pass size=(H, W) "
                f"(or a transform that has size and channels)"
            )
        defer = self._resize_on_device(on_gpu)
        # A batch with a buffer of its own (not on_device) is not page-locked there: it is freed with
        # the caller's tensor, which cannot unregister it; pin_memory then copies it (Pipeline.from_workers).
        # A deferred resize runs in this process, so the batch part after it does too.
        on_device = self._batch_ops_on_device(on_gpu) or defer
        shape = (channels, *(tf.canvas() if defer and tf is not None else size))  # defer: tf is not None
        try:
            from dstore.loader.workers import DecodeWorkers

            return DecodeWorkers(
                int(workers),
                shape=shape,
                info=info,
                channels=self.plan.channels,
                size=None if self.plan.resizes else self.size,
                hint=self.plan.hint,
                defer=defer,
                transform=tf,
                seed=self.store.seed,
                slots=self.ahead + 1,
                pin=(self.pin_memory or on_gpu) and on_device,
                on_device=on_device,
            )
        except (pickle.PicklingError, TypeError, AttributeError) as exc:
            raise ConfigError(
                f"workers={workers}: the transform {tf!r} cannot be pickled for the worker processes: {exc}"
            ) from None

    def _resize_on_device(self, on_gpu: bool) -> bool:
        """Whether the workers leave the transform's resize and crop to a batch op here (`resize_on`)."""
        tf = self.transform
        can = (
            tf is not None and hasattr(tf, "resize_batch") and hasattr(tf, "canvas") and getattr(tf, "deferrable", True)
        )
        if self.resize_on == "device" and not can:
            raise ConfigError(
                f"resize_on='device' needs a transform that can defer its resize "
                f"(dstore.training.augment.ImageTransform with resize='fast'), not {tf!r}"
            )
        return can and (self.resize_on == "device" or (self.resize_on == "auto" and on_gpu))

    def _batch_ops_on_device(self, on_gpu: bool) -> bool:
        """Whether the transform's batch part runs as tensor ops on the batch's device (`batch_ops`;
        auto: where that device is a GPU) rather than in the workers."""
        return self.batch_ops == "device" or (self.batch_ops == "auto" and on_gpu)

    @property
    def num_threads(self) -> int:
        """Deprecated name of `decode_threads`."""
        return self.decode_threads

    def __len__(self) -> int:
        return self.store.steps_per_epoch

    def set_epoch(self, epoch: int) -> None:
        """The epoch the next `iter(loader)` runs."""
        self._epoch = int(epoch)

    def __iter__(self) -> Generator[Any, None, None]:
        if torch.utils.data.get_worker_info() is not None:
            raise ConfigError(
                "StoreLoader cannot run in DataLoader worker processes (num_workers > 0): a worker "
                "is a fork of a process that holds MPI windows, after MPI_Init. Use "
                "DataLoader(loader, batch_size=None) with num_workers=0, or the loader itself; "
                "decoding already runs in its decode_threads threads"
            )
        _refuse_batching_dataloader(sys._getframe(1))
        epoch = self._epoch
        self._epoch += 1  # a plain `for epoch ...: for batch in loader` walks the epochs
        ended, self._ended = self._ended, None
        if epoch == ended:  # its batches were all yielded before the state was taken: the rest is none
            return _no_batches()
        return self.epoch(epoch)

    def __getstate__(self):
        raise ConfigError(
            "a StoreLoader cannot be pickled (it holds an MPI data store and threads); DataLoader "
            "with num_workers > 0 and a spawn/forkserver context would: use num_workers=0"
        )

    # -------------------------------------------------------------- state
    def state_dict(self) -> dict:
        """The store's state_dict at the position after the last batch this loader yielded (the
        next one it would yield), not where the store's read-ahead has got to. Plain ints and
        strings: it goes into a checkpoint as is (torch.save with weights_only=True).

        Taken right after an epoch's last batch, while that epoch's iteration is still open (the
        `for` has not seen its end), the position is the next epoch's start and "end_pending" is 1:
        as torchdata's StatefulDataLoader resumes a map-style dataset there, the loaded loader's
        next `iter` yields no batch (the end of that epoch) and the one after runs the next epoch,
        rather than a whole extra epoch. Taken after the iteration ended, the next `iter` runs the
        next epoch."""
        state = dict(self.store.state_dict())
        if self._pos is None:
            return state
        epoch, step = self._pos
        if step >= len(self):
            if self._active is not None and inspect.getgeneratorstate(self._active) != inspect.GEN_CLOSED:
                state["end_pending"] = 1
            epoch, step = epoch + 1, 0
        state["epoch"], state["step"] = int(epoch), int(step)
        if "position" in state:  # where the policy has one order (a mix's too): an index in it, whatever the rank count
            pol = policy.policy(state.get("shuffle", policy.GLOBAL.name))
            state["position"] = pol.position(step, int(state["batch_size"]))
        return state

    def load_state_dict(self, state: dict) -> None:
        """Continues at what state_dict() returned: the next `iter(loader)` (or `epoch(e)` of the
        saved epoch) starts at the saved batch. Ends an open epoch first."""
        self._end_epoch()
        self.store.load_state_dict(state)
        self._epoch = int(self.store.state_dict()["epoch"])
        self._pos = None
        self._ended = None
        if state.get("end_pending") and self._epoch > 0:  # the previous epoch's end is still to come
            self._epoch -= 1
            self._ended = self._epoch

    # -------------------------------------------------------------- epochs
    def epoch(self, epoch: int) -> Generator[Any, None, None]:
        """Yields (images, labels) for every step of `epoch` (see the class docstring), or with
        `fields=` a dict per step ("image", "label" and each field). Typed Any: which of the two
        depends on the constructor's argument, not on a type. A generator: its `close()` ends the
        epoch and the decodes running for it.

        An epoch of this loader still open (abandoned mid-way) is ended first.
        """
        if self._closed:
            raise ValueError("the StoreLoader is closed")
        self._end_epoch()
        # a generator: nothing runs before the first next()
        gen = self._recorded(LoaderEpoch(self.store, self.plan, self._pipeline, int(epoch)))
        if self._field_names:
            gen = self._with_fields(gen)
        self._active = gen
        return gen

    def _recorded(self, run: LoaderEpoch):
        """`run`'s batches as (images, labels), each recorded as it is yielded: `last_*`, the epoch's
        `stats` and the position after it (what `state_dict` gives)."""
        batches = iter(run)
        self.stats = run.stats
        try:
            for images, labels, ready in batches:
                self.last_wait_seconds = ready.wait_seconds
                self.last_decode_seconds = ready.decode_seconds
                self.last_ids, self.last_pad, self.last_fields = ready.ids, ready.pad, ready.fields
                self._pos = (ready.epoch, ready.step + 1)
                yield images, labels
        finally:
            batches.close()

    def _with_fields(self, batches):
        """Each batch of `batches` as a dict with its samples' field values (in last_ids' order)."""
        fields = self._fields
        try:
            for images, labels in batches:
                values = fields.batch(self.last_ids) if fields is not None else self.last_fields
                yield {"image": images, "label": labels, **values}
        finally:
            batches.close()  # an abandoned epoch ends its decodes (_end_epoch closes this generator)

    @property
    def workers(self):
        """The decode workers (dstore.loader.workers.DecodeWorkers: their `pids`, `native`), or None
        where the loader decodes in threads. Read-only: the loader owns and closes them."""
        return self._pipeline.workers

    def _end_epoch(self) -> None:
        active, self._active = self._active, None
        if active is not None:
            active.close()

    def close(self) -> None:
        """Ends an open epoch (after its running decodes) and stops the decode threads. Safe to call twice."""
        self._closed = True
        self._end_epoch()
        self._pipeline.close()
        if self._fields is not None:
            self._fields.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


def _no_batches() -> Generator[Any, None, None]:
    """An epoch with no batch left, a generator as `epoch` returns (so `iter(loader)` has `close()`)."""
    yield from ()


def _field_source(store, fields) -> tuple[StoreFields | None, dict]:
    """(a reader of the fields from storage, or None where the store serves them; {name: kind} of
    the fields asked for, {} for none). ConfigError naming a field the container lacks, one named
    like a batch key, or one a DataStore was not asked to hold."""
    if not fields:
        return None, {}
    names = (fields,) if isinstance(fields, str) else tuple(fields)
    held = getattr(store, "fields", None)
    if held is None:  # not a DataStore: read from storage, per batch (DirectSource reads its images so too)
        src = StoreFields(store, names)
        return src, {n: src.kind(n) for n in names}
    reader = store.container
    kinds = dict(reader.info.fields)
    missing = [n for n in names if n not in kinds or n in StoreFields.RESERVED]
    if missing:
        raise ConfigError(
            f"fields={list(names)}: {reader.path} has no field(s) {missing} (its fields: {list(kinds) or 'none'})"
        )
    lacking = [n for n in names if n not in held]
    if lacking:
        raise ConfigError(
            f"fields={list(names)}: the DataStore does not hold field(s) {lacking}; pass them to it, "
            f"DataStore(..., fields={list(names)!r}), and it serves them with their samples"
        )
    return None, {n: kinds[n] for n in names}


def _refuse_batching_dataloader(caller) -> None:
    """ConfigError if `iter(loader)` was called by a DataLoader that batches its items: a
    StoreLoader's items are whole batches, so `DataLoader(loader)` (batch_size=1, the default)
    would add a dimension to every tensor and silently train on (1, B, C, H, W) batches. torch has
    no public hook for this, so the DataLoader's fetcher (the caller of `iter`) is looked at; when
    torch's internals look different the check is skipped, never the iteration."""
    fetcher = caller.f_locals.get("self")
    if type(fetcher).__name__.endswith("IterableDatasetFetcher") and getattr(fetcher, "auto_collation", False):
        raise ConfigError(
            "DataLoader(loader) needs batch_size=None: a StoreLoader yields whole batches already "
            "(the store's batch_size), and a DataLoader batch_size would stack them into an extra "
            "dimension"
        )
