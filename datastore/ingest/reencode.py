"""Cheaper samples at ingest (FFCV-style): images whose longer side exceeds `max_side` are decoded,
shrunk to it and re-encoded as JPEG; the others are stored as they were (no MPI here).

Why: decoding cost grows with the pixel count, and a trainer that crops 224x224 out of a
400x500 image throws most of them away. Shrinking once at ingest makes every epoch's decode
cheaper and the container smaller (measured in docs/benchmarks.md, "Cheaper samples at ingest").

What is done to a larger image, and recorded in the container's attributes (`ingest_max_side`,
`ingest_quality`, `ingest_resample`, `ingest_subsampling`):
- decoded (JPEG: simplejpeg, at 1/2, 1/4 or 1/8 where that is still at least the target size,
  else in full, `dstore.codec.decode.dct_scale`; other
  formats: Pillow), grey kept grey, anything else (palette, alpha) made RGB;
- resized with Pillow's antialiased bicubic filter so that the longer side is exactly `max_side`
  and the shorter side keeps the aspect ratio (rounded, at least 1);
- encoded as JPEG at `quality` with 4:2:0 chroma subsampling (colour) by simplejpeg.
Metadata (EXIF, ICC profiles) is not carried over; the decoders here ignore it anyway. The
sample keeps its name (its source path), so provenance stays; its checksum is of the new bytes.
"""

from __future__ import annotations

import io

import numpy as np

from dstore.codec.decode import GREY_MODES, decode_image, sniff
from dstore.errors import ConfigError, SampleError

DEFAULT_QUALITY = 90
"""JPEG quality of re-encoded samples (FFCV's default too)."""
RESAMPLE = "bicubic"
SUBSAMPLING = "420"


def reencode_attrs(max_side: int, quality: int) -> dict:
    """The container attributes that record what was done to images larger than `max_side`."""
    return {
        "ingest_max_side": int(max_side),
        "ingest_quality": int(quality),
        "ingest_resample": RESAMPLE,
        "ingest_subsampling": SUBSAMPLING,
    }


def check_reencode(max_side, quality) -> None:
    """Raises ConfigError naming the parameter if `max_side` or `quality` is not allowed."""
    if max_side is not None and (
        not isinstance(max_side, (int, np.integer)) or isinstance(max_side, bool) or max_side < 8
    ):
        raise ConfigError(f"max_side={max_side!r} must be an integer >= 8 (or None: keep the images' sizes)")
    if quality is not None:
        if max_side is None:
            raise ConfigError(f"quality={quality!r} applies only to re-encoded images; it needs max_side")
        if not isinstance(quality, (int, np.integer)) or isinstance(quality, bool) or not 1 <= quality <= 100:
            raise ConfigError(f"quality={quality!r} must be an integer in 1..100")


def image_header(data, where: str) -> tuple[int, int, bool]:
    """(height, width, is grey) of encoded image bytes, from the header only.

    Raises:
        SampleError: naming `where` if the header cannot be read.
    """
    try:
        if sniff(data) == "jpeg":
            import simplejpeg

            h, w, colorspace, _ = simplejpeg.decode_jpeg_header(bytes(data))
            return int(h), int(w), colorspace == "Gray"
        from PIL import Image

        with Image.open(io.BytesIO(bytes(data))) as im:
            return int(im.height), int(im.width), im.mode in GREY_MODES
    except Exception as exc:  # decoders raise many types; name the sample and keep the cause
        raise SampleError(f"{where}: cannot read the image header: {type(exc).__name__}: {exc}") from exc


def target_size(h: int, w: int, max_side: int) -> tuple[int, int]:
    """(height, width) with the longer side `max_side` and the aspect ratio kept (sides >= 1)."""
    scale = max_side / max(h, w)
    return (max_side, max(1, round(w * scale))) if h >= w else (max(1, round(h * scale)), max_side)


def shrink(data, max_side: int, quality: int = DEFAULT_QUALITY, *, where: str = "<sample>") -> bytes | None:
    """JPEG bytes of the image `data` shrunk to a longer side of `max_side`, or None if it is no
    larger than that already (then the original is stored).

    Raises:
        SampleError: naming `where` if the image cannot be decoded or encoded.
    """
    h, w, grey = image_header(data, where)
    if max(h, w) <= max_side:
        return None
    th, tw = target_size(h, w, max_side)
    arr = decode_image(
        data, channels=1 if grey else 3, min_size=(th, tw), name=where
    )  # JPEG: reduced DCT scale, still >= target
    import simplejpeg
    from PIL import Image

    try:
        im = Image.fromarray(arr[:, :, 0] if arr.shape[2] == 1 else arr)
        small = np.asarray(im.resize((tw, th), Image.Resampling.BICUBIC))
        if small.ndim == 2:
            return simplejpeg.encode_jpeg(small[:, :, None], quality=int(quality), colorspace="GRAY")
        return simplejpeg.encode_jpeg(
            np.ascontiguousarray(small), quality=int(quality), colorspace="RGB", colorsubsampling=SUBSAMPLING
        )
    except Exception as exc:  # Pillow and simplejpeg raise many types; name the sample
        raise SampleError(f"{where}: cannot re-encode at max_side={max_side}: {type(exc).__name__}: {exc}") from exc
