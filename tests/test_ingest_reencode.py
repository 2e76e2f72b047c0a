"""`ingest --max-side S [--quality Q]`: larger images re-encoded as JPEG with the longer side S,
the others stored byte for byte, what was done recorded in the container, checksums of the stored
bytes; the same container from 1 rank and from `mpiexec -n 2`."""

import io
import os
import zlib

import numpy as np
import pytest
import simplejpeg
from mpi4py import MPI
from support.ingest import digit_png, listing, make_mixed_folder
from support.mpirun import run_mpi

from dstore.codec.decode import decode_image, sniff
from dstore.errors import ConfigError
from dstore.formats import open_container
from dstore.ingest import ingest
from dstore.ingest.reencode import shrink, target_size

S = 56


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    """JPEGs with sides 40..64 in class000..002 (some over S, some not) and 32x32 grey PNGs in `digits`."""
    root = tmp_path_factory.mktemp("reencode") / "images"
    make_mixed_folder(str(root), jpegs=24, pngs=6)
    return str(root)


def _pixels(data) -> np.ndarray:
    return decode_image(data).astype(np.int16)


def _expected_small(original: bytes) -> np.ndarray:
    """The original decoded in full and shrunk with Pillow's bicubic filter, as the reference."""
    from PIL import Image

    arr = decode_image(original)
    h, w = arr.shape[:2]
    th, tw = target_size(h, w, S)
    im = Image.fromarray(arr[:, :, 0] if arr.shape[2] == 1 else arr)
    out = np.asarray(im.resize((tw, th), Image.Resampling.BICUBIC))
    return (out[:, :, None] if out.ndim == 2 else out).astype(np.int16)


def check_reencoded(path: str, root: str, quality: int) -> int:
    """Every sample is its file's bytes where the image is no larger than S, else a JPEG of the
    shrunk image close to the reference; checksums are the stored bytes' CRC32; returns how many
    were re-encoded."""
    files = dict(listing(root))
    shrunk = 0
    with open_container(path) as c:
        assert c.num_samples == len(files)
        extra = c.info.extra
        assert (extra["ingest_max_side"], extra["ingest_quality"]) == (S, quality), extra
        assert extra["ingest_resample"] == "bicubic"
        for j in range(c.num_samples):
            data, label = c.sample(j)
            stored = bytes(data)
            assert int(c.checksums[j]) == zlib.crc32(stored)
            assert label == files[c.name(j)]
            with open(os.path.join(root, c.name(j)), "rb") as f:
                original = f.read()
            h, w = _pixels(original).shape[:2]
            if max(h, w) <= S:
                assert stored == original, c.name(j)
                continue
            shrunk += 1
            assert sniff(stored) == "jpeg"
            got, want = _pixels(stored), _expected_small(original)
            assert got.shape == want.shape and max(got.shape[:2]) == S, (got.shape, want.shape)
            # As close as a JPEG of the reference itself at that quality (these small noisy images
            # lose much to 4:2:0 JPEG at any size); a wrong size, crop or channel order is far off.
            ref = _pixels(simplejpeg.encode_jpeg(want.astype(np.uint8), quality=quality, colorsubsampling="420"))
            err, ref_err = np.abs(got - want).mean(), np.abs(ref - want).mean()
            assert err < 1.3 * ref_err + 1, (c.name(j), err, ref_err)
    return shrunk


def test_shrink_keeps_small_images_and_shapes_large_ones():
    from PIL import Image

    big = simplejpeg.encode_jpeg(np.full((100, 60, 3), 90, np.uint8), quality=95)
    out = shrink(big, 32)
    assert decode_image(out).shape == (32, 19, 3)  # 60 * 32 / 100 = 19.2
    assert shrink(big, 100) is None and shrink(big, 128) is None
    grey = shrink(digit_png(3, side=64), 16)
    assert simplejpeg.decode_jpeg_header(grey)[:3] == (16, 16, "Gray")  # grey stays grey
    grey_jpeg = simplejpeg.encode_jpeg(np.full((40, 30, 1), 7, np.uint8), colorspace="GRAY")
    assert simplejpeg.decode_jpeg_header(shrink(grey_jpeg, 20))[:3] == (20, 15, "Gray")
    buf = io.BytesIO()
    Image.new("RGBA", (40, 20), (10, 200, 30, 128)).save(buf, format="PNG")
    rgb = decode_image(shrink(buf.getvalue(), 20))
    assert rgb.shape == (10, 20, 3) and abs(int(rgb[5, 10, 1]) - 200) < 8


def test_ingest_max_side_single_process(mixed, tmp_path):
    report = ingest(
        mixed, str(tmp_path / "a.h5"), comm=MPI.COMM_SELF, progress=False, reencode_max_side=S, reencode_quality=80
    )
    assert report.encoding == "image"  # PNGs kept where small, JPEGs where shrunk
    shrunk = check_reencoded(str(tmp_path / "a.h5"), mixed, 80)
    assert 0 < shrunk < 24  # some over S, some not: both paths taken
    assert os.path.getsize(tmp_path / "a.h5") < sum(os.path.getsize(os.path.join(mixed, p)) for p, _ in listing(mixed))


def test_jpeg_source_stays_jpeg_and_the_refusals(mixed, tmp_path):
    jpegs = os.path.join(mixed, "class001")
    os.makedirs(tmp_path / "j", exist_ok=True)
    os.symlink(jpegs, tmp_path / "j" / "class001")
    report = ingest(
        str(tmp_path / "j"),
        str(tmp_path / "j.zarr"),
        fmt="zarr",
        comm=MPI.COMM_SELF,
        progress=False,
        reencode_max_side=S,
    )
    assert report.encoding == "jpeg"
    with open_container(str(tmp_path / "j.zarr")) as c:
        assert c.info.extra["ingest_quality"] == 90
    for kwargs, word in [
        ({"reencode_max_side": 4}, "max_side=4"),
        ({"reencode_quality": 80}, "needs max_side"),
        ({"reencode_max_side": S, "reencode_quality": 101}, "quality=101"),
        ({"reencode_max_side": S, "resize": "8x8"}, "raw/resize"),
    ]:
        with pytest.raises(ConfigError, match=word):
            ingest(mixed, str(tmp_path / "x.h5"), comm=MPI.COMM_SELF, progress=False, **kwargs)
    with pytest.raises(ConfigError, match="digits source"):
        ingest("digits", str(tmp_path / "d.h5"), comm=MPI.COMM_SELF, progress=False, reencode_max_side=S)
    assert not os.path.exists(tmp_path / "x.h5") and not os.path.exists(tmp_path / "d.h5")


@pytest.mark.mpi
def test_max_side_under_mpiexec_gives_the_single_process_container(mixed, tmp_path):
    ingest(
        mixed,
        str(tmp_path / "one.h5"),
        comm=MPI.COMM_SELF,
        progress=False,
        seed=4,
        reencode_max_side=S,
        reencode_quality=85,
    )
    run_mpi(
        2,
        [
            "dstore",
            "ingest",
            mixed,
            str(tmp_path / "two"),
            "--shards",
            "2",
            "--seed",
            "4",
            "--max-side",
            str(S),
            "--quality",
            "85",
            "--no-progress",
        ],
        timeout=120,
    )
    assert check_reencoded(str(tmp_path / "two"), mixed, 85) > 0
    with open_container(str(tmp_path / "one.h5")) as a, open_container(str(tmp_path / "two")) as b:
        assert a.num_samples == b.num_samples
        assert all(
            bytes(a.sample(j)[0]) == bytes(b.sample(j)[0]) and a.name(j) == b.name(j) for j in range(a.num_samples)
        )
