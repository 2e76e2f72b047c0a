"""From a container to training tensors: the built-in data set cache, the input spec (size,
channels, normalisation) read off the container, the train/held-out split, and the loaders.

Two batch sources feed the same decode-and-augment pipeline (dstore.loader.store_loader.StoreLoader):
`DataStore` (the distributed in-memory store, the point of this project) and `DirectSource`, a
baseline that reads every sample from the container file when its batch is due, in the same
global order, so the two can be compared with everything else equal.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import errno
import os
import queue
import threading
import time

import numpy as np

from dstore.codec.decode import decode_sample
from dstore.errors import ChecksumError, ConfigError, shown
from dstore.formats import checksum
from dstore.formats.integrity import read_error
from dstore.order import plan, shuffle
from dstore.order.mix import check_weights
from dstore.runtime import rc
from dstore.runtime.collective import on_root, seen_everywhere
from dstore.store.data_store import Batch
from dstore.training.augment import channel_stats, per_channel, to_channels

BUILTIN = {"digits": "digits.h5"}
"""Data sets `dstore train` ingests by itself when no container is given, and their file names."""


def cache_dir() -> str:
    """Where built-in data sets are ingested: $DSTORE_CACHE, else ~/.cache/dstore."""
    return rc.CACHE.get()


def ensure_builtin(comm, name: str = "digits", directory: str | None = None) -> str:
    """The path of built-in data set `name`'s container, ingesting it on first use (collective).

    Rank 0 ingests under an exclusive file lock (so two jobs sharing the cache do not race) while
    the other ranks wait for it; the container appears atomically (written under a temporary name
    and renamed), so a finished file is never half-written. A failure is raised on every rank.
    """
    if name not in BUILTIN:
        raise ConfigError(f"built-in data set {name!r} is not one of {tuple(BUILTIN)}")
    directory = directory or cache_dir()
    path = on_root(comm, _ingest_once, name, os.path.join(directory, BUILTIN[name]))
    seen_everywhere(comm, path, "the data set cache's container (--cache-dir, $DSTORE_CACHE)")
    return path


def _open_cache_lock(path: str) -> int:
    """The descriptor of the cache's lock file `path` (created, never truncated, never through a
    symbolic link: a link planted there must not make us write its target), or a ConfigError
    naming the cache directory (--cache-dir / $DSTORE_CACHE)."""
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        return os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        why = "is a symbolic link (remove it)" if exc.errno == errno.ELOOP else exc.strerror
        raise ConfigError(
            f"the data set cache {os.path.dirname(path)} (--cache-dir, $DSTORE_CACHE) cannot be used: "
            f"{exc.filename or path}: {why}"
        ) from None


def _ingest_once(name: str, path: str) -> str:
    if os.path.exists(path):
        return path
    import fcntl

    with os.fdopen(_open_cache_lock(path + ".lock"), "r+b") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if not os.path.exists(path):  # another job may have made it while we waited
                from mpi4py import MPI

                from dstore.ingest import ingest  # here: a run on a container never loads the 27 ingest modules

                print(f"dstore train: ingesting the built-in {name!r} data set into {path} (once)", flush=True)
                ingest(name, path, comm=MPI.COMM_SELF, fmt="hdf5", seed=0, progress=False)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    return path


@dataclasses.dataclass(frozen=True)
class InputSpec:
    """What the model is fed and what the data holds.

    Attributes:
        image_size: (H, W) of the data's images (of its first sample, for encoded images).
        channels: channels the model takes (1 or 3).
        num_classes: from the container's class names.
        mean, std: per-channel normalisation in [0, 1] units.
    """

    image_size: tuple[int, int]
    channels: int
    num_classes: int
    mean: tuple[float, ...]
    std: tuple[float, ...]


def split_ranges(num_samples: int, holdout: float) -> tuple[tuple[int, int], tuple[int, int] | None]:
    """(train range, held-out range or None): the held-out set is the container's tail.

    The container's order is already a seeded random mix (ingest shuffles; `--stratify`: every class
    spread evenly), so the tail is a random subset, and the split is the same for every run on the
    same container. A container in another order is checked first (dstore.training.holdout).
    """
    if not 0.0 <= holdout < 1.0:
        raise ConfigError(f"holdout={holdout} must be in [0, 1)")
    k = int(round(num_samples * holdout))
    if holdout > 0 and k == 0:
        k = 1
    if num_samples - k < 1:
        raise ConfigError(f"holdout={holdout} leaves no training samples out of {num_samples}")
    if k == 0:
        return (0, num_samples), None
    return (0, num_samples - k), (num_samples - k, num_samples)


def _first_images(reader, start: int, count: int, channels: int | None) -> list[np.ndarray]:
    """The first `count` images from `start`, decoded once their bytes match their checksums: a
    damaged sample is the ChecksumError the store and `dstore verify` give, not "cannot decode"."""
    stop = min(reader.num_samples, start + count)
    data = [reader.sample(i)[0] for i in range(start, stop)]
    bad = [i for i, x in zip(range(start, stop), data) if checksum(x) != int(reader.checksums[i])]
    if bad:
        raise read_error(reader, 0, ChecksumError("checksums differ", bad), 0, 0)
    return [
        decode_sample(x, reader.info, channels=channels, name=reader.name(i)) for i, x in zip(range(start, stop), data)
    ]


def _read_spec(parts, channels, mean, std) -> InputSpec:
    """The InputSpec from `parts` = [(reader, start, count), ...]: the size from the first part's
    first image; the channels (unless given) and stats (unless given) over every part's images.

    The channels the model takes are decided here, once per run: `channels` (--channels) where
    given, else 1 when every probed image is grey (one channel as decoded, dstore.codec.decode), else 3.
    The loaders then convert every sample to them (ImageTransform: grey repeated, colour to
    luminance), so a set probed grey whose later samples are colour trains grey: --channels 3."""
    reader = parts[0][0]
    raw = all(r.info.encoding == "raw" for r, _, _ in parts)
    if mean is not None and std is not None and (channels is not None or raw):  # only the size is needed
        parts = [(reader, parts[0][1], 1)]
    images = [img for r, start, count in parts for img in _first_images(r, start, count, channels)]
    h, w, _ = images[0].shape
    want_c = channels or (1 if all(img.shape[2] == 1 for img in images) else 3)
    if mean is None or std is None:
        m, s = channel_stats([to_channels(img, want_c) for img in images])
        mean = m if mean is None else mean
        std = s if std is None else std
    mean, std = per_channel(mean, want_c, "--mean"), per_channel(std, want_c, "--std")
    return InputSpec((int(h), int(w)), int(want_c), int(reader.info.num_classes), mean, std)


def probe_input(
    comm,
    reader,
    train_range: tuple[int, int],
    *,
    channels: int | None = None,
    mean=None,
    std=None,
    stats_samples: int = 256,
) -> InputSpec:
    """The InputSpec for a container (collective: rank 0 reads and decodes, then broadcasts).

    Image size and channels come from `raw_shape` for raw containers, else from decoding the first
    training sample. Unless `mean` and `std` are given, they are measured on the first
    `stats_samples` training samples.
    """
    return _checked(on_root(comm, _read_spec, [(reader, train_range[0], stats_samples)], channels, mean, std))


def probe_mix_input(
    comm, readers, weights, *, channels: int | None = None, mean=None, std=None, stats_samples: int = 256
) -> InputSpec:
    """probe_input for a mix: the image size from the first source (the loader resizes every
    source's samples to it), the stats (unless given) over the first samples of EVERY source, as
    many of each as its share of the mix's weight (at least one): a mix is normalised as it is
    drawn, not as its first source is."""
    total = float(sum(weights))
    parts = [(r, 0, max(1, round(stats_samples * w / total))) for r, w in zip(readers, weights)]
    return _checked(on_root(comm, _read_spec, parts, channels, mean, std))


def _checked(spec: InputSpec) -> InputSpec:
    if spec.num_classes < 2:
        raise ConfigError(f"the container has {spec.num_classes} class name(s); training needs >= 2")
    return spec


class DirectSource:
    """The no-store baseline: a DataStore look-alike that reads each sample from the container when
    its batch is due (per-sample reads), in the store's global order and batch split.

    A background thread reads up to `prefetch` batches ahead, as the store prefetches, so the
    comparison isolates where the bytes come from. Only the `global` shuffle policy is offered.

    Args:
        comm: this trainer's communicator (rank and size only; no communication).
        reader: an open ContainerReader (not owned).
        batch_size: the global batch size.
        seed: the order's seed.
        drop_last: drop the epoch order's last partial batch.
        sample_range: (start, stop) subset of the container, as for DataStore.
        prefetch: batches read ahead.
    """

    def __init__(
        self,
        comm,
        reader,
        *,
        batch_size: int,
        seed: int = 0,
        drop_last: bool = False,
        sample_range: tuple[int, int] | None = None,
        prefetch: int = 2,
    ):
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        self.reader = reader
        self.info = reader.info
        self.batch_size = int(batch_size)
        self.seed = int(seed)
        self.drop_last = bool(drop_last)
        self.start, self.stop = sample_range or (0, reader.num_samples)
        self.prefetch = max(1, int(prefetch))
        self.num_samples = self.stop - self.start
        self.steps_per_epoch = plan.steps_per_epoch(self.num_samples, self.batch_size, self.drop_last)
        self._epoch, self._step = 0, 0
        self.stats = {"read_s": 0.0, "bytes_read": 0, "samples_read": 0}

    def state_dict(self) -> dict:
        """(seed, epoch, step) of the next batch to deliver."""
        return {"seed": self.seed, "epoch": self._epoch, "step": self._step}

    def load_state_dict(self, state: dict) -> None:
        """Continues at the position state_dict() recorded."""
        self._epoch, self._step = int(state["epoch"]), int(state["step"])

    def _read_samples(self, ids: np.ndarray) -> list[np.ndarray]:
        """The bytes of samples `ids`, one read each from the container, each checked against its
        checksum (in the reading thread)."""
        out = [self.reader.sample(int(i))[0] for i in ids]
        bad = [int(i) for i, x in zip(ids.tolist(), out) if checksum(x) != int(self.reader.checksums[i])]
        if bad:
            raise read_error(self.reader, 0, ChecksumError("checksums differ", bad), 0, 0)
        return out

    def _read_batch(self, schedule, s: int, epoch: int):
        sl = schedule.step(s)
        ids = schedule.ids[sl]
        t0 = time.perf_counter()
        samples = self._read_samples(ids)
        self.stats["read_s"] += time.perf_counter() - t0
        self.stats["samples_read"] += len(ids)
        self.stats["bytes_read"] += int(sum(x.size for x in samples))
        return Batch(
            samples=samples,
            labels=self.reader.labels[ids].astype(np.int64),
            ids=ids,
            epoch=epoch,
            step=s,
            pad=schedule.pad[sl],
        )

    def epoch(self, epoch: int):
        """Yields this rank's batches of `epoch` (from the saved step if resuming into it)."""
        first = self._step if epoch == self._epoch else 0
        order = shuffle.global_order(self.num_samples, self.seed, epoch) + self.start
        schedule = plan.global_schedule(order, self.batch_size, self.size, self.rank, self.drop_last)
        q: queue.Queue = queue.Queue(maxsize=self.prefetch)
        stop = threading.Event()

        def produce():
            try:
                for s in range(first, schedule.steps):
                    if stop.is_set():
                        return
                    q.put(self._read_batch(schedule, s, epoch))
                q.put(None)
            except BaseException as exc:  # noqa: BLE001 - handed to the consumer, who re-raises
                q.put(exc)

        worker = threading.Thread(target=produce, daemon=True, name="direct-read")
        worker.start()
        try:
            while True:
                item = q.get()
                if item is None:
                    break
                if isinstance(item, BaseException):
                    raise item
                self._epoch, self._step = epoch, item.step + 1
                yield item
            self._epoch, self._step = epoch + 1, 0
        finally:
            stop.set()
            while worker.is_alive():  # unblock a producer waiting on a full queue
                try:
                    q.get_nowait()
                except queue.Empty:
                    worker.join(0.01)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


class FilesSource(DirectSource):
    """The baseline most training jobs run: every sample read from its own image file when its batch
    is due, as a DataLoader over an image folder does: an open, a read and a close per sample, with
    `read_threads` files read at once (as DataLoader's workers would; file reads release the GIL).

    The files are the ones the container was ingested from (`root`, default the container's
    `source` attribute, joined with each sample's name); the labels, order and batch split are the
    container's, so the training equals `--loader store`'s sample for sample. Only containers whose
    samples are the files' bytes qualify (ingested as is, not re-encoded or resized): every file's
    bytes are checked against its sample's checksum as it is read, and a file that is missing or
    has other bytes fails naming it, as does a sample name that would lead outside `root`
    (absolute, or with a `..` component).

    Args:
        root: the folder the sample names are relative to (default: reader.info.source).
        read_threads: files read at once per rank.
        (the rest as DirectSource)
    """

    def __init__(self, comm, reader, *, root: str | None = None, read_threads: int = 4, **kwargs):
        super().__init__(comm, reader, **kwargs)
        self.root = os.fspath(root or reader.info.source or "")
        if not self.root or not os.path.isdir(self.root):
            raise ConfigError(
                f"--loader files reads the image files {reader.path} was ingested from, but its "
                f"source folder {self.root!r} is not a directory here; pass --files-root FOLDER"
            )
        if int(read_threads) < 1:
            raise ConfigError(f"read_threads={read_threads} must be >= 1")
        self.read_threads = int(read_threads)
        self.stats["read_threads"] = self.read_threads
        self._pool = concurrent.futures.ThreadPoolExecutor(self.read_threads, thread_name_prefix="files-read")
        if self.num_samples:  # a container not ingested as is from these files fails here, not mid-epoch
            self._read_file(self.start)

    def _path(self, i: int) -> str:
        name = self.reader.name(int(i))
        if os.path.isabs(name) or ".." in name.replace("\\", "/").split("/"):
            raise ConfigError(
                f"--loader files: sample {int(i)} of {self.reader.path} is named {shown(name)!r}, "
                f"which leads outside the files root {self.root} (absolute or '..'): refused"
            )
        return os.path.join(self.root, name)

    def _read_file(self, i: int) -> np.ndarray:
        path = self._path(i)
        try:
            with open(path, "rb") as fh:
                data = np.frombuffer(fh.read(), np.uint8)
        except OSError as exc:
            raise ConfigError(f"--loader files: cannot read sample {int(i)}'s file {path}: {exc}") from exc
        if checksum(data) != int(self.reader.checksums[i]):  # here, in the reading thread
            raise ChecksumError(
                f"--loader files: {path} does not hold the bytes of sample {int(i)} of "
                f"{self.reader.path} (its CRC32 differs from the container's: changed since the "
                "ingest, or re-encoded/resized at ingest?)",
                [int(i)],
            )
        return data

    def _read_samples(self, ids: np.ndarray) -> list[np.ndarray]:
        """The bytes of samples `ids`, each from its file, `read_threads` files at once."""
        return list(self._pool.map(self._read_file, ids.tolist()))

    def __exit__(self, *exc):
        self._pool.shutdown(wait=True)
        return False


def parse_sources(data) -> list[tuple[str, float]] | None:
    """A mix's (container, weight) pairs from `dstore train`'s positionals (TrainConfig.data), or
    None for one container (a str: used as is, as before mixes) or none (the built-in set).

    Raises:
        ConfigError: naming a positional of a mix that is not CONTAINER:WEIGHT.
    """
    if data is None or isinstance(data, str):
        return None
    out = []
    for item in data:
        path, sep, weight = str(item).rpartition(":")
        try:
            w = float(weight) if sep and path else None
        except ValueError:
            w = None
        if w is None:
            raise ConfigError(
                f"data set {item!r}: several containers make a mix, each written CONTAINER:WEIGHT "
                f"(e.g. a.h5:0.7 b.zarr:0.3)"
            )
        out.append((path, w))
    check_weights([w for _, w in out], len(out), [p for p, _ in out])
    return out


def check_mix_flags(cfg) -> None:
    """Refuses (ConfigError, one line naming the flags) what a mix does not support: LTFB, the
    direct/files loaders, and a held-out set taken from the mix (it must come from --val)."""
    if cfg.trainers > 1:
        raise ConfigError(
            f"--trainers {cfg.trainers}: LTFB trains on one container; a mix (CONTAINER:WEIGHT ...) "
            f"runs with --trainers 1"
        )
    if cfg.loader != "store":
        raise ConfigError(
            f"--loader {cfg.loader} reads one container; a mix (CONTAINER:WEIGHT ...) needs --loader store"
        )
    if not cfg.val:
        raise ConfigError(
            "a mix (CONTAINER:WEIGHT ...) holds nothing out (--holdout splits one container): "
            "give the held-out set as --val CONTAINER"
        )


def check_mix_readers(mix: list[tuple[str, float]], readers, val_path: str | None, val_reader) -> None:
    """Refuses (ConfigError naming both) sources of a mix, or its --val, with different class lists,
    and a --val holding the same samples as a source (held-out figures would be training ones)."""
    from dstore.training.checkpoint import container_identity

    first, classes = mix[0][0], list(readers[0].info.class_names)
    others = [(p, r) for (p, _), r in zip(mix[1:], readers[1:])]
    if val_reader is not None:
        others.append((f"--val {val_path}", val_reader))
        val_sha = container_identity(val_reader)["checksums_sha256"]
        for (path, _), r in zip(mix, readers):
            if container_identity(r)["checksums_sha256"] == val_sha:
                raise ConfigError(
                    f"--val {val_path} holds the same samples as the mix's source {path}: held-out "
                    f"figures would be training figures; give a separate container"
                )

    def show(names):
        return f"{names[:5]}{'...' if len(names) > 5 else ''}"

    for path, r in others:
        if list(r.info.class_names) != classes:
            raise ConfigError(
                f"{path} has classes {show(list(r.info.class_names))} but {first} has {show(classes)}; "
                f"the mix's sources (and --val) must have the same class list"
            )
