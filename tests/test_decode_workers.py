"""StoreLoader(workers=N): batches bit-identical to the decode threads' (1 and 2 workers, across
epochs, across resume on another rank count under mpiexec -n 2), the batch part of a transform the
same on a CPU and a GPU, a worker's error naming the sample, a dead worker ending the epoch with an
error, and no worker outliving its rank (kill -9)."""

import io
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch
from mpi4py import MPI
from support.mpirun import run_mpi
from workers_run import TRANSFORM

from dstore.errors import ConfigError, DStoreError, SampleError
from dstore.formats import create_writer
from dstore.loader.store_loader import StoreLoader
from dstore.loader.workers import available_cores, default_workers
from dstore.store.data_store import DataStore
from dstore.training.augment import IDENTITY, ImageTransform

HERE = os.path.dirname(__file__)

BAD = 5  # the sample that is not a JPEG in `bad_container`


def _jpegs(path: str, n: int, bad: int | None = None) -> str:
    from PIL import Image

    rng = np.random.default_rng(0)
    with create_writer(path, "hdf5", encoding="jpeg", class_names=["a", "b"]) as w:
        for i in range(n):
            buf = io.BytesIO()
            Image.fromarray(rng.integers(0, 256, (40 + i % 7, 50 + i % 5, 3), dtype=np.uint8)).save(buf, "JPEG")
            data = b"\xff\xd8 not a jpeg" if i == bad else buf.getvalue()
            w.append(data, i % 2, f"p{i}.jpg", i)
    return path


@pytest.fixture(scope="module")
def jpegs(tmp_path_factory):
    return _jpegs(str(tmp_path_factory.mktemp("wk") / "jpegs.h5"), 40)


@pytest.fixture(scope="module")
def bad_container(tmp_path_factory):
    return _jpegs(str(tmp_path_factory.mktemp("wk") / "bad.h5"), 16, bad=BAD)


def _run(st, epochs, **kw):
    """(images, labels, ids) of every batch of `epochs` (an epoch or a tuple of them), one loader."""
    with StoreLoader(st, size=(32, 32), channels=3, **kw) as ld:
        return [(x, y, ld.last_ids.copy()) for e in np.atleast_1d(epochs) for x, y in ld.epoch(int(e))]


def _same(a, b) -> bool:
    return len(a) == len(b) and all(
        torch.equal(x, u) and torch.equal(y, v) and np.array_equal(i, k) for (x, y, i), (u, v, k) in zip(a, b)
    )


def test_workers_deliver_the_threads_batches_bit_for_bit(jpegs):
    with DataStore(MPI.COMM_SELF, jpegs, batch_size=8, seed=3) as st:
        ref = _run(st, (0, 1), transform=TRANSFORM, decode_threads=2)
        assert _same(ref, _run(st, (0, 1), transform=TRANSFORM, workers=1))
        assert _same(ref, _run(st, (0, 1), transform=TRANSFORM, workers=2, ahead=1))
        # the batch part as tensor ops on the CPU batch (as on a GPU): the same pixels
        assert _same(ref, _run(st, (0, 1), transform=TRANSFORM, workers=2, batch_ops="device"))
        # the resize and crop as one batch op too (the workers only decode and cut out): the same pixels
        assert _same(ref, _run(st, (0, 1), transform=TRANSFORM, workers=2, resize_on="device"))
        assert sum(len(x) for x, _, _ in ref) == 80 and ref[0][0].dtype == torch.uint8
        # no transform: the resized decode, as the threads give it
        assert _same(_run(st, 0, decode_threads=1), _run(st, 0, workers=2))
        # normalize=True: the batch normalised after the batch part, equal to the per-sample float path
        as_float = ImageTransform(**{**TRANSFORM.__dict__, "normalize": True})
        ref_float = _run(st, 1, transform=as_float, decode_threads=2)
        assert _same(ref_float, _run(st, 1, transform=as_float, workers=1, batch_ops="device"))
        # images shrunk 2.5x: blocks averaged first (dstore.codec.resize.fit), in the workers either way
        small = ImageTransform(**{**TRANSFORM.__dict__, "size": (16, 16), "pad": 2})
        ref_small = _run(st, 0, transform=small, decode_threads=2)
        assert ref_small[0][0].shape[1:] == (3, 16, 16)
        assert _same(ref_small, _run(st, 0, transform=small, workers=2, resize_on="device"))
        assert _same(ref_small, _run(st, 0, transform=small, workers=1, resize_on="worker"))
    with DataStore(MPI.COMM_SELF, jpegs, batch_size=8, seed=4) as st:  # another seed, other pixels
        other = _run(st, 0, transform=TRANSFORM, decode_threads=1)
    assert not torch.equal(other[0][0], ref[0][0])


def test_the_batch_part_flips_and_jitters_as_specified():
    tf = ImageTransform(**{**TRANSFORM.__dict__})
    rng = np.random.default_rng(7)
    images = torch.from_numpy(rng.integers(0, 256, (4, 3, 5, 6), dtype=np.uint8))
    params = torch.from_numpy(np.stack([IDENTITY, IDENTITY, IDENTITY, IDENTITY]))
    params[1, 0], params[2, 1], params[3, 2] = 1, 300, 200
    out = tf.batch_part(images, params)
    for k in range(4):  # the numpy form decode threads and workers apply: the same pixels
        hwc = images[k].permute(1, 2, 0).numpy()
        assert np.array_equal(tf.finish(hwc, params[k].numpy()), out[k].permute(1, 2, 0).numpy())
    assert torch.equal(out[0], images[0]) and torch.equal(out[1], images[1].flip(-1))
    want = np.clip(np.floor(images[2].numpy().astype(np.int64) * 300 / 256 + 0.5), 0, 255)
    assert np.array_equal(out[2].numpy(), want)
    x = images[3].numpy().astype(np.int64)
    mean = np.floor(x.mean() + 0.5)
    assert np.abs(out[3].numpy() - np.clip(mean + (x - mean) * 200 / 256, 0, 255)).max() <= 1
    with pytest.raises(ConfigError, match="jitter"):
        ImageTransform(**{**TRANSFORM.__dict__, "jitter": 1.5})


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU here")
def test_the_batch_part_gives_the_same_pixels_on_a_gpu(jpegs):
    rng = np.random.default_rng(8)
    images = torch.from_numpy(rng.integers(0, 256, (16, 3, 32, 32), dtype=np.uint8))
    params = torch.from_numpy(
        np.stack(
            [
                TRANSFORM.sample_part(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8), np.random.default_rng(i))[1]
                for i in range(16)
            ]
        )
    )
    assert torch.equal(TRANSFORM.batch_part(images, params), TRANSFORM.batch_part(images.cuda(), params).cpu())
    with DataStore(MPI.COMM_SELF, jpegs, batch_size=8, seed=3) as st:
        ref = _run(st, 1, transform=TRANSFORM, decode_threads=2)
        got = _run(st, 1, transform=TRANSFORM, workers=2, device="cuda", pin_memory=True)
        on_gpu = _run(st, 1, transform=TRANSFORM, workers=2, device="cuda", pin_memory=True, resize_on="device")
    assert all(torch.equal(x, u.cpu()) for (x, _, _), (u, _, _) in zip(ref, got))
    assert all(torch.equal(x, u.cpu()) for (x, _, _), (u, _, _) in zip(ref, on_gpu))


def test_a_worker_error_names_the_sample_and_the_loader_goes_on(bad_container):
    with (
        DataStore(MPI.COMM_SELF, bad_container, batch_size=4, seed=0) as st,
        StoreLoader(st, transform=TRANSFORM, workers=2) as ld,
    ):
        with pytest.raises(SampleError, match=f"cannot decode sample {BAD}:"):
            for _ in ld.epoch(0):
                pass
        # requests and answers still pair: the next epoch serves the good samples up to the bad one
        it = ld.epoch(1)
        x, _ = next(it)
        assert x.shape == (4, 3, 32, 32)
        it.close()


@pytest.mark.parametrize(
    "reaped, sig",
    [(False, signal.SIGKILL), (True, signal.SIGKILL), (False, signal.SIGSEGV)],
    ids=["dying", "dead-before-the-next-request", "SIGSEGV"],
)
def test_a_dead_worker_ends_the_epoch_with_an_error_naming_the_signal(jpegs, reaped, sig):
    with (
        DataStore(MPI.COMM_SELF, jpegs, batch_size=4, seed=0) as st,
        StoreLoader(st, transform=TRANSFORM, workers=2) as ld,
    ):
        it = ld.epoch(0)
        next(it)
        os.kill(ld.workers.pids[1], sig)
        if reaped:  # its pipe is closed when the next request is sent (a BrokenPipeError, unnamed, before)
            ld.workers.procs[1].wait(10)
        with pytest.raises(
            DStoreError,
            match=rf"decode worker 1 \(pid \d+\) ended unexpectedly, killed by "
            rf"{sig.name}",
        ) as err:
            for _ in it:
                pass
    assert ("out-of-memory" in str(err.value)) == (sig == signal.SIGKILL), err.value


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="killpg and the workers' sessions: POSIX")
def test_the_ranks_sigterm_never_reaches_its_workers(jpegs):
    """MPICH's proxy forwards mpiexec's SIGTERM to the rank's process group (and Slurm to every process of
    the step): the workers ignore it, and the rank, which checkpoints on it, gets its batches to the end."""
    res = subprocess.run(
        [sys.executable, os.path.join(HERE, "workers_run.py"), "term", jpegs],
        capture_output=True,
        text=True,
        timeout=120,
        start_new_session=True,
    )
    assert res.returncode == 0 and "served 4 after TERM" in res.stdout, (res.stdout, res.stderr)


def test_workers_refuse_what_they_cannot_run(jpegs):
    with DataStore(MPI.COMM_SELF, jpegs, batch_size=4) as st:
        with pytest.raises(ConfigError, match="sample_part"):
            StoreLoader(st, transform=lambda a: a, size=8, channels=3, workers=1)
        with pytest.raises(ConfigError, match="size"):
            StoreLoader(st, workers=1)
        with pytest.raises(ConfigError, match="workers"):
            StoreLoader(st, size=8, channels=3, workers=-1)
        with pytest.raises(ConfigError, match="resize_on"):
            StoreLoader(st, transform=TRANSFORM, size=8, channels=3, resize_on="device")  # threads
        with pytest.raises(ConfigError, match="resize_on"):
            StoreLoader(st, size=8, channels=3, workers=1, resize_on="device")  # no transform to defer
        with pytest.raises(ConfigError, match="resize_on"):
            StoreLoader(st, size=8, channels=3, resize_on="gpu")
    assert 1 <= default_workers(2) <= max(1, available_cores())


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/status") as fh:
            return any(line.startswith("State:") and "Z" in line.split()[1] for line in fh)
    except FileNotFoundError:
        return True


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_kill_9_of_the_rank_leaves_no_worker(jpegs):
    proc = subprocess.Popen(
        [sys.executable, os.path.join(HERE, "workers_run.py"), "hold", jpegs], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None  # stdout=PIPE
    try:
        line = proc.stdout.readline().split()
        assert line[:1] == ["pids"], line
        workers = [int(p) for p in line[2:]]
        assert len(workers) == 2 and not any(_gone(p) for p in workers)
    finally:
        proc.kill()
        proc.wait()
    deadline = time.monotonic() + 10
    while not all(_gone(p) for p in workers) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert all(_gone(p) for p in workers)


@pytest.mark.mpi
@pytest.mark.parametrize("node_views", ["1", "0"])
def test_two_ranks_of_workers_and_a_resume_on_one_rank_give_the_same_pixels(jpegs, tmp_path, node_views):
    """Node views on: the workers read the peer's samples in place too (NOTE [decode workers] 3);
    off: the peer's samples come by gets into the store's receive buffers, which the rank copies."""
    env = {"DSTORE_NODE_VIEWS": node_views}
    run_mpi(2, ["python", os.path.join(HERE, "workers_run.py"), "ranks", jpegs, str(tmp_path)], timeout=120, env=env)
    with DataStore(MPI.COMM_SELF, jpegs, batch_size=8, seed=3) as st:
        ref = _run(st, 1, transform=TRANSFORM, decode_threads=2)
        by_id = {int(i): x for (xs, _, ids) in ref for x, i in zip(xs, ids)}
        for r in range(2):
            got = np.load(tmp_path / f"rank{r}.npz")
            assert len(got["ids"]) == 20
            assert all(np.array_equal(by_id[int(i)].numpy(), x) for i, x in zip(got["ids"], got["images"]))
        with StoreLoader(st, transform=TRANSFORM, size=(32, 32), channels=3, workers=1) as ld:
            ld.load_state_dict(json.loads((tmp_path / "state.json").read_text()))
            rest = [(x, y, ld.last_ids.copy()) for x, y in ld]
    assert _same(rest, ref[1:])


def test_a_batch_let_go_of_is_written_again_and_a_held_one_never(jpegs):
    """NOTE [decode workers] 3: on the CPU a batch's segment comes back once the caller drops the
    batch, and is written again (no new segments in an epoch whose batches are dropped); a batch
    still held is never written; spares past KEEP_HANDED are closed and the workers unmap them."""
    from dstore.loader import workers as wk

    with (
        DataStore(MPI.COMM_SELF, jpegs, batch_size=4, seed=3) as st,
        StoreLoader(st, size=(32, 32), channels=3, workers=1) as ld,
    ):
        for _ in ld.epoch(0):  # the ring and its spares made
            pass
        made = wk.Segment._made
        for e in (1, 2, 3):  # 30 batches: how many are in flight at once varies by a batch or so
            for _ in ld.epoch(e):
                pass
        assert wk.Segment._made - made <= 2
        made = wk.Segment._made
        held = [(x, x.clone()) for x, _ in ld.epoch(4)]
        for _ in ld.epoch(5):
            pass
        assert wk.Segment._made - made >= 5  # the held batches' segments could not serve
        assert all(torch.equal(x, c) for x, c in held)
        del held  # ten segments back at once: four kept, the rest closed and retired
        for _ in ld.epoch(6):
            pass
        with open(f"/proc/{ld.workers.pids[0]}/maps") as fh:
            maps = {line.split()[0] for line in fh if "dstore-decode" in line}
        assert len(maps) <= 2 * len(ld.workers.slots) + wk.KEEP_HANDED + 2, maps


def test_the_compiled_kernels_give_the_same_batches_in_threads_and_workers(jpegs):
    """At 72 x 72 (over dstore.codec.kernels.NATIVE_MIN_PIXELS) the per-sample pass is the compiled one once
    it is loaded, in the rank's threads and in the workers: the batches of an epoch served after
    the load equal those of the numpy path (DSTORE_NATIVE=0 for the threads and in the workers)."""
    from dstore.codec import kernels

    big = ImageTransform(**{**TRANSFORM.__dict__, "size": (72, 72), "pad": 9})
    with DataStore(MPI.COMM_SELF, jpegs, batch_size=8, seed=3) as st:
        assert kernels.available()
        fast = _run(st, 1, transform=big, decode_threads=2)
        os.environ["DSTORE_NATIVE_AFTER"] = "1"  # the workers load them after their first sample
        try:
            with StoreLoader(st, size=(72, 72), channels=3, transform=big, workers=2) as ld:
                deadline = time.monotonic() + 60
                while not ld.workers.native and time.monotonic() < deadline:  # epochs until both loaded
                    for _ in ld.epoch(0):
                        pass
                assert ld.workers.native
                in_workers = [(x, y, ld.last_ids.copy()) for x, y in ld.epoch(1)]
        finally:
            del os.environ["DSTORE_NATIVE_AFTER"]
        os.environ["DSTORE_NATIVE"] = "0"
        kernels._reset()
        try:
            slow = _run(st, 1, transform=big, decode_threads=2)
            slow_workers = _run(st, 1, transform=big, workers=1)
        finally:
            del os.environ["DSTORE_NATIVE"]
            kernels._reset()
    assert fast[0][0].shape[1:] == (3, 72, 72)
    assert _same(fast, slow) and _same(fast, in_workers) and _same(fast, slow_workers)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="process_vm_readv is Linux's")
def test_workers_read_the_windows_samples_in_the_rank_and_the_rank_copies_nothing(jpegs, monkeypatch):
    """NOTE [decode workers] 3, reading in place: a batch's samples held in the store's windows are
    read by the workers out of the rank's memory at their `Batch.where` address (the rank copies no
    byte), the same batches as with the copy ($DSTORE_WORKERS_READ=0); an address that is not
    mapped is an OSError naming the process."""
    from dstore.loader import vmread

    with DataStore(MPI.COMM_SELF, jpegs, batch_size=8, seed=3) as st:
        batches = list(st.epoch(0))
        for b in batches:  # every sample of a window, at the address given
            assert b.where is not None and b.where.all()
            assert all(ctypes_bytes(a, s.size) == s.tobytes() for a, s in zip(b.where.tolist(), b.samples))
        b = batches[-1]
        with StoreLoader(st, size=(32, 32), channels=3, workers=2) as ld:
            read = [(x, y, ld.last_ids.copy()) for x, y in ld.epoch(1)]
            assert ld.workers.reads and ld.stats["copy_bytes"] == 0
            assert ld.workers.nothing_to_copy(b)  # so the request is sent from the caller's thread
        monkeypatch.setenv("DSTORE_WORKERS_READ", "0")
        with StoreLoader(st, size=(32, 32), channels=3, workers=2) as ld:
            copied = [(x, y, ld.last_ids.copy()) for x, y in ld.epoch(1)]
            assert not ld.workers.reads and ld.stats["copy_bytes"] > 0
    assert _same(read, copied) and len(read) == 5
    with pytest.raises(OSError, match=f"process {os.getpid()}"):
        vmread.read(os.getpid(), np.array([8], np.uint64), np.array([16], np.uint64), np.zeros(16, np.uint8))


def ctypes_bytes(address: int, n: int) -> bytes:
    import ctypes

    return ctypes.string_at(address, n)


class _Unloadable:
    """A transform the rank pickles and a worker cannot load (unpickling it divides by zero)."""

    size, channels = (8, 8), 3

    def __call__(self, arr):
        return arr

    def sample_part(self, arr, rng):
        return arr, ()

    def batch_part(self, images, params):
        return images

    def __reduce__(self):
        import operator

        return operator.truediv, (1, 0)


def test_a_worker_that_cannot_load_the_setup_says_why(jpegs):
    """NOTE [decode workers] 1: the worker's error answer to the setup is the loader's error."""
    with DataStore(MPI.COMM_SELF, jpegs, batch_size=4) as st, StoreLoader(st, transform=_Unloadable(), workers=1) as ld:
        with pytest.raises(DStoreError, match="could not start: cannot load the loader's setup: ZeroDivisionError"):
            next(iter(ld.epoch(0)))


def test_a_store_closed_before_its_loader_ends_the_loaders_epoch_before_freeing(jpegs):
    """Workers read the windows in place (NOTE [decode workers] 3): a store closed while a loader's
    epoch over it is open (batches in flight) ends that epoch first, its answers drained, and only
    then frees its windows (DataStore.before_free); the epoch is over, and the loader closes after."""
    st = DataStore(MPI.COMM_SELF, jpegs, batch_size=8, seed=3)
    st.populate()
    ld = StoreLoader(st, size=(32, 32), channels=3, workers=2)
    it = ld.epoch(0)
    first = next(it)
    assert ld.workers.reads  # the case that matters: the workers read the rank's memory
    st.close()
    with pytest.raises(StopIteration):
        next(it)
    ld.close()
    assert first[0].shape[1:] == (3, 32, 32)
