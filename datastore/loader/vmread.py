"""Reading another process's memory (Linux `process_vm_readv`): a decode worker reads a batch's bytes
straight out of its rank's memory (the store's windows), so the rank copies nothing
(dstore.loader.workers, NOTE [decode workers] 3).

The kernel allows it where the reader may ptrace the process read (same user, the process
dumpable); under Yama's `ptrace_scope` 1 only a declared tracer or its descendants may, which
`allow_descendants` declares (the rank itself, so its own children: its workers). Elsewhere (another
OS, Yama scope 2 or 3, a seccomp filter, a container without it) `readable` is False and the rank
copies the bytes into shared memory as before.
"""

from __future__ import annotations

import ctypes
import functools
import os
import sys

import numpy as np

IOV_MAX = 1024
"""Entries of one `process_vm_readv` call at most (Linux's UIO_MAXIOV)."""

_PR_SET_PTRACER = 0x59616D61
_IOVEC = np.dtype([("base", np.uint64), ("len", np.uint64)])  # struct iovec on 64-bit Linux


@functools.cache
def _lib() -> ctypes.CDLL | None:
    """libc with `process_vm_readv` typed, or None (not 64-bit Linux, or a libc without it)."""
    if not sys.platform.startswith("linux") or np.dtype(np.uintp).itemsize != 8:
        return None
    try:
        lib = ctypes.CDLL(None, use_errno=True)
        fn = lib.process_vm_readv
    except (OSError, AttributeError):
        return None
    fn.restype = ctypes.c_ssize_t
    fn.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_ulong, ctypes.c_void_p, ctypes.c_ulong, ctypes.c_ulong]
    return lib


def allow_descendants() -> None:
    """Under Yama's ptrace_scope 1, lets this process's descendants (its decode workers) read its
    memory (PR_SET_PTRACER naming itself); nothing where Yama is absent or ptrace_scope is not 1."""
    try:
        with open("/proc/sys/kernel/yama/ptrace_scope") as fh:
            scope = fh.read().strip()
    except OSError:
        return
    lib = _lib()
    if scope == "1" and lib is not None:
        lib.prctl(_PR_SET_PTRACER, os.getpid(), 0, 0, 0)  # fails harmlessly where refused


def read(pid: int, addrs: np.ndarray, lens: np.ndarray, into: np.ndarray) -> None:
    """Reads `lens[i]` bytes at address `addrs[i]` of process `pid`, for each i, back to back into the
    uint8 array `into`. OSError (with errno) where the kernel refuses or an address is not mapped."""
    lib = _lib()
    if lib is None:
        raise OSError("process_vm_readv is not available on this system")
    n = int(lens.size)
    total = int(lens.sum())
    if total > into.size:
        raise ValueError(f"{total} bytes do not fit into {into.size}")
    remote = np.empty(n, _IOVEC)
    remote["base"] = addrs
    remote["len"] = lens
    local = np.empty(1, _IOVEC)
    at = 0
    for a in range(0, n, IOV_MAX):  # one call per IOV_MAX samples, each into the next part of `into`
        part = remote[a : a + IOV_MAX]
        want = int(part["len"].sum())
        local["base"], local["len"] = into.ctypes.data + at, want
        got = lib.process_vm_readv(int(pid), local.ctypes.data, 1, part.ctypes.data, part.size, 0)
        if got != want:  # -1, or a short read: an address past the end of a mapping
            err = ctypes.get_errno() if got < 0 else 14  # EFAULT
            raise OSError(err, f"process_vm_readv from process {pid}: {os.strerror(err)} ({got} of {want} bytes)")
        at += want


def readable(pid: int, addr: int, expect: bytes) -> bool:
    """Whether this process may read process `pid`'s memory: `expect` read back at `addr`."""
    into = np.zeros(len(expect), np.uint8)
    try:
        read(pid, np.array([addr], np.uint64), np.array([len(expect)], np.uint64), into)
    except OSError:
        return False
    return into.tobytes() == expect
