"""A decode worker process: `python -m dstore.loader.decode_worker FD_IN FD_OUT PARENT_PID INDEX` (started as
`python -c` through `main`, dstore.loader.workers._WORKER_MAIN).

Started by `dstore.loader.workers.DecodeWorkers` (the protocol is its NOTE [decode workers]): it decodes,
resizes and runs the transform's per-sample part on ranges of whole batches, reading the encoded
bytes from shared memory or out of the rank's own memory (dstore.loader.vmread) and writing the
pixels (CHW uint8) and the batch-part parameters into shared memory. It imports neither MPI nor
torch, and it dies with its rank.
"""

from __future__ import annotations

import ctypes
import gc
import mmap
import os
import pickle
import signal
import sys
import time
from multiprocessing.connection import Connection

import numpy as np

from dstore.codec import kernels
from dstore.codec.decode import crop_size, decode_crop, decode_sample, resize
from dstore.codec.kernels import resize_chw
from dstore.loader import vmread
from dstore.loader.draws import draws_for
from dstore.loader.workers import JOB_SIGNALS, NPARAMS, params_offset

_PR_SET_PDEATHSIG = 1
MAX_SPARE_MAPS = 64
"""Spare output segments a worker keeps mapped at most, should the rank's `retired` never name
them (the rank keeps dstore.loader.workers.KEEP_HANDED spares and retires the rest)."""


def die_with_parent(parent: int) -> None:
    """SIGKILL this process when the thread that started it ends (Linux prctl), and exit now if
    the parent is already gone (it may have died before the prctl). NOTE [decode workers] 2."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except (OSError, AttributeError):  # no prctl: the pipe's EOF still ends the worker
            pass
    if os.getppid() != parent:
        os._exit(0)


class Segments:
    """The shared segments this worker has mapped: a slot's own, one per (slot, kind), mapped anew
    when the rank replaced it (a new uid); and a batch's own output segments (NOTE [decode workers]
    3), by uid, kept mapped while the rank keeps them as spares to be written again, unmapped when
    a request names them retired."""

    def __init__(self):
        self.maps = {}  # (slot, kind) or ("own", uid) -> (uid, mmap, uint8 array)

    def retire(self, uids) -> None:
        """Unmaps the batches' own output segments the rank has closed."""
        for uid in uids:
            self.maps.pop(("own", uid), None)

    def get(self, slot: int, kind: str, where: tuple[str, int, int], own: bool = False) -> np.ndarray:
        """The segment at `where` = (path, size, uid) as a uint8 array, mapped once per uid; `own`:
        a batch's own output segment (kept by uid, whichever slot it serves)."""
        path, size, uid = where
        key = ("own", uid) if own else (slot, kind)
        have = self.maps.get(key)
        if have is not None and have[0] == uid:
            return have[2]
        if have is not None:
            self.maps.pop(key)
            del have  # the array holds the map: both go before it closes
        if own:
            spares = [k for k in self.maps if k[0] == "own"]
            for k in spares[: max(0, len(spares) + 1 - MAX_SPARE_MAPS)]:
                self.maps.pop(k)
        fd = os.open(path, os.O_RDWR)
        try:
            mm = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        arr = np.frombuffer(mm, np.uint8)
        self.maps[key] = (uid, mm, arr)
        return arr


class Scratch:
    """The bytes this worker read out of its rank's memory (dstore.loader.vmread) for its part of a
    batch: one buffer, grown as needed and kept (a fresh one per batch would fault its pages in
    again)."""

    def __init__(self):
        self.buf = np.zeros(0, np.uint8)

    def take(self, rank: int, addrs: np.ndarray, lens: np.ndarray) -> list[np.ndarray]:
        """The samples at `addrs` (`lens` bytes each) of process `rank`, read in one call, as views."""
        total = int(lens.sum())
        if self.buf.size < total:
            self.buf = np.empty(max(total, 2 * self.buf.size), np.uint8)
        vmread.read(rank, addrs, lens, self.buf)
        ends = np.cumsum(lens).tolist()
        return [self.buf[b - n : b] for b, n in zip(ends, lens.tolist())]


def sample_bytes(src: np.ndarray, req: dict, lo: int, hi: int, rank: int, scratch: Scratch) -> list[np.ndarray]:
    """The encoded bytes of samples lo .. hi - 1 of a request (NOTE [decode workers] 4): a slice of
    the slot's input segment, or, where the request gives the sample's address in the rank (`addr`
    non-zero), read from there with the other such samples of the range in one call."""
    offsets = np.frombuffer(req["offsets"], np.int64)
    out = [src[offsets[i] : offsets[i + 1]] for i in range(lo, hi)]
    if req["addr"] is None:
        return out
    addr = np.frombuffer(req["addr"], np.int64)
    far = np.nonzero(addr[lo:hi])[0]
    if far.size:
        lens = np.frombuffer(req["lens"], np.int64)[lo:hi][far]
        try:
            got = scratch.take(rank, addr[lo:hi][far], lens)
        except OSError as exc:
            ids = np.frombuffer(req["ids"], np.int64)[lo:hi][far]
            raise RuntimeError(
                f"samples {ids[:4].tolist()}{'...' if ids.size > 4 else ''}: cannot read their bytes in the "
                f"rank (pid {rank}): {exc}"
            ) from None
        for k, view in zip(far.tolist(), got):
            out[k] = view
    return out


def decode_range(setup: dict, segs: Segments, req: dict, index: int, rank: int, scratch: Scratch) -> None:
    """This worker's part of one batch (samples cuts[index] .. cuts[index + 1] - 1), decoded into the
    output segment."""
    c, h, w = setup["shape"]
    cap = req["capacity"]
    segs.retire(req.get("retired", ()))
    src = segs.get(req["slot"], "in", req["in"])
    out = segs.get(req["slot"], "out", req["out"], own=req["fresh"])
    pixels = out[: cap * c * h * w].reshape(cap, c, h, w)
    at = params_offset(cap, (c, h, w))
    params = out[at : at + cap * 4 * NPARAMS].view(np.int32).reshape(cap, NPARAMS)
    ids, epoch = np.frombuffer(req["ids"], np.int64), req["epoch"]
    lo, hi = req["cuts"][index], req["cuts"][index + 1]
    data = sample_bytes(src, req, lo, hi, rank, scratch)
    tf, info, size, defer = setup["transform"], setup["info"], setup["size"], setup["defer"]
    into = tf is not None and hasattr(tf, "sample_into")
    for i in range(lo, hi):
        sid = int(ids[i])
        name = f"sample {sid}"
        if tf is not None and getattr(tf, "crop_aware", False):  # the crop known before the decode
            rng = draws_for(tf, (setup["seed"], epoch, sid))
            arr, where, p = decode_crop(
                data[i - lo],
                info,
                lambda shape, rng=rng: tf.plan(shape, rng),
                crop_size(tf),
                channels=setup["channels"],
                name=name,
                scratch=True,
            )
            plan = {"plan": (where, p)}
        else:
            arr, plan = (
                decode_sample(
                    data[i - lo],
                    info,
                    channels=setup["channels"],
                    min_size=setup["hint"],
                    name=name,
                ),
                {},
            )
        if size is not None and not plan:
            if tf is None and arr.ndim == 3 and arr.shape[2] == c and arr.dtype == np.uint8:
                # the resize and the CHW copy in one pass
                resize_chw(arr, (0, 0, int(arr.shape[0]), int(arr.shape[1])), size, pixels[i])
                continue
            arr = resize(arr, size)
        if tf is not None:
            rng = None if plan else draws_for(tf, (setup["seed"], epoch, sid))  # as the decode threads,
            # NOTE [decode workers] 6
            if into and not defer:  # the whole per-sample part in one pass, straight into the batch
                try:
                    p = tf.sample_into(arr, rng, pixels[i], finish=setup["finish"], **plan)
                except Exception as exc:  # the transform's own errors: name the sample
                    raise RuntimeError(f"the transform failed on {name}: {type(exc).__name__}: {exc}") from exc
                if not setup["finish"]:
                    params[i, : len(p)] = p
                continue
            try:
                arr, p = (
                    tf.sample_part(arr, rng, defer_resize=True, **plan) if defer else tf.sample_part(arr, rng, **plan)
                )
            except Exception as exc:  # the transform's own errors: name the sample
                raise RuntimeError(f"the transform failed on {name}: {type(exc).__name__}: {exc}") from exc
            if setup["finish"]:  # the batch stays on the CPU: its batch part is applied here
                arr = tf.finish(arr, p)
            else:
                params[i, : len(p)] = p
        if defer:  # the part to resize, in the canvas's top left corner; its size is in the parameters
            ih, iw, ic = arr.shape
            if ic != c or ih > h or iw > w:
                raise RuntimeError(
                    f"{name}: the part to resize has shape {arr.shape} (H, W, C), more than the "
                    f"batch's canvas {(h, w, c)}"
                )
            pixels[i, :, :ih, :iw] = arr.transpose(2, 0, 1)
            continue
        if arr.shape != (h, w, c):
            remedy = (
                "channels=1 or 3 (StoreLoader(channels=...), dstore train --channels)"
                if arr.shape[2:] != (c,)
                else "size=(H, W)"
            )
            raise RuntimeError(
                f"{name} decodes to shape {arr.shape} (H, W, C), the batch's is {(h, w, c)}; "
                f"pass {remedy}, or a transform that makes them equal"
            )
        pixels[i] = arr.transpose(2, 0, 1)


def serve(conn_in: Connection, conn_out: Connection, index: int = 0, rank: int = 0) -> int:
    """Worker `index`'s loop (its rank: process `rank`): the setup, then one answer per request,
    until "stop" or EOF."""
    try:
        setup = pickle.loads(conn_in.recv_bytes())
    except EOFError:
        return 0
    except Exception as exc:  # noqa: BLE001 - an unpicklable transform (its module missing here, say)
        conn_out.send_bytes(
            pickle.dumps(("error", -1, f"cannot load the loader's setup: {type(exc).__name__}: {exc}", False))
        )
        return 1
    # The loop makes no reference cycles; the collector's passes over the interpreter's objects
    # showed as 1.3% of a worker's time (py-spy): they are set aside, and passes made rarer.
    gc.collect()
    gc.freeze()
    gc.set_threshold(50_000, 50, 100)
    probe = setup.get("probe")  # (address, bytes) in the rank: whether this worker can read there
    reads = probe is not None and vmread.readable(rank, *probe)
    conn_out.send_bytes(pickle.dumps(("ready", os.getpid(), reads, kernels.loaded())))
    segs, scratch = Segments(), Scratch()
    while True:
        try:
            req = pickle.loads(conn_in.recv_bytes())
        except EOFError:  # the rank is gone or closed its end
            return 0
        if req is None:
            return 0
        t0 = time.perf_counter()
        try:
            decode_range(setup, segs, req, index, rank, scratch)
            answer = ("ok", req["ticket"], time.perf_counter() - t0, kernels.loaded())
        except Exception as exc:  # noqa: BLE001 - every error goes back to the rank, named
            answer = ("error", req["ticket"], str(exc), kernels.loaded())
        conn_out.send_bytes(pickle.dumps(answer))


def main(argv=None) -> int:
    fd_in, fd_out, parent, index = (int(a) for a in (argv or sys.argv[1:]))
    for name in JOB_SIGNALS:  # the rank's, which stops its workers
        signal.signal(getattr(signal, name), signal.SIG_IGN)  # (NOTE [decode workers] 2; already, under -c)
    die_with_parent(parent)
    return serve(Connection(fd_in, writable=False), Connection(fd_out, readable=False), index, parent)


if __name__ == "__main__":
    raise SystemExit(main())
