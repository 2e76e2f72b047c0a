"""Per-sample transforms `(hwc_uint8, rng) -> CHW tensor`: channel fix-up, resize, seeded random
crop with padding (the CIFAR recipe) or random resized crop (the ImageNet recipe), flip, colour
jitter and normalisation. They run in the loader's decode threads,
or split: the per-sample part in its decode workers, the batch part on the batch's device.

The trainer normalises whole batches on its device instead (`ImageTransform(normalize=False)` hands
out uint8, `normalize_batch` runs after the copy): a float32 batch is 4x the bytes of a uint8 one to
stack, pin and copy, and per-sample float arithmetic in Python threads scales poorly (measured on a
16-core GPU node: 761 samples/s with per-sample normalisation in 14 decode threads, 1,846 with uint8).

All randomness comes from the `rng` (a numpy Generator) the loader passes in, so the same seed
gives the same augmented images whatever the thread schedule.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from dstore.codec import antialias
from dstore.codec.kernels import resize_chw
from dstore.codec.resize import fit, resize, resize_batch, shift
from dstore.errors import ConfigError

if TYPE_CHECKING:
    from dstore.loader.transform import SplitTransform


def to_channels(img: np.ndarray, channels: int) -> np.ndarray:
    """An (H, W, C) uint8 image converted to `channels` (1 or 3): grey is repeated, colour is
    reduced to luminance (ITU-R 601), an alpha channel is dropped."""
    c = img.shape[2]
    if c == channels:
        return img
    if c in (2, 4):  # grey+alpha, RGBA
        img, c = img[:, :, : c - 1], c - 1
        if c == channels:
            return img
    if c == 1 and channels == 3:
        return np.repeat(img, 3, axis=2)
    if c == 3 and channels == 1:
        grey = img.astype(np.float32) @ np.array([0.299, 0.587, 0.114], np.float32)
        return np.clip(grey + 0.5, 0, 255).astype(np.uint8)[:, :, None]
    raise ConfigError(f"cannot convert an image with {img.shape[2]} channels to {channels}")


def box(shape: tuple[int, int], size: tuple[int, int]) -> tuple[int, int, int, int]:
    """(top, left, height, width) of the centred part of an image of `shape` (H, W) that has the
    aspect ratio of `size` and fills the image's shorter side: what `resize_to` scales to `size`."""
    h, w = int(shape[0]), int(shape[1])
    th, tw = size
    scale = max(th / h, tw / w)
    bh, bw = min(h, max(1, round(th / scale))), min(w, max(1, round(tw / scale)))
    return (h - bh) // 2, (w - bw) // 2, bh, bw


def resize_to(img: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """Resizes the shorter side to fit `size` (keeping the aspect ratio), then centre-crops to it:
    one resize (dstore.codec.resize, fixed-point bilinear) of the centred part `box` picks."""
    if img.shape[:2] == tuple(size):
        return img
    top, left, bh, bw = box(img.shape[:2], size)
    return resize(img[top : top + bh, left : left + bw], size)


RECIPES = ("cifar", "imagenet")
"""`ImageTransform.recipe`: cifar (centred part resized, random crop with padding, flip) or imagenet
(training: random resized crop + flip; evaluation: resize the shorter side to size*256/224, centre crop)."""
RESIZES = ("fast", "torchvision")
"""`ImageTransform.resize`: fast (dstore.codec.resize's fixed-point bilinear, the default) or
torchvision (its antialiased bilinear and box placement, dstore.codec.antialias; ImageNet recipe)."""
RRC_SCALE = (0.08, 1.0)
RRC_RATIO = (3 / 4, 4 / 3)
"""torchvision's RandomResizedCrop defaults: the crop's area fraction and aspect ratio (w / h)."""


def random_resized_box(shape: tuple[int, int], rng, scale=RRC_SCALE, ratio=RRC_RATIO) -> tuple[int, int, int, int]:
    """(top, left, height, width) of a random resized crop of an image of `shape` (H, W): torchvision's
    `RandomResizedCrop.get_params` step by step (0.24), its draws taken from `rng` (a KeyedDraws or a
    numpy Generator) in its order: up to 10 tries of (area fraction uniform in `scale`, log aspect
    ratio uniform in log `ratio`, then top and left uniform among the places the crop fits), else
    the centred crop of the image clamped to `ratio`. One difference: torchvision takes the log of
    the ratio bounds in float32, this in float64."""
    height, width = int(shape[0]), int(shape[1])
    area = height * width
    log_lo, log_hi = math.log(ratio[0]), math.log(ratio[1])
    for _ in range(10):
        target_area = area * rng.uniform(scale[0], scale[1])
        aspect = math.exp(rng.uniform(log_lo, log_hi))
        w = int(round(math.sqrt(target_area * aspect)))
        h = int(round(math.sqrt(target_area / aspect)))
        if 0 < w <= width and 0 < h <= height:
            top = int(rng.integers(0, height - h + 1))
            left = int(rng.integers(0, width - w + 1))
            return top, left, h, w
    in_ratio = width / height  # the fallback: the whole image, clamped to the ratio range, centred
    if in_ratio < min(ratio):
        w, h = width, int(round(width / min(ratio)))
    elif in_ratio > max(ratio):
        h, w = height, int(round(height * max(ratio)))
    else:
        w, h = width, height
    return (height - h) // 2, (width - w) // 2, h, w


def centre_box(
    shape: tuple[int, int], size: tuple[int, int], resize_ratio: float = 256 / 224
) -> tuple[int, int, int, int]:
    """(top, left, height, width), in the image's own pixels, of what torchvision's evaluation
    transform `Resize(round(size * resize_ratio))` + `CenterCrop(size)` keeps of an image of `shape`:
    the shorter side resized to S = int(min(size) * resize_ratio) (torchvision's Resize(int): the
    longer side int(S * long / short)), the centred `size` of that (its offsets rounded as CenterCrop
    rounds them), mapped back to the image by the resize's factor and rounded to whole pixels. One
    resize of this box replaces torchvision's two (a fraction of a pixel apart at the edges)."""
    h, w = int(shape[0]), int(shape[1])
    th, tw = int(size[0]), int(size[1])
    short = int(min(th, tw) * resize_ratio)
    rh, rw = (short, int(short * w / h)) if h <= w else (int(short * h / w), short)
    ct, cl = int(round((rh - th) / 2.0)), int(round((rw - tw) / 2.0))
    fy, fx = h / rh, w / rw
    top, left = int(round(ct * fy)), int(round(cl * fx))
    bh, bw = max(1, min(h - top, int(round(th * fy)))), max(1, min(w - left, int(round(tw * fx))))
    return max(0, top), max(0, left), bh, bw


def random_crop(img: np.ndarray, pad: int, rng) -> np.ndarray:
    """Pads by `pad` zero pixels on each side and crops the original size at a random offset."""
    if pad <= 0:
        return img
    top, left = rng.integers(0, 2 * pad + 1, size=2)
    # the crop of the padded image, built without padding it (np.pad was most of the transform's cost)
    return shift(img, int(top) - pad, int(left) - pad)


@dataclasses.dataclass(frozen=True)
class ImageTransform:
    """The transform the trainer gives the loader.

    Attributes:
        size: (H, W) the model is fed.
        channels: 1 or 3.
        mean, std: per-channel normalisation in [0, 1] units (length `channels`).
        train: apply the random augmentation (crop with padding, flip) if True.
        pad: padding of the random crop (0 turns it off).
        flip: random horizontal flip.
        normalize: True: each sample becomes a normalised float32 tensor; False: an augmented uint8
            tensor, to be normalised per batch by `normalize_batch` (on the model's device).
        jitter: colour jitter strength j: brightness and contrast each scaled by a factor drawn
            in [1 - j, 1 + j] (0: off).
        recipe: "cifar": the centred part of the image's aspect ratio resized to `size`, then (train)
            the crop with padding `pad`; "imagenet": (train) a random resized crop
            (`random_resized_box`, torchvision's algorithm, scale (0.08, 1), ratio (3/4, 4/3)), or
            (evaluation) the shorter side resized to size*256/224 and the centre `size` kept
            (`centre_box`); `pad` must be 0. Either way one resize.
        resize: "fast": dstore.codec.resize's fixed-point bilinear (a box average first where an axis
            shrinks 2x or more; JPEGs decoded at a reduced DCT scale where that still covers the
            box); "torchvision" (ImageNet recipe): torchvision v2's pixels, its antialiased bilinear
            (dstore.codec.antialias, torch's uint8 arithmetic) of full-scale decodes, the training
            crop resized as `resized_crop` does and the evaluation image as `Resize(size*256/224)`
            + `CenterCrop(size)` (the window of the whole image's resize, no box rounded); slower,
            and not a batch op (no `resize_on="device"`). See docs/training.md for both figures.

    Every recipe first picks a box of the image and the sample's parameters (`plan`, from the image's
    size and the draws alone), then resizes the box: so a loader that knows the image's size before
    decoding it (a JPEG's header) can decode only what the box needs (`crop_aware`,
    dstore.codec.decode.decode_crop) and give the plan with the smaller image: the same draws, whichever
    thread or worker decodes it.

    The work is in two parts: `sample_part` (resize, crop: needs the sample; run where it is
    decoded) and `batch_part` (flip, jitter: whole-batch integer tensor ops, run on the batch's
    device by a StoreLoader with workers). `__call__` runs both on one sample. The resize and the
    crop may also move to the batch (`sample_part(defer_resize=True)`, then `resize_batch`): the
    decode workers then only decode and cut out the part to be resized.
    """

    size: tuple[int, int]
    channels: int
    mean: tuple[float, ...]
    std: tuple[float, ...]
    train: bool = False
    pad: int = 0
    flip: bool = False
    normalize: bool = True
    jitter: float = 0.0
    recipe: str = "cifar"
    resize: str = "fast"

    def __post_init__(self):
        if self.channels not in (1, 3):
            raise ConfigError(f"channels={self.channels} must be 1 or 3")
        if len(self.mean) != self.channels or len(self.std) != self.channels:
            raise ConfigError(f"mean={self.mean} and std={self.std} need {self.channels} value(s) each")
        if any(s <= 0 for s in self.std):
            raise ConfigError(f"std={self.std} must be positive")
        if not 0 <= self.jitter < 1:
            raise ConfigError(f"jitter={self.jitter} must be in [0, 1)")
        if self.recipe not in RECIPES:
            raise ConfigError(f"recipe={self.recipe!r} must be one of {RECIPES}")
        if self.recipe == "imagenet" and self.pad:
            raise ConfigError(f"recipe='imagenet' crops by random resized crop: pad={self.pad} must be 0")
        if self.resize not in RESIZES:
            raise ConfigError(f"resize={self.resize!r} must be one of {RESIZES}")
        if self.resize == "torchvision":
            if self.recipe != "imagenet":
                raise ConfigError(
                    f"resize='torchvision' is torchvision's ImageNet transforms: it needs "
                    f"recipe='imagenet', not {self.recipe!r}"
                )
            if max(self.size) > int(min(self.size) * 256 / 224):
                raise ConfigError(
                    f"resize='torchvision' with size={tuple(self.size)}: torchvision's "
                    f"CenterCrop would pad the Resize({int(min(self.size) * 256 / 224)}) of a "
                    f"narrow image; give a size whose sides differ by at most 8/7"
                )

    @property
    def deferrable(self) -> bool:
        """Whether the resize can move to a batch op (`resize_batch`; a StoreLoader's resize_on):
        the fast filter's, not torchvision's."""
        return self.resize == "fast"

    @property
    def reduced_decode(self) -> bool:
        """Whether a JPEG may decode at a reduced DCT scale (1/2-1/8) where that still covers the
        box: the fast filter; torchvision resizes full-scale decodes."""
        return self.resize == "fast"

    @property
    def crop_aware(self) -> bool:
        """Whether a loader should decode through `plan` (dstore.codec.decode.decode_crop): the ImageNet
        recipe, whose box is a small part of the image (the CIFAR recipe's is the whole shorter side:
        the loader's own DCT scale serves it)."""
        return self.recipe == "imagenet"

    def plan(self, shape: tuple[int, int], rng=None) -> tuple[tuple[int, int, int, int], np.ndarray]:
        """(box, params) of a sample whose image is `shape` (H, W): the part (top, left, height,
        width) to resize to `size`, and the int32 PARAMS, drawn from `rng` in a fixed order (the
        random resized crop's draws, then crop with padding, flip, jitter). A function of the shape
        and the draws alone."""
        if self.recipe == "cifar":
            return box(shape, self.size), self.draw(rng)
        if self.train:
            if rng is None:
                raise ConfigError(
                    "a training transform needs an rng (numpy Generator or dstore.loader.draws.KeyedDraws)"
                )
            where = random_resized_box(shape, rng)
        elif self.resize == "torchvision":  # the whole image: its resize's window is placed from its size
            where = (0, 0, int(shape[0]), int(shape[1]))
        else:
            where = centre_box(shape, self.size)
        return where, self.draw(rng)

    def _torchvision(self, img: np.ndarray, where) -> np.ndarray:
        """resize='torchvision': the (H, W, C) uint8 pixels torchvision gives, before the flip:
        training, `resized_crop` of the box `where`; evaluation, `Resize` + `CenterCrop` of the
        image `where` covers (the whole image, `plan`)."""
        top, left, bh, bw = (int(v) for v in where)
        part = img[top : top + bh, left : left + bw]
        if self.train:
            return antialias.resize(part, self.size)
        resized, offset = antialias.centre_window(part.shape[:2], self.size)
        return antialias.resize(part, self.size, resized=resized, offset=offset)

    resizes: ClassVar[bool] = True
    """The transform makes the one resize to `size` (a StoreLoader then only decodes at a DCT scale
    at least that large, and does not resize first)."""

    def sample_part(
        self, img: np.ndarray, rng=None, *, defer_resize: bool = False, plan=None
    ) -> tuple[np.ndarray, np.ndarray]:
        """The part that needs the sample alone (CPU, no torch): the (H, W, C) uint8 image resized
        (`resize_to`) and randomly cropped, and the int32 parameters of the rest, drawn here from
        the same `rng` in a fixed order (crop, flip, jitter) and applied to a whole batch by
        `batch_part`: `PARAMS` (identity: `IDENTITY`; the factors in 1/256 units).

        With defer_resize=True the resize and the crop are left to `resize_batch` (a batch op, on the
        GPU where there is one): the image returned is the centred part `resize_to` would scale,
        box-reduced as it would be (`dstore.codec.resize.fit`), and the parameters also hold its height
        and width and the crop's offsets. The pixels `resize_batch` then gives are these exactly.

        plan: (box, params) as `plan` gives them, the box in `img`'s pixels (a decode that kept
        less than the image, dstore.codec.decode.decode_crop): used instead of drawing from `rng`."""
        img = to_channels(img, self.channels)
        (top, left, bh, bw), params = plan if plan is not None else self.plan(img.shape[:2], rng)
        params = np.array(params, np.int32)  # a copy: the caller's plan stays as it was
        if self.resize == "torchvision":
            if defer_resize:
                raise ConfigError("resize='torchvision' is not a batch op: it cannot be deferred (resize_on='device')")
            return self._torchvision(img, (top, left, bh, bw)), params
        part = img[top : top + bh, left : left + bw]
        if defer_resize:
            img = fit(part, self.size)
            params[3:5] = img.shape[:2]
            return img, params
        return shift(resize(part, self.size), int(params[5]), int(params[6])), params

    keyed: ClassVar[bool] = True
    """The transform draws from a `dstore.loader.draws.KeyedDraws` as well as from a numpy Generator (a
    StoreLoader then passes it the keyed draws: numpy's Generator cost a decode worker a tenth of
    its time per sample, dstore.loader.draws)."""

    def draw(self, rng) -> np.ndarray:
        """The sample's int32 parameters (PARAMS), drawn from `rng` (a numpy Generator or a
        KeyedDraws) in a fixed order: crop, flip, jitter (IDENTITY where not training)."""
        params = IDENTITY.copy()
        if self.train:
            if rng is None:
                raise ConfigError(
                    "a training transform needs an rng (numpy Generator or dstore.loader.draws.KeyedDraws)"
                )
            if self.pad > 0:
                top, left = rng.integers(0, 2 * self.pad + 1, size=2)
                params[5] = int(top) - self.pad
                params[6] = int(left) - self.pad
            if self.flip and rng.random() < 0.5:
                params[0] = 1
            if self.jitter > 0:
                bright, contrast = rng.uniform(1 - self.jitter, 1 + self.jitter, size=2)
                params[1] = int(np.rint(bright * 256))
                params[2] = int(np.rint(contrast * 256))
        return params

    def sample_into(self, img: np.ndarray, rng, out: np.ndarray, *, finish: bool, plan=None) -> np.ndarray:
        """`sample_part(img, rng)` written into `out` (uint8 [C, H, W], e.g. a batch buffer's
        sample), and with finish=True `finish` too: the pixels of those and a CHW copy, made in one
        pass by the compiled kernel where there is one (dstore.codec.kernels.resize_chw: resize, crop and
        flip; the jitter after it, in numpy). Returns the parameters (the batch part's, where
        finish=False). plan: as `sample_part`'s."""
        img = to_channels(img, self.channels)
        where, params = plan if plan is not None else self.plan(img.shape[:2], rng)
        flip = finish and bool(params[0])
        if self.resize == "torchvision":
            pixels = self._torchvision(img, where)
            out[...] = (pixels[:, ::-1] if flip else pixels).transpose(2, 0, 1)
        else:
            resize_chw(img, where, self.size, out, shift=(int(params[5]), int(params[6])), flip=flip)
        if finish and (params[1] != 256 or params[2] != 256):
            out[...] = _jitter_np(out, int(params[1]), int(params[2]))
        return params

    def resize_batch(self, images, params):
        """The images `sample_part(defer_resize=True)` gave, each in the top left corner of a uint8 batch
        [b, C, Hc, Wc] (on any device), resized and cropped as `sample_part` does: [b, C, H, W]
        uint8, the same pixels on every device (dstore.codec.resize.resize_batch)."""
        return resize_batch(images, params[:, 3:5], self.size, params[:, 5:7])

    def canvas(self) -> tuple[int, int]:
        """(Hc, Wc) that holds every image `sample_part(defer_resize=True)` returns: twice `size`
        (`fit` leaves an axis shrunk less than 2x, and a box smaller than `size` as it is)."""
        return 2 * self.size[0], 2 * self.size[1]

    def batch_part(self, images, params):
        """A uint8 batch [b, C, H, W] (on any device) with each sample's `sample_part` parameters
        (int [b, 3]) applied: the flip, then brightness and contrast in integer arithmetic, so the
        pixels are the same on a CPU and a GPU and the same as `__call__` sample by sample."""
        import torch

        if not (self.train and (self.flip or self.jitter > 0)):
            return images
        params = params.to(images.device)
        if self.flip:
            flip = params[:, 0].bool().view(-1, 1, 1, 1)
            images = torch.where(flip, images.flip(-1), images)
        if self.jitter > 0:
            images = _jitter(images, params[:, 1].reshape(-1, 1, 1, 1), params[:, 2].reshape(-1, 1, 1, 1))
        return images

    def finish(self, img: np.ndarray, params: np.ndarray) -> np.ndarray:
        """`batch_part` on one (H, W, C) uint8 image, in numpy with the same integer arithmetic:
        how a decode thread, or a worker whose batch stays on the CPU, applies it (there the flip
        is only a stride of the copy the worker makes anyway, where a batch op is another pass)."""
        if params[0]:
            img = img[:, ::-1]
        if params[1] != 256 or params[2] != 256:
            img = _jitter_np(img, int(params[1]), int(params[2]))
        return img

    def pixels(self, img: np.ndarray, rng=None, *, plan=None) -> np.ndarray:
        """The augmented (H, W, C) uint8 image, before normalisation."""
        return self.finish(*self.sample_part(img, rng, plan=plan))

    def __call__(self, img: np.ndarray, rng=None, *, plan=None):
        """The augmented sample as a CHW tensor: uint8, or normalised float32 (normalize=True),
        the pixels of `pixels` made by `sample_into` (plan: as `sample_part`'s)."""
        import torch

        x = np.empty((self.channels, *self.size), np.uint8)
        self.sample_into(img, rng, x, finish=True, plan=plan)
        if self.normalize:
            x = x.astype(np.float32) * (1.0 / 255.0)
            shape = (self.channels, 1, 1)
            x = (x - np.asarray(self.mean, np.float32).reshape(shape)) / np.asarray(self.std, np.float32).reshape(shape)
        return torch.from_numpy(x)

    def normalize_batch(self, images):
        """A uint8 batch [b, C, H, W] (on any device) as the normalised float32 batch, equal to what
        `normalize=True` gives sample by sample (the same float32 operations in the same order).
        A batch that is already floating point is returned unchanged."""

        if images.is_floating_point():
            return images
        return (images.float() * (1.0 / 255.0) - _per_channel(tuple(self.mean), images.device)) / _per_channel(
            tuple(self.std), images.device
        )


PARAMS = ("flip", "brightness", "contrast", "box_height", "box_width", "crop_dy", "crop_dx")
"""`sample_part`'s int32 parameters, in this order (the box only with defer_resize=True)."""
IDENTITY = np.array([0, 256, 256, 0, 0, 0, 0], np.int32)
"""`sample_part`'s parameters that change nothing: no flip, brightness and contrast 256/256, no shift."""


def _jitter_np(img: np.ndarray, bright: int, contrast: int) -> np.ndarray:
    """`_jitter` of one uint8 image (any layout: the mean is over all its values) in numpy."""
    x = np.clip((img.astype(np.int32) * bright + 128) >> 8, 0, 255)
    mean = (int(x.sum(dtype=np.int64)) + x.size // 2) // x.size
    return np.clip(mean + (((x - mean) * contrast + 128) >> 8), 0, 255).astype(np.uint8)


def _jitter(images, bright, contrast):
    """Brightness then contrast (about the image's mean) scaled by factor/256, rounded half up and
    clipped to [0, 255], in integer arithmetic (the same result on every device)."""
    import torch

    x = torch.clamp(torch.div(images.to(torch.int32) * bright + 128, 256, rounding_mode="floor"), 0, 255)
    n = x[0].numel()
    mean = torch.div(x.sum(dim=(1, 2, 3), keepdim=True, dtype=torch.int64) + n // 2, n, rounding_mode="floor")
    x = mean + torch.div((x - mean) * contrast + 128, 256, rounding_mode="floor")
    return torch.clamp(x, 0, 255).to(torch.uint8)


@functools.lru_cache(maxsize=16)
def _per_channel(values: tuple[float, ...], device):
    """`values` as a float32 [1, C, 1, 1] tensor on `device`, made once per (values, device), not
    once per batch (on a GPU each would be a host-to-device copy)."""
    import torch

    return torch.tensor(values, dtype=torch.float32, device=device).view(1, len(values), 1, 1)


def default_augmentation(size: tuple[int, int]) -> tuple[int, bool]:
    """(pad, flip) used by `--augment auto`: crop with padding size/8 and flip for 32x32 and up,
    nothing for smaller images (a shifted or mirrored 8x8 digit is a different digit)."""
    if min(size) >= 32:
        return max(1, min(size) // 8), True
    return 0, False


def per_channel(values, channels: int, flag: str) -> tuple[float, ...]:
    """`values` (a normalisation mean or std) as one float per channel: a single value stands for
    every channel (broadcast once), else there must be `channels` of them; ConfigError naming `flag`."""
    out = tuple(float(v) for v in values)
    if len(out) == 1:
        return out * channels
    if len(out) != channels:
        raise ConfigError(
            f"{flag} {','.join(f'{v:g}' for v in out)}: {len(out)} values for {channels}-channel "
            f"input; give one (for every channel) or {channels}"
        )
    return out


def channel_stats(images: list[np.ndarray]) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Per-channel mean and std in [0, 1] units over a list of (H, W, C) uint8 images of one C."""
    if not images:
        raise ConfigError("channel_stats needs at least one image")
    c = images[0].shape[2]
    total = np.zeros(c)
    total_sq = np.zeros(c)
    n = 0
    for img in images:
        x = img.reshape(-1, c).astype(np.float64) / 255.0
        total += x.sum(0)
        total_sq += (x * x).sum(0)
        n += x.shape[0]
    mean = total / n
    std = np.sqrt(np.maximum(total_sq / n - mean * mean, 1e-12))
    std = np.maximum(std, 1e-3)  # a constant channel must not divide by zero
    return tuple(float(v) for v in mean), tuple(float(v) for v in std)


if TYPE_CHECKING:  # pyright checks that ImageTransform is all a StoreLoader can use of a transform

    def _splits(tf: ImageTransform) -> SplitTransform:
        return tf
