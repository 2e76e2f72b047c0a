"""The crop-aware partial decode (dstore.codec._jpegcrop, through dstore.codec.decode.decode_crop)
against the whole decode on real photos: the same pixels at every scale, chroma subsampling,
progressive and restart-marker file, and the same batches through the loader with it on and off."""

import types
from typing import Any

import numpy as np
import pytest
import simplejpeg
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from mpi4py import MPI
from support.photos import COLOUR, JPEG_SETTINGS, jpeg, photo

from dstore.codec import decode
from dstore.errors import SampleError
from dstore.formats import create_writer
from dstore.loader.store_loader import StoreLoader
from dstore.store.data_store import DataStore
from dstore.training.augment import ImageTransform

pytestmark = pytest.mark.skipif(
    decode.extension() is None, reason="the extension dstore.codec._jpegcrop is not built here"
)
JPEG = types.SimpleNamespace(encoding="jpeg")


def region(data: bytes, box, denom: int = 1, gray: bool = False) -> np.ndarray:
    """The partial decode of `box` = (top, left, height, width) at 1/denom, cut to the box."""
    top, left, h, w = box
    c = 1 if gray else 3
    out = np.empty(h * (w + 64) * c, np.uint8)
    ext = decode.extension()
    assert ext is not None
    width, x0 = ext.decode_region(data, out, top, left, h, w, denom, int(gray))
    assert x0 <= left and x0 + width >= left + w
    return out[: h * width * c].reshape(h, width, c)[:, left - x0 : left - x0 + w]


def whole(data: bytes, denom: int = 1, gray: bool = False) -> np.ndarray:
    """The whole decode at 1/denom by the extension itself (the region is the image), checked equal
    to simplejpeg's (libjpeg-turbo's defaults both: fancy upsampling, the integer IDCT)."""
    h, w = (int(v) for v in simplejpeg.decode_jpeg_header(data)[:2])
    sh, sw = -(-h // denom), -(-w // denom)
    arr = region(data, (0, 0, sh, sw), denom, gray)
    ref = simplejpeg.decode_jpeg(
        data, colorspace="GRAY" if gray else "RGB", min_height=sh if denom > 1 else 0, min_width=sw if denom > 1 else 0
    )
    assert np.array_equal(arr, ref.reshape(arr.shape))
    return arr


def _files():
    """(kind, JPEG bytes): a 375x500 photo at each of Pillow's settings, and simplejpeg's 4:4:0 and
    4:1:1 (Pillow writes neither); a 512x512 one at 4:2:0; a grey JPEG."""
    img = photo("coffee.png", (375, 500))
    out = [(f"coffee.png {kind}", jpeg(img, **opts)) for kind, opts in JPEG_SETTINGS.items()]
    out += [
        (f"coffee.png {s}", simplejpeg.encode_jpeg(np.ascontiguousarray(img), quality=90, colorsubsampling=s))
        for s in ("440", "411")
    ]
    out.append(("astronaut.png 4:2:0", jpeg(photo("astronaut.png"), **JPEG_SETTINGS["4:2:0"])))
    out.append(("chelsea.png grey", jpeg(photo("chelsea.png")[:, :, 1])))
    return out


def _boxes(shape, rng, n: int):
    """n random boxes of an image of `shape`, and boxes at its edges and at iMCU boundaries."""
    h, w = shape
    boxes = [
        (0, 0, h, w),
        (0, 0, 1, 1),
        (h - 1, w - 1, 1, 1),
        (5, 15, h - 9, 2),
        (7, 16, 20, 16),
        (9, 17, 20, 31),
        (0, w - 33, h, 33),
        (h // 2, 1, 3, w - 2),
    ]
    for _ in range(n):
        bh, bw = int(rng.integers(1, h + 1)), int(rng.integers(1, w + 1))
        boxes.append((int(rng.integers(0, h - bh + 1)), int(rng.integers(0, w - bw + 1)), bh, bw))
    return boxes


def test_every_box_of_every_kind_of_file_is_the_whole_decodes():
    """0 differing pixels: 12 random boxes and 8 at edges and iMCU boundaries, per file and scale
    (1, and 1/2, 1/4, 1/8: 3 random ones), RGB and grey output, on the 10 files of `_files` (4:4:4,
    4:2:2, 4:2:0, 4:4:0, 4:1:1, progressive, restart markers, a grey JPEG). Before the edge context was decoded,
    a 4:2:0 crop's first and last columns differed by up to 25 levels."""
    rng = np.random.default_rng(0)
    checked = 0
    for kind, data in _files():
        for denom in (1, 2, 4, 8):
            for gray in (False, True):
                if gray and denom != 1:
                    continue
                ref = whole(data, denom, gray)
                for box in _boxes(ref.shape[:2], rng, 12 if denom == 1 else 3):
                    t, left, h, w = box
                    got = region(data, box, denom, gray)
                    diff = int((got != ref[t : t + h, left : left + w]).any(axis=2).sum())
                    assert diff == 0, f"{kind} at 1/{denom}{' grey' if gray else ''}, box {box}: {diff} pixels differ"
                    checked += 1
    assert checked > 450


@settings(max_examples=60)
@given(st.sampled_from(sorted(JPEG_SETTINGS)), st.sampled_from([1, 1, 2]), st.data())
def test_any_box_is_the_whole_decodes(kind, denom, data):
    """Hypothesis over boxes of a 4:2:0/4:2:2/4:4:4 photo of ImageNet's size (rocket, 375x500)."""
    blob = _rocket(kind)
    ref = _rocket_whole(kind, denom)
    h, w = ref.shape[:2]
    top = data.draw(st.integers(0, h - 1))
    left = data.draw(st.integers(0, w - 1))
    bh = data.draw(st.integers(1, h - top))
    bw = data.draw(st.integers(1, w - left))
    assert np.array_equal(region(blob, (top, left, bh, bw), denom), ref[top : top + bh, left : left + bw])


_cache: dict = {}


def _rocket(kind: str) -> bytes:
    if kind not in _cache:
        _cache[kind] = jpeg(photo("rocket.jpg", (375, 500)), **JPEG_SETTINGS[kind])
    return _cache[kind]


def _rocket_whole(kind: str, denom: int) -> np.ndarray:
    key = (kind, denom)
    if key not in _cache:
        _cache[key] = whole(_rocket(kind), denom)
    return _cache[key]


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    """A container of 18 real photos as 4:2:0 JPEGs (Pillow's default), 375x500, 500x375 and their own sizes."""
    path = str(tmp_path_factory.mktemp("photos") / "photos.h5")
    with create_writer(path, "hdf5", encoding="jpeg", class_names=["a", "b"]) as w:
        for i in range(18):
            name = COLOUR[i % len(COLOUR)]
            size = ((375, 500), (500, 375), None)[i % 3] if "retina" not in name else (375, 500)
            w.append(jpeg(photo(name, size), quality=85 + i % 10), i % 2, f"{name}-{i}.jpg", i)
    return path


def _batches(st_, tf, epochs=(0, 1)):
    with StoreLoader(st_, channels=3, transform=tf, decode_threads=2) as ld:
        return [(x, y) for e in epochs for x, y in ld.epoch(e)]


@pytest.mark.parametrize("size", [224, 96])
def test_the_loader_gives_the_same_batches_with_the_partial_decode_on_and_off(photos, size):
    """`DSTORE_PARTIAL_DECODE=1` and `0` (the extension, or simplejpeg's whole decode at the same DCT
    scale): the same uint8 batches of the ImageNet recipe's training (2 epochs) and evaluation
    transforms on real 4:2:0 photos, at 224 (mostly full scale) and 96 (mostly 1/2 and 1/4)."""
    common: dict[str, Any] = dict(channels=3, mean=(0.5,) * 3, std=(0.25,) * 3, normalize=False, recipe="imagenet")
    for tf in (
        ImageTransform(size=(size, size), train=True, flip=True, **common),
        ImageTransform(size=(size, size), **common),
    ):
        with DataStore(MPI.COMM_SELF, photos, batch_size=6, seed=3) as st_:
            on = _batches(st_, tf)
            with decode.using_extension(None):
                off = _batches(st_, tf)
        assert len(on) == len(off) == 6 and on[0][0].shape == (6, 3, size, size)
        for (x, y), (u, v) in zip(on, off):
            assert torch.equal(y, v)
            assert int((x != u).sum()) == 0, (
                f"{int((x != u).sum())} values differ, up to {int((x.int() - u.int()).abs().max())}"
            )


def _damaged(data: bytes, kind: str, at: float) -> bytes:
    """`data` damaged from `at` (a fraction of its length) on: cut there, 48 bytes overwritten with
    noise, or 400 bytes zeroed."""
    p = int(len(data) * at)
    if kind == "cut":
        return data[:p]
    bad = bytearray(data)
    if kind == "noise":
        bad[p : p + 48] = np.random.default_rng(p).integers(0, 256, 48, dtype=np.uint8).tobytes()
    else:
        bad[p : p + 400] = bytes(400)
    return bytes(bad)


def test_damage_below_the_crop_is_refused_as_the_whole_decode_refuses_it():
    """A crop in the top quarter of a real photo, the file damaged in its last fifth (rows the crop
    never reads): refused naming the sample (SampleError) exactly where simplejpeg's whole decode
    refuses the file, with its message, on baseline 4:2:0 and 4:4:4, restart-marker and progressive
    files (36 damaged files). Before, the partial decode stopped below the crop and served them."""
    img = photo("motorcycle_left.png", (375, 500))
    top_quarter = lambda shape: ((8, 40, shape[0] // 4, shape[1] // 2), None)  # noqa: E731 - a fixed plan
    refused = 0
    for kind in ("4:2:0", "4:4:4", "4:2:0 restart markers", "4:2:0 progressive"):
        data = jpeg(img, **JPEG_SETTINGS[kind])
        decode.decode_crop(data, JPEG, top_quarter, (64, 64), name="clean")  # the clean file decodes
        for damage in ("cut", "noise", "zeros"):
            for at in (0.82, 0.9, 0.97):
                bad = _damaged(data, damage, at)
                try:
                    simplejpeg.decode_jpeg(bad)
                except ValueError as exc:
                    whole_says = str(exc)
                else:  # the whole decode takes it (damage libjpeg cannot see): so does the partial one
                    decode.decode_crop(bad, JPEG, top_quarter, (64, 64), name="sample 7")
                    continue
                with pytest.raises(ValueError):  # the extension itself, not only its fallback
                    region(bad, (8, 40, 375 // 4, 250))
                with pytest.raises(SampleError, match=r"cannot decode sample 7: ValueError: ") as info:
                    decode.decode_crop(bad, JPEG, top_quarter, (64, 64), name="sample 7")
                assert whole_says in str(info.value)  # the whole decode's own message
                refused += 1
    assert refused >= 24


@pytest.fixture(scope="module")
def damaged(tmp_path_factory):
    """A container of 6 real photos; photo 4 cut at 98.5% of its bytes (its last rows: below the
    evaluation transform's centre crop, which ends 24 rows above the bottom)."""
    path = str(tmp_path_factory.mktemp("damaged") / "damaged.h5")
    with create_writer(path, "hdf5", encoding="jpeg", class_names=["a", "b"]) as w:
        for i in range(6):
            data = jpeg(photo(COLOUR[i], (375, 500)))
            w.append(_damaged(data, "cut", 0.985) if i == 4 else data, i % 2, f"photo{i}.jpg", i)
    return path


def test_the_loader_refuses_a_photo_damaged_below_its_crop_naming_it(damaged):
    """Through StoreLoader (decode threads, the ImageNet recipe's evaluation transform, whose centre
    crop stops above the damage): the epoch ends in a SampleError naming the damaged sample, as
    with the whole decode."""
    tf = ImageTransform(size=(64, 64), channels=3, mean=(0.5,) * 3, std=(0.25,) * 3, normalize=False, recipe="imagenet")
    with DataStore(MPI.COMM_SELF, damaged, batch_size=3, seed=1) as st_:
        with pytest.raises(SampleError, match=r"^cannot decode sample 4: ValueError: Premature end of JPEG file"):
            _batches(st_, tf, epochs=(0,))


def test_an_older_build_of_the_extension_is_not_used_and_said():
    """A build without the check to the end (an install that did not rebuild the extension): not
    used (whole decodes, which check every file), with one RuntimeWarning naming it."""
    old = types.SimpleNamespace(VERSION=2, __file__="/site/dstore/loader/_jpegcrop.so")
    with pytest.warns(RuntimeWarning, match=r"_jpegcrop.so\) is an older build .*version 2 < 3.*decoded whole"):
        assert decode.usable(old) is None
    assert decode.usable(decode.extension()) is decode.extension() and decode.usable(None) is None
