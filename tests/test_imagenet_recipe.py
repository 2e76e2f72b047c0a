"""The ImageNet recipe (ImageTransform(recipe="imagenet")): torchvision's random resized crop
sampling, the evaluation box of Resize(size*256/224) + CenterCrop(size), the crop-aware decode
(dstore.codec.decode.decode_crop) and the same pixels from decode threads, 1 and 2 workers, the batch
ops on the device and the compiled kernels."""

import types
from typing import Any

import numpy as np
import pytest
import simplejpeg
import torch
from mpi4py import MPI

from dstore.codec import decode, kernels
from dstore.codec.decode import crop_divisor, decode_crop, decode_image, scale_box
from dstore.errors import ConfigError, SampleError
from dstore.formats import create_writer
from dstore.ingest.synthetic import synthetic_image
from dstore.loader.draws import KeyedDraws
from dstore.loader.store_loader import StoreLoader
from dstore.store.data_store import DataStore
from dstore.training.augment import ImageTransform, centre_box, random_resized_box

JPEG = types.SimpleNamespace(encoding="jpeg")
COMMON: dict[str, Any] = dict(
    channels=3, mean=(0.5, 0.5, 0.5), std=(0.25, 0.25, 0.25), normalize=False, recipe="imagenet"
)


class Scripted:
    """An rng that hands out given uniforms (in [0, 1), scaled as numpy's) and integers (offsets)."""

    def __init__(self, u, ints=()):
        self.u, self.ints = list(u), list(ints)

    def uniform(self, low, high):
        return low + (high - low) * self.u.pop(0)

    def integers(self, low, high):
        return low + self.ints.pop(0) % (high - low)


def test_random_resized_box_follows_torchvisions_algorithm():
    # a try that fits: area 0.5 * 100*200, log ratio midway (ratio 1): w = h = round(sqrt(10000)) = 100
    assert random_resized_box((100, 200), Scripted([(0.5 - 0.08) / 0.92, 0.5], [0, 37])) == (0, 37, 100, 100)
    # ten tries that do not fit (area 1.0 at the largest ratio on a tall image is too wide), then the
    # fallback: a 100x20 image (ratio 0.2 < 3/4) keeps its width and a 4:3 height, centred
    fails = [1.0 - 1e-12, 1.0 - 1e-12] * 10
    assert random_resized_box((100, 20), Scripted(fails)) == ((100 - 27) // 2, 0, 27, 20)
    # within the ratio range the fallback is the whole image
    assert random_resized_box((30, 35), Scripted([1.0 - 1e-12, 1.0 - 1e-12] * 10)) == (0, 0, 30, 35)
    # with real draws: inside the image, and area and ratio within the bounds on the tries that fit
    for i in range(300):
        top, left, h, w = random_resized_box((375, 500), KeyedDraws(1, 2, i))
        assert 0 <= top <= 375 - h and 0 <= left <= 500 - w and h > 0 and w > 0
        assert 0.07 * 375 * 500 <= h * w and 0.74 <= w / h <= 1.35


def test_the_evaluation_box_is_torchvisions_resize_then_centre_crop():
    # 375x500 -> Resize(256): 256x341; CenterCrop(224): rows 16.., columns round(58.5) = 58..;
    # mapped back by 375/256: top 23, left 85, side 328
    assert centre_box((375, 500), (224, 224)) == (23, 85, 328, 328)
    assert centre_box((500, 375), (224, 224)) == (85, 23, 328, 328)
    assert centre_box((256, 256), (224, 224)) == (16, 16, 224, 224)  # no resize: the plain centre crop


def test_the_recipe_refuses_a_padded_crop():
    with pytest.raises(ConfigError, match="pad=4 must be 0"):
        ImageTransform(size=(32, 32), train=True, pad=4, **COMMON)
    with pytest.raises(ConfigError, match="recipe='vgg'"):
        ImageTransform(size=(32, 32), **{**COMMON, "recipe": "vgg"})


def test_crop_divisor_and_scale_box():
    assert crop_divisor((500, 460), (224, 224)) == 2 and crop_divisor((400, 500), (224, 224)) == 1
    assert crop_divisor((300, 260), (32, 32)) == 8 and crop_divisor((200, 130), (32, 32)) == 4
    assert scale_box((23, 85, 328, 328), 1, (375, 500)) == (23, 85, 328, 328)
    # edges divided by 2, rounded half up (rows 23..351 -> 12..176), inside the 1/2-scale image
    assert scale_box((23, 85, 328, 328), 2, (188, 250)) == (12, 43, 164, 164)


def _jpeg(i: int) -> bytes:
    img, _ = synthetic_image(i, amplitude=20)  # 333..500 px, ImageNet-like
    return simplejpeg.encode_jpeg(img, quality=90)


def test_crop_aware_decode_decodes_less_and_stays_close_to_the_full_decode():
    """At 64x64 most crops decode at 1/2 or 1/4; a crop decoded at scale 1 gives the full decode's
    pixels exactly; a reduced one differs (the reduced IDCT is a box filter before the bilinear):
    mean absolute difference measured 3.2-4.7 levels per image on these noisy images, bounded at 8."""
    tf = ImageTransform(size=(64, 64), train=True, flip=True, **COMMON)
    seen = set()
    for i in range(12):
        data = _jpeg(i)
        full = decode_image(data)
        box, _ = tf.plan(full.shape[:2], KeyedDraws(0, 0, i))
        k = crop_divisor(box[2:], tf.size)
        seen.add(k)
        arr, where, params = decode_crop(data, JPEG, lambda s, i=i: tf.plan(s, KeyedDraws(0, 0, i)), tf.size)
        if decode._jpegcrop is not None or k > 1:  # the region, or the scaled image: less than the whole
            assert arr.shape[0] * arr.shape[1] < full.shape[0] * full.shape[1]
        want = tf.pixels(full, KeyedDraws(0, 0, i))
        got = tf.pixels(arr, plan=(where, params))
        if k == 1:
            assert np.array_equal(got, want)
        else:
            assert np.abs(got.astype(int) - want.astype(int)).mean() < 8
    assert seen >= {1, 2, 4}


@pytest.mark.skipif(decode._jpegcrop is None, reason="the extension dstore.codec._jpegcrop is not built here")
def test_the_partial_decode_gives_the_whole_decodes_pixels(monkeypatch):
    """libjpeg's partial decode (dstore.codec._jpegcrop) against simplejpeg's whole decode at the same
    scale, cropped: the same pixels, at 224 (scale 1) and 32 (1/2-1/8), RGB and grey."""
    for size, channels in (((224, 224), 3), ((32, 32), 3), ((32, 32), 1)):
        tf = ImageTransform(
            size=size,
            train=True,
            flip=True,
            **{**COMMON, "channels": channels, "mean": (0.5,) * channels, "std": (0.2,) * channels},
        )
        for i in range(8):
            data = _jpeg(i)

            def plan(s, i=i, tf=tf):
                return tf.plan(s, KeyedDraws(2, 0, i))

            part, where, params = decode_crop(data, JPEG, plan, size, channels=channels)
            with monkeypatch.context() as m:
                m.setattr(decode, "_jpegcrop", None)
                whole, where_w, params_w = decode_crop(data, JPEG, plan, size, channels=channels)
            assert np.array_equal(params, params_w) and part.shape[0] == where[2] < whole.shape[0]
            t, left, h, w = where
            tw, lw = where_w[:2]
            assert np.array_equal(part[t : t + h, left : left + w], whole[tw : tw + h, lw : lw + w])
    assert decode._jpegcrop is not None  # the skipif above
    with pytest.raises(ValueError, match="outside"):
        decode._jpegcrop.decode_region(_jpeg(0), np.empty(10**6, np.uint8), 0, 0, 9999, 10, 1, 0)


def _container(path: str, n: int) -> str:
    rng = np.random.default_rng(0)
    with create_writer(path, "hdf5", encoding="jpeg", class_names=["a", "b"]) as w:
        for i in range(n):  # 90..300 px: at 32x32 every DCT divisor (1, 2, 4, 8) occurs
            h, w_ = (int(v) for v in rng.integers(90, 300, size=2))
            img = np.clip(rng.normal(128, 40, (h // 8 + 1, w_ // 8 + 1, 3)), 0, 255).astype(np.uint8)
            img = np.repeat(np.repeat(img, 8, 0), 8, 1)[:h, :w_]
            w.append(simplejpeg.encode_jpeg(np.ascontiguousarray(img), quality=85), i % 2, f"p{i}.jpg", i)
    return path


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    return _container(str(tmp_path_factory.mktemp("inet") / "photos.h5"), 24)


def _batches(st, epochs, **kw):
    with StoreLoader(st, channels=3, **kw) as ld:
        return [(x, y) for e in epochs for x, y in ld.epoch(e)]


def _same(a, b) -> bool:
    return len(a) == len(b) and all(torch.equal(x, u) and torch.equal(y, v) for (x, y), (u, v) in zip(a, b))


def test_threads_workers_and_the_device_resize_give_the_same_pixels(photos):
    train = ImageTransform(size=(32, 32), train=True, flip=True, **COMMON)
    evaluate = ImageTransform(size=(32, 32), **COMMON)
    with DataStore(MPI.COMM_SELF, photos, batch_size=8, seed=5) as st:
        for tf in (train, evaluate):
            ref = _batches(st, (0, 1), transform=tf, decode_threads=2)
            assert ref[0][0].shape == (8, 3, 32, 32)
            assert _same(ref, _batches(st, (0, 1), transform=tf, workers=1))
            assert _same(ref, _batches(st, (0, 1), transform=tf, workers=2, batch_ops="device"))
            assert _same(ref, _batches(st, (0, 1), transform=tf, workers=2, resize_on="device"))
        # the crop is drawn per (seed, epoch, id): two epochs differ, and one sample equals the
        # transform applied to its full decode wherever its crop decodes at full scale
        ref = _batches(st, (0, 1), transform=train, decode_threads=1)
        assert not torch.equal(ref[0][0], ref[3][0])


def test_the_compiled_kernels_give_the_numpy_pixels():
    if not kernels.available():
        pytest.skip("numba is not available here")
    tf = ImageTransform(size=(80, 80), train=True, flip=True, **COMMON)  # 6,400 px: the kernels' size
    for i in range(6):
        data = _jpeg(i)
        arr, where, params = decode_crop(data, JPEG, lambda s, i=i: tf.plan(s, KeyedDraws(3, 1, i)), tf.size)
        out = np.empty((3, 80, 80), np.uint8)
        kernels._resize_chw(kernels._kernels, arr, where, (80, 80), out, (0, 0), bool(params[0]))
        assert np.array_equal(out.transpose(1, 2, 0), tf.pixels(arr, plan=(where, params)))


@pytest.mark.mpi
def test_dstore_train_with_the_imagenet_recipe_is_the_same_run_in_threads_and_workers(photos, tmp_path):
    """`dstore train --augment imagenet` on a tiny model end to end: the start line names the model,
    its input size and why; decode threads and 2 decode workers train on the same pixels, so the
    deterministic runs' losses and accuracies are equal."""
    from support.mpirun import run_mpi

    from dstore.training.metrics import read_jsonl

    runs = []
    for workers in ("0", "2"):
        run_dir = tmp_path / f"w{workers}"
        res = run_mpi(
            1,
            [
                "dstore",
                "train",
                photos,
                "--augment",
                "imagenet",
                "--model",
                "small_cnn",
                "--image-size",
                "32",
                "--epochs",
                "1",
                "--batch-size",
                "8",
                "--deterministic",
                "--no-progress",
                "--decode-workers",
                workers,
                "--run-dir",
                str(run_dir),
            ],
            timeout=120,
        )
        assert "model small_cnn at 32x32 (--model small_cnn;" in res.stdout and "--augment imagenet" in res.stdout
        rows = read_jsonl(run_dir / "metrics.jsonl")
        runs.append([(r["train_loss"], r["train_accuracy"], r["val_loss"]) for r in rows if "epoch" in r])
    assert runs[0] == runs[1] and len(runs[0]) == 1


def test_a_broken_jpeg_is_refused_naming_the_sample():
    """A file cut short within the rows the crop needs, or not a JPEG: SampleError naming the sample,
    with the partial decode as with the whole one (libjpeg's warnings are errors, as simplejpeg's)."""
    data = _jpeg(0)
    whole = lambda s: ((0, 0, s[0], s[1]), None)  # noqa: E731 - the crop is the whole image
    for bad in (data[: len(data) // 2], b"\xff\xd8 not a jpeg"):
        with pytest.raises(SampleError, match="cannot decode sample 7"):
            decode_crop(bad, JPEG, whole, (32, 32), name="sample 7")
    if decode._jpegcrop is not None:
        with pytest.raises(ValueError, match="Premature end"):
            h, w = (int(v) for v in simplejpeg.decode_jpeg_header(data)[:2])
            decode._jpegcrop.decode_region(data[: len(data) // 2], np.empty(h * w * 3, np.uint8), 0, 0, h, w, 1, 0)


def test_dstore_partial_decode_0_turns_the_partial_decode_off():
    import subprocess
    import sys

    code = "from dstore.codec import decode; print(decode._jpegcrop is None)"
    env = {**__import__("os").environ, "DSTORE_PARTIAL_DECODE": "0"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "True"
