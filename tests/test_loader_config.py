"""LoaderConfig (StoreLoader's arguments, validated in one place) and SplitTransform (what the loader
asks of a transform). In-process on COMM_SELF; no decode workers started."""

import dataclasses
from pathlib import Path

import numpy as np
import pytest
from mpi4py import MPI

from dstore.errors import ConfigError
from dstore.formats import create_writer
from dstore.loader.config import LoaderConfig, options_table
from dstore.loader.store_loader import StoreLoader
from dstore.loader.transform import SplitTransform
from dstore.store.data_store import DataStore
from dstore.training.augment import ImageTransform


@pytest.fixture(scope="module")
def raw_container(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("lc") / "raw.h5")
    rng = np.random.default_rng(1)
    with create_writer(
        path, "hdf5", encoding="raw", class_names=["a", "b"], raw_dtype="uint8", raw_shape=(6, 5, 3)
    ) as w:
        for i in range(10):
            w.append(rng.integers(0, 256, 90, dtype=np.uint8).tobytes(), i % 2, f"r{i}", i)
    return path


@pytest.mark.parametrize(
    "name, value, message",
    [
        ("decode_threads", 0, "decode_threads=0 must be an integer >= 1"),
        ("decode_threads", True, "decode_threads=True must be an integer"),
        ("ahead", 0, "ahead=0 must be an integer >= 1"),
        ("channels", 2, "channels=2 must be None, 1 or 3"),
        ("size", (0, 4), r"size=\(0, 4\) must be a positive int"),
        ("size", "big", "size='big' must be an int or"),
        ("device", "gpu7", "device='gpu7' is not a torch device"),
        ("workers", -1, r"workers=-1 must be an integer >= 0 \(0: decode in threads\)"),
        ("batch_ops", "gpu", "batch_ops='gpu' must be 'auto', 'device' or 'worker'"),
        ("resize_on", "host", "resize_on='host' must be 'auto', 'device' or 'worker'"),
    ],
)
def test_a_bad_argument_is_one_line_naming_it(name, value, message):
    with pytest.raises(ConfigError, match=f"^{message}") as err:
        LoaderConfig(**{name: value}).checked()
    assert "\n" not in str(err.value)


def test_checked_normalises_and_every_field_is_documented():
    cfg = LoaderConfig(size=np.int64(8), ahead=np.int64(3), workers=0, device="cpu").checked()  # pyright: ignore[reportArgumentType] - numpy's int, made an int
    assert cfg.size == (8, 8) and type(cfg.ahead) is int and cfg.workers == 0 and str(cfg.device) == "cpu"
    assert all(f.metadata["values"] and f.metadata["doc"] for f in dataclasses.fields(LoaderConfig))


def test_keywords_and_a_config_give_the_same_loader(raw_container):
    with DataStore(MPI.COMM_SELF, raw_container, batch_size=4, seed=2) as st:
        with StoreLoader(st, None, 3, None, (4, 4), 1, batch_ops="worker") as old:  # positional, as before
            assert old.config == LoaderConfig(decode_threads=3, size=(4, 4), ahead=1, batch_ops="worker")
            want = [(images.clone(), labels.clone()) for images, labels in old.epoch(0)]
        with StoreLoader(st, config=LoaderConfig(decode_threads=3, size=4, ahead=1, batch_ops="worker")) as new:
            assert (new.decode_threads, new.size, new.ahead, new.batch_ops) == (3, (4, 4), 1, "worker")
            got = list(new.epoch(0))
        assert len(got) == len(want) and all((a == c).all() and (b == d).all() for (a, b), (c, d) in zip(want, got))
        with pytest.raises(ConfigError, match=r"LoaderConfig or keywords, not both \(size, ahead\)"):
            StoreLoader(st, config=LoaderConfig(), ahead=3, size=np.array([4, 4]))
        with pytest.raises(ConfigError, match="^ahead=0 must be an integer >= 1"):
            StoreLoader(st, config=LoaderConfig(ahead=0))


def test_image_transform_is_a_split_transform():
    # pyright checks the same statically (training/augment.py, `_splits`)
    tf = ImageTransform(size=(8, 8), channels=3, mean=(0.5,) * 3, std=(0.25,) * 3)
    assert isinstance(tf, SplitTransform)
    assert not isinstance(lambda arr: arr, SplitTransform)  # a plain callable: still a transform, not split


def test_the_guide_shows_the_generated_table_of_loader_options():
    guide = (Path(__file__).resolve().parent.parent / "docs" / "guide.md").read_text()
    assert options_table() in guide, "docs/guide.md: paste `python -m dstore.loader.config` under Loader options"
