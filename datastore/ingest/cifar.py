"""CIFAR-10/100 "python version" batch files, read without executing arbitrary pickles.

The files are pickles of dicts (`data`: uint8[N, 3072] in R, G, B planes; `labels` for CIFAR-10,
`fine_labels`/`coarse_labels` for CIFAR-100). A pickle can name any callable, so they are read with
`SafeUnpickler`, whose `find_class` admits only the few numpy functions an array pickle needs and
refuses everything else with a SampleError naming the file, before anything is called. Samples are
stored raw as uint8 (32, 32, 3), HWC.
"""

from __future__ import annotations

import io
import os
import pickle

import numpy as np

from dstore.errors import ConfigError, SampleError
from dstore.ingest.source import ArraySamples, check_label_count

CIFAR10_TRAIN = tuple(f"data_batch_{i}" for i in range(1, 6))
CIFAR10_TEST = ("test_batch",)
CIFAR100_TRAIN = ("train",)
CIFAR100_TEST = ("test",)
SPLITS = ("train", "test", "all")

_reconstruct = np.zeros(1).__reduce_ex__(2)[0]
_frombuffer = np.zeros(1).__reduce_ex__(5)[0]

_ALLOWED = {
    # numpy array pickles: protocol <= 4 (and Python 2 pickles) ...
    ("numpy.core.multiarray", "_reconstruct"): _reconstruct,
    ("numpy._core.multiarray", "_reconstruct"): _reconstruct,
    ("numpy", "ndarray"): np.ndarray,
    ("numpy", "dtype"): np.dtype,
    # ... and protocol 5 (out-of-band buffers)
    ("numpy.core.numeric", "_frombuffer"): _frombuffer,
    ("numpy._core.numeric", "_frombuffer"): _frombuffer,
    # a Python 3 pickle of `bytes` with protocol < 3 spells it _codecs.encode(text, "latin1")
    ("_codecs", "encode"): __import__("_codecs").encode,
}
"""(module, name) -> the object a pickle may refer to. Nothing else is importable."""


class SafeUnpickler(pickle.Unpickler):
    """An Unpickler that resolves only the globals in _ALLOWED (`where` names the file in errors)."""

    def __init__(self, file, where: str):
        super().__init__(file, encoding="latin1")  # Python 2 str -> str, as torchvision reads CIFAR
        self._where = where

    def find_class(self, module, name):
        try:
            return _ALLOWED[(module, name)]
        except KeyError:
            raise SampleError(
                f"{self._where}: refusing to unpickle global {module}.{name}: a CIFAR batch "
                "file holds only dicts, lists and numpy arrays (not executed)"
            ) from None

    def persistent_load(self, pid):
        raise SampleError(f"{self._where}: refusing a pickle persistent id: not a CIFAR batch file")


def safe_load(path: str) -> dict:
    """Loads a CIFAR batch (or meta) pickle with SafeUnpickler; keys are returned as str.

    Raises:
        SampleError: the file is unreadable, not a pickle, names a disallowed global, or is not a dict.
    """
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as exc:
        raise SampleError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    try:
        obj = SafeUnpickler(io.BytesIO(raw), path).load()
    except SampleError:
        raise
    except Exception as exc:  # truncated or garbage pickles raise many types
        raise SampleError(f"{path}: not a readable CIFAR batch pickle: {type(exc).__name__}: {exc}") from exc
    if not isinstance(obj, dict):
        raise SampleError(f"{path}: a CIFAR batch pickle holds a dict, this one holds {type(obj).__name__}")
    return {(k.decode("latin1") if isinstance(k, bytes) else str(k)): v for k, v in obj.items()}


def _list(directory: str) -> set[str]:
    try:
        return set(os.listdir(directory))
    except OSError as exc:
        raise SampleError(f"{directory}: cannot list: {exc.strerror or exc}") from exc


def looks_like_cifar_dir(path: str) -> bool:
    """True if the directory holds CIFAR-10 or CIFAR-100 python batch files.

    Raises:
        SampleError: the directory cannot be listed (naming it and the reason).
    """
    names = _list(path)
    return bool(names & set(CIFAR10_TRAIN + CIFAR10_TEST)) or (
        "meta" in names and bool(names & set(CIFAR100_TRAIN + CIFAR100_TEST))
    )


def looks_like_cifar_file(path: str) -> bool:
    """True if the file starts like a pickle (protocol 2 or later)."""
    try:
        with open(path, "rb") as f:
            return f.read(1) == b"\x80"
    except OSError:
        return False


def batch_files(path: str, split: str) -> tuple[list[str], str | None]:
    """The batch files of `split` under a CIFAR directory (or the one file given) and its meta file."""
    if split not in SPLITS:
        raise ConfigError(f"split={split!r} is not one of {SPLITS}")
    if os.path.isfile(path):
        directory = os.path.dirname(os.path.abspath(path))
        files = [os.path.abspath(path)]
    else:
        directory = os.path.abspath(path)
        names = _list(directory)
        if names & set(CIFAR10_TRAIN + CIFAR10_TEST):
            train, test = CIFAR10_TRAIN, CIFAR10_TEST
        else:
            train, test = CIFAR100_TRAIN, CIFAR100_TEST
        wanted = {"train": train, "test": test, "all": train + test}[split]
        files = [os.path.join(directory, n) for n in wanted if n in names]
        if not files:
            raise SampleError(f"{directory}: no CIFAR {split} batch files (looked for {', '.join(wanted)})")
    for meta in ("batches.meta", "meta"):
        if os.path.isfile(os.path.join(directory, meta)) and os.path.join(directory, meta) not in files:
            return files, os.path.join(directory, meta)
    return files, None


class CifarSource(ArraySamples):
    """CIFAR-10/100 python batches as raw uint8 (32, 32, 3) samples.

    Args:
        path: a directory with the batch files, or one batch file.
        split: `train` (data_batch_1..5 / train), `test` (test_batch / test) or `all`.
        labels: for CIFAR-100, `fine` (100 classes) or `coarse` (20); ignored for CIFAR-10.
    """

    kind = "cifar"

    def __init__(self, path: str, *, split: str = "train", labels: str = "fine"):
        super().__init__()
        if labels not in ("fine", "coarse"):
            raise ConfigError(f"labels={labels!r} is not one of ('fine', 'coarse')")
        if not os.path.exists(path):
            raise SampleError(f"{path}: no such CIFAR file or directory")
        files, meta_path = batch_files(path, split)
        images, label_parts, self._rows = [], [], []
        label_key = None
        for fpath in files:
            batch = safe_load(fpath)
            key = "labels" if "labels" in batch else f"{labels}_labels"
            label_key = label_key or key
            data, lab = batch.get("data"), batch.get(key)
            if not isinstance(data, np.ndarray) or data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3072:
                raise SampleError(
                    f"{fpath}: 'data' must be a uint8 array of shape (N, 3072), got "
                    f"{getattr(data, 'dtype', type(data).__name__)}{getattr(data, 'shape', '')}"
                )
            if lab is None or len(lab) != data.shape[0]:
                raise SampleError(
                    f"{fpath}: {key!r} is missing or does not have one label per row of 'data' ({data.shape[0]})"
                )
            lab = np.asarray(lab)
            if lab.dtype.kind not in "iu" or (lab.size and lab.min() < 0):
                raise SampleError(f"{fpath}: {key!r} must be non-negative integers")
            images.append(data.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1))
            label_parts.append(lab.astype(np.int64))
            base = os.path.basename(fpath)
            self._rows.extend((base, r) for r in range(data.shape[0]))
        self._images = np.ascontiguousarray(np.concatenate(images)) if images else np.zeros((0, 32, 32, 3), np.uint8)
        self._labels = np.concatenate(label_parts) if label_parts else np.zeros(0, np.int64)
        num_classes = int(self._labels.max()) + 1 if self._labels.size else 0
        check_label_count(os.path.abspath(path), num_classes - 1)
        self.class_names = self._class_names(meta_path, label_key, num_classes)
        if num_classes > len(self.class_names):
            raise SampleError(
                f"{path}: label {num_classes - 1} but the meta file names only {len(self.class_names)} classes"
            )
        if len(self._labels) == 0:
            raise SampleError(f"{path}: the CIFAR batch files hold no samples")
        self.description = os.path.abspath(path)
        self.encoding, self.raw_dtype, self.raw_shape = "raw", "uint8", (32, 32, 3)

    @staticmethod
    def _class_names(meta_path, label_key, num_classes) -> tuple[str, ...]:
        default_count = 10 if label_key == "labels" else (20 if label_key == "coarse_labels" else 100)
        if meta_path is not None:
            meta = safe_load(meta_path)
            key = "label_names" if label_key == "labels" else label_key.replace("_labels", "_label_names")
            names = meta.get(key)
            if isinstance(names, list) and names:
                return tuple(n.decode("latin1") if isinstance(n, bytes) else str(n) for n in names)
        return tuple(str(i) for i in range(max(default_count, num_classes)))

    def name(self, i: int) -> str:
        base, row = self._rows[i]
        return f"{base}[{row}]"
