"""Real photographs for the decode and resize tests: scikit-image's bundled sample photos (its
`skimage/data` folder, read with Pillow; the package itself is not imported), encoded as JPEGs with
Pillow at each chroma subsampling, progressive or with restart markers."""

from __future__ import annotations

import functools
import importlib.util
import io
import os

import numpy as np
import pytest

COLOUR = (
    "astronaut.png",
    "chelsea.png",
    "coffee.png",
    "rocket.jpg",
    "motorcycle_left.png",
    "ihc.png",
    "hubble_deep_field.jpg",
    "motorcycle_right.png",
    "retina.jpg",
)
"""scikit-image's colour photos (300x451 to 1411x1411 px)."""
JPEG_SETTINGS = {
    "4:4:4": dict(subsampling=0),
    "4:2:2": dict(subsampling=1),
    "4:2:0": dict(subsampling=2),
    "4:2:0 progressive": dict(subsampling=2, progressive=True),
    "4:2:0 restart markers": dict(subsampling=2, restart_marker_blocks=5),
    "4:2:2 progressive, restart markers": dict(subsampling=1, progressive=True, restart_marker_rows=1),
}
"""Pillow's JPEG options of each kind of file the tests cover."""


def data_dir() -> str:
    """scikit-image's folder of sample images; the test is skipped where it is not installed."""
    spec = importlib.util.find_spec("skimage")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("scikit-image (its sample photos) is not installed: pip install -e '.[test]'")
    return os.path.join(list(spec.submodule_search_locations)[0], "data")


@functools.cache
def photo(name: str, size: tuple[int, int] | None = None) -> np.ndarray:
    """Photo `name` of COLOUR as an RGB uint8 array (read-only); with `size` = (H, W), resized to
    cover it (Pillow's Lanczos) and centre-cropped, e.g. (375, 500) for an ImageNet-like photo."""
    from PIL import Image

    with Image.open(os.path.join(data_dir(), name)) as im:
        im = im.convert("RGB")
        if size is not None:
            h, w = size
            s = max(w / im.width, h / im.height)
            im = im.resize((max(w, round(im.width * s)), max(h, round(im.height * s))), Image.Resampling.LANCZOS)
            x, y = (im.width - w) // 2, (im.height - h) // 2
            im = im.crop((x, y, x + w, y + h))
        arr = np.asarray(im)
    arr.flags.writeable = False
    return arr


def jpeg(img: np.ndarray, quality: int = 90, **options) -> bytes:
    """`img` (H, W, 3 or H, W) encoded by Pillow with `options` (JPEG_SETTINGS' values)."""
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(img)).save(buf, "JPEG", quality=quality, **options)
    return buf.getvalue()


def write_folder(root: str, count: int, size: tuple[int, int] = (375, 500)) -> None:
    """`count` JPEGs (Pillow, quality 90, 4:2:0) of COLOUR's photos at `size` and its transpose (every
    third), each a different crop of its photo, as root/photos/<i>.jpg: an ImageNet-like folder for
    `dstore ingest` (docs/benchmarks.md)."""
    from PIL import Image

    rng = np.random.default_rng(0)
    os.makedirs(os.path.join(root, "photos"), exist_ok=True)
    for k in range(count):
        with Image.open(os.path.join(data_dir(), COLOUR[k % len(COLOUR)])) as im:
            im = im.convert("RGB")
            h, w = size if k % 3 else size[::-1]
            s = max(w / im.width, h / im.height) * rng.uniform(1.0, 1.3)
            im = im.resize((max(w, round(im.width * s)), max(h, round(im.height * s))), Image.Resampling.LANCZOS)
            x, y = int(rng.integers(0, im.width - w + 1)), int(rng.integers(0, im.height - h + 1))
            im.crop((x, y, x + w, y + h)).save(os.path.join(root, "photos", f"{k:04d}.jpg"), quality=90)
