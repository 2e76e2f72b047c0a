"""`SplitTransform`: what a StoreLoader asks of a transform beyond a plain callable (no torch here).

A StoreLoader takes any per-sample callable: `fn(array)`, or the seeded `fn(array, rng)`
(`dstore.loader.store_loader.seeded`). Everything else it reads from the transform is optional
and looked up by name, each with its own default, so a plain callable keeps working:

- decode threads: `resizes`, `size` (the transform makes the one resize), `channels` (it converts
  grey and colour itself, dstore.loader.store_loader.decode_channels), `keyed` (it draws from a
  dstore.loader.draws.KeyedDraws), `crop_aware` with `plan` (decode only the crop it plans,
  dstore.codec.decode.decode_crop; `reduced_decode`, default True: at a reduced DCT scale where
  that still covers `size`);
- decode workers (`StoreLoader(workers=N)`, dstore.loader.decode_worker): `sample_part`,
  `batch_part`, `finish`, `size` and `channels` are required; `sample_into` is used where present;
  `resize_batch` with `canvas` where the resize moves to the batch (`resize_on`; not where
  `deferrable` is False); `normalize`
  with `normalize_batch` after the batch part.

`SplitTransform` is the whole of that, as dstore.training.augment.ImageTransform implements it: a
transform that satisfies it gets every path of the loader (a test checks ImageTransform does, and
pyright an assignment). It is `runtime_checkable`, but `isinstance` only sees that the names exist.
"""

from __future__ import annotations

from typing import Any, ClassVar, Protocol, runtime_checkable

import numpy as np


@runtime_checkable
class SplitTransform(Protocol):
    """A per-sample transform split into a part per sample and a part per batch.

    `resizes` and `keyed` are class constants; the other attributes are read-only here (a dataclass
    field or a property satisfies them).
    Images are HWC uint8 ndarrays per sample and CHW uint8 tensors `[b, C, H, W]` per batch;
    `params` are each sample's int32 parameters (at most dstore.loader.workers.NPARAMS of them).
    """

    @property
    def size(self) -> tuple[int, int]:
        """(H, W) of every sample the transform gives."""
        ...

    @property
    def channels(self) -> int:
        """1 or 3: the transform converts each image to these itself."""
        ...

    resizes: ClassVar[bool]
    """True: the transform makes the one resize to `size` (the loader does not resize first)."""

    keyed: ClassVar[bool]
    """True: the seeded transform draws from a dstore.loader.draws.KeyedDraws, not a numpy Generator."""

    @property
    def crop_aware(self) -> bool:
        """True: the loader decodes through `plan`, only the box it returns (dstore.codec.decode.decode_crop)."""
        ...

    @property
    def normalize(self) -> bool:
        """False: samples stay uint8 and `normalize_batch` normalises each batch (after `batch_part`)."""
        ...

    def __call__(self, img: np.ndarray, rng: Any = None, *, plan: Any = None) -> Any:
        """The whole transform of one sample (the decode threads' call): a CHW tensor or ndarray."""
        ...

    def plan(self, shape: tuple[int, int], rng: Any = None) -> tuple[tuple[int, int, int, int], np.ndarray]:
        """(box, params) of an image of `shape` (H, W): the part to keep and the sample's parameters."""
        ...

    def sample_part(
        self, img: np.ndarray, rng: Any = None, *, defer_resize: bool = False, plan: Any = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """(image, params): the per-sample part (run where the sample is decoded, no torch)."""
        ...

    def sample_into(self, img: np.ndarray, rng: Any, out: np.ndarray, *, finish: bool, plan: Any = None) -> np.ndarray:
        """`sample_part` written into `out` (uint8 CHW), with `finish` too where finish=True; the params."""
        ...

    def finish(self, img: np.ndarray, params: np.ndarray) -> np.ndarray:
        """The batch part applied to one sample on the CPU: the CHW array `batch_part` would give for it."""
        ...

    def batch_part(self, images: Any, params: Any) -> Any:
        """The per-batch part (tensor ops, on the batch's device) of a uint8 batch and its params."""
        ...

    def resize_batch(self, images: Any, params: Any) -> Any:
        """The resize and crop of `sample_part(defer_resize=True)`'s images, as one batch op."""
        ...

    def canvas(self) -> tuple[int, int]:
        """(Hc, Wc) that holds every image `sample_part(defer_resize=True)` returns."""
        ...

    def normalize_batch(self, images: Any) -> Any:
        """A uint8 batch normalised (float), where `normalize` is False."""
        ...
