"""StoreLoader: decoded tensors equal the container's samples, labels and ids line up, transforms
are reproducible, and mixed shapes without `size` fail clearly. In-process on COMM_SELF."""

import io

import numpy as np
import pytest
import torch
from mpi4py import MPI

from datastore.decode import decode_sample
from datastore.errors import ConfigError
from datastore.formats import create_writer, open_container
from datastore.store import DataStore
from datastore.torch import StoreLoader, resize


@pytest.fixture(scope="module")
def raw_container(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("ad") / "raw.h5")
    rng = np.random.default_rng(1)
    with create_writer(path, "hdf5", encoding="raw", class_names=["a", "b", "c"], raw_dtype="uint8",
                       raw_shape=(6, 5, 3)) as w:
        for i in range(37):
            w.append(rng.integers(0, 256, 90, dtype=np.uint8).tobytes(), i % 3, f"r{i}", i)
    return path


@pytest.fixture(scope="module")
def png_container(tmp_path_factory):
    from PIL import Image

    path = str(tmp_path_factory.mktemp("ad") / "png.h5")
    rng = np.random.default_rng(2)
    with create_writer(path, "hdf5", encoding="png", class_names=["a", "b"]) as w:
        for i in range(11):
            h, wd = 8 + i % 3, 9 + i % 2  # mixed shapes
            buf = io.BytesIO()
            Image.fromarray(rng.integers(0, 256, (h, wd, 3), dtype=np.uint8)).save(buf, format="PNG")
            w.append(buf.getvalue(), i % 2, f"p{i}.png", i)
    return path


def test_tensors_match_the_container(raw_container):
    reader = open_container(raw_container)
    with DataStore(MPI.COMM_SELF, reader, batch_size=8, seed=3) as st, StoreLoader(st, num_threads=3) as ld:
        seen = []
        ld.set_epoch(1)
        for images, labels in ld:
            assert images.dtype == torch.uint8 and images.shape[1:] == (3, 6, 5)
            assert labels.dtype == torch.int64 and len(labels) == len(ld.last_ids) == images.shape[0]
            for img, lab, i in zip(images, labels, ld.last_ids):
                want = decode_sample(reader.sample(int(i))[0], reader.info)
                assert torch.equal(img, torch.from_numpy(want).permute(2, 0, 1))
                assert lab == reader.labels[i]
            seen.extend(ld.last_ids.tolist())
        assert sorted(seen) == list(range(37))
        assert len(ld) == 5 and ld.stats["batches"] == 5
    reader.close()


def test_transform_is_reproducible_and_float(raw_container):
    def aug(arr, rng):
        flip = rng.random() < 0.5
        out = torch.from_numpy(arr.copy()).permute(2, 0, 1).float() / 255
        return out.flip(-1) if flip else out + float(rng.random())

    with DataStore(MPI.COMM_SELF, raw_container, batch_size=6) as st:
        runs = []
        for threads in (1, 4):
            with StoreLoader(st, transform=aug, num_threads=threads) as ld:
                runs.append([x for x, _ in ld.epoch(2)])
        assert runs[0][0].dtype == torch.float32
        assert all(torch.equal(a, b) for a, b in zip(*runs))  # same seed/epoch/id -> same augmentation
        with StoreLoader(st, transform=aug) as ld:
            other = [x for x, _ in ld.epoch(3)]
        assert not torch.equal(torch.cat(other), torch.cat(runs[0]))


def test_mixed_shapes_need_size(png_container):
    with DataStore(MPI.COMM_SELF, png_container, batch_size=4) as st:
        with StoreLoader(st) as ld, pytest.raises(ConfigError, match="size="):
            for _ in ld.epoch(0):
                pass
        with StoreLoader(st, size=(7, 7), channels=1) as ld:
            out = [x for x, _ in ld.epoch(0)]
        assert all(x.shape[1:] == (1, 7, 7) for x in out)
        assert sum(x.shape[0] for x in out) == 11


def test_resize_and_bad_arguments():
    a = np.zeros((4, 6, 3), np.uint8)
    assert resize(a, (4, 6)) is a and resize(a, (2, 3)).shape == (2, 3, 3)
    for kw in (dict(num_threads=0), dict(channels=2), dict(size=(0, 3)), dict(transform=5)):
        with pytest.raises(ConfigError):
            StoreLoader(object(), **kw)
