"""dstore.codec.resize: the fixed-point bilinear per sample (numpy) and per batch (torch) give the same
uint8 pixels, on the CPU and on a GPU where there is one; its taps are the half-pixel bilinear's."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dstore.codec.resize import box_factors, box_reduce, fit, resize, resize_batch, shift, taps


def _batch(images, size, offsets, device="cpu"):
    """resize_batch over `images` (each fitted first), placed on one canvas of twice `size`."""
    fitted = [fit(img, size) for img in images]
    c = images[0].shape[2]
    canvas = torch.full((len(images), c, 2 * size[0], 2 * size[1]), 255, dtype=torch.uint8)
    for k, f in enumerate(fitted):
        canvas[k, :, : f.shape[0], : f.shape[1]] = torch.from_numpy(np.ascontiguousarray(f)).permute(2, 0, 1)
    hw = torch.tensor([f.shape[:2] for f in fitted])
    return resize_batch(canvas.to(device), hw, size, torch.tensor(offsets)).cpu()


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 5), st.sampled_from([1, 3]), st.integers(1, 40), st.integers(1, 40), st.integers(0, 2**31 - 1))
def test_the_batch_resize_equals_the_per_sample_one(b, c, th, tw, seed):
    rng = np.random.default_rng(seed)
    images = [
        rng.integers(0, 256, (int(rng.integers(1, 140)), int(rng.integers(1, 140)), c), dtype=np.uint8)
        for _ in range(b)
    ]
    offsets = rng.integers(-4, 5, (b, 2)).tolist()
    got = _batch(images, (th, tw), offsets)
    for k, img in enumerate(images):
        want = shift(resize(img, (th, tw)), *offsets[k])
        assert np.array_equal(got[k].permute(1, 2, 0).numpy(), want)


def test_the_taps_are_half_pixel_bilinear():
    for n_in, n_out in [(10, 4), (4, 10), (313, 224), (224, 224), (7, 1)]:
        i0, i1, f = taps(n_in, n_out)
        x = np.clip((np.arange(n_out) + 0.5) * n_in / n_out - 0.5, 0, n_in - 1)
        assert np.all(np.abs(i0 + f / 256 - x) <= 1 / 256) and np.all(i1 - i0 <= 1) and np.all(i1 < n_in)
    img = np.arange(4 * 6 * 3, dtype=np.uint8).reshape(4, 6, 3)
    assert resize(img, (4, 6)) is img
    flat = np.full((9, 7, 1), 77, np.uint8)  # a constant image stays constant at any scale
    assert (resize(flat, (20, 3)) == 77).all() and (resize(flat, (2, 2)) == 77).all()


def test_blocks_are_averaged_before_shrinking_2x_or_more():
    assert box_factors((100, 90), (50, 40)) == (2, 2) and box_factors((99, 60), (50, 40)) == (1, 1)
    img = np.zeros((4, 4, 1), np.uint8)
    img[:2, :2] = 255
    assert box_reduce(img, 2, 2)[:, :, 0].tolist() == [[255, 0], [0, 0]]
    assert box_reduce(np.array([[[1], [2]]], np.uint8), 1, 2)[0, 0, 0] == 2  # 1.5 rounds half up
    # a checkerboard, the worst case of aliasing, shrunk 4x is its mean grey, not a pattern
    board = ((np.indices((64, 64)).sum(0) % 2) * 255).astype(np.uint8)[:, :, None]
    assert np.abs(resize(board, (16, 16)).astype(int) - 128).max() <= 1


def test_shift_is_a_crop_of_the_zero_padded_image():
    img = np.arange(1, 13, dtype=np.uint8).reshape(3, 4, 1)
    padded = np.pad(img, ((2, 2), (2, 2), (0, 0)))
    for dy in range(-2, 3):
        for dx in range(-2, 3):
            assert np.array_equal(shift(img, dy, dx), padded[2 + dy : 5 + dy, 2 + dx : 6 + dx])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU here")
def test_the_batch_resize_is_the_same_on_a_gpu():
    rng = np.random.default_rng(3)
    images = [
        rng.integers(0, 256, (int(rng.integers(200, 500)), int(rng.integers(200, 500)), 3), dtype=np.uint8)
        for _ in range(16)
    ]
    offsets = rng.integers(-28, 29, (16, 2)).tolist()
    assert torch.equal(_batch(images, (224, 224), offsets), _batch(images, (224, 224), offsets, "cuda"))
