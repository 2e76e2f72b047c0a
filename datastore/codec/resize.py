"""A fixed-point bilinear resize that gives the same uint8 pixels per sample (numpy) and per batch
(torch, on any device).

The loader's one resize. JPEGs arrive reduced in the DCT domain where 1/2, 1/4 or 1/8 still
covers the target (`dstore.codec.decode.dct_scale`), so what is left is a scale between 1 and 2; a
two-tap bilinear is right for that (it aliases only past 2x, where `box_reduce` first averages
whole blocks, as the DCT scaling does for JPEGs). Pillow's antialiased bilinear took 0.6-0.8 ms
per 224px sample here; this one about half of that in numpy, about an eighth compiled
(`dstore.codec.kernels`, the same pixels: this module is its reference), and as a batch op it runs on
the GPU (`resize_batch`), where the decode workers then only decode and crop.

The arithmetic (half-pixel centres, as OpenCV's INTER_LINEAR and torch's align_corners=False):
for output index j of n_out from n_in, the source coordinate in 1/256 units is
`s = ((2j + 1) * n_in * 128) // n_out - 128`, clamped to [0, (n_in - 1) * 256]; taps
`i0 = s >> 8`, `i1 = min(i0 + 1, n_in - 1)`, weight `f = s & 255`. Rows first, then columns, each
pass `(a * (256 - f) + b * f + 128) >> 8`: integers below 2^16 throughout, so numpy (uint16) and
torch (int32, CPU or CUDA) agree exactly.
"""

from __future__ import annotations

import functools
import math
import threading

import numpy as np

CPU_CHUNK = 4
"""Samples per pass of `resize_batch` on a CPU: measured 7.8 ms per 224px sample over a batch of
64 at once (its int32 intermediates, ~50 MB, go to memory), 1.3 ms in chunks of 4."""
MAX_FACTOR = 2
"""A resize that shrinks an axis by this factor or more first averages blocks of `box_factors`."""


@functools.lru_cache(maxsize=1024)
def taps(n_in: int, n_out: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(i0, i1, f) of resizing an axis of `n_in` pixels to `n_out` (see the module docstring):
    int64 taps and uint16 weights in 1/256 units, read-only (cached)."""
    j = np.arange(n_out, dtype=np.int64)
    s = np.clip((2 * j + 1) * n_in * 128 // n_out - 128, 0, (n_in - 1) * 256)
    i0 = s >> 8
    out = (i0, np.minimum(i0 + 1, n_in - 1), (s & 255).astype(np.uint16))
    for a in out:
        a.flags.writeable = False
    return out


def box_factors(shape: tuple[int, int], size: tuple[int, int]) -> tuple[int, int]:
    """(ky, kx): the integer block sizes `box_reduce` averages before resizing `shape` (H, W) to
    `size`: floor(H / h) on an axis shrunk MAX_FACTOR times or more, else 1."""
    ky, kx = shape[0] // size[0], shape[1] // size[1]
    return (ky if ky >= MAX_FACTOR else 1), (kx if kx >= MAX_FACTOR else 1)


def box_reduce(img: np.ndarray, ky: int, kx: int) -> np.ndarray:
    """The (H, W, C) uint8 image averaged over blocks of ky x kx (rounded half up; the last rows
    and columns that fill no whole block dropped)."""
    if ky == 1 and kx == 1:
        return img
    h, w = img.shape[0] // ky, img.shape[1] // kx
    # one strided view per offset in the block, summed: numpy's sum over the axes of a 5-D view
    # of the blocks took ~8 ms for a 500px image, these adds ~0.3 ms
    acc = img[0 : h * ky : ky, 0 : w * kx : kx].astype(np.uint32)
    for dy in range(ky):
        for dx in range(kx):
            if dy or dx:
                acc += img[dy : h * ky : ky, dx : w * kx : kx]
    n = int(ky) * int(kx)
    acc += n // 2
    acc //= n
    return acc.astype(np.uint8)


def fit(img: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """`img` box-reduced as `resize` would before its bilinear pass (the image a batch resize is
    given: then `resize_batch` of it equals `resize` of `img`)."""
    return box_reduce(img, *box_factors(img.shape[:2], size))


def resize(img: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """An (H, W, C) uint8 image resized to `size` = (h, w) (a new, writable array; `img` itself
    where it has that size already)."""
    th, tw = int(size[0]), int(size[1])
    if img.shape[:2] == (th, tw):
        return img
    img = fit(img, (th, tw))
    h, w, c = img.shape
    y0, y1, fy = taps(h, th)
    x0, x1, fx = taps(w, tw)
    g8, a, b, p, q = _scratch(th, w, tw, c)
    # rows: contiguous row gathers, then the two-tap blend in uint16, in place
    np.take(img, y0, axis=0, out=g8)
    np.copyto(a, g8)
    np.take(img, y1, axis=0, out=g8)
    np.copyto(b, g8)
    wy = fy[:, None, None]
    a *= 256 - wy
    b *= wy
    a += b
    a += 128
    a >>= 8
    # columns: the (x, channel) pairs gathered with one take along each row
    rows = a.reshape(th, w * c)
    ch = np.arange(c)
    rows.take((x0[:, None] * c + ch).ravel(), axis=1, out=p)
    rows.take((x1[:, None] * c + ch).ravel(), axis=1, out=q)
    wx = np.repeat(fx, c)[None]
    p *= 256 - wx
    q *= wx
    p += q
    p += 128
    p >>= 8
    out = np.empty((th, tw, c), np.uint8)
    np.copyto(out.reshape(th, tw * c), p, casting="unsafe")
    return out


_local = threading.local()


def scratch(name: str, shape: tuple[int, ...], dtype) -> np.ndarray:
    """This thread's scratch array `name` of `shape`, a view of a buffer that only grows: fresh
    arrays of a few hundred KB per call are mapped anew by malloc and page-faulted in, which
    measured about as much as the arithmetic (a 224px resize 1.4 ms against 0.5 ms with malloc
    told not to map them). Also the compiled kernels' (dstore.codec.kernels)."""
    need = math.prod(shape)
    have = getattr(_local, name, None)
    if have is None or have.dtype != dtype or have.size < need:
        have = np.empty(need, dtype)
        setattr(_local, name, have)
    return have[:need].reshape(shape)


def _scratch(th: int, w: int, tw: int, c: int):
    """This thread's intermediates of `resize` for these sizes (`scratch`)."""
    return (
        scratch("g8", (th, w, c), np.uint8),
        scratch("a", (th, w, c), np.uint16),
        scratch("b", (th, w, c), np.uint16),
        scratch("p", (th, tw * c), np.uint16),
        scratch("q", (th, tw * c), np.uint16),
    )


def shift(img: np.ndarray, dy: int, dx: int) -> np.ndarray:
    """out[y, x] = img[y + dy, x + dx] where that lies inside `img`, else 0 (a crop of the image
    padded with zeros, without padding it); `img` itself for (0, 0)."""
    if dy == 0 and dx == 0:
        return img
    h, w = img.shape[:2]
    out = np.zeros_like(img)
    y0, y1, x0, x1 = max(0, -dy), min(h, h - dy), max(0, -dx), min(w, w - dx)
    if y1 > y0 and x1 > x0:
        out[y0:y1, x0:x1] = img[y0 + dy : y1 + dy, x0 + dx : x1 + dx]
    return out


def _taps_batch(n_in, n_out: int, offset):
    """Per sample b: (i0, i1, f, valid) for output index j reading resized index j + offset[b]
    (valid: inside [0, n_out)); int64 [B, n_out] tensors, the arithmetic of `taps`."""
    import torch

    n_in = n_in.to(torch.int64)[:, None]
    j = torch.arange(n_out, dtype=torch.int64, device=n_in.device)[None] + offset.to(torch.int64)[:, None]
    valid = (j >= 0) & (j < n_out)
    j = j.clamp(0, n_out - 1)
    s = torch.minimum(
        torch.clamp(torch.div((2 * j + 1) * n_in * 128, n_out, rounding_mode="floor") - 128, min=0), (n_in - 1) * 256
    )
    i0 = s >> 8
    return i0, torch.minimum(i0 + 1, n_in - 1), s & 255, valid


def resize_batch(canvas, hw, size: tuple[int, int], offsets=None):
    """Each sample of a uint8 batch [B, C, Hc, Wc], its image (`fit`'s output) in the top left
    hw[b] = (h, w) corner, resized to `size` = (th, tw) and then shifted by offsets[b] = (dy, dx)
    as `shift` does: [B, C, th, tw] uint8, equal to `shift(resize(image), dy, dx)` per sample, on
    the canvas's device. hw and offsets: int tensors [B, 2] (offsets None: no shift)."""
    import torch

    b, c, hc, wc = canvas.shape
    th, tw = int(size[0]), int(size[1])
    dev = canvas.device
    hw = hw.to(dev)
    offsets = torch.zeros_like(hw) if offsets is None else offsets.to(dev)
    if dev.type == "cpu" and b > CPU_CHUNK:  # int32 passes over a whole batch spill the caches
        return torch.cat(
            [
                resize_batch(canvas[k : k + CPU_CHUNK], hw[k : k + CPU_CHUNK], size, offsets[k : k + CPU_CHUNK])
                for k in range(0, b, CPU_CHUNK)
            ]
        )
    y0, y1, fy, vy = _taps_batch(hw[:, 0], th, offsets[:, 0])
    x0, x1, fx, vx = _taps_batch(hw[:, 1], tw, offsets[:, 1])
    wmax = int(hw[:, 1].max()) if b else 1  # columns past every sample's image are not read
    # rows: one index_select of whole rows over the batch's planes ([B * C * Hc, Wc] rows)
    plane = (torch.arange(b * c, device=dev, dtype=torch.int64) * hc).view(b, c, 1)
    flat = canvas.reshape(b * c * hc, wc)[:, :wmax]
    r0 = flat.index_select(0, (plane + y0[:, None]).reshape(-1)).to(torch.int32)
    r1 = flat.index_select(0, (plane + y1[:, None]).reshape(-1)).to(torch.int32)
    wy = fy.to(torch.int32)[:, None, :, None].expand(b, c, th, 1).reshape(-1, 1)
    rows = (r0 * (256 - wy) + r1 * wy + 128) >> 8  # [B * C * th, wmax]
    # columns: the rows turned so that a sample's columns are rows, then index_select again
    cols = rows.view(b, c * th, wmax).transpose(1, 2).reshape(b * wmax, c * th)
    first = (torch.arange(b, device=dev, dtype=torch.int64) * wmax)[:, None]
    p = cols.index_select(0, (first + x0).reshape(-1))
    q = cols.index_select(0, (first + x1).reshape(-1))
    wx = fx.to(torch.int32).reshape(-1, 1)
    out = ((p * (256 - wx) + q * wx + 128) >> 8).view(b, tw, c, th).permute(0, 2, 3, 1)
    keep = (vy[:, None, :, None] & vx[:, None, None, :]).to(torch.int32)
    return (out * keep).to(torch.uint8).contiguous()
