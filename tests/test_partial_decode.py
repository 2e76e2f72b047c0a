"""The crop-aware partial decode (dstore.loader._jpegcrop, through dstore.loader.decode.decode_crop)
against the whole decode on real photos: the same pixels at every scale, chroma subsampling,
progressive and restart-marker file, and the same batches through the loader with it on and off."""

import types

import numpy as np
import pytest
import simplejpeg
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from mpi4py import MPI
from support.photos import COLOUR, JPEG_SETTINGS, jpeg, photo

from dstore.formats import create_writer
from dstore.loader import decode
from dstore.loader.store_loader import StoreLoader
from dstore.store.data_store import DataStore
from dstore.training.augment import ImageTransform

pytestmark = pytest.mark.skipif(decode._jpegcrop is None, reason="the extension dstore.loader._jpegcrop is not built here")
JPEG = types.SimpleNamespace(encoding="jpeg")


def region(data: bytes, box, denom: int = 1, gray: bool = False) -> np.ndarray:
    """The partial decode of `box` = (top, left, height, width) at 1/denom, cut to the box."""
    top, left, h, w = box
    c = 1 if gray else 3
    out = np.empty(h * (w + 64) * c, np.uint8)
    assert decode._jpegcrop is not None
    width, x0 = decode._jpegcrop.decode_region(data, out, top, left, h, w, denom, int(gray))
    assert x0 <= left and x0 + width >= left + w
    return out[: h * width * c].reshape(h, width, c)[:, left - x0:left - x0 + w]


def whole(data: bytes, denom: int = 1, gray: bool = False) -> np.ndarray:
    """The whole decode at 1/denom by the extension itself (the region is the image), checked equal
    to simplejpeg's (libjpeg-turbo's defaults both: fancy upsampling, the integer IDCT)."""
    h, w = (int(v) for v in simplejpeg.decode_jpeg_header(data)[:2])
    sh, sw = -(-h // denom), -(-w // denom)
    arr = region(data, (0, 0, sh, sw), denom, gray)
    ref = simplejpeg.decode_jpeg(data, colorspace="GRAY" if gray else "RGB", min_height=sh if denom > 1 else 0,
                                 min_width=sw if denom > 1 else 0)
    assert np.array_equal(arr, ref.reshape(arr.shape))
    return arr


def _files():
    """(kind, JPEG bytes): two photos (one 375x500, one 512x512) at each of Pillow's settings, and
    simplejpeg's 4:4:0 and 4:1:1 (Pillow writes neither) and a grey JPEG."""
    out = []
    for name, size in (("coffee.png", (375, 500)), ("astronaut.png", None)):
        img = photo(name, size)
        out += [(f"{name} {kind}", jpeg(img, **opts)) for kind, opts in JPEG_SETTINGS.items()]
        out += [(f"{name} {s}", simplejpeg.encode_jpeg(np.ascontiguousarray(img), quality=90, colorsubsampling=s))
                for s in ("440", "411")]
    out.append(("chelsea.png grey", jpeg(photo("chelsea.png")[:, :, 1])))
    return out


def _boxes(shape, rng, n: int):
    """n random boxes of an image of `shape`, and boxes at its edges and at iMCU boundaries."""
    h, w = shape
    boxes = [(0, 0, h, w), (0, 0, 1, 1), (h - 1, w - 1, 1, 1), (5, 15, h - 9, 2), (7, 16, 20, 16), (9, 17, 20, 31),
             (0, w - 33, h, 33), (h // 2, 1, 3, w - 2)]
    for _ in range(n):
        bh, bw = int(rng.integers(1, h + 1)), int(rng.integers(1, w + 1))
        boxes.append((int(rng.integers(0, h - bh + 1)), int(rng.integers(0, w - bw + 1)), bh, bw))
    return boxes


def test_every_box_of_every_kind_of_file_is_the_whole_decodes():
    """0 differing pixels: 16 random boxes and 8 at edges and iMCU boundaries, per file and scale
    (1, and 1/2, 1/4, 1/8: 4 random ones), RGB and grey output, on the 17 files of `_files` (4:4:4, 4:2:2, 4:2:0,
    4:4:0, 4:1:1, progressive, restart markers, a grey JPEG). Before the edge context was decoded,
    a 4:2:0 crop's first and last columns differed by up to 25 levels."""
    rng = np.random.default_rng(0)
    checked = 0
    for kind, data in _files():
        for denom in (1, 2, 4, 8):
            for gray in (False, True):
                if gray and denom in (2, 4):
                    continue
                ref = whole(data, denom, gray)
                for box in _boxes(ref.shape[:2], rng, 16 if denom == 1 else 4):
                    t, left, h, w = box
                    got = region(data, box, denom, gray)
                    diff = int((got != ref[t:t + h, left:left + w]).any(axis=2).sum())
                    assert diff == 0, f"{kind} at 1/{denom}{' grey' if gray else ''}, box {box}: {diff} pixels differ"
                    checked += 1
    assert checked > 900


@settings(max_examples=80)
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
    assert np.array_equal(region(blob, (top, left, bh, bw), denom), ref[top:top + bh, left:left + bw])


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
def test_the_loader_gives_the_same_batches_with_the_partial_decode_on_and_off(photos, monkeypatch, size):
    """`DSTORE_PARTIAL_DECODE=1` and `0` (the extension, or simplejpeg's whole decode at the same DCT
    scale): the same uint8 batches of the ImageNet recipe's training (2 epochs) and evaluation
    transforms on real 4:2:0 photos, at 224 (mostly full scale) and 96 (mostly 1/2 and 1/4)."""
    common = dict(channels=3, mean=(0.5,) * 3, std=(0.25,) * 3, normalize=False, recipe="imagenet")
    for tf in (ImageTransform(size=(size, size), train=True, flip=True, **common),
               ImageTransform(size=(size, size), **common)):
        with DataStore(MPI.COMM_SELF, photos, batch_size=6, seed=3) as st_:
            on = _batches(st_, tf)
            with monkeypatch.context() as m:
                m.setattr(decode, "_jpegcrop", None)
                off = _batches(st_, tf)
        assert len(on) == len(off) == 6 and on[0][0].shape == (6, 3, size, size)
        for (x, y), (u, v) in zip(on, off):
            assert torch.equal(y, v)
            assert int((x != u).sum()) == 0, f"{int((x != u).sum())} values differ, up to {int((x.int() - u.int()).abs().max())}"
