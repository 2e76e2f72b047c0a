"""Compiled per-sample kernels (numba): the decode workers' and decode threads' resize, crop, flip
and CHW copy in one pass over the pixels, with the GIL released.

`dstore.codec.resize` defines the arithmetic and keeps its numpy form as the reference; the kernel here
does the same integer operations in the same order, so its pixels are the numpy ones exactly (and
so the batch resize's on any device: tests/test_kernels.py compares all three). Why a compiled
kernel: a worker's time per 224px sample was the decode (about 1,070 us here) plus 320 us of numpy
resize and crop and 40 us of CHW copy, each numpy call a full pass over a few hundred KB and each
intermediate a new array; the kernel makes one pass and writes the batch buffer directly.

numba is optional: where it does not import (or `DSTORE_NATIVE=0`), the callers use the numpy
reference, with the same pixels. Loading the kernels costs a process about 1 s of CPU (numba's
import, 0.2 s, and its on-disk cache of them, `cache=True`, 0.9 s for the first; compiling them
anew takes longer), which pays for itself after about 4,000 224px samples (a quarter of a
millisecond saved on each). So a process takes the numpy path for its first
`DSTORE_NATIVE_AFTER` (2,000) such samples, then loads the kernels in a background thread and
goes on with numpy until they are loaded: a short job, a first batch and an epoch 0 never wait
for numba (loading at once made the first epoch of 480 samples 1.5 s instead of 0.44 s here, two
decode threads). Outputs under
NATIVE_MIN_PIXELS (digits, CIFAR) never load them: there the kernel saves a few microseconds a
sample. `available()` loads them and waits (tests and measurements).
"""

from __future__ import annotations

import functools
import threading
import types

import numpy as np

from dstore.memory.costs import NATIVE_MIN_PIXELS, RESERVE_BYTES  # noqa: F401 - RESERVE_BYTES: read here too
from dstore.runtime import rc

BAND = 8
"""Output rows a band of the RGB resize (`resize_rgb`) makes at once: the row pass's scratch is
BAND rows, not the whole image's (as fast here: 83 us per 224px sample either way)."""
_wanted = 0  # samples of NATIVE_MIN_PIXELS or more so far (no lock: the order of a few does not matter)
_load_after: int | None = None  # DSTORE_NATIVE_AFTER, read at the first such sample

_kernels = None  # the loaded namespace once `_load` is done, else None
_loader: threading.Thread | bool | None = None  # the loading thread; False: turned off (DSTORE_NATIVE=0)
_load_lock = threading.Lock()


def _compiled():
    """The kernels if they are loaded, else None, starting their load in the background the first
    time (see the module docstring); None for good where numba is missing or turned off. Once the
    load has started (or was refused) this is two reads: it runs per sample."""
    if _kernels is None and _loader is None:
        start()
    return _kernels


def loaded() -> bool:
    """Whether the kernels are loaded now (never waits)."""
    return _kernels is not None


def start() -> threading.Thread | None:
    """Starts loading the kernels in the background (once); the loading thread, or None where
    DSTORE_NATIVE=0 (then `_loader` is False until `_reset`: the variable is not read again)."""
    global _loader
    with _load_lock:
        if _loader is None:
            if not rc.NATIVE.get():
                _loader = False
                return None
            _loader = threading.Thread(target=_load, name="dstore-kernels", daemon=True)
            _loader.start()
        return _loader if isinstance(_loader, threading.Thread) else None


def available() -> bool:
    """Whether the compiled kernels are in use: waits for their load (numba missing, or
    DSTORE_NATIVE=0: False)."""
    loader = start()
    if loader is not None:
        loader.join()
    return _kernels is not None


def _reset() -> None:
    """Forgets the loaded kernels and the samples counted (tests: after changing DSTORE_NATIVE)."""
    global _kernels, _loader, _wanted, _load_after
    if isinstance(_loader, threading.Thread):
        _loader.join()
    _kernels, _loader, _wanted, _load_after = None, None, 0, None


def _load() -> None:
    """Builds the kernels and calls each once on small arrays of the types the callers pass, so that
    numba loads (or compiles) them here and not in a caller's first sample."""
    global _kernels
    k = _build()
    if k is None:
        return
    try:
        for c in (3, 1):  # a read-only image (raw samples) or a strided output: loaded at first use
            img = np.zeros((6, 5, c), np.uint8)
            _resize_chw(k, img, (0, 0, 6, 5), (4, 4), np.empty((c, 4, 4), np.uint8), (1, -1), True)
            _resize_chw(k, img, (0, 0, 6, 5), (2, 2), np.empty((c, 2, 2), np.uint8), (0, 0), False)  # box-averaged
        for c in (3, 1):  # the antialiased resize's passes (dstore.codec.antialias)
            img = np.zeros((6, 5 * c), np.uint8)
            first, weights = np.zeros(4, np.uint64), np.ones((4, 2), np.int32)
            weights.flags.writeable = False  # antialias.taps's are read-only (cached): another type to numba
            k.aa_cols(img, c, first, weights, 1, np.empty((6, 4 * c), np.uint8))
            k.aa_rows(img, first, weights, 1, np.empty(5 * c, np.int32), np.empty((4, 5 * c), np.uint8))
    except Exception:  # noqa: BLE001 - a kernel that cannot compile here: the numpy path serves
        return
    _kernels = k


def _build():
    """The jitted kernels (a namespace), or None where numba is missing."""
    try:
        import numba
    except ImportError:
        return None

    # Indices here are loop counters, slices' offsets or unsigned: numba checks a signed index
    # for wrap-around (a negative one counts from the end), and that branch per access kept the
    # compiler from vectorising (the RGB row pass: 163 us against 27 us per 224px sample).

    @numba.njit(nogil=True, cache=True)
    def box_rows(src, c, top, left, ky, kx, m, acc, red):  # pragma: no cover - compiled
        """red[y, x*c + ch] = the rounded mean of the ky x kx block at (top + y*ky, left + x*kx),
        channel ch, of src (H, W*c, an image's rows flattened): dstore.codec.resize.box_reduce. The
        division by n = ky*kx is a multiply by m = ceil(2^40 / n) and a shift, exact for sums below
        2^24 (a sum times m's error, under n, stays below 2^40); acc: uint32 scratch of a source row."""
        h, wc = red.shape
        w = wc // c
        n = np.uint64(ky * kx)
        half = n // np.uint64(2)
        span = w * kx * c
        for y in range(h):
            acc[:] = 0  # the block's rows summed first (contiguous, vectorised), then its columns
            for dy in range(ky):
                row = src[top + y * ky + dy, left * c : left * c + span]
                for k in range(span):
                    acc[k] += row[k]
            for x in range(w):
                for ch in range(c):
                    total = np.uint32(0)
                    for dx in range(kx):
                        total += acc[(x * kx + dx) * c + ch]
                    acc[x * c + ch] = total
            out = red[y]
            for k in range(wc):
                out[k] = ((np.uint64(acc[k]) + half) * m) >> np.uint64(40)

    @numba.njit(nogil=True, cache=True)
    def rows_any(src, top, left, w, y0, y1, fy, ylo, yhi, rows):  # pragma: no cover - compiled
        """rows[y, x*C + ch] = the two-tap blend of src rows top + y0[y] and top + y1[y] at column
        left + x, channel ch (uint16), for y in [ylo, yhi): dstore.codec.resize.resize's row pass.
        src: (H, W*C) uint8, an image's rows flattened (C = rows.shape[1] // w)."""
        wc = rows.shape[1]
        c = wc // w
        for y in range(ylo, yhi):
            s0 = src[top + y0[y], left * c : left * c + wc]
            s1 = src[top + y1[y], left * c : left * c + wc]
            f = np.uint16(fy[y])
            g = np.uint16(256) - f
            r = rows[y]
            for k in range(wc):
                r[k] = (np.uint16(s0[k]) * g + np.uint16(s1[k]) * f + np.uint16(128)) >> np.uint16(8)

    @numba.njit(nogil=True, cache=True)
    def rows_rgb(src, top, left, w, y0, y1, fy, ylo, yhi, rows):  # pragma: no cover - compiled
        """`rows_any` of an RGB image into four lanes a pixel (R, G, B, 0), for `cols_rgb`."""
        for y in range(ylo, yhi):
            s0 = src[top + y0[y], left * 3 : (left + w) * 3]
            s1 = src[top + y1[y], left * 3 : (left + w) * 3]
            f = np.uint16(fy[y])
            g = np.uint16(256) - f
            r = rows[y]
            for x in range(w):
                for ch in range(3):
                    r[x * 4 + ch] = (
                        np.uint16(s0[x * 3 + ch]) * g + np.uint16(s1[x * 3 + ch]) * f + np.uint16(128)
                    ) >> np.uint16(8)
                r[x * 4 + 3] = 0

    @numba.njit(nogil=True, cache=True)
    def zero_border(out, ylo, yhi, xa, xb):  # pragma: no cover - compiled
        """Zeros out[:, Y, X] outside Y in [ylo, yhi), X in [xa, xb): what a shift moved past the edge."""
        out[:, :ylo] = 0
        out[:, yhi:] = 0
        out[:, :, :xa] = 0
        out[:, :, xb:] = 0

    @numba.njit(nogil=True, cache=True)
    def cols_rgb(r64, x0, x1, fx, ylo, yhi, xa, xb, dy, dx, flip, tmp, out):  # pragma: no cover - compiled
        """out[ch, Y, X] (3 channels) = the two-tap blend of pixels x0[j], x1[j] of row Y + dy of the
        row pass, weight fx[j], j = X + dx (tw - 1 - X + dx where `flip`), for Y in [ylo, yhi) and
        X in [xa, xb) (the rest is left as it is). A row pass pixel is one uint64 of four 16-bit lanes (R, G, B, 0),
        all blended at once: each lane's a*(256-f) + b*f + 128 is at most 65,408, so no lane
        carries into the next. A row is blended into `tmp` (uint64 [tw]) first, then split into the
        planes (two loops: 37 us against 44 per 224px sample)."""
        c, th, tw = out.shape
        lo8 = np.uint64(0x00FF00FF00FF00FF)
        half = np.uint64(0x0080008000800080)
        one = np.uint64(256)
        byte = np.uint64(0xFF)
        n = xb - xa
        first = (tw - 1 - xa + dx) if flip else (xa + dx)  # j of X = xa; j steps by -1 or +1
        step = -1 if flip else 1
        for yy in range(ylo, yhi):
            r = r64[yy + dy]
            for i in range(n):
                j = np.uint64(first + step * i)
                w = np.uint64(fx[j])
                tmp[i] = ((r[x0[j]] * (one - w) + r[x1[j]] * w + half) >> np.uint64(8)) & lo8
            q0, q1, q2 = out[0, yy, xa:xb], out[1, yy, xa:xb], out[2, yy, xa:xb]
            for i in range(n):
                v = tmp[i]
                q0[i] = v & byte
                q1[i] = (v >> np.uint64(16)) & byte
                q2[i] = (v >> np.uint64(32)) & byte

    @numba.njit(nogil=True, cache=True)
    def cols_any(rows, x0, x1, fx, ylo, yhi, xa, xb, dy, dx, flip, out):  # pragma: no cover - compiled
        """`cols_rgb` for any number of channels, one at a time (rows: uint16 [th, w*C])."""
        c, th, tw = out.shape
        zero_border(out, ylo, yhi, xa, xb)
        cu = np.uint64(c)
        first = (tw - 1 - xa + dx) if flip else (xa + dx)
        step = -1 if flip else 1
        for yy in range(ylo, yhi):
            r = rows[yy + dy]
            for ch in range(c):
                q = out[ch, yy, xa:xb]
                cc = np.uint64(ch)
                for i in range(xb - xa):
                    j = np.uint64(first + step * i)
                    w = np.uint32(fx[j])
                    q[i] = (
                        np.uint32(r[x0[j] * cu + cc]) * (np.uint32(256) - w)
                        + np.uint32(r[x1[j] * cu + cc]) * w
                        + np.uint32(128)
                    ) >> np.uint32(8)

    @numba.njit(nogil=True, cache=True)
    def resize_rgb(src, top, left, w, y0, y1, fy, x0, x1, fx, ylo, yhi, xa, xb, dy, dx, flip, rows, tmp, out):
        """The RGB resize in one call (one dispatch from Python): `rows_rgb`, then `cols_rgb`, on
        bands of BAND output rows, so that a band's row pass (rows: uint16 [BAND, w*4]) is still in
        the cache when its column pass reads it."""  # pragma: no cover - compiled
        zero_border(out, ylo, yhi, xa, xb)
        band = rows.shape[0]
        for y in range(ylo, yhi, band):
            end = min(yhi, y + band)
            rows_rgb(
                src, top, left, w, y0[y + dy : end + dy], y1[y + dy : end + dy], fy[y + dy : end + dy], 0, end - y, rows
            )
            cols_rgb(rows.view(np.uint64), x0, x1, fx, 0, end - y, xa, xb, 0, dx, flip, tmp, out[:, y:end])

    @numba.njit(nogil=True, cache=True)
    def aa_cols(src, c, first, weights, precision, out):  # pragma: no cover - compiled
        """out[y, j*c + ch] = dstore.codec.antialias's column pass of src (H, W*c uint8, an image's
        rows flattened) with taps `first` (uint64 [n]) and int32 `weights` [n, K]."""
        h = src.shape[0]
        w = src.shape[1] // c
        n, taps = weights.shape
        half = np.int32(1 << (precision - 1)) if precision > 0 else np.int32(0)
        for y in range(h):
            row = src[y]
            dst = out[y]
            for j in range(n):
                base = first[j]
                for ch in range(c):
                    acc = half
                    for k in range(taps):
                        x = min(base + np.uint64(k), np.uint64(w - 1))
                        acc += weights[j, k] * np.int32(row[x * np.uint64(c) + np.uint64(ch)])
                    acc >>= precision
                    dst[j * c + ch] = 255 if acc > 255 else (0 if acc < 0 else acc)

    @numba.njit(nogil=True, cache=True)
    def aa_rows(src, first, weights, precision, acc, out):  # pragma: no cover - compiled
        """out[i] = dstore.codec.antialias's row pass of src (H, W*C uint8) with taps `first`
        (uint64 [n]) and int32 `weights` [n, K]; acc: int32 scratch of a row."""
        h, wc = src.shape
        n, taps = weights.shape
        half = np.int32(1 << (precision - 1)) if precision > 0 else np.int32(0)
        for i in range(n):
            acc[:] = half
            for k in range(taps):
                wt = weights[i, k]
                if wt == 0:
                    continue
                row = src[min(first[i] + np.uint64(k), np.uint64(h - 1))]
                for q in range(wc):
                    acc[q] += wt * np.int32(row[q])
            dst = out[i]
            for q in range(wc):
                v = acc[q] >> precision
                dst[q] = 255 if v > 255 else (0 if v < 0 else v)

    return types.SimpleNamespace(
        box_rows=box_rows, rows_any=rows_any, cols_any=cols_any, resize_rgb=resize_rgb, aa_cols=aa_cols, aa_rows=aa_rows
    )


def compiled_for(pixels: int):
    """The kernels for a sample whose output has `pixels` (H x W), or None where the numpy path
    serves it (the module docstring's rule: outputs under NATIVE_MIN_PIXELS never load them; the
    first DSTORE_NATIVE_AFTER such samples take numpy unless they are loaded already; then their
    load starts in the background). Counts the sample."""
    global _wanted, _load_after
    if pixels < NATIVE_MIN_PIXELS:
        return None
    if _load_after is None:
        _load_after = int(rc.NATIVE_AFTER.get())
    _wanted += 1
    return _kernels if _wanted <= _load_after else _compiled()


def resize_chw(
    img: np.ndarray,
    box: tuple[int, int, int, int],
    size: tuple[int, int],
    out: np.ndarray,
    *,
    shift: tuple[int, int] = (0, 0),
    flip: bool = False,
) -> None:
    """out (uint8 [C, th, tw], any strides) = the part `box` = (top, left, height, width) of the
    (H, W, C) uint8 `img`, resized to `size` as `dstore.codec.resize.resize` does, shifted as
    `dstore.codec.resize.shift` does by `shift` = (dy, dx), flipped left-right where `flip`; the kernel
    where it is loaded (and the output has NATIVE_MIN_PIXELS or more), else the numpy reference,
    with the same pixels."""
    th, tw = int(size[0]), int(size[1])
    if img.dtype != np.uint8 or img.ndim != 3 or out.shape != (img.shape[2], th, tw):
        raise ValueError(f"resize_chw: image {img.shape} {img.dtype} into {out.shape}, size {(th, tw)}")
    k = compiled_for(th * tw)
    if k is None:
        from dstore.codec import resize as rs

        top, left, bh, bw = (int(v) for v in box)
        part = rs.shift(rs.resize(img[top : top + bh, left : left + bw], (th, tw)), int(shift[0]), int(shift[1]))
        out[...] = (part[:, ::-1] if flip else part).transpose(2, 0, 1)
        return
    _resize_chw(k, img, box, (th, tw), out, shift, flip)


def _resize_chw(k, img, box, size, out, shift, flip) -> None:
    """`resize_chw` by the kernels `k`."""
    from dstore.codec import resize as rs

    top, left, bh, bw = (int(v) for v in box)
    th, tw = size
    dy, dx = int(shift[0]), int(shift[1])
    c = img.shape[2]
    ky, kx = rs.box_factors((bh, bw), (th, tw))
    src = img
    if ky > 1 or kx > 1:
        if 255 * ky * kx >= 1 << 23:  # beyond box_rows' exact division: a 57,000 px axis or more
            part = rs.fit(img[top : top + bh, left : left + bw], (th, tw))
            return _resize_chw(k, part, (0, 0, *part.shape[:2]), (th, tw), out, shift, flip)
        h, w = bh // ky, bw // kx
        src = rs.scratch("kernel_red", (h, w, c), np.uint8)
        acc = rs.scratch("kernel_acc", (w * kx * c,), np.uint32)
        k.box_rows(
            np.ascontiguousarray(img).reshape(img.shape[0], -1),
            c,
            top,
            left,
            ky,
            kx,
            np.uint64(-(-(1 << 40) // (ky * kx))),
            acc,
            src.reshape(h, w * c),
        )
        top, left, bh, bw = 0, 0, h, w
    y0, y1, fy = rs.taps(bh, th)
    x0, x1, fx = _utaps(bw, tw)
    ylo = min(th, max(0, -dy))  # [ylo, yhi): the output rows that read the resized image
    yhi = max(ylo, min(th, th - dy))
    lo = min(tw, max(0, -dx))  # [lo, hi): the output columns that do, before the flip
    hi = max(lo, min(tw, tw - dx))
    xa, xb = (tw - hi, tw - lo) if flip else (lo, hi)
    flat = (
        src.reshape(src.shape[0], -1) if src.flags.c_contiguous else np.ascontiguousarray(src).reshape(src.shape[0], -1)
    )
    if c == 3:
        k.resize_rgb(
            flat,
            top,
            left,
            bw,
            y0,
            y1,
            fy,
            x0,
            x1,
            fx,
            ylo,
            yhi,
            xa,
            xb,
            dy,
            dx,
            bool(flip),
            rs.scratch("kernel_rows", (BAND, bw * 4), np.uint16),
            rs.scratch("kernel_tmp", (tw,), np.uint64),
            out,
        )
    else:
        rows = rs.scratch("kernel_rows_any", (th, bw * c), np.uint16)
        k.rows_any(flat, top, left, bw, y0, y1, fy, max(0, ylo + dy), min(th, yhi + dy), rows)
        k.cols_any(rows, x0, x1, fx, ylo, yhi, xa, xb, dy, dx, bool(flip), out)


@functools.lru_cache(maxsize=4096)
def _utaps(n_in: int, n_out: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`dstore.codec.resize.taps` with unsigned taps (no wrap-around check in the kernels); read-only, cached."""
    from dstore.codec import resize as rs

    i0, i1, f = rs.taps(n_in, n_out)
    out = i0.astype(np.uint64), i1.astype(np.uint64), f
    for a in out[:2]:
        a.flags.writeable = False
    return out
