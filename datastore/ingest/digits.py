"""scikit-learn's real handwritten digits (1,797 8x8 images, values 0..16) as raw uint8 (8, 8, 1).

The data ships inside scikit-learn (no download). Values are scaled to 0..255 (round(v * 255 / 16)).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dstore.ingest.source import ArraySamples


def digits_arrays() -> tuple[np.ndarray, np.ndarray]:
    """(images uint8[1797, 8, 8, 1] scaled to 0..255, labels int64[1797])."""
    from sklearn.datasets import load_digits

    d: Any = load_digits()  # a Bunch; sklearn types it as Bunch | tuple (return_X_y=True)
    images = np.rint(d.images * (255.0 / 16.0)).clip(0, 255).astype(np.uint8)[..., None]
    return images, d.target.astype(np.int64)


class DigitsSource(ArraySamples):
    """The `digits` source: class names "0".."9"."""

    kind = "digits"

    def __init__(self):
        super().__init__()
        self._images, self._labels = digits_arrays()
        self.description = "sklearn.datasets.load_digits"
        self.class_names = tuple(str(i) for i in range(10))
        self.encoding, self.raw_dtype, self.raw_shape = "raw", "uint8", (8, 8, 1)

    def name(self, i: int) -> str:
        return f"digits[{i}]"
