"""NumPy arrays as a source: a `.npz` with images and labels, or a `.npy` of images, stored raw.

- `.npz`: images under the first of IMAGE_KEYS present (or `images_key`), labels under the first of
  LABEL_KEYS (or `labels_key`); optional class names under `class_names`/`classes`.
- `.npy`: the images; labels from `labels=PATH` (a .npy of N integers), else from a sidecar file
  `<stem>.labels.npy` or `<stem>_labels.npy` beside it, else all 0 (a note says so).
Images are (N, H, W) (stored as (H, W, 1)) or (N, H, W, C), any numeric dtype (kept as is; the
container's raw_dtype says which). Arrays are loaded with allow_pickle=False; a `.npy` is memory-
mapped, so a rank reads only the samples it processes.
"""

from __future__ import annotations

import os
import zipfile

import numpy as np

from dstore.errors import ConfigError, SampleError
from dstore.ingest.source import ArraySamples, check_label_count

IMAGE_KEYS = ("x", "images", "data", "X", "x_train", "image", "imgs", "arr_0")
LABEL_KEYS = ("y", "labels", "targets", "Y", "y_train", "label", "arr_1")


def _load(path: str, **kwargs):
    if os.path.exists(path) and not os.path.isfile(path):  # a FIFO would block the read for ever
        raise SampleError(f"{path}: not a regular file (a directory, FIFO, socket or device?)")
    try:
        return np.load(path, allow_pickle=False, **kwargs)
    except FileNotFoundError as exc:
        raise SampleError(f"{path}: no such file") from exc
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as exc:
        raise SampleError(f"{path}: not a readable NumPy file (object arrays are refused): {exc}") from exc


def _pick(keys, wanted, options, what, path):
    if wanted is not None:
        if wanted not in keys:
            raise SampleError(f"{path}: no array {wanted!r} ({what}); it holds {sorted(keys)}")
        return wanted
    for k in options:
        if k in keys:
            return k
    return None


class ArraySource(ArraySamples):
    """Images (and labels) from a `.npy` or `.npz` file.

    Args:
        path: the file.
        images_key, labels_key: array names inside a `.npz` (default: the first of IMAGE_KEYS /
            LABEL_KEYS present).
        labels: for a `.npy`, a `.npy` file of labels (default: a sidecar, else zeros).
    """

    kind = "arrays"

    def __init__(
        self, path: str, *, images_key: str | None = None, labels_key: str | None = None, labels: str | None = None
    ):
        super().__init__()
        self.path = os.path.abspath(path)
        self.description = self.path
        class_names = None
        if self.path.lower().endswith(".npz"):
            with _load(self.path) as z:
                keys = set(z.files)
                ik = _pick(keys, images_key, IMAGE_KEYS, "images", self.path)
                if ik is None:
                    raise SampleError(
                        f"{self.path}: no images array (looked for {IMAGE_KEYS}; pass images_key); "
                        f"it holds {sorted(keys)}"
                    )
                lk = _pick(keys, labels_key, LABEL_KEYS, "labels", self.path)
                images = z[ik]
                lab = z[lk] if lk is not None else None
                for ck in ("class_names", "classes"):
                    if ck in keys:
                        class_names = tuple(str(c) for c in z[ck].tolist())
            if lab is None:
                self.notes.append(f"{self.path}: no labels array (looked for {LABEL_KEYS}); all labels are 0")
        else:
            if images_key is not None or labels_key is not None:
                raise ConfigError("images_key/labels_key apply to .npz files; for a .npy pass labels=PATH")
            images = _load(self.path, mmap_mode="r")
            lab = None
            stem = self.path[:-4]
            sidecars = [labels] if labels is not None else [stem + ".labels.npy", stem + "_labels.npy"]
            for side in sidecars:
                if labels is not None or os.path.isfile(side):
                    lab = _load(side)
                    self.notes.append(f"labels from {side}")
                    break
            if lab is None:
                self.notes.append(
                    f"{self.path}: no labels file (pass labels=PATH or put {stem}.labels.npy "
                    "beside it); all labels are 0"
                )
        self._images = self._check_images(images)
        n = self._images.shape[0]
        self._labels = self._check_labels(lab, n)
        num_classes = int(self._labels.max()) + 1 if n else 0
        if class_names is None:
            check_label_count(self.path, num_classes - 1)
            class_names = tuple(str(i) for i in range(num_classes))
        elif len(class_names) < num_classes:
            raise SampleError(f"{self.path}: label {num_classes - 1} but only {len(class_names)} class names")
        if n == 0:
            raise SampleError(f"{self.path}: the images array holds no samples")
        self.class_names = class_names
        self.encoding = "raw"
        self.raw_dtype = str(self._images.dtype)
        self.raw_shape = tuple(int(s) for s in self._images.shape[1:])

    def _check_images(self, images) -> np.ndarray:
        if images.dtype.kind not in "uifb":
            raise SampleError(f"{self.path}: images must be a numeric array, got dtype {images.dtype}")
        if images.ndim == 3:
            return images.reshape(images.shape + (1,))
        if images.ndim != 4:
            raise SampleError(f"{self.path}: images must have shape (N, H, W) or (N, H, W, C), got {images.shape}")
        return images

    def _check_labels(self, lab, n) -> np.ndarray:
        if lab is None:
            return np.zeros(n, np.int64)
        lab = np.asarray(lab)
        if lab.ndim != 1 or lab.shape[0] != n:
            raise SampleError(f"{self.path}: labels have shape {lab.shape}, expected ({n},) to match the images")
        if lab.dtype.kind not in "iu" and not (lab.dtype.kind == "f" and np.all(lab == np.round(lab))):
            raise SampleError(f"{self.path}: labels must be integers, got dtype {lab.dtype}")
        lab = lab.astype(np.int64)
        if n and lab.min() < 0:
            raise SampleError(f"{self.path}: labels must be non-negative, found {int(lab.min())}")
        return lab

    def name(self, i: int) -> str:
        return f"{os.path.basename(self.path)}[{i}]"

    def locate(self, i: int) -> str:
        return f"{self.path}[{i}]"

    def load(self, i: int) -> np.ndarray:
        try:
            return np.ascontiguousarray(self._images[i])
        except OSError as exc:  # a memory-mapped file that shrank or went away
            raise SampleError(f"{self.locate(i)}: cannot read: {exc}") from exc
