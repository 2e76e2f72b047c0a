"""Ingest sources and the single-process driver on real files: image folders and every kind of bad
input, CIFAR batches (and a malicious pickle), NumPy arrays, digits, synthetic JPEGs."""

import os

import numpy as np
import pytest
from support.ingest import (
    BAD_KINDS,
    Exploit,
    add_bad,
    check_container_against_folder,
    ingest_here,
    leftovers,
    make_mixed_folder,
    png_bytes,
    small_jpegs,
    write_cifar10,
    write_pickle,
)

from dstore.errors import ConfigError, SampleError
from dstore.formats import ContainerExistsError, open_container
from dstore.ingest import open_source
from dstore.ingest.cifar import CifarSource
from dstore.ingest.synthetic import SyntheticSource, generate_image_folder


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    root = tmp_path_factory.mktemp("mixed") / "images"
    make_mixed_folder(str(root))
    return root


def test_folder_stores_original_bytes_labels_and_provenance(mixed, tmp_path):
    report = ingest_here(mixed, tmp_path / "out.h5")
    check_container_against_folder(str(tmp_path / "out.h5"), str(mixed), expect_encoding="image")
    assert report.samples == 36 and report.skipped == []
    assert any(p.endswith("README.txt") for p in report.ignored)
    with open_container(str(tmp_path / "out.h5")) as c:
        assert c.info.class_names == ("class000", "class001", "class002", "digits")
        assert c.info.source == str(mixed)


def test_folder_of_jpegs_is_encoding_jpeg_and_keep_order(tmp_path):
    root = tmp_path / "jpegs"
    small_jpegs(str(root), 9)
    ingest_here(root, tmp_path / "a.h5", keep_order=True)
    with open_container(str(tmp_path / "a.h5")) as c:
        assert c.info.encoding == "jpeg"
        assert c.source_index.tolist() == list(range(9))
    ingest_here(root, tmp_path / "b.zarr", fmt="zarr", seed=5)
    check_container_against_folder(str(tmp_path / "b.zarr"), str(root), expect_encoding="jpeg")


def test_a_png_named_jpg_is_refused_when_the_encoding_is_jpeg(tmp_path):
    root = tmp_path / "jpegs"
    small_jpegs(str(root), 6)
    (root / "class001" / "liar.jpg").write_bytes(png_bytes())  # every name says JPEG: encoding 'jpeg'
    with pytest.raises(SampleError, match="liar.jpg: is a PNG file but the container's encoding is 'jpeg'"):
        ingest_here(root, tmp_path / "o.h5")
    assert leftovers(str(tmp_path)) == []
    ingest_here(root, tmp_path / "o.h5", encoding="image")  # mixed formats are what 'image' is for
    check_container_against_folder(str(tmp_path / "o.h5"), str(root), expect_encoding="image")


@pytest.mark.parametrize("kind", BAD_KINDS)
def test_bad_input_raise_names_the_file_and_leaves_nothing(tmp_path, kind):
    root = tmp_path / "images"
    small_jpegs(str(root), 8)
    path, word = add_bad(str(root), kind)
    with pytest.raises(SampleError) as info:
        ingest_here(root, tmp_path / "out.h5")
    assert path in str(info.value) and word in str(info.value), str(info.value)
    assert leftovers(str(tmp_path)) == [], "a failed ingest must leave no container or temporary"


def test_bad_inputs_skip_lists_every_one_and_keeps_the_rest(tmp_path):
    root = tmp_path / "images"
    small_jpegs(str(root), 8)
    bad = dict(add_bad(str(root), kind) for kind in BAD_KINDS)
    report = ingest_here(root, tmp_path / "out.h5", on_error="skip")
    skipped = dict(report.skipped)
    assert set(skipped) == set(bad), (sorted(skipped), sorted(bad))
    for path, word in bad.items():
        assert word in skipped[path], (path, skipped[path])
    assert report.samples == 8
    assert any(p.endswith("notes.txt") for p in report.ignored)
    check_container_against_folder(str(tmp_path / "out.h5"), str(root), exclude=bad, check_index=False)
    with open_container(str(tmp_path / "out.h5")) as c:
        assert "class999" in c.info.class_names  # an empty class keeps its label
    assert "skipped 7" in report.summary()


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files whatever their permissions")
def test_unreadable_file(tmp_path):
    root = tmp_path / "images"
    small_jpegs(str(root), 4)
    path = root / "class000" / "0000000.jpg"
    os.chmod(path, 0)
    with pytest.raises(SampleError, match="cannot read"):
        ingest_here(root, tmp_path / "out.h5")


@pytest.mark.parametrize("layout", ["empty_dir", "no_class_dirs", "only_empty_classes", "missing"])
def test_empty_source_is_a_clear_error(tmp_path, layout):
    root = tmp_path / "src"
    if layout != "missing":
        root.mkdir()
    if layout == "no_class_dirs":
        (root / "loose.jpg").write_bytes(b"\xff\xd8")
    if layout == "only_empty_classes":
        (root / "a").mkdir()
    with pytest.raises((SampleError, ConfigError), match="src"):
        ingest_here(root, tmp_path / "out.h5", on_error="skip")
    assert leftovers(str(tmp_path)) == []


def test_existing_output_and_bad_parameters(mixed, tmp_path):
    out = tmp_path / "out.h5"
    ingest_here(mixed, out)
    with pytest.raises(ContainerExistsError):
        ingest_here(mixed, out)
    ingest_here(mixed, out, overwrite=True, seed=1)
    with pytest.raises(ConfigError, match="on_error"):
        ingest_here(mixed, tmp_path / "x.h5", on_error="ignore")
    with pytest.raises(ConfigError, match="resize"):
        ingest_here(mixed, tmp_path / "x.h5", encoding="raw")
    with pytest.raises(ConfigError, match="takes no option"):
        ingest_here(mixed, tmp_path / "x.h5", quality=3)
    with pytest.raises(ConfigError, match="suffix of the other format but fmt=.hdf5."):  # unless given, x.zarr is Zarr
        ingest_here(mixed, tmp_path / "x.zarr", fmt="hdf5")


def test_resize_stores_decoded_pixels(mixed, tmp_path):
    report = ingest_here(mixed, tmp_path / "r.h5", resize="16x12")
    assert report.encoding == "raw"
    from PIL import Image

    from dstore.codec.decode import decode_image

    with open_container(str(tmp_path / "r.h5")) as c:
        assert c.info.raw_shape == (16, 12, 3) and c.info.raw_dtype == "uint8"
        for j in (0, c.num_samples - 1):
            data, _ = c.sample(j)
            with open(os.path.join(str(mixed), c.name(j)), "rb") as f:
                img = decode_image(f.read(), channels=3)
            want = np.asarray(Image.fromarray(img).resize((12, 16), Image.Resampling.BILINEAR))
            assert np.array_equal(data.reshape(16, 12, 3), want)


# --- CIFAR -----------------------------------------------------------------------------------


@pytest.mark.parametrize("protocol", [2, 4, 5])
def test_cifar_batches_ingest_as_hwc_uint8(tmp_path, protocol):
    batches = write_cifar10(str(tmp_path / "cifar"), protocol=protocol)
    report = ingest_here(tmp_path / "cifar", tmp_path / "c.h5")
    assert report.samples == 40
    data = np.concatenate([b[b"data"] for b in batches])
    labels = sum((b[b"labels"] for b in batches), [])
    with open_container(str(tmp_path / "c.h5")) as c:
        assert c.info.raw_shape == (32, 32, 3) and c.info.class_names[0] == "airplane"
        for j in range(c.num_samples):
            i = int(c.source_index[j])
            img = c.sample(j)[0].reshape(32, 32, 3)
            assert np.array_equal(img, data[i].reshape(3, 32, 32).transpose(1, 2, 0))
            assert int(c.labels[j]) == labels[i]


def test_cifar_python2_pickle_and_cifar100(tmp_path):
    # The distributed CIFAR files are Python 2 cPickles: str keys and data, numpy.core.multiarray.
    from support.ingest import py2_cifar_pickle

    data = np.random.default_rng(1).integers(0, 256, size=(7, 3072), dtype=np.uint8)
    path = tmp_path / "data_batch_1"
    path.write_bytes(py2_cifar_pickle(data, [3, 1, 4, 1, 5, 9, 2]))
    src = CifarSource(str(path))
    assert len(src) == 7 and [src.label(i) for i in range(7)] == [3, 1, 4, 1, 5, 9, 2]
    assert np.array_equal(src.load(6), data[6].reshape(3, 32, 32).transpose(1, 2, 0))
    c100 = tmp_path / "c100"
    c100.mkdir()
    from support.ingest import cifar_batch

    write_pickle(str(c100 / "train"), cifar_batch(10, num_classes=100, cifar100=True))
    write_pickle(
        str(c100 / "meta"),
        {
            b"fine_label_names": [f"f{i}".encode() for i in range(100)],
            b"coarse_label_names": [f"c{i}".encode() for i in range(20)],
        },
    )
    fine, coarse = CifarSource(str(c100)), CifarSource(str(c100), labels="coarse")
    assert len(fine.class_names) == 100 and len(coarse.class_names) == 20
    assert [coarse.label(i) for i in range(10)] == [fine.label(i) // 5 for i in range(10)]


def test_malicious_pickle_is_refused_and_nothing_runs(tmp_path):
    marker = tmp_path / "pwned"
    root = tmp_path / "cifar"
    root.mkdir()
    write_pickle(str(root / "data_batch_1"), {b"data": Exploit(f"touch {marker}"), b"labels": [0]})
    with pytest.raises(SampleError, match=r"data_batch_1.*posix\.system|data_batch_1.*os\.system"):
        ingest_here(root, tmp_path / "c.h5")
    assert not marker.exists()
    write_pickle(str(root / "data_batch_1"), [Exploit(f"touch {marker}")], protocol=4)
    with pytest.raises(SampleError, match="refusing"):
        CifarSource(str(root / "data_batch_1"))
    assert not marker.exists() and leftovers(str(tmp_path)) == []


# --- arrays, digits, synthetic ---------------------------------------------------------------


def test_npz_and_npy_with_sidecar_labels(tmp_path):
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, size=(30, 6, 5, 3), dtype=np.uint8)
    y = rng.integers(0, 4, size=30)
    np.savez(tmp_path / "d.npz", images=x, labels=y)
    ingest_here(tmp_path / "d.npz", tmp_path / "a.h5")
    with open_container(str(tmp_path / "a.h5")) as c:
        assert c.info.raw_shape == (6, 5, 3) and c.info.class_names == ("0", "1", "2", "3")
        for j in range(30):
            i = int(c.source_index[j])
            assert np.array_equal(c.sample(j)[0].reshape(6, 5, 3), x[i]) and c.labels[j] == y[i]
    g = rng.random(size=(12, 4, 4)).astype(np.float32)
    np.save(tmp_path / "g.npy", g)
    report = ingest_here(tmp_path / "g.npy", tmp_path / "g0.h5")
    assert any("all labels are 0" in n for n in report.notes)
    np.save(tmp_path / "g.labels.npy", np.arange(12) % 3)
    ingest_here(tmp_path / "g.npy", tmp_path / "g.h5", keep_order=True)
    with open_container(str(tmp_path / "g.h5")) as c:
        assert c.info.raw_dtype == "float32" and c.info.raw_shape == (4, 4, 1)
        assert c.labels.tolist() == (np.arange(12) % 3).tolist()
        assert np.array_equal(c.sample(5)[0].view(np.float32).reshape(4, 4), g[5])
    np.save(tmp_path / "o.npy", np.array([{"a": 1}], dtype=object))
    with pytest.raises(SampleError, match="o.npy"):
        ingest_here(tmp_path / "o.npy", tmp_path / "o.h5")


def test_digits_are_the_real_1797_images(tmp_path):
    from sklearn.datasets import load_digits
    from sklearn.utils import Bunch

    report = ingest_here("digits", tmp_path / "d.h5")
    d = load_digits()
    assert isinstance(d, Bunch)  # not the (X, y) tuple of return_X_y=True
    assert report.samples == 1797
    with open_container(str(tmp_path / "d.h5")) as c:
        assert c.info.raw_shape == (8, 8, 1) and c.info.class_names == tuple("0123456789")
        idx = c.source_index
        assert sorted(idx.tolist()) == list(range(1797))
        assert np.array_equal(c.labels, d.target[idx])
        img = c.read_range(0, 1797).reshape(1797, 8, 8)
        assert np.array_equal(img, np.rint(d.images[idx] * 255 / 16).astype(np.uint8))
        assert img.max() == 255


def test_synthetic_is_seeded_imagenet_sized_and_learnable(tmp_path):
    a, b, other = SyntheticSource(60, seed=1), SyntheticSource(60, seed=1), SyntheticSource(60, seed=2)
    blobs = [a.load(i) for i in range(60)]
    assert blobs == [b.load(i) for i in range(60)]
    assert blobs[0] != other.load(0)
    mean = np.mean([len(x) for x in blobs])
    assert 0.8 * 110_000 < mean < 1.2 * 110_000, mean
    from dstore.codec.decode import decode_image

    sides = [decode_image(x).shape[:2] for x in blobs[:10]]
    assert all(333 <= h <= 500 and 333 <= w <= 500 for h, w in sides) and len(set(sides)) > 5
    # The label is visible: the mean colour of the border (background) separates classes.
    means = np.array([decode_image(blobs[i])[:20].reshape(-1, 3).mean(0) for i in range(20)])
    assert np.linalg.norm(means[0] - means[10]) < np.linalg.norm(means[0] - means[5])


def test_generated_folder_equals_synthetic_source(tmp_path):
    paths = generate_image_folder(str(tmp_path / "f"), 12, seed=4, mean_bytes=3000, min_side=48, max_side=64)
    ingest_here(tmp_path / "f", tmp_path / "f.h5")
    ingest_here("synthetic", tmp_path / "s.h5", count=12, seed=4, mean_bytes=3000, min_side=48, max_side=64)
    with open_container(str(tmp_path / "f.h5")) as f, open_container(str(tmp_path / "s.h5")) as s:
        by_name = {s.name(j): bytes(s.sample(j)[0]) for j in range(12)}
        assert {f.name(j): bytes(f.sample(j)[0]) for j in range(12)} == by_name
    assert len(paths) == 12 and all(os.path.isfile(p) for p in paths)


def test_open_source_detects_types(mixed, tmp_path):
    assert open_source(str(mixed)).kind == "folder"
    assert open_source("digits").kind == "digits"
    write_cifar10(str(tmp_path / "c"), batches=1)
    assert open_source(str(tmp_path / "c")).kind == "cifar"
    assert open_source(str(tmp_path / "c" / "data_batch_1")).kind == "cifar"
    with pytest.raises(ConfigError, match="does not exist"):
        open_source(str(tmp_path / "nothing"))


def test_a_failure_in_the_writer_thread_is_reported_and_nothing_is_left(tmp_path):
    from dstore.formats import create_writer
    from dstore.ingest.digits import DigitsSource
    from dstore.ingest.writer import BackgroundWriter

    class BadLabel(DigitsSource):
        def label(self, i):  # pyright: ignore[reportIncompatibleMethodOverride] - a str label on purpose
            return "seven" if i == 5 else super().label(i)  # the writer's int() fails on it

    src = BadLabel()
    writer = create_writer(
        str(tmp_path / "w.h5"), encoding="raw", class_names=src.class_names, raw_dtype="uint8", raw_shape=(8, 8, 1)
    )
    out = BackgroundWriter(writer, src, np.arange(10))
    out.submit(0, np.full(10, 64), [src.load(i).reshape(-1) for i in range(10)])
    error = out.finish()
    assert isinstance(error, ValueError) and out.error is error
    out.abort()
    out.abort()
    assert leftovers(str(tmp_path)) == []


def test_raw_sources_resize_and_refuse_reencoding(tmp_path):
    report = ingest_here("digits", tmp_path / "d16.h5", resize="16x16", keep_order=True, count=20)
    assert report.samples == 20
    from PIL import Image

    from dstore.ingest.digits import digits_arrays

    images, _ = digits_arrays()
    with open_container(str(tmp_path / "d16.h5")) as c:
        assert c.info.raw_shape == (16, 16, 1)
        want = np.asarray(Image.fromarray(images[3, :, :, 0]).resize((16, 16), Image.Resampling.BILINEAR))
        assert np.array_equal(c.sample(3)[0].reshape(16, 16), want)
    with pytest.raises(ConfigError, match="re-encoding"):
        ingest_here("digits", tmp_path / "x.h5", encoding="png")


def test_a_file_that_cannot_be_read_is_a_sample_error(tmp_path):
    # What a permission error does, in a form root cannot read past: the file vanished after listing.
    from dstore.ingest.folder import FolderSource
    from dstore.ingest.process import process_block, resolve_target

    root = tmp_path / "images"
    small_jpegs(str(root), 4)
    src = FolderSource(str(root))
    os.remove(src.locate(2))
    with pytest.raises(SampleError, match=f"{src.locate(2)}: cannot read: No such file"):
        src.load(2)
    block = process_block(src, [0, 1, 2, 3], resolve_target(src, None, None), on_error="skip")
    assert block.sizes.tolist()[2] == -1 and block.skipped[0][0] == src.locate(2)
