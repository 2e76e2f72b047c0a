"""A seeded generator of ImageNet-like JPEGs: varied sizes, about 110 KB each, a learnable label.

Image i depends only on (seed, i) and the options, never on which rank makes it. It has a
background whose hue is set by the class, one shape whose kind (ellipse, square, triangle) is set by
the class and whose place and size are random, and block noise whose amplitude sets the file size:
`mean_bytes` is reached by choosing the amplitude from a measured table of JPEG bytes per pixel
(quality 90, libjpeg-turbo via simplejpeg). About 200 images/s per core here.
"""

from __future__ import annotations

import os

import numpy as np

from dstore.errors import ConfigError, SampleError
from dstore.ingest.source import Source

# Noise amplitude -> mean JPEG bytes per pixel at quality 90 (measured over 40 images each).
_AMPLITUDE = np.array([0, 2, 5, 10, 15, 20, 25, 30, 40, 60, 80, 100, 128], dtype=np.float64)
_BYTES_PER_PIXEL = np.array(
    [0.0553, 0.1458, 0.2428, 0.3672, 0.4873, 0.5964, 0.6918, 0.7761, 0.9212, 1.145, 1.3093, 1.4335, 1.563]
)
TABLE_QUALITY = 90


def noise_amplitude(mean_bytes: float, min_side: int, max_side: int) -> float:
    """The noise amplitude whose images average `mean_bytes` for sides uniform in [min_side, max_side].

    Raises:
        ConfigError: `mean_bytes` is outside what the table covers for those sides.
    """
    mean_pixels = ((min_side + max_side) / 2.0) ** 2
    bpp = mean_bytes / mean_pixels
    lo, hi = _BYTES_PER_PIXEL[0] * mean_pixels, _BYTES_PER_PIXEL[-1] * mean_pixels
    if not _BYTES_PER_PIXEL[0] <= bpp <= _BYTES_PER_PIXEL[-1]:
        raise ConfigError(
            f"mean_bytes={mean_bytes} is out of reach for sides {min_side}..{max_side}: "
            f"allowed {int(lo)}..{int(hi)} (change min_side/max_side for other sizes)"
        )
    return float(np.interp(bpp, _BYTES_PER_PIXEL, _AMPLITUDE))


def class_dir_names(num_classes: int) -> tuple[str, ...]:
    """`class000`, `class001`, ...: zero-padded so that sorted names are in label order."""
    width = max(3, len(str(num_classes - 1)))
    return tuple(f"class{k:0{width}d}" for k in range(num_classes))


MAX_SIDE = 8192
"""The largest side of a synthetic image (one of that size takes about 1.6 GB while it is made)."""


def synthetic_image(
    i: int, *, seed: int = 0, num_classes: int = 10, amplitude: float = 20.0, min_side: int = 333, max_side: int = 500
) -> tuple[np.ndarray, int]:
    """Image i as (uint8[H, W, 3], label); label = i % num_classes."""
    from PIL import Image, ImageDraw

    rng = np.random.default_rng([int(seed), int(i)])
    h, w = (int(v) for v in rng.integers(min_side, max_side + 1, size=2))
    label = int(i) % num_classes
    angle = 2 * np.pi * label / num_classes
    base = np.cos(angle + np.array([0.0, 2.1, 4.2])) * 60 + 128 + rng.integers(-15, 16, size=3)
    bg = tuple(int(v) for v in base)
    im = Image.new("RGB", (w, h), bg)
    draw = ImageDraw.Draw(im)
    fg = tuple(255 - v for v in bg)
    cx, cy = int(rng.integers(w // 4, 3 * w // 4)), int(rng.integers(h // 4, 3 * h // 4))
    s = int(rng.integers(min(h, w) // 6, min(h, w) // 3))
    box = [cx - s, cy - s, cx + s, cy + s]
    shape = label % 3
    if shape == 0:
        draw.ellipse(box, fill=fg)
    elif shape == 1:
        draw.rectangle(box, fill=fg)
    else:
        draw.polygon([(cx, cy - s), (cx - s, cy + s), (cx + s, cy + s)], fill=fg)
    arr = np.asarray(im).astype(np.int16)
    amp = int(round(amplitude))
    if amp > 0:
        # Noise in 2x2 blocks: photo-like grain, and a quarter of the random numbers.
        noise = rng.integers(-amp, amp + 1, size=((h + 1) // 2, (w + 1) // 2, 3), dtype=np.int16)
        arr += noise.repeat(2, axis=0).repeat(2, axis=1)[:h, :w]
    return np.clip(arr, 0, 255).astype(np.uint8), label


class SyntheticSource(Source):
    """`count` generated JPEGs, named `class<k>/<i>.jpg` like the files `generate_image_folder` writes.

    Args:
        count: number of images.
        seed: the generator seed (same seed, same bytes).
        num_classes: labels are i % num_classes.
        mean_bytes: target mean file size.
        min_side, max_side: height and width are uniform in [min_side, max_side].
        quality: JPEG quality (the size table holds for 90).
    """

    kind = "synthetic"

    def __init__(
        self,
        count: int = 1000,
        *,
        seed: int = 0,
        num_classes: int = 10,
        mean_bytes: int = 110_000,
        min_side: int = 333,
        max_side: int = 500,
        quality: int = TABLE_QUALITY,
    ):
        super().__init__()
        for key, value, low in (("count", count, 1), ("num_classes", num_classes, 1), ("min_side", min_side, 8)):
            if int(value) < low:
                raise ConfigError(f"{key}={value} must be at least {low}")
        if max_side < min_side:
            raise ConfigError(f"max_side={max_side} is smaller than min_side={min_side}")
        if max_side > MAX_SIDE:  # an image is made in memory, several copies of H x W x 3 (noise in float)
            raise ConfigError(f"max_side={max_side} (--max-side) is more than {MAX_SIDE} pixels")
        if not 1 <= quality <= 100:
            raise ConfigError(f"quality={quality} must be in 1..100")
        self.count, self.seed, self.num_classes = int(count), int(seed), int(num_classes)
        self.min_side, self.max_side, self.quality = int(min_side), int(max_side), int(quality)
        self.amplitude = noise_amplitude(mean_bytes, self.min_side, self.max_side)
        if quality != TABLE_QUALITY:
            self.notes.append(
                f"quality {quality}: mean size will differ from mean_bytes={mean_bytes} "
                f"(the size table is for quality {TABLE_QUALITY})"
            )
        self.class_names = class_dir_names(self.num_classes)
        self.encoding = "jpeg"
        self.description = (
            f"synthetic(seed={seed}, count={count}, num_classes={num_classes}, "
            f"mean_bytes={mean_bytes}, sides={min_side}..{max_side}, quality={quality})"
        )
        self._width = max(7, len(str(self.count - 1)))

    @property
    def estimated_sample_bytes(self) -> int:
        return int(np.interp(self.amplitude, _AMPLITUDE, _BYTES_PER_PIXEL) * ((self.min_side + self.max_side) / 2) ** 2)

    def __len__(self) -> int:
        return self.count

    def label(self, i: int) -> int:
        return int(i) % self.num_classes

    def name(self, i: int) -> str:
        return f"{self.class_names[self.label(i)]}/{int(i):0{self._width}d}.jpg"

    def load(self, i: int) -> bytes:
        import simplejpeg

        img, _ = synthetic_image(
            i,
            seed=self.seed,
            num_classes=self.num_classes,
            amplitude=self.amplitude,
            min_side=self.min_side,
            max_side=self.max_side,
        )
        return simplejpeg.encode_jpeg(img, quality=self.quality, colorspace="RGB")


def generate_image_folder(
    root,
    count: int,
    *,
    seed: int = 0,
    num_classes: int = 10,
    mean_bytes: int = 110_000,
    min_side: int = 333,
    max_side: int = 500,
    quality: int = TABLE_QUALITY,
    comm=None,
) -> list[str]:
    """Writes `count` synthetic JPEGs as root/class<k>/<i>.jpg (an ImageFolder) and returns their paths.

    The files are byte for byte the samples `SyntheticSource` with the same options produces. With
    an MPI `comm`, rank r writes images r, r + size, ...; every rank returns the full list.

    Args:
        root: the folder (created if missing; existing files of the same name are replaced).
        count, seed, num_classes, mean_bytes, min_side, max_side, quality: as for SyntheticSource.
        comm: an mpi4py communicator, or None to write everything in this process.
    """
    src = SyntheticSource(
        count,
        seed=seed,
        num_classes=num_classes,
        mean_bytes=mean_bytes,
        min_side=min_side,
        max_side=max_side,
        quality=quality,
    )
    root = os.path.abspath(os.fspath(root))
    rank, size = (0, 1) if comm is None else (comm.Get_rank(), comm.Get_size())
    error = None
    try:
        for name in src.class_names:
            os.makedirs(os.path.join(root, name), exist_ok=True)
        for i in range(rank, count, size):
            path = os.path.join(root, src.name(i))
            tmp = path + ".tmp"  # not an image extension: a crash leaves nothing an ingest would take
            with open(tmp, "wb") as f:
                f.write(src.load(i))
            os.replace(tmp, path)
    except OSError as exc:
        error = f"cannot write the synthetic image folder {root}: {exc}"
    errors = [error] if comm is None else comm.allgather(error)  # every rank learns of any failure
    failed = [e for e in errors if e]
    if failed:
        raise SampleError(failed[0])
    return [os.path.join(root, src.name(i)) for i in range(count)]
