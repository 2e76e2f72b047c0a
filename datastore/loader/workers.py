"""Decode workers: a StoreLoader's per-sample work (decode, resize, the transform's per-sample part)
in processes of their own, so the rank's process holds the GIL only for whole batches.

The rank never touches a sample in Python: per batch it sends its workers one request (sample ids,
and where each sample's bytes are: in the store's windows, which the workers read out of the rank's
memory themselves where the system allows it, else copied by the rank into shared memory in one
call), and reads one answer per worker; the pixels arrive in a shared batch buffer, from which the
batch is copied once (to the GPU from pinned memory, or into a tensor of its own on the CPU).

NOTE [decode workers] (the protocol; code relying on a point cites it by number)
1. Start. Each worker is `python -c _WORKER_MAIN FD_IN FD_OUT RANK_PID INDEX` (dstore.loader.decode_worker's
   `main`), started through
   subprocess (fork and exec at once) from the loader's copier thread. Not multiprocessing's fork:
   a copy of a process that called MPI_Init, with other threads' locks possibly held. Not spawn or
   forkserver either: both re-import the main script in the child, and a script that imports
   mpi4py at its top would call MPI_Init there. An exec'd interpreter inherits only its two pipe
   ends, and its environment lacks the launcher's variables (PMI_*, PMIX_*, OMPI_*, HYDRA_*,
   MPI_LOCALRANKID...), so not even an import of mpi4py could join the job. Workers import
   neither MPI nor torch. The first message is the setup (the pickled transform, shapes, seed, and
   a probe: an address in the rank and the 16 bytes there); the worker answers ("ready", pid,
   whether it read the probe's bytes at that address, native) (or an error, raised by the loader)
   before any request.
2. Lifetime. The job's signals are the rank's, never a worker's: a worker runs in a session (and
   process group) of its own, so a signal to the rank's group misses it (MPICH's proxy forwards
   mpiexec's SIGTERM to each rank's process group, as a terminal's Ctrl-C goes to its foreground
   group), and it ignores SIGTERM, SIGINT, SIGUSR1/2 and SIGHUP from its first instruction (Slurm
   signals every process of the step). The rank stops its workers when it ends (preempted or not).
   A worker found dead is named with the signal that ended it (-N: that signal's name); the
   out-of-memory killer is named only for SIGKILL. The worker sets PR_SET_PDEATHSIG = SIGKILL (Linux, prctl through ctypes): it is
   killed when the thread that started it ends, the copier thread, which lives until the loader
   closes, or the rank dies (kill -9 included). It then checks its parent pid (the rank may have
   died before the prctl). EOF on its requests pipe ends it too (any OS). `close` sends "stop",
   waits, then kills.
3. Memory. The ring has `ahead + 1` slots (`ahead` batches decoding, one being handed over). A
   slot has an input segment (the encoded bytes, back to back, of the batch's samples the workers
   do not read themselves, copied out of the store's views by the copier thread) and an output
   segment (`capacity` x [C, H, W] uint8 pixels, then `capacity` x NPARAMS int32 batch-part
   parameters at `params_offset(capacity)`). With a deferred resize (`defer`) a sample's pixels
   are the part of its image the batch resize reads, in the top left corner of a canvas
   [C, Hc, Wc] (`ImageTransform.canvas`), its size among the parameters. Where batches stay on
   the CPU each batch gets an output segment of its own instead, the workers apply the transform's
   batch part themselves (`finish`: the flip is a stride of the copy they make anyway), and the
   caller's batch tensor is a view of the segment: no copy of the pixels in the rank at all (a
   batch-part flip there cost 1.2 ms per 224px sample, a clone 58 us). When the caller lets go of
   that tensor (its last view), the segment comes back as a spare, to be written again: up to
   KEEP_HANDED spares are kept, mapped by the rank and by the workers, and one past that is closed,
   its uid sent with the next request (`retired`) so that the workers unmap it too. A fresh
   segment per batch cost its writer 88 us of page faults per 224px sample and 26 us to free its
   pages, against 3 us to write a mapped one again (measured): a tenth of a worker's time. A segment is a memfd
   on Linux, shared by the path /proc/RANK_PID/fd/N: nothing to unlink, freed with the last map,
   so a kill -9 leaves nothing behind; elsewhere a file in /dev/shm (or the temporary folder)
   removed at close. A batch larger than its slot gets a new, larger segment; a worker maps a
   slot anew when its path changes. Where CUDA exists the output segments are page-locked
   (cudaHostRegister), so the copy to the GPU is asynchronous.
   Reading in place. A sample the store serves from a window (its `Batch.where`: its address in
   the rank, valid while the store is open) is not copied: where every worker read the probe
   (NOTE 1; the kernel's ptrace rule, dstore.loader.vmread; $DSTORE_WORKERS_READ=0 turns it off),
   the request gives its address and the worker reads its range's samples out of the rank's
   memory in one process_vm_readv, into a buffer of its own. The copy into the ring was the rank's
   largest cost per batch (0.4 ms of its 1.7 ms at 24 samples of 110 KB, measured); in a worker it
   is a few percent of the decode. The windows outlive every request: an epoch reads all its
   answers before it ends (NOTE 4), and a store ends its loaders' epochs before it frees its
   windows, also when it is closed first (StoreLoader registers with DataStore.before_free).
4. Requests. Per batch the rank sends each worker with samples to do the same request, pickled
   once: (ticket, slot, segment paths and sizes, capacity, cuts[workers + 1], offsets[n + 1],
   addr[n] and lens[n] or None, ids[n], epoch; the int64 arrays as their bytes); worker k does
   samples cuts[k]..cuts[k+1]-1. Sample
   i is at addr[i] in the rank (lens[i] bytes) where addr[i] is not 0 (NOTE 3), else
   input[offsets[i]:offsets[i+1]].
   A worker answers every request, in order: ("ok", ticket, seconds, native) once its pixels are
   written, or ("error", ticket, message naming the sample, native); native: its compiled kernels
   (dstore.codec.kernels) are loaded, which happens in the background after its start (`native`).
   `collect` reads one answer from each worker of the oldest batch, all of them even when one is
   an error (requests and answers stay paired),
   then raises the error as a SampleError. A dead worker is EOF on its answers pipe: a DStoreError
   naming it and its exit status.
5. Reuse. A slot is written again only after its batch was collected and, on a GPU, after the
   copy out of it finished (the CUDA event given to `release`).
6. Determinism. A sample's pixels and parameters are a function of (seed, epoch, sample id): the
   worker draws from `KeyedDraws(seed, epoch, id)` for a transform that says it can (`keyed`,
   dstore.loader.draws), else from numpy's Generator seeded with [seed, epoch, id], as the decode threads
   do, and which worker decodes a sample changes nothing.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import mmap
import os
import pickle
import signal
import subprocess
import sys
import tempfile
import threading
import time
import types
import weakref
from multiprocessing.connection import Connection
from typing import Protocol

import numpy as np

from dstore.errors import DStoreError, SampleError
from dstore.loader import vmread
from dstore.memory.costs import KEEP_HANDED, WORKER_BYTES  # noqa: F401 - WORKER_BYTES: read here too (the memory it costs)
from dstore.runtime import rc

_LAUNCHER_VARS = (
    "PMI_",
    "PMIX_",
    "OMPI_",
    "HYDRA_",
    "MPI_LOCALRANKID",
    "MPI_LOCALNRANKS",
    "MPIR_",
    "I_MPI_",
    "SLURM_STEP_",
    "PALS_",
)
JOB_SIGNALS = ("SIGTERM", "SIGINT", "SIGUSR1", "SIGUSR2", "SIGHUP")
"""Signals a worker ignores: the job's (preemption, Ctrl-C, hang-up), the rank's to act on (NOTE 2)."""
_WORKER_MAIN = (
    f"import signal as s\nfor n in {JOB_SIGNALS!r}: s.signal(getattr(s, n), s.SIG_IGN)\n"
    "from dstore.loader.decode_worker import main\nraise SystemExit(main())"
)
"""A worker's command line (`python -c`): the job's signals are ignored before anything is imported
(NOTE [decode workers] 2); they are the rank's, which stops its workers itself."""
STOP_SECONDS = 5.0


NPARAMS = 8
"""int32 parameters per sample in an output segment (the transform's PARAMS, padded)."""


def params_offset(capacity: int, shape: tuple[int, int, int]) -> int:
    """Where the parameters start in an output segment of `capacity` images of `shape` (C, H, W):
    8-byte aligned after the pixels."""
    return -(-capacity * math.prod(shape) // 8) * 8


def available_cores() -> int:
    """The cores this process may run on: its CPU affinity, capped by a cgroup v2 cpu.max quota."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    try:
        with open("/sys/fs/cgroup/cpu.max") as fh:
            quota, period = fh.read().split()[:2]
        if quota != "max":
            cores = min(cores, max(1, int(int(quota) // int(period))))
    except (OSError, ValueError):
        pass
    return max(1, cores)


def default_workers(local_ranks: int) -> int:
    """Decode workers per rank by default: the cores this rank may use shared by the node's ranks."""
    return max(1, available_cores() // max(1, int(local_ranks)))


class Segment:
    """A shared-memory segment of `size` bytes: a memfd (Linux) or a file in /dev/shm, mapped here.
    NOTE [decode workers] 3."""

    _made = 0

    def __init__(self, size: int, pin: bool = False, capacity: int = 0):
        self.size = max(int(size), 8)
        self.capacity = int(capacity)  # an output segment's samples (NOTE 3)
        Segment._made += 1
        self.uid = Segment._made  # a path may name a later segment (fd numbers are reused); this never
        self._file = None
        if hasattr(os, "memfd_create") and os.path.isdir(f"/proc/{os.getpid()}/fd"):
            self.fd = os.memfd_create("dstore-decode", os.MFD_CLOEXEC)
            self.path = f"/proc/{os.getpid()}/fd/{self.fd}"
        else:
            shm = "/dev/shm" if os.path.isdir("/dev/shm") else None
            self.fd, self._file = tempfile.mkstemp(prefix="dstore-decode-", dir=shm)
            self.path = self._file
        os.ftruncate(self.fd, self.size)
        self.map = mmap.mmap(self.fd, self.size)
        self._array = np.frombuffer(self.map, np.uint8)
        self.tensor = None
        self._pinned = False
        if pin:
            self._pin()

    def _pin(self) -> None:
        import torch

        tensor = self.tensor = torch.frombuffer(self.map, dtype=torch.uint8)
        try:
            cudart = torch.cuda.cudart()
            if cudart is None:  # never past its _lazy_init (an AssertionError there); unpinned if it were
                self._pinned = False
                return
            err = cudart.cudaHostRegister(tensor.data_ptr(), self.size, 0)
            self._pinned = int(err) == 0
        except (RuntimeError, AttributeError, TypeError):  # unpinned still works, only the copy is synchronous
            self._pinned = False

    @property
    def array(self) -> np.ndarray:
        """The segment's bytes (uint8, this process's map); ValueError once closed."""
        if self._array is None:
            raise ValueError(f"the segment {self.path} is closed: its map is gone")
        return self._array

    def lend(self, back) -> np.ndarray:
        """The segment as a uint8 array for the caller; `back(self)` runs once the array's last view
        is gone (NOTE 3: the segment is then a spare). The array is made here, held by nothing else,
        and `weakref.finalize` reports its end; tensors made of it (torch.from_numpy) hold it."""
        if self.map is None:
            raise ValueError(f"the segment {self.path} is closed: it cannot be lent")
        view = np.frombuffer(self.map, np.uint8)
        weakref.finalize(view, back, self)
        return view

    def torch(self):
        """The segment as a uint8 torch tensor (made once)."""
        import torch

        if self.tensor is None:
            self.tensor = torch.frombuffer(self.map, dtype=torch.uint8)
        return self.tensor

    def close(self) -> None:
        if self._pinned:
            import torch

            cudart, tensor = torch.cuda.cudart(), self.tensor
            if cudart is not None and tensor is not None:  # both are, while pinned (_pin)
                cudart.cudaHostUnregister(tensor.data_ptr())
            self._pinned = False
        self.tensor = self._array = None
        if self.map is not None:
            try:
                self.map.close()
            except BufferError:  # a batch tensor still views it: the map goes with the last view
                pass
            self.map = None
        if self.fd < 0:
            return
        os.close(self.fd)
        self.fd = -1
        if self._file is not None:
            os.unlink(self._file)
            self._file = None


class _Event(Protocol):
    """What a slot needs of a CUDA event (torch.cuda.Event): waiting for the work it marks."""

    def synchronize(self) -> None: ...


@dataclasses.dataclass
class Slot:
    """One ring slot: its segments, the samples its output holds, and the GPU copy out of it."""

    inp: Segment | None = None
    out: Segment | None = None
    capacity: int = 0
    event: _Event | None = None  # a CUDA event: the copy out of `out` (NOTE 5)

    def output(self) -> Segment:
        """The output segment; ValueError where there is none (the workers are closed, or the
        segment was handed to the caller)."""
        if self.out is None:
            raise ValueError("this ring slot has no output segment: the decode workers are closed")
        return self.out


@dataclasses.dataclass
class Ticket:
    """A batch handed to the workers: its slot and which workers have a part of it."""

    seq: int
    slot: int
    n: int
    nbytes: int
    workers: list


class DecodeWorkers:
    """`n` decode worker processes and their shared ring (NOTE [decode workers]).

    `start` runs in the loader's copier thread; `submit` (which waits for the GPU's copy out of its
    slot, NOTE 5) there too, or in the caller's thread where it copies and waits for nothing
    (`nothing_to_copy`); `collect` and `release` in the caller's. Args: shape: (C, H, W) of the
    output (of the canvas with `defer`); info: the container's ContainerInfo; channels: as the
    StoreLoader's; size: the workers' own resize, None where the transform resizes; hint: the
    decode's minimum (H, W) (a JPEG's DCT scale); defer: the transform's resize and crop are left
    to the caller (`sample_part(defer_resize=True)`); transform: None or one with `sample_part`;
    seed: the store's seed; slots: the ring's slots; pin: page-lock the output segments (CUDA);
    on_device: the caller runs the transform's batch part on the batch's device, else the workers
    apply it (its `finish`) and each batch gets an output segment of its own, handed to the caller
    (NOTE 3)."""

    def __init__(
        self,
        n: int,
        *,
        shape,
        info,
        channels,
        size,
        transform,
        seed: int,
        slots: int,
        pin: bool,
        on_device: bool,
        hint=None,
        defer: bool = False,
    ):
        self.n = int(n)
        c, h, w = (int(x) for x in shape)
        self.shape = (c, h, w)
        self.pin = pin
        self.fresh = not on_device
        self.defer = bool(defer)
        info = types.SimpleNamespace(
            encoding=info.encoding,
            raw_dtype=getattr(info, "raw_dtype", None),
            raw_shape=getattr(info, "raw_shape", None),
        )
        # NOTE 3: the workers read the batch's bytes out of this process where they can (vmread)
        self._probe = np.frombuffer(os.urandom(16), np.uint8).copy() if rc.WORKERS_READ.get() else None
        self.reads = False  # every worker can (their "ready", `start`)
        self._setup = pickle.dumps(
            {
                "probe": None if self._probe is None else (self._probe.ctypes.data, self._probe.tobytes()),
                "shape": self.shape,
                "info": info,
                "channels": channels,
                "size": size,
                "hint": size if hint is None else hint,
                "defer": self.defer,
                "transform": transform,
                "seed": int(seed),
                "finish": not on_device,
            }
        )
        self.slots = [Slot() for _ in range(slots)]
        self._spare: collections.deque[Segment] = collections.deque()  # NOTE 3: let go of by the caller
        self._retired: list[int] = []  # uids of closed spares the workers have yet to unmap
        self._lock = threading.Lock()  # spares come back in whichever thread drops a batch's last view
        self._closed = False
        self.procs, self._to, self._from = [], [], []
        self._native = [False] * self.n  # per worker: its compiled kernels loaded, as of its last answer
        self._seq = 0
        self.pids = []

    @property
    def native(self) -> bool:
        """Whether every worker had its compiled kernels (dstore.codec.kernels) loaded at its last answer:
        they load in the background after the start, the numpy path serving until then."""
        return all(self._native)

    # ---------------------------------------------------------------- start and stop
    def start(self) -> None:
        """Starts the workers and waits for each one's "ready" (NOTE 1)."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(_LAUNCHER_VARS)}
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
        env["OMP_NUM_THREADS"] = "1"
        if self._probe is not None:
            vmread.allow_descendants()
        for k in range(self.n):
            req_r, req_w = os.pipe()
            ans_r, ans_w = os.pipe()
            proc = subprocess.Popen(
                [sys.executable, "-c", _WORKER_MAIN, str(req_r), str(ans_w), str(os.getpid()), str(k)],
                pass_fds=(req_r, ans_w),
                env=env,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
            os.close(req_r)
            os.close(ans_w)
            self.procs.append(proc)
            self._to.append(Connection(req_w, readable=False))
            self._from.append(Connection(ans_r, writable=False))
        for k in range(self.n):
            self._to[k].send_bytes(self._setup)
        reads = []
        for k in range(self.n):
            kind, pid, can_read, native = self._answer(k)
            self._native[k] = native
            if kind != "ready":
                raise DStoreError(f"decode worker {k} could not start: {can_read}")  # ("error", -1, message, native)
            self.pids.append(pid)
            reads.append(bool(can_read))
        self.reads = self._probe is not None and all(reads)

    def close(self) -> None:
        """Stops the workers (NOTE 2) and frees the ring. Safe to call twice."""
        for conn in self._to:
            try:
                conn.send_bytes(pickle.dumps(None))
            except OSError:  # already gone
                pass
            conn.close()
        deadline = time.monotonic() + STOP_SECONDS
        for proc in self.procs:
            try:
                proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for conn in self._from:
            conn.close()
        self.procs, self._to, self._from = [], [], []
        for slot in self.slots:
            for seg in (slot.inp, slot.out):
                if seg is not None:
                    seg.close()
            slot.inp = slot.out = None
        with self._lock:
            self._closed = True
            spare, self._spare = list(self._spare), collections.deque()
        for seg in spare:
            seg.close()

    def _back(self, seg: Segment) -> None:
        """A lent output segment whose batch the caller let go of (NOTE 3): kept as a spare, or
        closed (past KEEP_HANDED spares, or once the workers are closed)."""
        with self._lock:
            if not self._closed and len(self._spare) < KEEP_HANDED:
                self._spare.append(seg)
                return
            if not self._closed:
                self._retired.append(seg.uid)
        seg.close()

    def _spare_for(self, n: int) -> Segment | None:
        """A spare output segment with room for `n` samples (NOTE 3), or None."""
        with self._lock:
            for seg in self._spare:
                if seg.capacity >= n:
                    self._spare.remove(seg)
                    return seg
        return None

    # ---------------------------------------------------------------- per batch
    def nothing_to_copy(self, batch) -> bool:
        """Whether `submit(batch)` would copy nothing and wait for nothing: the workers read every
        sample in place (NOTE 3) and the next slot has no GPU copy to wait for (NOTE 5), so it may
        run on the caller's thread, without a hand-off to the copier thread."""
        where = getattr(batch, "where", None)
        slot = self.slots[self._seq % len(self.slots)]
        return self.reads and where is not None and bool(where.all()) and slot.event is None

    def submit(self, batch) -> Ticket:
        """Sends the workers `batch` (NOTE 4): its samples held in the store's windows by their address
        in this process, where the workers can read there (`reads`), the others' bytes copied into
        the next slot's input segment; one request, pickled once, for every worker with a part."""
        seq, self._seq = self._seq, self._seq + 1
        k = seq % len(self.slots)
        slot = self.slots[k]
        if slot.event is not None:  # NOTE 5: the GPU's copy out of this slot must be done
            slot.event.synchronize()
            slot.event = None
        n = len(batch.samples)
        lens = np.fromiter((s.size for s in batch.samples), np.int64, n)
        where = getattr(batch, "where", None) if self.reads else None
        copied = batch.samples if where is None else [s for s, w in zip(batch.samples, where.tolist()) if not w]
        offsets = np.zeros(n + 1, np.int64)
        np.cumsum(lens if where is None else np.where(where != 0, 0, lens), out=offsets[1:])
        inp, out = self._fit(slot, int(offsets[-1]), n)
        if copied:
            np.concatenate(copied, out=inp.array[: offsets[-1]])
        cuts = [n * w // self.n for w in range(self.n + 1)]
        request = pickle.dumps(
            {
                "ticket": seq,
                "slot": k,
                "in": (inp.path, inp.size, inp.uid),
                "out": (out.path, out.size, out.uid),
                "capacity": slot.capacity,
                "cuts": cuts,
                # int64 arrays as bytes: a tenth of the pickling of arrays
                "offsets": offsets.tobytes(),
                "addr": None if where is None else np.asarray(where, np.int64).tobytes(),
                "lens": None if where is None else lens.tobytes(),
                "ids": np.asarray(batch.ids, np.int64).tobytes(),
                "epoch": int(batch.epoch),
                "fresh": self.fresh,
                "retired": self._take_retired(),
            }
        )
        parts = [w for w in range(self.n) if cuts[w + 1] > cuts[w]]
        for w in parts:
            try:
                self._to[w].send_bytes(request)
            except OSError:  # a broken pipe: the worker died before this request
                raise self._died(w) from None
        return Ticket(seq, k, n, int(offsets[-1]), parts)

    def _fit(self, slot: Slot, nbytes: int, n: int) -> tuple[Segment, Segment]:
        """Replaces a slot's segments that are too small for `nbytes` / `n` samples (NOTE 3); the
        slot's (input, output) segments."""
        inp, out = slot.inp, slot.out
        if inp is None or inp.size < nbytes:
            if inp is not None:
                inp.close()
            inp = slot.inp = Segment(int(nbytes * 1.25) + 4096)
        if self.fresh and out is None:
            out = self._spare_for(n)
        if out is None or out.capacity < n:
            if out is not None:
                out.close()
                if self.fresh:  # a batch's own segment, mapped by uid in the workers (NOTE 3)
                    with self._lock:
                        self._retired.append(out.uid)
            cap = max(n, 1)
            out = Segment(params_offset(cap, self.shape) + 4 * NPARAMS * cap, pin=self.pin, capacity=cap)
        slot.out, slot.capacity = out, out.capacity
        return inp, out

    def _take_retired(self) -> list[int]:
        with self._lock:
            gone, self._retired = self._retired, []
        return gone

    def collect(self, ticket: Ticket):
        """Waits for `ticket`'s answers (NOTE 4): (pixels uint8 [n, C, H, W], parameters int32
        [n, NPARAMS], worker-seconds), both views of the slot until `release`, or of memory of their own
        (one segment per batch, the batch part applied) without `on_device`."""
        secs, error = 0.0, None
        for w in ticket.workers:
            kind, seq, value, native = self._answer(w)
            self._native[w] = native
            if seq != ticket.seq:
                raise DStoreError(f"decode worker {w} answered batch {seq} where {ticket.seq} was due (a bug)")
            if kind == "ok":
                secs += value
            elif error is None:
                error = value
        if error is not None:
            raise SampleError(f"decode worker: {error}")
        slot = self.slots[ticket.slot]
        cap, (c, h, w) = slot.capacity, self.shape
        at = params_offset(cap, self.shape)
        if self.fresh:  # NOTE 3: the caller's from now on, a spare again once it lets go
            # cut in numpy, then one torch.from_numpy each: a third of the cost of torch's views
            whole, slot.out = slot.output().lend(self._back), None
            images = torch_from_numpy(whole[: cap * c * h * w].reshape(cap, c, h, w)[: ticket.n])
            params = torch_from_numpy(
                whole[at : at + 4 * NPARAMS * cap].view(np.int32).reshape(cap, NPARAMS)[: ticket.n]
            )
            return images, params, secs
        whole = slot.output().torch()  # made once, page-locked where CUDA is (NOTE 3)
        images = whole[: cap * c * h * w].view(cap, c, h, w)[: ticket.n]
        params = whole[at : at + 4 * NPARAMS * cap].view(_int32()).view(cap, NPARAMS)[: ticket.n]
        return images, params, secs

    def release(self, ticket: Ticket, event=None) -> None:
        """The slot of `ticket` may be written again (after `event`, a CUDA event, where given)."""
        self.slots[ticket.slot].event = event

    def _answer(self, w: int):
        """Worker `w`'s next answer; a DStoreError naming it if it died."""
        conn = self._from[w]
        try:  # recv_bytes blocks until the answer (EOF if the worker died); a select first cost the rank ~80 us
            return pickle.loads(conn.recv_bytes())
        except (EOFError, OSError):
            raise self._died(w) from None

    def _died(self, w: int) -> DStoreError:
        """The error naming worker `w`, found dead (by a request's broken pipe or an answer's EOF)."""
        proc = self.procs[w]
        try:
            code = proc.wait(1.0)
        except subprocess.TimeoutExpired:
            code = None
        return DStoreError(f"decode worker {w} (pid {proc.pid}) ended unexpectedly{ended_by(code)}")


def ended_by(code: int | None) -> str:
    """How a worker ended, from its exit status (subprocess's: -N for signal N), as the end of a
    sentence: the signal by name, the out-of-memory killer named only for SIGKILL (NOTE 2)."""
    if code is None:
        return ""
    if code >= 0:
        return f" with exit status {code}"
    try:
        name = signal.Signals(-code).name
    except ValueError:
        name = f"signal {-code}"
    why = (
        "; SIGKILL is often the kernel's out-of-memory killer (dmesg, or the job's memory limit)"
        if -code == signal.SIGKILL
        else ""
    )
    return f", killed by {name}{why}"


def _int32():
    import torch

    return torch.int32


def torch_from_numpy(a: np.ndarray):
    """torch.from_numpy (torch imported where first needed: this module is imported by the workers,
    which never import torch)."""
    import torch

    return torch.from_numpy(a)
