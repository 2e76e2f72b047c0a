"""Images from the wild decode to the right 8-bit pixels or are refused by name (issue 29): 16-bit
grey scaled by its high byte, float and 32-bit refused (by `verify --decode` too), grey kept grey
only where asked, a grey+colour set served as RGB by StoreLoader and a mix, decode errors escaped,
and the loader's and the trainer's arguments checked. In-process on COMM_SELF."""

from __future__ import annotations

import io
import struct
import zlib

import numpy as np
import pytest
import torch
from mpi4py import MPI
from PIL import Image
from support.formats import write_samples

from dstore.codec.decode import decode_image
from dstore.errors import ConfigError, SampleError
from dstore.loader.store_loader import StoreLoader
from dstore.runtime.job import describe
from dstore.store.data_store import DataStore
from dstore.verify import verify_container

WIDE = np.array([[0, 255, 256, 32768, 65535, 65280, 128, 40000]], np.uint16)
HIGH_BYTE = [0, 0, 1, 128, 255, 255, 0, 156]  # WIDE >> 8


def encoded(im: Image.Image, fmt: str, **kw) -> bytes:
    buf = io.BytesIO()
    im.save(buf, fmt, **kw)
    return buf.getvalue()


def png16(arr: np.ndarray, color_type: int) -> bytes:
    """A 16-bit PNG of `arr` (H, W[, C]) written by hand (Pillow cannot write 48-bit RGB)."""
    h, w = arr.shape[:2]
    rows = b"".join(b"\x00" + arr[y].astype(">u2").tobytes() for y in range(h))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 16, color_type, 0, 0, 0))
        + chunk(b"IDAT", zlib.compress(rows))
        + chunk(b"IEND", b"")
    )


def solid_jpeg(mode: str, value, side: int = 16) -> bytes:
    return encoded(Image.new(mode, (side, side), value), "JPEG", quality=95)


@pytest.mark.parametrize(
    "blob",
    [
        pytest.param(lambda: encoded(Image.fromarray(WIDE), "PNG"), id="png-I;16"),
        pytest.param(lambda: encoded(Image.fromarray(WIDE), "TIFF"), id="tiff-I;16"),
        pytest.param(
            lambda: encoded(Image.frombytes("I;16B", (8, 1), WIDE.astype(">u2").tobytes()), "TIFF"), id="tiff-I;16B"
        ),
        pytest.param(lambda: encoded(Image.fromarray(WIDE.astype(np.int32)), "TIFF"), id="tiff-I"),
    ],
)
def test_16_bit_grey_keeps_its_high_byte(blob):
    data = blob()
    grey = decode_image(data)
    assert grey.shape == (1, 8, 1) and grey.dtype == np.uint8
    assert grey[0, :, 0].tolist() == HIGH_BYTE  # not convert("L")'s 255 for everything above 255
    rgb = decode_image(data, channels=3)
    assert rgb.shape == (1, 8, 3) and (rgb == grey).all()


def test_48_bit_rgb_and_16_bit_grey_alpha_keep_their_high_byte():
    rgb16 = np.stack([WIDE, WIDE[:, ::-1], WIDE // 2], -1)
    assert decode_image(png16(rgb16, 2)).tolist() == (rgb16 >> 8).astype(np.uint8).tolist()
    la = decode_image(png16(np.stack([WIDE, WIDE], -1), 4), channels=1)
    assert la[0, :, 0].tolist() == HIGH_BYTE


def test_images_without_an_8_bit_scale_are_refused_by_name():
    floats = encoded(Image.fromarray(WIDE.astype(np.float32) / 65535), "TIFF")
    with pytest.raises(SampleError, match=r"cannot decode f\.tif faithfully: a 32-bit float image \(Pillow mode F\)"):
        decode_image(floats, name="f.tif")
    wide32 = encoded(Image.fromarray(np.array([[0, 70000]], np.int32)), "TIFF")
    with pytest.raises(SampleError, match=r"i\.tif faithfully: .*values in 0\.\.70000, outside the 16-bit range"):
        decode_image(wide32, name="i.tif")


def test_verify_decode_reports_what_it_cannot_decode_faithfully(tmp_path):
    samples = [
        (encoded(Image.fromarray(WIDE), "PNG"), 0, "wide.png", 0),
        (encoded(Image.fromarray(WIDE.astype(np.float32)), "TIFF"), 0, "float.tif", 1),
    ]
    path = write_samples(tmp_path / "modes.h5", "hdf5", samples, encoding="image", class_names=("x",))
    report = verify_container(path, decode=True)
    assert [(b.index, b.name) for b in report.bad] == [(1, "float.tif")]
    assert "Pillow mode F" in report.bad[0].reason


def test_grey_stays_grey_only_where_asked_and_other_modes_give_rgb():
    grey = solid_jpeg("L", 77)
    assert decode_image(grey).shape == (16, 16, 1)  # channels=None: the image's own
    assert decode_image(grey, channels=3).shape == (16, 16, 3)
    assert decode_image(grey, min_size=(8, 8)).shape == (8, 8, 1)  # one header read for both
    # a CMYK JPEG (Pillow writes Adobe's inverted CMYK): the RGB Pillow's own convert gives, within rounding
    cmyk = solid_jpeg("CMYK", (30, 100, 200, 50))
    want = np.asarray(Image.open(io.BytesIO(cmyk)).convert("RGB")).astype(int)
    got = decode_image(cmyk)
    assert got.shape == (16, 16, 3) and np.abs(got.astype(int) - want).max() <= 1
    la = decode_image(encoded(Image.new("LA", (4, 4), (100, 50)), "PNG"))  # alpha dropped, as convert("RGB")
    assert la.shape == (4, 4, 1) and (la == 100).all()
    palette = Image.new("P", (4, 4), 1)
    palette.putpalette([0, 0, 0, 10, 20, 30] + [0] * 762)
    pa = decode_image(encoded(palette, "PNG", transparency=1))  # palette expanded, transparency dropped
    assert pa.shape == (4, 4, 3) and pa[0, 0].tolist() == [10, 20, 30]


def test_a_decode_error_escapes_the_name_it_quotes():
    name = "evil\x1b[2J\nOK.jpg"
    for data in (b"\xff\xd8 not a jpeg", b"not an image"):
        with pytest.raises(SampleError) as err:
            decode_image(data, name=name)
        text = str(err.value)
        assert "\x1b" not in text and "\n" not in text and "evil\\x1b[2J\\nOK.jpg" in text


def test_the_job_prints_any_of_our_errors_on_one_escaped_line():
    """Every DStoreError reaches the user through job.describe: a name quoted raw anywhere (a class, a
    path in a CSV) is escaped there, so the error stays one line with no terminal control sequence."""
    line = describe(ConfigError("labels.csv: row 3: class 'a\x1b[2J\nOK' is not a number"))
    assert line == "ConfigError: labels.csv: row 3: class 'a\\x1b[2J\\nOK' is not a number"


@pytest.fixture(scope="module")
def grey_and_colour(tmp_path_factory) -> str:
    """An ImageFolder-like set: colour and grey photos, JPEG and PNG, of different sizes."""
    rng = np.random.default_rng(5)
    samples = []
    for i in range(10):
        h, w = 12 + i, 14 + i % 3
        if i % 3 == 0:
            im = Image.fromarray(rng.integers(0, 256, (h, w), dtype=np.uint8))  # grey
        else:
            im = Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8))
        samples.append((encoded(im, "PNG" if i % 2 else "JPEG"), i % 2, f"s{i}", i))
    return write_samples(
        tmp_path_factory.mktemp("gc") / "gc.h5", "hdf5", samples, encoding="image", class_names=("a", "b")
    )


def test_a_grey_and_colour_set_loads_as_rgb(grey_and_colour):
    with DataStore(MPI.COMM_SELF, grey_and_colour, batch_size=5, seed=1) as st, StoreLoader(st, size=8) as ld:
        batches = [x for x, _ in ld.epoch(0)]
    assert [tuple(x.shape) for x in batches] == [(5, 3, 8, 8)] * 2
    with (
        DataStore(MPI.COMM_SELF, grey_and_colour, batch_size=5, seed=1) as st,
        StoreLoader(st, size=8, channels=1) as ld,
    ):
        assert all(x.shape[1] == 1 for x, _ in ld.epoch(0))


def test_decode_workers_give_the_threads_rgb_by_default(grey_and_colour):
    with DataStore(MPI.COMM_SELF, grey_and_colour, batch_size=5, seed=1) as st:
        with StoreLoader(st, size=8) as ld:
            threads = [x for x, _ in ld.epoch(0)]
        with StoreLoader(st, size=8, workers=1) as ld:
            workers = [x for x, _ in ld.epoch(0)]
    assert len(workers) == 2 and all(torch.equal(a, b) for a, b in zip(threads, workers))


def test_a_mix_of_a_grey_and_a_colour_set_loads_as_rgb(tmp_path, grey_and_colour):
    from dstore.store.mixed import MixedStore

    grey = [(encoded(Image.new("L", (9, 9), 40 + i), "PNG"), 0, f"g{i}", i) for i in range(6)]
    grey_path = write_samples(tmp_path / "grey.h5", "hdf5", grey, encoding="image", class_names=("a", "b"))
    with (
        MixedStore(MPI.COMM_SELF, [(grey_path, 0.5), (grey_and_colour, 0.5)], batch_size=4, seed=2) as st,
        StoreLoader(st, size=(6, 7)) as ld,
    ):
        shapes = {tuple(x.shape[1:]) for x, _ in ld.epoch(0)}
    assert shapes == {(3, 6, 7)}


def test_a_channel_mismatch_names_channels(grey_and_colour):
    def native(arr):  # a transform that keeps what it is given: RGB, and grey where the loader decodes grey
        return torch.from_numpy(np.ascontiguousarray(arr[:4, :4])).permute(2, 0, 1)

    def greys_some(arr):
        return native(arr[:, :, :1] if arr[0, 0, 0] % 2 else arr)

    with DataStore(MPI.COMM_SELF, grey_and_colour, batch_size=10, seed=1) as st:
        with StoreLoader(st, transform=greys_some) as ld, pytest.raises(ConfigError, match=r"channels=1 or 3"):
            for _ in ld.epoch(0):
                pass


@pytest.mark.parametrize("size", [True, False, 0, -3, (True, 4), (4, 0), (7.5, 7), "8", (4, 4, 4)])
def test_storeloader_refuses_bad_sizes_naming_size(size):
    with pytest.raises(ConfigError, match=r"^size="):
        StoreLoader(object(), size=size)


def test_one_mean_or_std_value_is_broadcast_once_and_a_wrong_count_is_refused(grey_and_colour):
    from dstore.codec.decode import decode_sample
    from dstore.formats import open_container
    from dstore.training.data import _read_spec

    with open_container(grey_and_colour) as r:
        spec = _read_spec([(r, 0, 10)], None, (0.4,), None)
        assert spec.channels == 3 and spec.mean == (0.4, 0.4, 0.4) and len(spec.std) == 3
        spec = _read_spec([(r, 0, 10)], None, None, (0.2,))
        assert spec.std == (0.2, 0.2, 0.2) and len(spec.mean) == 3
        with pytest.raises(ConfigError, match=r"^--mean 0\.4,0\.5: 2 values for 3-channel input"):
            _read_spec([(r, 0, 10)], None, (0.4, 0.5), (0.2,))
        with pytest.raises(ConfigError, match=r"^--std 0\.2,0\.3: 2 values for 1-channel input"):
            _read_spec([(r, 0, 10)], 1, (0.4,), (0.2, 0.3))
        # the channels come from every probed image: the first sample is grey, the set is not
        assert decode_sample(r.sample(0)[0], r.info).shape[2] == 1
        assert _read_spec([(r, 0, 10)], None, None, None).channels == 3


def test_bench_decode_pass_over_a_grey_and_colour_container(grey_and_colour):
    """What `dstore bench --container` runs: one epoch through StoreLoader(size=...)."""
    from dstore.tools.bench.store_bench import decode_pass

    m, _ = decode_pass(MPI.COMM_SELF, grey_and_colour, batch_size=5, seed=0, num_threads=1, size=8)
    assert list(m.samples) == [10] and list(m.nbytes) == [10 * 3 * 8 * 8]  # RGB, grey samples too
