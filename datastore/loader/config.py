"""`LoaderConfig`: StoreLoader's keyword arguments, each with its default and its doc, on the
pattern of dstore.store.config.StoreConfig (no `agree`: a loader is a rank's own).

`StoreLoader(store, transform, decode_threads=4, ...)` builds one from its keywords;
`StoreLoader(store, transform, config=LoaderConfig(...))` takes one. `checked()` validates and
normalises it (ConfigError naming the argument and its value), what the loader keeps as
`loader.config`. The table of options in docs/guide.md is `python -m dstore.loader.config`'s
(a test compares). torch is imported only by `checked()`, to resolve `device`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from dstore.errors import ConfigError
from dstore.runtime import values

CHOICES = ("auto", "device", "worker")
"""The values of batch_ops and resize_on."""


def arg(default: Any, *, values: str, doc: str) -> Any:
    """A LoaderConfig field: its default, `values` (the allowed values and the default, as the docs
    show them) and `doc` (what it does)."""
    return dataclasses.field(default=default, metadata={"values": values, "doc": doc})


@dataclasses.dataclass(frozen=True)
class LoaderConfig:
    """StoreLoader's arguments (everything but the store and the transform)."""

    decode_threads: int = arg(
        2,
        values="int in [1, 1024] (2)",
        doc=("decode threads (`num_threads` is its deprecated old name); with `workers`, they only stack batches"),
    )
    channels: int | None = arg(
        None,
        values="None, 1, 3",
        doc=(
            "channels encoded images are converted to; None: 3 (RGB, as torchvision's folder loader), or each "
            "image's own for a transform with a `channels` attribute (it converts them itself); raw samples keep "
            "their stored shape"
        ),
    )
    size: Any = arg(
        None,
        values="int or (H, W) (none)",
        doc=(
            "resize every decoded image to it (a JPEG decodes at the DCT scale still at least this large); "
            "without it all samples of a batch must share a shape"
        ),
    )
    ahead: int = arg(
        2,
        values="int in [1, 1024] (2)",
        doc=(
            "batches decoding ahead of the one returned; 1 decodes straight from the store's views (no copy), "
            ">= 2 copies each fetched batch's bytes once"
        ),
    )
    pin_memory: bool = arg(
        False,
        values="bool",
        doc=("stack each batch into page-locked memory; without a CUDA device it warns and is ignored"),
    )
    device: Any = arg(
        None,
        values='None, "cuda", "cuda:1", ...',
        doc=("where batches are delivered, copied on a side CUDA stream that the caller's stream waits for"),
    )
    workers: int | None = arg(
        None,
        values="int >= 0 (none)",
        doc=(
            "decode in N worker processes (dstore.loader.workers) instead of threads (at most 4 per core this process "
            "may use, and what its available memory holds at 128 MiB each: more is refused before any starts); needs "
            "the batch's shape (`size`, or a transform with size and channels) and a transform None or split (`SplitTransform`)"
        ),
    )
    batch_ops: str = arg(
        "auto",
        values="`auto` (default), `device`, `worker`",
        doc=(
            "with workers, where the transform's batch part runs: on the batch's device, in the workers, or auto: "
            "device on a GPU, else worker"
        ),
    )
    resize_on: str = arg(
        "auto",
        values="`auto` (default), `device`, `worker`",
        doc=(
            "with workers and a transform that can defer its resize: one batch op on the batch's device, or in the "
            "workers; auto: device on a GPU, else worker (the same pixels either way)"
        ),
    )
    fields: Any = arg(
        None,
        values="field names (none)",
        doc=(
            'the container\'s extra fields served with each batch, which is then a dict {"image", "label", '
            "name: [value per sample]}; a DataStore must hold them"
        ),
    )

    def checked(self) -> LoaderConfig:
        """This config validated (ConfigError naming the argument and its value) and normalised: plain
        ints, `size` an (H, W) pair or None, `device` a torch.device or None."""
        self = dataclasses.replace(self, **values.typed(self))  # every bool and number by one rule
        most = values.MAX_BUFFERS
        decode_threads = values.integer("decode_threads", self.decode_threads, 1, most)
        ahead = values.integer("ahead", self.ahead, 1, most)
        if self.channels not in (None, 1, 3):
            raise ConfigError(f"channels={self.channels!r} must be None, 1 or 3")
        device = device_of(self.device)
        size = size_pair(self.size)
        for name in ("batch_ops", "resize_on"):
            if getattr(self, name) not in CHOICES:
                raise ConfigError(f"{name}={getattr(self, name)!r} must be 'auto', 'device' or 'worker'")
        workers = None if self.workers is None else check_workers("workers", self.workers)
        return dataclasses.replace(
            self, decode_threads=decode_threads, ahead=ahead, size=size, device=device, workers=workers
        )


def field_names() -> list[str]:
    """LoaderConfig's field names, in order (StoreLoader's keywords after store and transform)."""
    return [f.name for f in dataclasses.fields(LoaderConfig)]


def check_workers(name: str, workers) -> int:
    """`workers` decode processes (0: none) checked against what this machine allows: at most
    4 per core this process may use, and no more than its available memory holds at WORKER_BYTES
    each; ConfigError naming `name`, the cores and the memory otherwise (before any is started)."""
    from dstore.loader.workers import WORKER_BYTES, available_cores  # here: it is only needed to check
    from dstore.memory.limits import available_memory

    workers = values.integer(name, workers, 0, why=" (0: decode in threads)")
    cores = available_cores()
    memory, where = available_memory()
    most = max(1, min(4 * cores, memory // WORKER_BYTES))
    if workers > most:
        raise ConfigError(
            f"{name}={workers} decode worker processes are more than this machine allows: at most "
            f"{most} (4 per core of the {cores} this process may use, and {WORKER_BYTES >> 20} MiB "
            f"each within {where})"
        )
    return workers


def device_of(device):
    """None (leave batches on the CPU) or a torch.device that exists here."""
    if device is None:
        return None
    import torch  # here: the config is read without torch (dstore.loader holds it to two modules)

    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ConfigError(f"device={device!r} is not a torch device: {exc}") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(f"device={device!r} was asked for but torch sees no CUDA GPU; use device=None or 'cpu'")
        if dev.index is None:
            dev = torch.device("cuda", torch.cuda.current_device())
    return dev


def size_pair(size, name: str = "size"):
    """None, or `size` (an int or (height, width)) as a pair of positive ints; ConfigError naming
    `name` otherwise (a bool is refused: True is an int, and would mean 1 x 1)."""
    if size is None:
        return None
    pair = (size, size) if isinstance(size, (int, np.integer)) else size
    try:
        h, w = pair
    except (TypeError, ValueError):
        raise ConfigError(f"{name}={size!r} must be an int or (height, width)") from None
    for v in (h, w):
        if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)) or v < 1:
            raise ConfigError(f"{name}={size!r} must be a positive int or (height, width) of positive ints")
    return int(h), int(w)


def options_table() -> str:
    """The markdown table of StoreLoader's options that docs/guide.md shows (one row per field)."""
    rows = ["| option | values | what it does |", "| --- | --- | --- |"]
    for f in dataclasses.fields(LoaderConfig):
        rows.append(f"| `{f.name}` | {f.metadata['values']} | {f.metadata['doc']} |")
    return "\n".join(rows) + "\n"


if __name__ == "__main__":  # pragma: no cover - prints the docs table
    print(options_table(), end="")
