"""torchvision's resize: the antialiased bilinear of `torch.nn.functional.interpolate(mode="bilinear",
antialias=True)` on uint8 images (torchvision v2's tensor path; Pillow's `resize(BILINEAR)`, its PIL
path, is the same filter), in integer numpy: `ImageTransform(resize="torchvision")`, `--resize torchvision`.

The arithmetic is torch's uint8 kernel's (aten UpSampleKernel.cpp, Pillow's ImagingResample):
per axis of n_in pixels resized to n_out, scale = n_in / n_out, support = max(scale, 1); output
index i has centre c = scale * (i + 0.5), taps from xmin = max(int(c - support + 0.5), 0) to
min(int(c + support + 0.5), n_in), weights the triangle 1 - |x| at (j - c + 0.5) / max(scale, 1),
normalised to sum 1 (float64), then scaled to integers by 2^p, p the largest precision (below 22)
at which the axis's largest weight still fits 15 bits, rounded half away from zero. The columns
are resampled first, each pixel `(sum(w * x) + 2^(p-1)) >> p` clipped to 0..255 (uint8), then the
rows the same way. Integers throughout, so the pixels are the same in any thread, process or
machine (torch's own float path, on a GPU or a CPU without AVX2, differs by a level here and there).

A window of the resized image is computed directly (`resize(..., resized=, offset=)`): torchvision's
`Resize(256)` + `CenterCrop(224)` is the centre 224x224 of the whole image's resize, with no
rounding of where that window lies in the source.
"""

from __future__ import annotations

import functools

import numpy as np

from dstore.codec import kernels


@functools.lru_cache(maxsize=1024)
def taps(n_in: int, n_out: int) -> tuple[np.ndarray, np.ndarray, int]:
    """(first, weights, precision) of resizing an axis of `n_in` pixels to `n_out` (see the module
    docstring): int64 [n_out] first taps, int32 [n_out, K] weights (0 past each output's own
    taps), read-only (cached)."""
    scale = n_in / n_out
    support = scale if scale >= 1.0 else 1.0
    invscale = 1.0 / scale if scale >= 1.0 else 1.0
    centre = scale * (np.arange(n_out, dtype=np.float64) + 0.5)
    xmin = np.maximum((centre - support + 0.5).astype(np.int64), 0)  # C's cast: towards zero
    xsize = np.minimum((centre + support + 0.5).astype(np.int64), n_in) - xmin
    k = int(xsize.max())
    j = np.arange(k)[None, :]
    w = np.clip(1.0 - np.abs((j + xmin[:, None] - centre[:, None] + 0.5) * invscale), 0.0, None)
    w[j >= xsize[:, None]] = 0.0
    total = w.sum(axis=1, keepdims=True)
    w = np.divide(w, total, out=np.zeros_like(w), where=total != 0)
    top = float(w.max())
    precision = 0
    while precision < 22 and int(0.5 + top * (1 << (precision + 1))) < (1 << 15):
        precision += 1
    scaled = w * (1 << precision)
    weights = np.where(scaled < 0, scaled - 0.5, scaled + 0.5).astype(np.int32)  # C's cast: towards zero
    for a in (xmin, weights):
        a.flags.writeable = False
    return xmin, weights, precision


def _pass(src: np.ndarray, first: np.ndarray, weights: np.ndarray, precision: int, axis: int, k) -> np.ndarray:
    """One axis (0: rows, 1: columns) of an (H, W, C) uint8 image resampled with these taps: by the
    compiled kernels `k` (dstore.codec.kernels) where given, else in numpy, the same pixels."""
    if k is not None:
        h, w, c = src.shape
        flat = np.ascontiguousarray(src).reshape(h, w * c)
        start = first.astype(np.uint64)
        if axis == 1:
            out = np.empty((h, len(first) * c), np.uint8)
            k.aa_cols(flat, c, start, weights, precision, out)
            return out.reshape(h, len(first), c)
        out = np.empty((len(first), w * c), np.uint8)
        k.aa_rows(flat, start, weights, precision, np.empty(w * c, np.int32), out)
        return out.reshape(len(first), w, c)
    n_in = src.shape[axis]
    acc = np.full(
        (len(first), src.shape[1], src.shape[2]) if axis == 0 else (src.shape[0], len(first), src.shape[2]),
        1 << (precision - 1) if precision else 0,
        np.int32,
    )
    for k in range(weights.shape[1]):
        w = weights[:, k]
        if not w.any():
            continue
        idx = np.minimum(first + k, n_in - 1)
        part = np.take(src, idx, axis=axis).astype(np.int32)
        part *= w[:, None, None] if axis == 0 else w[None, :, None]
        acc += part
    acc >>= precision
    np.clip(acc, 0, 255, out=acc)
    return acc.astype(np.uint8)


def resize(
    img: np.ndarray, size: tuple[int, int], *, resized: tuple[int, int] | None = None, offset: tuple[int, int] = (0, 0)
) -> np.ndarray:
    """The window `size` = (h, w) at `offset` = (top, left) of the (H, W, C) uint8 `img` resized to
    `resized` = (RH, RW) (default: `size`, the whole resize) as torch's antialiased bilinear does
    (a new array; `img` itself where nothing changes)."""
    th, tw = int(size[0]), int(size[1])
    rh, rw = (th, tw) if resized is None else (int(resized[0]), int(resized[1]))
    oy, ox = int(offset[0]), int(offset[1])
    if not (0 <= oy and oy + th <= rh and 0 <= ox and ox + tw <= rw):
        raise ValueError(f"window {size} at {offset} outside the resized image {(rh, rw)}")
    h, w = img.shape[:2]
    out = img
    k = kernels.compiled_for(th * tw) if (h, w) != (rh, rw) else None
    if (
        w != rw
    ):  # columns first, over only the rows the row pass reads (torch and Pillow skip a pass that changes nothing)
        fx, wx, px = taps(w, rw)
        rows, vertical = slice(None), None
        if h != rh:
            fy, wy, _ = taps(h, rh)
            last = fy[oy : oy + th] + (wy[oy : oy + th] != 0).sum(axis=1)
            lo, hi = int(fy[oy : oy + th].min()), int(last.max())
            rows, vertical = slice(lo, hi), (fy[oy : oy + th] - lo, wy[oy : oy + th])
        out = _pass(img[rows], fx[ox : ox + tw], wx[ox : ox + tw], px, 1, k)
        if vertical is not None:  # h != rh: the row pass, over the rows cut out above
            return _pass(out, vertical[0], vertical[1], taps(h, rh)[2], 0, k)
        return out[oy : oy + th] if (oy, th) != (0, h) else out
    if ox or tw != w:
        out = out[:, ox : ox + tw]
    if h != rh:
        fy, wy, py = taps(h, rh)
        return _pass(out, fy[oy : oy + th], wy[oy : oy + th], py, 0, k)
    return out[oy : oy + th] if (oy, th) != (0, h) else out


def resize_shorter(shape: tuple[int, int], short: int) -> tuple[int, int]:
    """(H, W) of torchvision's `Resize(short)` of an image of `shape`: the shorter side `short`, the
    longer `int(short * long / shorter)` (torchvision's _compute_resized_output_size)."""
    h, w = int(shape[0]), int(shape[1])
    if w <= h:
        return int(short * h / w), short
    return short, int(short * w / h)


def centre_window(shape: tuple[int, int], size: tuple[int, int], resize_ratio: float = 256 / 224):
    """((RH, RW), (top, left)) of torchvision's `Resize(int(min(size) * resize_ratio))` +
    `CenterCrop(size)` of an image of `shape`: the resized size and the crop's offsets in it
    (`int(round((RH - h) / 2.0))`, as CenterCrop rounds). A resized side shorter than the crop
    (torchvision would pad with zeros) is refused: ValueError."""
    th, tw = int(size[0]), int(size[1])
    rh, rw = resize_shorter(shape, int(min(th, tw) * resize_ratio))
    if rh < th or rw < tw:
        raise ValueError(f"Resize to {(rh, rw)} is smaller than the crop {size}")
    return (rh, rw), (int(round((rh - th) / 2.0)), int(round((rw - tw) / 2.0)))
