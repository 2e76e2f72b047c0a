"""Decoding a sample's bytes into an HWC uint8 array: simplejpeg for JPEG, Pillow for the rest, raw as is.

Both libraries release the GIL, so callers decode in a thread pool (see dstore.loader.store_loader).
"""

from __future__ import annotations

import contextlib
import io
import warnings

import numpy as np

from dstore.codec import resize as _resize
from dstore.errors import SampleError, shown
from dstore.runtime import rc

_JPEG_MAGIC = b"\xff\xd8"
_PNG_MAGIC = b"\x89PNG"

try:  # simplejpeg is a declared dependency; the fallback keeps a broken wheel from stopping everything.
    import simplejpeg as _simplejpeg
except ImportError:  # pragma: no cover
    _simplejpeg = None

try:  # the partial decode (datastore/codec/_jpegcrop.c), an optional extension: see decode_crop
    from dstore.codec import _jpegcrop
except ImportError:  # not built here (no compiler or libjpeg headers at install): whole decodes
    _jpegcrop = None
if not rc.PARTIAL_DECODE.get():  # DSTORE_PARTIAL_DECODE=0: whole decodes, read once per process
    _jpegcrop = None
EXTENSION_VERSION = 3
"""The build of dstore.codec._jpegcrop this module uses (its VERSION): 3, exact at the edges of
subsampled chroma (2) and each file checked to its end (3). An older build (an install that did not
rebuild it) is not used: whole decodes, said once per process."""


def usable(module):
    """`module` (a build of dstore.codec._jpegcrop, or None) if it is at least EXTENSION_VERSION,
    else None, with a RuntimeWarning naming its file (Python shows it once per process)."""
    if module is None or getattr(module, "VERSION", 1) >= EXTENSION_VERSION:
        return module
    warnings.warn(
        f"dstore.codec._jpegcrop ({getattr(module, '__file__', module)}) is an older build than this "
        f"dstore's (version {getattr(module, 'VERSION', 1)} < {EXTENSION_VERSION}): it does not check a "
        f"file past the crop, so JPEGs are decoded whole; reinstall dstore to rebuild it",
        RuntimeWarning,
        stacklevel=2,
    )
    return None


_jpegcrop = usable(_jpegcrop)


def sniff(data) -> str:
    """`jpeg`, `png` or `other`, from the first bytes."""
    head = bytes(memoryview(data)[:4])
    if head.startswith(_JPEG_MAGIC):
        return "jpeg"
    if head.startswith(_PNG_MAGIC):
        return "png"
    return "other"


GREY_MODES = frozenset({"1", "L", "LA", "La", "I", "I;16", "I;16L", "I;16B", "I;16N"})
"""Pillow modes that `decode_image(channels=None)` keeps as one channel (an alpha channel is dropped)."""
WIDE_MODES = frozenset({"I;16", "I;16L", "I;16B", "I;16N", "I"})
"""Pillow modes of 16-bit (or 32-bit integer) grey samples, which `Image.convert("L")` would clip to
255 above 255: `decode_image` scales them to 8 bits itself (`to_8bit`)."""


def decode_image(
    data, *, channels: int | None = None, min_size: tuple[int, int] | None = None, name: str = "<sample>"
) -> np.ndarray:
    """Decodes encoded image bytes into a uint8 array of shape (H, W, C).

    Every image comes out 8 bits per channel. 16-bit samples are scaled by keeping their high byte
    (`v >> 8`, `to_8bit`): what Pillow itself does for 48-bit RGB and 16-bit grey+alpha PNGs, and
    torchvision's `to_dtype(torch.uint8)` for uint16. Images without a defined 8-bit scale are
    refused (SampleError): 32-bit float (mode F), 32-bit integer outside 0..65535. An alpha channel
    is dropped (as torchvision's `convert("RGB")`), a palette expanded, CMYK converted.

    Args:
        data: the file's bytes (bytes, memoryview or uint8 array).
        channels: 1 (grey) or 3 (RGB) to convert to; None: the image's own, one channel for a
            grey image (a grey JPEG, Pillow modes in GREY_MODES) and 3 (RGB) for any other.
        min_size: (H, W) the caller will resize/crop to; lets JPEG decode at a reduced DCT scale
            (1/2, 1/4 or 1/8, `dct_scale`) that is still at least this large.
        name: used in the error message.

    Raises:
        SampleError: naming `name`, if the bytes are not an image this decodes faithfully; its
            whole message is `shown` (control characters escaped): a decoder may quote the name.
    """
    buf = memoryview(data).cast("B") if not isinstance(data, bytes) else data
    kind = sniff(buf)
    try:
        if kind == "jpeg" and _simplejpeg is not None:
            if channels is None or min_size is not None:  # the header says both: read it once
                h, w, space, _ = _simplejpeg.decode_jpeg_header(buf)
                grey = channels == 1 or (channels is None and space == "Gray")
                min_h, min_w = _dct_min(int(h), int(w), min_size)
            else:
                grey, min_h, min_w = channels == 1, 0, 0
            # simplejpeg reads any buffer, read-only ones too: no copy of the bytes
            arr = _simplejpeg.decode_jpeg(buf, colorspace="GRAY" if grey else "RGB", min_height=min_h, min_width=min_w)
            if arr.ndim == 2:
                arr = arr[:, :, None]
            return arr
        from PIL import Image

        with Image.open(io.BytesIO(buf)) as im:
            im.load()
            arr = _from_pillow(im, channels)
        if arr.ndim == 2:
            arr = arr[:, :, None]
        return arr
    except _Refused as exc:
        raise SampleError(shown(f"cannot decode {name} faithfully: {exc}")) from None
    except Exception as exc:  # decoders raise many types; name the sample and keep the cause
        raise SampleError(shown(f"cannot decode {name}: {type(exc).__name__}: {exc}")) from exc


class _Refused(Exception):
    """An image that decodes, but has no faithful 8-bit form (the message says why and what to do)."""


def _from_pillow(im, channels: int | None) -> np.ndarray:
    """A loaded Pillow image as an (H, W) or (H, W, C) uint8 array of `channels` (None: 1 for
    GREY_MODES, else 3)."""
    if im.mode == "F":
        raise _Refused(
            "a 32-bit float image (Pillow mode F) has no defined 8-bit scale; convert it to "
            "8 or 16 bits per channel at its source"
        )
    grey = channels == 1 or (channels is None and im.mode in GREY_MODES)
    if im.mode not in WIDE_MODES:
        return np.asarray(im.convert("L" if grey else "RGB"))
    arr = to_8bit(np.asarray(im), im.mode)
    return arr if grey else np.repeat(arr[:, :, None], 3, axis=2)


def to_8bit(arr: np.ndarray, mode: str) -> np.ndarray:
    """16-bit grey samples (Pillow modes I;16*, or mode I, which older Pillows open 16-bit PNGs
    as) as uint8: the high byte, `v >> 8` (65535 -> 255, 256 -> 1, 255 -> 0). Mode I values outside
    0..65535 (a 32-bit TIFF) have no such scale: refused."""
    if mode == "I" and arr.size and (int(arr.min()) < 0 or int(arr.max()) > 0xFFFF):
        raise _Refused(
            f"a 32-bit integer image (Pillow mode I) with values in {int(arr.min())}..{int(arr.max())}, "
            f"outside the 16-bit range 0..65535, has no defined 8-bit scale; convert it to 8 or 16 "
            f"bits at its source"
        )
    return (arr.astype(np.uint32, copy=False) >> 8).astype(np.uint8)


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
    header = _simplejpeg.decode_jpeg_header(data)
    return _dct_min(int(header[0]), int(header[1]), min_size)


def _dct_min(h: int, w: int, min_size) -> tuple[int, int]:
    """`dct_scale` of a JPEG of h x w pixels."""
    if min_size is None:
        return 0, 0
    want_h, want_w = int(min_size[0]), int(min_size[1])
    for k in DCT_DIVISORS:
        sh, sw = -(-h // k), -(-w // k)
        if sh >= want_h and sw >= want_w:
            return sh, sw
    return 0, 0


def crop_divisor(box_hw: tuple[int, int], size: tuple[int, int]) -> int:
    """The DCT divisor (8, 4, 2 of DCT_DIVISORS, else 1) at which a crop of `box_hw` (H, W) pixels of
    the full image still has at least `size` (H, W) on both axes: the largest k with
    height >= k * size[0] and width >= k * size[1]."""
    for k in DCT_DIVISORS:
        if box_hw[0] >= k * size[0] and box_hw[1] >= k * size[1]:
            return k
    return 1


def scale_box(box: tuple[int, int, int, int], k: int, shape: tuple[int, int]) -> tuple[int, int, int, int]:
    """`box` (top, left, height, width) in a full image's pixels, in the pixels of its decode at 1/k
    of `shape` (H, W): each edge divided by k, rounded half up, kept inside the image and at least
    one pixel wide."""
    top, left, bh, bw = (int(v) for v in box)
    if k == 1:
        return top, left, bh, bw
    h, w = int(shape[0]), int(shape[1])
    y0, x0 = min(h - 1, (2 * top + k) // (2 * k)), min(w - 1, (2 * left + k) // (2 * k))
    y1, x1 = min(h, (2 * (top + bh) + k) // (2 * k)), min(w, (2 * (left + bw) + k) // (2 * k))
    return y0, x0, max(1, y1 - y0), max(1, x1 - x0)


def decode_crop(
    data,
    info,
    plan,
    size: tuple[int, int] | None,
    *,
    channels: int | None = None,
    name: str = "<sample>",
    scratch: bool = False,
):
    """Decodes a sample whose crop is known before its pixels: `plan(shape)` is called with the
    image's full (H, W) (a JPEG's, from its header, before decoding) and returns (box, extra), box
    = (top, left, height, width) in those pixels. A JPEG is then decoded at the reduced DCT scale
    1/k of `crop_divisor(box, size)` (the crop still at least `size`; size None: at full scale,
    `crop_size`), not at the image's own
    (`dct_scale`), and, where the extension dstore.codec._jpegcrop is built, only the region around the
    box: libjpeg-turbo skips the rows above it without the inverse DCT, decodes only the iMCU
    columns over it and stops below it (for torchvision's random resized crop of 500x375 photos
    at 224: a third less CPU than the whole decode, docs/benchmarks.md). Other encodings decode whole.

    Returns:
        (image, box, extra): the decoded (h, w, C) uint8 image (with the extension: the box's
        rows, and columns to the iMCU edges around it), the box in its pixels (`scale_box`), and
        `plan`'s extra as it gave it.

    The file is checked to its end either way: the extension still entropy-decodes the rows below
    the box and reads on to the end marker, so a file damaged anywhere is refused as the whole
    decode refuses it (SampleError naming `name`), never served in part.

    The pixels in the box are the whole decode's at the same scale, for every chroma subsampling
    (the extension decodes the chroma context the upsampler reads beside the box:
    tests/test_partial_decode.py), so at scale 1 they are the full decode's. At 1/2-1/8 they differ
    from a full decode cropped and resized at the same box: libjpeg's reduced IDCT averages each
    8x8 block's frequencies, a box filter, before the resize's bilinear (tests/test_imagenet_recipe.py
    bounds the difference). The same bytes and plan give the same pixels in any thread or process.

    scratch: with the extension, decode into this thread's scratch buffer (dstore.codec.resize.scratch),
    valid until the thread's next decode_crop: for a caller that uses the image at once (the
    loaders), saving the page faults of a fresh buffer per sample.

    Raises:
        SampleError: naming `name`, if the bytes are not a decodable image.
    """
    buf = memoryview(data).cast("B") if not isinstance(data, bytes) else data
    if info.encoding == "raw" or _simplejpeg is None or sniff(buf) != "jpeg":
        arr = decode_sample(data, info, channels=channels, name=name)
        where, extra = plan(arr.shape[:2])
        return arr, tuple(int(v) for v in where), extra
    try:
        header = _simplejpeg.decode_jpeg_header(buf)
    except Exception as exc:  # a broken header: name the sample, as decode_image does
        raise SampleError(f"cannot decode {name}: {type(exc).__name__}: {exc}") from exc
    h, w = int(header[0]), int(header[1])
    where, extra = plan((h, w))
    k = 1 if size is None else crop_divisor((int(where[2]), int(where[3])), (int(size[0]), int(size[1])))
    if _jpegcrop is not None:
        region = _decode_region(buf, where, k, (h, w), channels, scratch)
        if region is not None:
            return (*region, extra)
    try:
        fmt = "GRAY" if channels == 1 else "RGB"
        arr = _simplejpeg.decode_jpeg(
            buf, colorspace=fmt, min_height=-(-h // k) if k > 1 else 0, min_width=-(-w // k) if k > 1 else 0
        )
    except Exception as exc:  # decoders raise many types; name the sample and keep the cause
        raise SampleError(f"cannot decode {name}: {type(exc).__name__}: {exc}") from exc
    if arr.ndim == 2:
        arr = arr[:, :, None]
    return arr, scale_box(where, k, arr.shape[:2]), extra


def extension():
    """The build of the partial decode (dstore.codec._jpegcrop) `decode_crop` uses; None: whole decodes."""
    return _jpegcrop


@contextlib.contextmanager
def using_extension(module):
    """`decode_crop` decodes with `module` (a build of dstore.codec._jpegcrop, or None: whole decodes)
    inside the block, in every thread: for measurements that compare builds (tools/measure/crop_decode.py)."""
    global _jpegcrop
    saved, _jpegcrop = _jpegcrop, module
    try:
        yield
    finally:
        _jpegcrop = saved


def crop_size(transform) -> tuple[int, int] | None:
    """The `size` a loader gives decode_crop for a crop-aware transform: its `size`, or None (full-scale
    decodes) where its `reduced_decode` is False (ImageTransform(resize="torchvision"))."""
    return transform.size if getattr(transform, "reduced_decode", True) else None


def _decode_region(buf, where, k: int, shape: tuple[int, int], channels: int | None, scratch: bool):
    """(image, box) of the partial decode (dstore.codec._jpegcrop) of box `where` at 1/k of a JPEG of
    `shape`, or None where libjpeg refuses it (a colour space it cannot convert, or corrupt data
    anywhere in the file): the caller then decodes whole, which raises the error (simplejpeg's
    message) a broken file deserves, the same as where the extension is not built."""
    ext = _jpegcrop
    if ext is None:
        return None
    scaled = (-(-shape[0] // k), -(-shape[1] // k))
    top, left, bh, bw = scale_box(where, k, scaled)
    c = 1 if channels == 1 else 3
    need = bh * (bw + 64) * c  # the iMCU columns around the box and the edge context: 64 px at most more
    out = _resize.scratch("jpegcrop", (need,), np.uint8) if scratch else np.empty(need, np.uint8)
    try:
        width, x0 = ext.decode_region(buf, out, top, left, bh, bw, k, int(c == 1))
    except ValueError:
        return None
    return out[: bh * width * c].reshape(bh, width, c), (0, left - x0, bh, bw)


def decode_raw(data, dtype: str, shape: tuple[int, ...], *, name: str = "<sample>") -> np.ndarray:
    """A raw sample's bytes viewed as `shape` elements of `dtype` (no copy)."""
    arr = np.frombuffer(data, dtype=np.uint8)
    want = int(np.prod(shape)) * np.dtype(dtype).itemsize
    if arr.size != want:
        raise SampleError(shown(f"raw sample {name} has {arr.size} bytes, expected {want} for {dtype}{tuple(shape)}"))
    return arr.view(dtype).reshape(shape)


def decode_sample(data, info, *, channels: int | None = None, min_size=None, name: str = "<sample>") -> np.ndarray:
    """Decodes one sample of a container with ContainerInfo `info` into an (H, W, C) array."""
    if info.encoding == "raw":
        arr = decode_raw(data, info.raw_dtype, info.raw_shape, name=name)
        return arr if arr.ndim == 3 else arr.reshape(arr.shape + (1,) * (3 - arr.ndim))
    return decode_image(data, channels=channels, min_size=min_size, name=name)


def resize(arr: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """An HWC uint8 array resized to `size` = (H, W) (fixed-point bilinear, dstore.codec.resize: the same
    pixels as a batch resize on any device); returned as is if already that size, else a new,
    writable array."""
    return _resize.resize(arr, size)
