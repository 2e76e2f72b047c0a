"""StoreLoader: decoded tensors equal the container's samples, labels and ids line up, transforms
are reproducible, and mixed shapes without `size` fail clearly. In-process on COMM_SELF."""

import io
import threading
import time
import warnings
from typing import Any

import numpy as np
import pytest
import torch
from mpi4py import MPI

from dstore.codec.decode import decode_sample, resize
from dstore.errors import ConfigError
from dstore.formats import create_writer, open_container
from dstore.loader.store_loader import StoreLoader, seeded
from dstore.store.data_store import DataStore


@pytest.fixture(scope="module")
def raw_container(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("ad") / "raw.h5")
    rng = np.random.default_rng(1)
    with create_writer(
        path, "hdf5", encoding="raw", class_names=["a", "b", "c"], raw_dtype="uint8", raw_shape=(6, 5, 3)
    ) as w:
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
    with DataStore(MPI.COMM_SELF, reader, batch_size=8, seed=3) as st, StoreLoader(st, decode_threads=3) as ld:
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
            with StoreLoader(st, transform=aug, decode_threads=threads) as ld:
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
    kw: dict[str, Any]  # wrong values on purpose: each is refused
    for kw in (
        dict(decode_threads=0),
        dict(num_threads=1, decode_threads=1),
        dict(device="nowhere"),
        dict(channels=2),
        dict(size=(0, 3)),
        dict(transform=5),
    ):
        with pytest.raises(ConfigError):
            StoreLoader(object(), **kw)


def _epoch_record(ld, epoch):
    """(images, labels, ids, pads) of a whole epoch, per batch."""
    out = []
    for images, labels in ld.epoch(epoch):
        out.append((images, labels, ld.last_ids.copy(), ld.last_pad.copy()))
    return out


@pytest.mark.parametrize("ahead", [2, 3, 7])
@pytest.mark.parametrize("policy", ["global", "local"])
def test_ahead_delivers_each_sample_once_as_ahead_1_does(raw_container, png_container, ahead, policy):
    kw: dict[str, Any]
    for path, kw in ((raw_container, {}), (png_container, dict(size=(6, 7)))):
        with DataStore(MPI.COMM_SELF, path, batch_size=4, seed=5, shuffle=policy, prefetch=1) as st:
            with StoreLoader(st, decode_threads=2, ahead=1, **kw) as ld:
                ref = _epoch_record(ld, 1)
                assert ld.stats["copy_bytes"] == 0  # ahead=1 decodes from the store's views
            with StoreLoader(st, decode_threads=3, ahead=ahead, **kw) as ld:
                got = _epoch_record(ld, 1)
                assert ld.stats["batches"] == len(got) == st.steps_per_epoch
                assert ld.stats["copy_bytes"] == int(np.diff(st.offsets)[np.concatenate([g[2] for g in got])].sum())
        assert len(got) == len(ref)
        for (xi, yl, ids, pad), (rx, ry, rids, rpad) in zip(got, ref):
            assert torch.equal(xi, rx) and torch.equal(yl, ry)
            assert np.array_equal(ids, rids) and np.array_equal(pad, rpad)
        ids = np.concatenate([g[2] for g in got])
        assert sorted(ids.tolist()) == list(range(st.num_samples))


def test_ahead_views_survive_the_store_moving_on(raw_container):
    # prefetch=0: the store has ONE receive buffer, reused by every batch; with ahead=4 four batches
    # are fetched before the first is decoded, so their bytes must have been copied out.
    reader = open_container(raw_container)
    slow = threading.Event()

    def late(arr, rng):
        slow.wait(0.002)
        return torch.from_numpy(arr.copy()).permute(2, 0, 1)

    with (
        DataStore(MPI.COMM_SELF, reader, batch_size=5, seed=2, prefetch=0) as st,
        StoreLoader(st, transform=late, decode_threads=1, ahead=4) as ld,
    ):
        for images, _ in ld.epoch(0):
            for img, i in zip(images, ld.last_ids):
                want = decode_sample(reader.sample(int(i))[0], reader.info)
                assert torch.equal(img, torch.from_numpy(want).permute(2, 0, 1))
    reader.close()


class _Counting:
    """A transform that counts the decodes running at any moment."""

    def __init__(self, fail_on=None):
        self.lock = threading.Lock()
        self.running = 0
        self.done = 0
        self.fail_on = fail_on

    def __call__(self, arr, rng):
        with self.lock:
            self.running += 1
        try:
            time.sleep(0.001)
            if self.fail_on is not None and int(arr.sum()) == self.fail_on:
                raise ValueError("bad sample in the transform")
            return torch.from_numpy(arr.copy()).permute(2, 0, 1)
        finally:
            with self.lock:
                self.running -= 1
                self.done += 1


@pytest.mark.parametrize("ahead", [1, 3])
def test_abandoning_an_epoch_leaves_no_decode_running(raw_container, ahead):
    tf = _Counting()
    with DataStore(MPI.COMM_SELF, raw_container, batch_size=4, seed=1) as st:
        ld = StoreLoader(st, transform=tf, decode_threads=3, ahead=ahead)
        it = ld.epoch(0)
        next(it)
        next(it)
        it.close()  # what a trainer's `break` + close does
        assert tf.running == 0
        assert tf.done <= 4 * (2 + ahead)  # nothing decoded past the read-ahead
        full = _epoch_record(ld, 0)  # the store and the loader go on
        assert sorted(np.concatenate([g[2] for g in full]).tolist()) == list(range(37))
        it = ld.epoch(1)
        next(it)  # left open: a new epoch, then close(), end it
        it2 = ld.epoch(2)
        next(it2)
        with pytest.raises(StopIteration):
            next(it)
        ld.close()
        assert tf.running == 0
        ld.close()  # safe twice
        with pytest.raises(ValueError, match="closed"):
            ld.epoch(3)


@pytest.mark.parametrize("ahead", [1, 2, 4])
def test_an_error_in_a_transform_propagates(raw_container, ahead):
    reader = open_container(raw_container)
    target = int(decode_sample(reader.sample(9)[0], reader.info).sum())
    reader.close()
    tf = _Counting(fail_on=target)
    with DataStore(MPI.COMM_SELF, raw_container, batch_size=4, seed=1) as st:
        with StoreLoader(st, transform=tf, decode_threads=2, ahead=ahead) as ld:
            seen = []
            with pytest.raises(ValueError, match="bad sample in the transform"):
                for _ in ld.epoch(0):
                    seen.extend(ld.last_ids.tolist())
            assert 9 not in seen and tf.running == 0
            tf.fail_on = None
            assert sum(len(g[2]) for g in _epoch_record(ld, 1)) == 37  # usable afterwards


def test_ahead_argument_and_resize_is_writable(png_container):
    # text of an integer is that integer (dstore.runtime.values); text that is none is refused
    for bad in (0, -1, True, 1.5, "x", "1.5"):
        with pytest.raises(ConfigError, match="ahead"):
            StoreLoader(object(), ahead=bad)  # pyright: ignore[reportArgumentType]
    out = resize(np.zeros((5, 6, 3), np.uint8), (3, 4))
    assert out.flags.writeable and out.shape == (3, 4, 3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # torch.from_numpy warns on read-only arrays
        with (
            DataStore(MPI.COMM_SELF, png_container, batch_size=4) as st,
            StoreLoader(st, size=(7, 7), transform=lambda a, rng: torch.from_numpy(a).permute(2, 0, 1)) as ld,
        ):
            assert sum(x.shape[0] for x, _ in ld.epoch(0)) == 11


# ------------------------------------------------------------------ the loader as PyTorch users expect it
def _ids(loader, it):
    out = []
    for _ in it:
        out.append(loader.last_ids.tolist())
    return out


@pytest.mark.parametrize("ahead", [1, 3])
def test_state_dict_is_the_position_of_what_was_yielded(raw_container, ahead):
    """The store reads ahead; the loader's state is after the batches it handed out, and a new
    loader (a restarted job) continues there with nothing lost or repeated."""
    with DataStore(MPI.COMM_SELF, raw_container, batch_size=4, seed=5) as st, StoreLoader(st, ahead=ahead) as ld:
        whole = _ids(ld, ld.epoch(1))
        assert len(whole) == len(ld) == 10
        ld.set_epoch(1)
        it = iter(ld)
        first = [next(it) and ld.last_ids.tolist() for _ in range(3)]
        state = ld.state_dict()
        assert (state["epoch"], state["step"], state["position"]) == (1, 3, 12)
        assert st.state_dict()["step"] > 3 or ahead == 1  # the store itself is further on
        it.close()
    with DataStore(MPI.COMM_SELF, raw_container, batch_size=4, seed=5) as st, StoreLoader(st, ahead=ahead) as ld:
        ld.load_state_dict(state)
        rest = _ids(ld, ld)  # iter(loader) after load_state_dict: the saved epoch, from the saved batch
        assert first + rest == whole
        assert ld.state_dict()["epoch"] == 2 and ld.state_dict()["step"] == 0  # epoch done: the next one
        nxt = _ids(ld, ld)  # iter again: the next epoch, as Mosaic's loader does
        assert nxt == _ids(ld, ld.epoch(2))


def test_a_torch_dataloader_takes_it_without_workers(raw_container):
    from torch.utils.data import DataLoader, IterableDataset

    with DataStore(MPI.COMM_SELF, raw_container, batch_size=8, seed=3) as st, StoreLoader(st) as ld:
        assert isinstance(ld, IterableDataset)
        ld.set_epoch(0)
        direct = [(x.clone(), y.clone()) for x, y in ld]
        ld.set_epoch(0)
        via = list(DataLoader(ld, batch_size=None))
        assert len(via) == len(direct) == 5
        assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(direct, via))
        with pytest.raises(Exception, match="worker processes"):
            list(DataLoader(ld, batch_size=None, num_workers=1, multiprocessing_context="fork"))
        with pytest.raises(ConfigError, match="num_workers=0"):
            import pickle

            pickle.dumps(ld)  # what a spawn or forkserver worker start would do


def test_one_argument_and_seeded_transforms(raw_container):
    def plain(arr):  # torchvision style: one argument
        return torch.from_numpy(arr.copy()).permute(2, 0, 1).float() / 255

    def aug(arr, noise):  # seeded form under another parameter name: wrapped explicitly
        return plain(arr) + float(noise.random())

    with DataStore(MPI.COMM_SELF, raw_container, batch_size=8) as st:
        with StoreLoader(st, transform=plain) as ld:
            x, _ = next(iter(ld))
            assert x.dtype == torch.float32 and float(x.max()) <= 1.0
        runs = []
        for threads in (1, 3):
            with StoreLoader(st, transform=seeded(aug), decode_threads=threads) as ld:
                runs.append(torch.cat([x for x, _ in ld.epoch(0)]))
        assert torch.equal(runs[0], runs[1])


def test_devices_pinning_and_the_old_thread_name(raw_container):
    with DataStore(MPI.COMM_SELF, raw_container, batch_size=8) as st:
        with StoreLoader(st, device="cpu") as ld:
            x, y = next(iter(ld))
            assert x.device.type == "cpu" and y.device.type == "cpu"
        with pytest.warns(DeprecationWarning, match="decode_threads"):
            ld = StoreLoader(st, num_threads=3)
        assert ld.decode_threads == 3
        ld.close()
        if not torch.cuda.is_available():
            with pytest.warns(UserWarning, match="pin_memory"):
                StoreLoader(st, pin_memory=True).close()
            with pytest.raises(ConfigError, match="no CUDA"):
                StoreLoader(st, device="cuda")
