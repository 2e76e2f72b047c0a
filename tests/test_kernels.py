"""dstore.codec.kernels: the compiled resize, crop, flip and CHW copy give the numpy reference's pixels
(dstore.codec.resize) exactly, on RGB, grey and 4-channel images, with box-averaging, shifts past the
edge and flips; the trainer's `sample_into` gives `sample_part` + `finish`'s pixels; without numba
(or DSTORE_NATIVE=0) the same pixels come from numpy. Also the JPEG decode's DCT scale choice."""

import threading

import numpy as np
import pytest
import simplejpeg
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dstore.codec import kernels
from dstore.codec import resize as rs
from dstore.codec.decode import DCT_DIVISORS, dct_scale, decode_image
from dstore.training.augment import ImageTransform, default_augmentation

pytestmark = pytest.mark.skipif(not kernels.available(), reason="numba is not installed here")


def _kernel(img, box, size, out, shift=(0, 0), flip=False):
    """The kernels on any size (`resize_chw` itself takes the numpy path under NATIVE_MIN_PIXELS)."""
    assert kernels.available()
    kernels._resize_chw(kernels._kernels, img, box, size, out, shift, flip)


def _reference(img, box, size, shift, flip):
    top, left, bh, bw = box
    part = rs.shift(rs.resize(img[top : top + bh, left : left + bw], size), *shift)
    return np.ascontiguousarray((part[:, ::-1] if flip else part).transpose(2, 0, 1))


@st.composite
def _case(draw):
    c = draw(st.sampled_from([1, 3, 4]))
    h, w = draw(st.integers(1, 200)), draw(st.integers(1, 200))
    top, left = draw(st.integers(0, h - 1)), draw(st.integers(0, w - 1))
    bh, bw = draw(st.integers(1, h - top)), draw(st.integers(1, w - left))
    size = draw(st.integers(1, 90)), draw(st.integers(1, 90))
    shift = draw(st.integers(-100, 100)), draw(st.integers(-100, 100))
    return c, (h, w), (top, left, bh, bw), size, shift, draw(st.booleans()), draw(st.integers(0, 2**32 - 1))


@settings(max_examples=300, deadline=None)
@given(_case())
def test_the_kernel_gives_the_numpy_reference_pixels(case):
    c, (h, w), box, size, shift, flip, seed = case
    img = np.random.default_rng(seed).integers(0, 256, (h, w, c), dtype=np.uint8)
    out = np.full((c, *size), 7, np.uint8)  # what the kernel must overwrite, zeros included
    _kernel(img, box, size, out, shift, flip)
    assert np.array_equal(out, _reference(img, box, size, shift, flip)), (c, (h, w), box, size, shift, flip)


def test_large_box_factors_divide_exactly():
    """Blocks of up to 64 x 64 averaged (the multiply-and-shift division against numpy's //), on a
    non-contiguous view and into a strided output (a batch's sample of a bigger buffer)."""
    rng = np.random.default_rng(3)
    for shape, size in [
        ((640, 700, 3), (10, 11)),
        ((256, 256, 1), (4, 4)),
        ((255, 511, 3), (1, 1)),
        ((99, 301, 3), (33, 3)),
    ]:
        img = rng.integers(0, 256, shape, dtype=np.uint8)
        img[: shape[0] // 2] = 255  # block sums at the top of their range
        box = (0, 0, *shape[:2])
        batch = np.zeros((2, shape[2], size[0], size[1] * 2), np.uint8)
        out = batch[1, :, :, ::2]
        _kernel(img, box, size, out)
        assert np.array_equal(out, _reference(img, box, size, (0, 0), False)), shape
    view = rng.integers(0, 256, (300, 300, 3), dtype=np.uint8)[::2, 1::1]
    out = np.empty((3, 20, 30), np.uint8)
    _kernel(view, (5, 7, 140, 200), (20, 30), out, (1, -2), True)
    assert np.array_equal(out, _reference(view, (5, 7, 140, 200), (20, 30), (1, -2), True))


def test_the_kernel_equals_the_batch_resize():
    """The kernel against `resize_batch` (the device's op, here on the CPU) on the same images."""
    rng = np.random.default_rng(5)
    size = (24, 20)
    images = [
        rng.integers(0, 256, (int(rng.integers(20, 80)), int(rng.integers(20, 80)), 3), dtype=np.uint8)
        for _ in range(6)
    ]
    offsets = rng.integers(-3, 4, (6, 2))
    fitted = [rs.fit(img, size) for img in images]
    canvas = torch.zeros((6, 3, 2 * size[0], 2 * size[1]), dtype=torch.uint8)
    for k, f in enumerate(fitted):
        canvas[k, :, : f.shape[0], : f.shape[1]] = torch.from_numpy(np.ascontiguousarray(f.transpose(2, 0, 1)))
    got = rs.resize_batch(canvas, torch.tensor([f.shape[:2] for f in fitted]), size, torch.from_numpy(offsets))
    for k, img in enumerate(images):
        out = np.empty((3, *size), np.uint8)
        _kernel(img, (0, 0, *img.shape[:2]), size, out, tuple(offsets[k]))
        assert np.array_equal(out, got[k].numpy()), k


@pytest.mark.parametrize(("jitter", "s"), [(0.0, (32, 28)), (0.4, (32, 28)), (0.2, (80, 72))])
def test_sample_into_gives_sample_part_and_finish(jitter, s):
    """Under NATIVE_MIN_PIXELS by numpy, at 80 x 72 by the kernels."""
    pad, flip = default_augmentation(s)
    tf = ImageTransform(
        size=s,
        channels=3,
        mean=(0.5,) * 3,
        std=(0.25,) * 3,
        train=True,
        pad=pad,
        flip=flip,
        normalize=False,
        jitter=jitter,
    )
    rng = np.random.default_rng(11)
    for k in range(40):
        img = rng.integers(0, 256, (int(rng.integers(10, 200)), int(rng.integers(10, 200)), 3), dtype=np.uint8)
        out = np.empty((3, *s), np.uint8)
        p = tf.sample_into(img, np.random.default_rng([1, k]), out, finish=True)
        assert np.array_equal(out, tf.pixels(img, np.random.default_rng([1, k])).transpose(2, 0, 1)), k
        part = np.empty((3, *s), np.uint8)
        q = tf.sample_into(img, np.random.default_rng([1, k]), part, finish=False)  # the batch part left to do
        want, wp = tf.sample_part(img, np.random.default_rng([1, k]))
        assert np.array_equal(part, want.transpose(2, 0, 1)) and np.array_equal(q, wp) and np.array_equal(p, wp)


def test_without_numba_the_numpy_reference_serves(monkeypatch):
    rng = np.random.default_rng(2)
    img = rng.integers(0, 256, (190, 170, 3), dtype=np.uint8)
    fast = np.empty((3, 70, 80), np.uint8)
    _kernel(img, (3, 4, 180, 160), (70, 80), fast, (2, -5), True)
    monkeypatch.setenv("DSTORE_NATIVE", "0")
    kernels._reset()
    try:
        assert not kernels.available()
        slow = np.empty_like(fast)
        kernels.resize_chw(img, (3, 4, 180, 160), (70, 80), slow, shift=(2, -5), flip=True)
    finally:
        monkeypatch.delenv("DSTORE_NATIVE")
        kernels._reset()
    assert np.array_equal(fast, slow) and kernels.available() and kernels._kernels is not None


def test_the_kernels_load_after_some_samples_and_nobody_waits(monkeypatch):
    """The first DSTORE_NATIVE_AFTER samples take the numpy path and start no load; the next one
    starts it and does not wait for it (the numpy path serves until it is done, the same pixels)."""
    kernels._reset()
    monkeypatch.setenv("DSTORE_NATIVE_AFTER", "3")
    gate = threading.Event()
    real = kernels._load
    monkeypatch.setattr(kernels, "_load", lambda: (gate.wait(10), real()))
    img = np.random.default_rng(4).integers(0, 256, (120, 100, 3), dtype=np.uint8)
    outs = [np.empty((3, 64, 64), np.uint8) for _ in range(6)]
    try:
        for out in outs[:3]:
            kernels.resize_chw(img, (0, 0, 120, 100), (64, 64), out)
        assert kernels._loader is None  # not started yet
        kernels.resize_chw(img, (0, 0, 120, 100), (64, 64), outs[3])  # starts the load, does not wait
        assert kernels._loader is not None and kernels._kernels is None
        small = np.empty((3, 8, 8), np.uint8)
        kernels.resize_chw(img, (0, 0, 120, 100), (8, 8), small)  # under NATIVE_MIN_PIXELS: not counted
        gate.set()
        assert kernels.available()
        kernels.resize_chw(img, (0, 0, 120, 100), (64, 64), outs[4])
        _kernel(img, (0, 0, 120, 100), (64, 64), outs[5])
    finally:
        gate.set()
        monkeypatch.delenv("DSTORE_NATIVE_AFTER")
        kernels._reset()
        kernels.available()
    assert all(np.array_equal(outs[0], o) for o in outs[1:])


def test_the_kernel_refuses_a_mismatched_output():
    img = np.zeros((10, 10, 3), np.uint8)
    with pytest.raises(ValueError, match="resize_chw"):
        kernels.resize_chw(img, (0, 0, 10, 10), (5, 5), np.empty((1, 5, 5), np.uint8))


def test_jpegs_decode_at_a_power_of_two_scale_or_in_full():
    """1/2, 1/4, 1/8 where that still covers the minimum on both axes, else the full image (the
    other M/8 scales cost as much as a full decode: DCT_DIVISORS)."""
    rng = np.random.default_rng(0)
    for h, w in [(500, 375), (449, 900), (447, 900), (1800, 1800), (3600, 240), (224, 224), (100, 50)]:
        data = simplejpeg.encode_jpeg(rng.integers(0, 256, (h, w, 3), dtype=np.uint8))
        got = decode_image(data, min_size=(224, 224)).shape[:2]
        fits = [k for k in DCT_DIVISORS if -(-h // k) >= 224 and -(-w // k) >= 224]
        want = (-(-h // fits[0]), -(-w // fits[0])) if fits else (h, w)
        assert got == want, (h, w, got, want)
        assert dct_scale(data, None) == (0, 0) and decode_image(data).shape[:2] == (h, w)
