"""A decode worker process: `python -m dstore.decode_worker FD_IN FD_OUT PARENT_PID`.

Started by `dstore.workers.DecodeWorkers` (the protocol is its NOTE [decode workers]): it decodes,
resizes and runs the transform's per-sample part on ranges of whole batches, reading the encoded
bytes from shared memory and writing the pixels (CHW uint8) and the batch-part parameters into
shared memory. It imports neither MPI nor torch, and it dies with its rank.
"""

from __future__ import annotations

import collections
import ctypes
import mmap
import os
import pickle
import signal
import sys
import time
from multiprocessing.connection import Connection

import numpy as np

from dstore.decode import decode_sample, resize
from dstore.workers import NPARAMS, params_offset

_PR_SET_PDEATHSIG = 1
KEEP_HANDED = 4
"""Batches handed to the caller whose segments a worker keeps mapped a while (see Segments.drop)."""


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
    """The shared segments this worker has mapped, one per (slot, kind), mapped anew when the
    rank replaced a slot's segment (a new path) and unmapped then."""

    def __init__(self):
        self.maps = {}  # (slot, kind) -> (uid, mmap, uint8 array)
        self.handed = collections.deque()  # maps of the batches handed to the caller, newest last

    def drop(self, slot: int, kind: str) -> None:
        """Lets go of the segment of (slot, kind): a batch's own segment, now the caller's. Its map
        is kept for the next KEEP_HANDED batches, so that the rank's process, letting go of a batch
        it has used, only unmaps it, and freeing its pages (about 40 us of kernel time per 224px
        sample, measured) mostly falls to this worker, when it unmaps it here later."""
        have = self.maps.pop((slot, kind), None)
        if have is not None:
            self.handed.append(have)
        while len(self.handed) > KEEP_HANDED:
            self.handed.popleft()

    def get(self, slot: int, kind: str, where: tuple[str, int, int]) -> np.ndarray:
        """The segment at `where` = (path, size, uid) as a uint8 array, mapped once per uid."""
        path, size, uid = where
        key = (slot, kind)
        have = self.maps.get(key)
        if have is not None and have[0] == uid:
            return have[2]
        if have is not None:
            self.maps.pop(key)
            del have  # the array holds the map: both go before it closes
        fd = os.open(path, os.O_RDWR)
        try:
            mm = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        arr = np.frombuffer(mm, np.uint8)
        self.maps[key] = (uid, mm, arr)
        return arr


def decode_range(setup: dict, segs: Segments, req: dict) -> None:
    """Samples req["lo"] .. req["hi"] - 1 of one batch, decoded into the output segment."""
    c, h, w = setup["shape"]
    cap = req["capacity"]
    src = segs.get(req["slot"], "in", req["in"])
    out = segs.get(req["slot"], "out", req["out"])
    pixels = out[: cap * c * h * w].reshape(cap, c, h, w)
    at = params_offset(cap, (c, h, w))
    params = out[at: at + cap * 4 * NPARAMS].view(np.int32).reshape(cap, NPARAMS)
    offsets, ids, epoch = req["offsets"], req["ids"], req["epoch"]
    tf, info, size, defer = setup["transform"], setup["info"], setup["size"], setup["defer"]
    for i in range(req["lo"], req["hi"]):
        sid = int(ids[i])
        name = f"sample {sid}"
        arr = decode_sample(src[offsets[i]:offsets[i + 1]], info, channels=setup["channels"], min_size=setup["hint"],
                            name=name)
        if size is not None:
            arr = resize(arr, size)
        if tf is not None:
            rng = np.random.default_rng([setup["seed"], epoch, sid])
            try:
                arr, p = tf.sample_part(arr, rng, defer_resize=True) if defer else tf.sample_part(arr, rng)
            except Exception as exc:  # the transform's own errors: name the sample
                raise RuntimeError(f"the transform failed on {name}: {type(exc).__name__}: {exc}") from exc
            if setup["finish"]:  # the batch stays on the CPU: its batch part is applied here
                arr = tf.finish(arr, p)
            else:
                params[i, : len(p)] = p
        if defer:  # the part to resize, in the canvas's top left corner; its size is in the parameters
            ih, iw, ic = arr.shape
            if ic != c or ih > h or iw > w:
                raise RuntimeError(f"{name}: the part to resize has shape {arr.shape} (H, W, C), more than the "
                                   f"batch's canvas {(h, w, c)}")
            pixels[i, :, :ih, :iw] = arr.transpose(2, 0, 1)
            continue
        if arr.shape != (h, w, c):
            raise RuntimeError(f"{name} decodes to shape {arr.shape} (H, W, C), the batch's is {(h, w, c)}; "
                               f"pass size=(H, W) and channels, or a transform that makes them equal")
        pixels[i] = arr.transpose(2, 0, 1)
    if req["fresh"]:  # a batch's own segment, the caller's from now on: unmap it here
        segs.drop(req["slot"], "out")


def serve(conn_in: Connection, conn_out: Connection) -> int:
    """The worker's loop: the setup, then one answer per request, until "stop" or EOF."""
    try:
        setup = pickle.loads(conn_in.recv_bytes())
    except EOFError:
        return 0
    except Exception as exc:  # noqa: BLE001 - an unpicklable transform (its module missing here, say)
        conn_out.send_bytes(pickle.dumps(("error", -1, f"cannot load the loader's setup: {type(exc).__name__}: "
                                                       f"{exc}")))
        return 1
    conn_out.send_bytes(pickle.dumps(("ready", os.getpid(), 0.0)))
    segs = Segments()
    while True:
        try:
            req = pickle.loads(conn_in.recv_bytes())
        except EOFError:  # the rank is gone or closed its end
            return 0
        if req is None:
            return 0
        t0 = time.perf_counter()
        try:
            decode_range(setup, segs, req)
            answer = ("ok", req["ticket"], time.perf_counter() - t0)
        except Exception as exc:  # noqa: BLE001 - every error goes back to the rank, named
            answer = ("error", req["ticket"], str(exc))
        conn_out.send_bytes(pickle.dumps(answer))


def main(argv=None) -> int:
    fd_in, fd_out, parent = (int(a) for a in (argv or sys.argv[1:]))
    die_with_parent(parent)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C goes to the rank, which stops its workers
    return serve(Connection(fd_in, writable=False), Connection(fd_out, readable=False))


if __name__ == "__main__":
    raise SystemExit(main())
