"""Decoding a sample's bytes into an HWC uint8 array: simplejpeg for JPEG, Pillow for the rest, raw as is.

Both libraries release the GIL, so callers decode in a thread pool (see dstore.torch).
"""

from __future__ import annotations

import io

import numpy as np

from dstore import resize as _resize
from dstore.errors import SampleError

_JPEG_MAGIC = b"\xff\xd8"
_PNG_MAGIC = b"\x89PNG"

try:  # simplejpeg is a declared dependency; the fallback keeps a broken wheel from stopping everything.
    import simplejpeg as _simplejpeg
except ImportError:  # pragma: no cover
    _simplejpeg = None


def sniff(data) -> str:
    """`jpeg`, `png` or `other`, from the first bytes."""
    head = bytes(memoryview(data)[:4])
    if head.startswith(_JPEG_MAGIC):
        return "jpeg"
    if head.startswith(_PNG_MAGIC):
        return "png"
    return "other"


def decode_image(data, *, channels: int | None = None, min_size: tuple[int, int] | None = None,
                 name: str = "<sample>") -> np.ndarray:
    """Decodes encoded image bytes into a uint8 array of shape (H, W, C).

    Args:
        data: the file's bytes (bytes, memoryview or uint8 array).
        channels: 1 (grey) or 3 (RGB) to convert to; None keeps grey as 1 channel and everything
            else as RGB.
        min_size: (H, W) the caller will resize/crop to; lets JPEG decode at a reduced DCT scale
            (1/2, 1/4 or 1/8, `dct_scale`) that is still at least this large.
        name: used in the error message.

    Raises:
        SampleError: naming `name`, if the bytes are not a decodable image.
    """
    buf = memoryview(data).cast("B") if not isinstance(data, bytes) else data
    kind = sniff(buf)
    try:
        if kind == "jpeg" and _simplejpeg is not None:
            fmt = "GRAY" if channels == 1 else "RGB"
            # simplejpeg reads any buffer, read-only ones too: no copy of the bytes
            min_h, min_w = dct_scale(buf, min_size)
            arr = _simplejpeg.decode_jpeg(buf, colorspace=fmt, min_height=min_h, min_width=min_w)
            if arr.ndim == 2:
                arr = arr[:, :, None]
            return arr
        from PIL import Image

        with Image.open(io.BytesIO(buf)) as im:
            im.load()
            if channels == 1 or (channels is None and im.mode in ("L", "1", "I", "I;16", "LA")):
                im = im.convert("L")
            else:
                im = im.convert("RGB")
            arr = np.asarray(im)
        if arr.ndim == 2:
            arr = arr[:, :, None]
        return arr
    except Exception as exc:  # decoders raise many types; name the sample and keep the cause
        raise SampleError(f"cannot decode {name}: {type(exc).__name__}: {exc}") from exc


DCT_DIVISORS = (8, 4, 2)
"""The reduced JPEG decodes `dct_scale` picks: 1/8, 1/4 and 1/2, the scales libjpeg-turbo has SIMD
code for. Its other M/8 scales cost as much as a full decode or more here (5/8: 1,041 us, 6/8:
1,167, 7/8: 1,367 against 1,054 us full, 4/8: 932, for 400-500 px ImageNet-like images), so an
image that 1/2 would make too small decodes at full scale."""


def dct_scale(data, min_size) -> tuple[int, int]:
    """(min_height, min_width) to give simplejpeg so that it decodes `data` at the smallest of 1/8,
    1/4, 1/2 (DCT_DIVISORS) still at least `min_size` (H, W) on both axes, else at full scale:
    (0, 0), simplejpeg's own default. libjpeg's output side at 1/k is ceil(side / k), and simplejpeg
    picks the smallest M/8 scale that gives at least the minimum, so ceil(side / k) picks 1/k."""
    if min_size is None or _simplejpeg is None:
        return 0, 0
    want_h, want_w = int(min_size[0]), int(min_size[1])
    header = _simplejpeg.decode_jpeg_header(data)
    h, w = int(header[0]), int(header[1])
    for k in DCT_DIVISORS:
        sh, sw = -(-h // k), -(-w // k)
        if sh >= want_h and sw >= want_w:
            return sh, sw
    return 0, 0


def decode_raw(data, dtype: str, shape: tuple[int, ...], *, name: str = "<sample>") -> np.ndarray:
    """A raw sample's bytes viewed as `shape` elements of `dtype` (no copy)."""
    arr = np.frombuffer(data, dtype=np.uint8)
    want = int(np.prod(shape)) * np.dtype(dtype).itemsize
    if arr.size != want:
        raise SampleError(f"raw sample {name} has {arr.size} bytes, expected {want} for {dtype}{tuple(shape)}")
    return arr.view(dtype).reshape(shape)


def decode_sample(data, info, *, channels: int | None = None, min_size=None, name: str = "<sample>") -> np.ndarray:
    """Decodes one sample of a container with ContainerInfo `info` into an (H, W, C) array."""
    if info.encoding == "raw":
        arr = decode_raw(data, info.raw_dtype, info.raw_shape, name=name)
        return arr if arr.ndim == 3 else arr.reshape(arr.shape + (1,) * (3 - arr.ndim))
    return decode_image(data, channels=channels, min_size=min_size, name=name)


def resize(arr: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """An HWC uint8 array resized to `size` = (H, W) (fixed-point bilinear, dstore.resize: the same
    pixels as a batch resize on any device); returned as is if already that size, else a new,
    writable array."""
    return _resize.resize(arr, size)
