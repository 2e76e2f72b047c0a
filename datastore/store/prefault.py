"""Reading into fresh memory with its page faults overlapped: while piece k is read, a thread
faults in the pages of piece k+1, so the faults no longer add to the I/O time.

A rank's preload writes its whole block into a window allocated just before; every page of it is
faulted in on first touch. On some machines (VMs especially) that costs about as much as the disk
itself, and a single large read pays the two one after the other. No MPI here.
"""

from __future__ import annotations

import collections
import concurrent.futures
import ctypes
import ctypes.util
import errno
import mmap

import numpy as np

PIECE_BYTES = 32 << 20
"""Bytes read per call when filling fresh memory (large enough for sequential read speed, small
enough that the first piece, which is not pre-faulted, is a small part of a block)."""

_PAGE = mmap.PAGESIZE
_MADV_POPULATE_WRITE = 23  # Linux >= 5.14: fault pages in writable, without writing them
_libc = None
_madvise_ok = True


def _madvise_populate(arr: np.ndarray) -> bool:
    """Faults `arr`'s pages in with madvise(MADV_POPULATE_WRITE); False where that is not available."""
    global _libc, _madvise_ok
    if not _madvise_ok:
        return False
    if _libc is None:
        try:
            _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
            _libc.madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
            _libc.madvise.restype = ctypes.c_int
        except (OSError, AttributeError):
            _madvise_ok = False
            return False
    addr = arr.ctypes.data
    lo = addr - addr % _PAGE  # madvise wants a page-aligned start; the page holding arr[0] is ours too
    # ctypes releases the GIL for the call, so the reading thread runs meanwhile.
    if _libc.madvise(lo, addr + arr.nbytes - lo, _MADV_POPULATE_WRITE) != 0:
        if ctypes.get_errno() == errno.EINVAL:  # a kernel before 5.14: the fallback from now on
            _madvise_ok = False
        return False
    return True


def touch(arr: np.ndarray) -> None:
    """Faults in every page of the writable uint8 array `arr` (its contents may be overwritten)."""
    if arr.size == 0:
        return
    if not _madvise_populate(arr):
        arr[::_PAGE] = 0  # one byte per page; numpy releases the GIL for the strided store


def read_in_pieces(read, out: np.ndarray, piece: int | None = None, depth: int = 2) -> None:
    """Fills `out` with `read(a, b, out[a:b])` calls over consecutive pieces of `piece` bytes,
    while a thread faults in the pages of the next `depth` pieces.

    The first piece is read without help (its faults are taken by the read); from then on the
    reads and the faults run side by side, and the slower of the two sets the pace.

    Args:
        read: callable (start, stop, view) writing bytes [start, stop) of the source into `view`.
        out: writable uint8 array, the destination (typically memory allocated just before).
        piece: bytes per read call (>= 1); None: PIECE_BYTES.
        depth: pieces the fault thread may run ahead of the reads (>= 1), to absorb jitter.
    """
    n = out.size
    if n == 0:
        return
    piece, depth = max(1, int(PIECE_BYTES if piece is None else piece)), max(1, int(depth))
    cuts = list(range(0, n, piece)) + [n]
    if len(cuts) == 2:  # one piece: nothing to overlap with
        read(0, n, out)
        return
    pieces = list(zip(cuts[:-1], cuts[1:]))
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="dstore-prefault") as pool:
        touched = collections.deque()  # futures of pieces 1, 2, ... in order
        queued = 1
        try:
            for k, (a, b) in enumerate(pieces):
                while queued < len(pieces) and queued <= k + depth:
                    lo, hi = pieces[queued]
                    touched.append(pool.submit(touch, out[lo:hi]))
                    queued += 1
                if k:
                    touched.popleft().result()  # piece k is faulted in
                read(a, b, out[a:b])
        finally:
            for f in touched:  # a read failed: the thread must be done with `out` before we return
                f.cancel()
            concurrent.futures.wait(touched)
