"""`ImageTransform(resize="torchvision")` (`--resize torchvision`): torchvision v2's pixels on real
photos, with torch's own interpolate as the reference (torchvision's tensor path is
`interpolate(mode="bilinear", antialias=True)`; torchvision itself does not import beside this torch):
its antialiased bilinear (dstore.codec.antialias), `resized_crop` for training and `Resize(256)` +
`CenterCrop(224)` for evaluation, through the crop-aware decode, the same in threads and workers."""

import types
from typing import Any

import numpy as np
import pytest
import torch
from mpi4py import MPI
from support.photos import COLOUR, jpeg, photo

from dstore.codec import antialias, decode
from dstore.errors import ConfigError
from dstore.formats import create_writer
from dstore.loader.draws import KeyedDraws
from dstore.loader.store_loader import StoreLoader
from dstore.store.data_store import DataStore
from dstore.training.augment import ImageTransform
from dstore.training.config import TrainConfig

JPEG = types.SimpleNamespace(encoding="jpeg")
COMMON: dict[str, Any] = dict(channels=3, mean=(0.5,) * 3, std=(0.25,) * 3, normalize=False, recipe="imagenet")
NATIVE_UINT8 = torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512")
"""Whether torch resizes uint8 images itself here (as torchvision does on such CPUs), else in float."""


def interpolate(img: np.ndarray, size, *, as_float: bool = False) -> np.ndarray:
    """torch's antialiased bilinear of an (H, W, C) uint8 image: its uint8 kernel (torchvision's
    CPU path with AVX2), or with as_float its float path rounded (torchvision's on a GPU)."""
    x = torch.from_numpy(np.ascontiguousarray(img)).permute(2, 0, 1)[None]
    if as_float:
        x = x.float()
    y = torch.nn.functional.interpolate(x, size=tuple(size), mode="bilinear", antialias=True, align_corners=False)
    if as_float:
        y = y.round().clamp(0, 255).to(torch.uint8)
    return y[0].permute(1, 2, 0).numpy()


def torchvision_eval(img: np.ndarray, size: int = 224) -> np.ndarray:
    """torchvision v2's `Resize(int(size * 256 / 224))` + `CenterCrop(size)` on a uint8 image tensor:
    the shorter side resized (the longer `int(short * long / shorter)`), the crop's offsets
    `int(round((resized - crop) / 2.0))` (torchvision's _compute_resized_output_size and
    _center_crop_compute_crop_anchor, written out here)."""
    h, w = img.shape[:2]
    short = int(size * 256 / 224)
    rh, rw = (int(short * h / w), short) if w <= h else (short, int(short * w / h))
    out = interpolate(img, (rh, rw)) if (rh, rw) != (h, w) else img
    top, left = int(round((rh - size) / 2.0)), int(round((rw - size) / 2.0))
    return out[top : top + size, left : left + size]


def torchvision_train(img: np.ndarray, box, flip: bool, size: int = 224) -> np.ndarray:
    """torchvision v2's `resized_crop(img, *box, size)` (a crop, then the resize), then the flip."""
    top, left, h, w = box
    out = interpolate(img[top : top + h, left : left + w], (size, size))
    return out[:, ::-1] if flip else out


def test_the_filter_is_torchs_antialiased_bilinear():
    """On crops of real photos, shrunk and enlarged on either axis: torch's uint8 kernel's pixels
    exactly (where torch has it, AVX2), and within one level of its float path (mean under 0.25)."""
    rng = np.random.default_rng(0)
    for name in COLOUR[:6]:
        img = photo(name)
        for size in ((224, 224), (64, 64), (300, 180)):
            h, w = int(rng.integers(20, img.shape[0])), int(rng.integers(20, img.shape[1]))
            top, left = int(rng.integers(0, img.shape[0] - h + 1)), int(rng.integers(0, img.shape[1] - w + 1))
            part = img[top : top + h, left : left + w]
            got = antialias.resize(part, size)
            if NATIVE_UINT8:
                assert np.array_equal(got, interpolate(part, size)), (name, (h, w), size)
            diff = np.abs(got.astype(int) - interpolate(part, size, as_float=True))
            assert diff.max() <= 1 and diff.mean() < 0.25
    # a window of the resize is that window of the whole resize
    img = photo("coffee.png")
    whole = antialias.resize(img, (273, 410))
    assert np.array_equal(
        antialias.resize(img, (100, 120), resized=(273, 410), offset=(37, 201)), whole[37:137, 201:321]
    )
    with pytest.raises(ValueError, match="outside the resized image"):
        antialias.resize(img, (100, 120), resized=(273, 410), offset=(200, 0))


@pytest.mark.parametrize("shape", [(375, 500), (200, 300), None])
def test_the_evaluation_and_training_pixels_are_torchvisions(shape):
    """`resize="torchvision"` through decode_crop (the partial decode at full scale where it is
    built) against torch on the whole decode: 0 differing values at 224 for evaluation (Resize(256)
    + CenterCrop(224), shorter sides above and below 256) and training (random resized crop +
    flip); the fast filter's differences are what docs/training.md states."""
    ev = ImageTransform(size=(224, 224), resize="torchvision", **COMMON)
    tr = ImageTransform(size=(224, 224), train=True, flip=True, resize="torchvision", **COMMON)
    fast = ImageTransform(size=(224, 224), **COMMON)
    tol = 0 if NATIVE_UINT8 else 1
    fast_means = []
    for i, name in enumerate(COLOUR[:5]):
        data = jpeg(photo(name, shape))
        full = decode.decode_image(data)
        want = torchvision_eval(full)
        arr, where, params = decode.decode_crop(data, JPEG, ev.plan, decode.crop_size(ev))
        assert np.abs(ev.pixels(arr, plan=(where, params)).astype(int) - want).max() <= tol
        arr, where, params = decode.decode_crop(data, JPEG, fast.plan, decode.crop_size(fast))
        fast_means.append(np.abs(fast.pixels(arr, plan=(where, params)).astype(int) - want).mean())
        for j in range(3):

            def plan(s, k=10 * i + j):
                return tr.plan(s, KeyedDraws(4, 0, k))

            arr, where, params = decode.decode_crop(data, JPEG, plan, decode.crop_size(tr))
            box, drawn = plan(full.shape[:2])
            want = torchvision_train(full, box, bool(drawn[0]))
            assert np.abs(tr.pixels(arr, plan=(where, params)).astype(int) - want).max() <= tol
    assert np.mean(fast_means) > 1  # the fast filter is another filter: what the option is for


def test_torchvision_resize_is_refused_where_it_cannot_be_what_torchvision_does():
    with pytest.raises(ConfigError, match="needs recipe='imagenet'"):
        ImageTransform(size=(32, 32), resize="torchvision", **{**COMMON, "recipe": "cifar"})
    with pytest.raises(ConfigError, match="resize='bicubic' must be one of"):
        ImageTransform(size=(32, 32), resize="bicubic", **COMMON)
    with pytest.raises(ConfigError, match="CenterCrop would pad"):
        ImageTransform(size=(224, 320), resize="torchvision", **COMMON)
    with pytest.raises(ConfigError, match="--resize torchvision .* needs --augment imagenet, not --augment auto"):
        TrainConfig(data="x.h5", resize="torchvision").check()
    with pytest.raises(ConfigError, match="not as a batch op: give --resize-on worker or auto"):
        TrainConfig(data="x.h5", resize="torchvision", augment="imagenet", resize_on="device").check()
    tf = ImageTransform(size=(64, 64), train=True, resize="torchvision", **COMMON)
    with pytest.raises(ConfigError, match="cannot be deferred"):
        tf.sample_part(np.zeros((80, 90, 3), np.uint8), KeyedDraws(0, 0, 0), defer_resize=True)


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("tv") / "photos.h5")
    with create_writer(path, "hdf5", encoding="jpeg", class_names=["a", "b"]) as w:
        for i in range(8):
            w.append(jpeg(photo(COLOUR[i], ((375, 500), (500, 375))[i % 2])), i % 2, f"p{i}.jpg", i)
    return path


def _batches(st_, **kw):
    with StoreLoader(st_, channels=3, **kw) as ld:
        return [x for e in (0, 1) for x, _ in ld.epoch(e)]


def test_threads_and_workers_give_the_same_torchvision_pixels(photos):
    """decode threads, 2 decode workers (resize_on auto: in the workers) and 1 with the flip as a
    batch op, 2 epochs, training and evaluation; resize_on='device' is refused with the reason."""
    for train in (True, False):
        tf = ImageTransform(size=(96, 96), train=train, flip=train, resize="torchvision", **COMMON)
        with DataStore(MPI.COMM_SELF, photos, batch_size=4, seed=2) as st_:
            ref = _batches(st_, transform=tf, decode_threads=2)
            got = _batches(st_, transform=tf, workers=2)
            assert len(ref) == len(got) == 4 and all(torch.equal(a, b) for a, b in zip(ref, got))
            got = _batches(st_, transform=tf, workers=1, batch_ops="device")  # the flip as a batch op
            assert all(torch.equal(a, b) for a, b in zip(ref, got))
            with pytest.raises(ConfigError, match="with resize='fast'"):
                _batches(st_, transform=tf, workers=1, resize_on="device")


def test_the_compiled_passes_give_the_numpy_pixels():
    from dstore.codec import kernels

    if not kernels.available():
        pytest.skip("numba is not available here")
    img = photo("chelsea.png")
    for c in (3, 1):
        part = np.ascontiguousarray(img[7:290, 3:400, :c])
        for axis, n_out in ((1, 224), (1, 500), (0, 96), (0, 301)):
            first, weights, precision = antialias.taps(part.shape[axis], n_out)
            assert np.array_equal(
                antialias._pass(part, first, weights, precision, axis, kernels._kernels),
                antialias._pass(part, first, weights, precision, axis, None),
            )
