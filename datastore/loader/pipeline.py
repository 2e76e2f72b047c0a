"""What a StoreLoader's epochs run on, as values: `LoaderPlan` (its settings, frozen) and `Pipeline`
(its decode machinery: the decode threads, the copier thread, the decode workers, the side CUDA stream);
`StoreFields`, the fields it reads from storage where its source holds none.

`StoreLoader` builds both once and hands them to each `dstore.loader.epoch.LoaderEpoch`, which reads
them and writes nothing back: the epoch yields each batch with its place and timings, and the loader
records those itself (as torchdata's iterator owns its epoch and the loader asks it for its state).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import time
from typing import Any

import numpy as np
import torch

from dstore.codec.decode import crop_size, decode_crop, decode_sample, resize
from dstore.codec.kernels import resize_chw
from dstore.errors import ConfigError
from dstore.formats import open_container
from dstore.formats.base import ContainerReader
from dstore.formats.fields import RESERVED
from dstore.loader.draws import draws_for


@dataclasses.dataclass(frozen=True)
class LoaderPlan:
    """A StoreLoader's settings as its epochs use them, decided once when it is made."""

    channels: int | None
    """What encoded images decode to (`store_loader.decode_channels`): 1, 3, or None (each image's own)."""
    size: tuple[int, int] | None
    """The size the loader resizes every image to (None: the transform's or the images' own)."""
    hint: tuple[int, int] | None
    """The smallest size a JPEG may decode at (a DCT scale): `size`, or the transform's where it resizes."""
    seeded: bool
    """The transform takes the sample's draws (`seeded`, or an (array, rng) signature)."""
    resizes: bool
    """The transform makes the one resize itself: the loader hands it the decoded image as it is."""
    ahead: int
    """Batches decoding ahead of the one returned."""
    threads: int
    """Decode threads (with workers, they only stack batches)."""
    device: torch.device | None
    """Where batches are delivered (None: where they were made)."""
    pin: bool
    """Stack each batch into page-locked memory."""


def crop_then_transform(tf, data, info, key, channels, name: str):
    """What a decode thread gives for a `crop_aware` transform (ImageTransform's ImageNet recipe):
    the sample's plan drawn from `key` and the image's size before the decode, the decode of what
    it needs (dstore.codec.decode.decode_crop), then the transform with that plan."""
    rng = draws_for(tf, key)
    arr, where, params = decode_crop(
        data, info, lambda shape: tf.plan(shape, rng), crop_size(tf), channels=channels, name=name, scratch=True
    )
    return tf(arr, plan=(where, params))


class Pipeline:
    """A StoreLoader's decode machinery: the decode threads (`pool`), the copier thread, the decode
    workers (or None), the side CUDA stream, and a sample's decode. `batch_fields`: the fields, by
    kind, an epoch decodes from the store's batches ({} where none are asked for or the loader
    reads them from storage itself)."""

    def __init__(self, plan: LoaderPlan, store, transform, workers, batch_fields: dict):
        self.plan, self.store, self.transform, self.workers = plan, store, transform, workers
        self.batch_fields = dict(batch_fields)
        on_gpu = plan.device is not None and plan.device.type == "cuda"
        self.stream = torch.cuda.Stream(plan.device) if on_gpu else None
        self.pool = concurrent.futures.ThreadPoolExecutor(plan.threads, thread_name_prefix="dstore-decode")
        self.copier = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="dstore-copy")
        # NOTE [decode workers] 2: started by the copier thread, which lives as long as the loader
        self.workers_ready = None if workers is None else self.copier.submit(workers.start)

    # ------------------------------------------------------------ decode threads
    def decode_one(self, data, sid: int, epoch: int, source: int | None = None) -> torch.Tensor:
        """One sample decoded, resized and transformed; `source` is its source in a mix (dstore.store.mixed),
        whose encoding it is decoded by and which joins the augmentation's seed."""
        p, tf, store = self.plan, self.transform, self.store
        info = store.info if source is None else store.infos[source]
        name = f"sample {sid}" if source is None else f"source {source} sample {sid}"
        key = [store.seed, epoch, sid] if source is None else [store.seed, epoch, sid, source]
        if p.seeded and getattr(tf, "crop_aware", False):  # the crop known before the decode
            return _tensor(crop_then_transform(tf, data, info, key, p.channels, name))
        arr = decode_sample(data, info, channels=p.channels, min_size=p.hint, name=name)
        if p.size is not None and not p.resizes:
            if tf is None and arr.dtype == np.uint8:  # the resize and the CHW copy in one pass
                out = np.empty((arr.shape[2], *p.size), np.uint8)
                resize_chw(arr, (0, 0, *arr.shape[:2]), p.size, out)
                return torch.from_numpy(out)
            arr = resize(arr, p.size)
        if tf is None:
            if not arr.flags.writeable:  # a raw sample viewing the batch's bytes: copy out of it
                arr = arr.copy()
            return torch.from_numpy(np.ascontiguousarray(arr)).permute(2, 0, 1)
        return _tensor(tf(arr, draws_for(tf, key)) if p.seeded else tf(arr))

    def decode_chunk(self, job, k: int, samples, ids, sources) -> None:
        """In a decode thread: part `k` of `job` (a dstore.loader.epoch.BatchDecode) decoded."""
        t0 = time.perf_counter()
        try:
            job.parts[k] = [self.decode_one(s, i, job.batch.epoch, src) for s, i, src in zip(samples, ids, sources)]
            err = None
        except BaseException as exc:  # noqa: BLE001 - handed to the caller through job.result
            err = exc
        job.chunk_done(time.perf_counter() - t0, err)

    # ------------------------------------------------------------ workers
    def wait_workers(self) -> None:
        """Waits for the workers' start (raising its error); at once without workers."""
        if self.workers_ready is not None:
            self.workers_ready.result()

    def from_workers(self, ticket) -> tuple[torch.Tensor, float]:
        """A batch the workers decoded, copied once out of its slot (to the device, or on the CPU
        into a tensor of its own), with the transform's batch part and normalisation applied there.
        NOTE [decode workers] 5: the slot is released after the copy (on a GPU, after its event)."""
        workers, device = self.workers, self.plan.device
        if workers is None:  # LoaderEpoch calls this only with workers
            raise ValueError("from_workers needs decode workers (StoreLoader(workers=N))")
        images, params, secs = workers.collect(ticket)
        slot_storage = None if workers.fresh else images.untyped_storage().data_ptr()
        event = None
        if self.stream is not None:
            with torch.cuda.stream(self.stream):
                images = images.to(device, non_blocking=True)
                params = params.to(device, non_blocking=True)
                event = torch.cuda.Event()
                event.record(self.stream)
            current = torch.cuda.current_stream(device)
            current.wait_stream(self.stream)
            images.record_stream(current)
            params.record_stream(current)
        elif device is not None and device.type != "cpu":
            images, params = images.to(device), params.to(device)
        tf = self.transform
        if tf is not None:
            if workers.defer:  # the workers cut out what to resize: the resize and crop run here
                images = tf.resize_batch(images, params)
            if not workers.fresh:  # else the workers applied it
                images = tf.batch_part(images, params)
            if getattr(tf, "normalize", False):
                images = tf.normalize_batch(images)
        if not workers.fresh and images.untyped_storage().data_ptr() == slot_storage:
            images = images.clone()  # the slot is written again: the caller gets a copy
        elif workers.fresh and self.plan.pin and device is None:
            images = images.pin_memory()
        workers.release(ticket, event)
        return images, secs

    # ------------------------------------------------------------ delivery
    def to_device(self, images, labels):
        """The batch on the plan's device (unchanged without one). On CUDA the copies run on a side
        stream, overlapping what the caller's stream still has queued; the caller's stream then
        waits for them, and record_stream keeps the memory from being reused before its use."""
        device = self.plan.device
        if device is None:
            return images, labels
        if self.stream is None:
            return images.to(device), labels.to(device)
        if self.plan.pin:
            labels = labels.pin_memory()
        with torch.cuda.stream(self.stream):
            images = images.to(device, non_blocking=True)
            labels = labels.to(device, non_blocking=True)
        current = torch.cuda.current_stream(device)
        current.wait_stream(self.stream)
        images.record_stream(current)
        labels.record_stream(current)
        return images, labels

    def close(self) -> None:
        """Stops the workers (after a start still running), the copier and the decode threads."""
        if self.workers is not None:
            if self.workers_ready is not None:  # always, with workers (__init__)
                concurrent.futures.wait([self.workers_ready])  # a start still running ends first
            self.workers.close()
        self.copier.shutdown(wait=True)
        self.pool.shutdown(wait=True)


class StoreFields:
    """The extra fields of a source's batches read from storage by this process (a loader's
    `fields=` over a source that holds none: dstore.training.data.DirectSource, which reads its
    samples from storage too): a reader of its own over the source's container, so the source's
    readers are not shared. A DataStore holds the fields it is asked for and serves them with its
    samples instead (dstore.store.fieldstore)."""

    RESERVED = RESERVED
    """Keys of a loader's batch dict that a field may not take (dstore.formats.fields.RESERVED)."""

    def __init__(self, store, names):
        names = (names,) if isinstance(names, str) else tuple(names)
        reader: ContainerReader | None = getattr(store, "container", None) or getattr(store, "reader", None)
        if reader is None or not hasattr(reader, "field_names"):  # a ContainerReader, by what it has
            raise ConfigError(
                f"fields={list(names)}: the store ({type(store).__name__}) is not over one container; "
                "fields are read from a DataStore's or DirectSource's container only"
            )
        missing = [n for n in names if n not in reader.field_names or n in self.RESERVED]
        if missing:
            raise ConfigError(
                f"fields={list(names)}: {reader.path} has no field(s) {missing} "
                f"(its fields: {list(reader.field_names) or 'none'})"
            )
        self.names = names
        self._reader = open_container(reader.path, check_labels=False)

    def kind(self, name: str) -> str:
        """Field `name`'s kind (`text`, `json` or `bytes`)."""
        return dict(self._reader.info.fields)[name]

    def batch(self, ids) -> dict[str, list]:
        """{field: [value of each sample id]}: str (text), parsed JSON or bytes, each checked
        against its checksum (ChecksumError naming the sample and the field)."""
        return {n: [self._reader.field(n, int(i)) for i in ids] for n in self.names}

    def close(self) -> None:
        self._reader.close()


def _tensor(out: Any) -> torch.Tensor:
    """A transform's output as a tensor (an ndarray made contiguous)."""
    return out if isinstance(out, torch.Tensor) else torch.from_numpy(np.ascontiguousarray(out))
