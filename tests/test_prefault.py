"""dstore.store.prefault: reading in pieces with the next pieces' pages faulted in by a thread gives
the same bytes as one read, for every piece size and depth, empty and one-piece destinations
included; a failing read propagates after the thread is done. No MPI."""

import mmap
import threading

import numpy as np
import pytest

from dstore.store import prefault


def _fresh(n):
    return np.frombuffer(mmap.mmap(-1, max(n, 1)), np.uint8)[:n]


@pytest.mark.parametrize("n", [0, 1, 4095, 4096, 100_003, 3 * 65536])
@pytest.mark.parametrize("piece", [1, 777, 4096, 65536, 10**7, None])
@pytest.mark.parametrize("depth", [1, 2, 5])
def test_pieces_give_the_bytes_of_one_read(n, piece, depth):
    if piece == 1 and n > 5000:
        n = 5000  # one read call per byte: keep it short
    src = np.random.default_rng(n).integers(0, 256, n, dtype=np.uint8)
    out = _fresh(n)
    calls = []

    def read(a, b, view):
        assert view.size == b - a and 0 <= a < b <= n
        calls.append((a, b))
        view[:] = src[a:b]

    prefault.read_in_pieces(read, out, piece, depth)
    assert np.array_equal(out, src)
    step = prefault.PIECE_BYTES if piece is None else piece
    assert calls == [(a, min(a + step, n)) for a in range(0, n, step)]  # in order, each byte once


def test_touch_faults_in_without_changing_the_length():
    for use_madvise in (True, False):
        a = _fresh(3 * mmap.PAGESIZE + 5)
        saved = prefault._madvise_ok
        prefault._madvise_ok = use_madvise and saved
        try:
            prefault.touch(a[1:])
            prefault.touch(a[:0])
        finally:
            prefault._madvise_ok = saved
        a[:] = 7  # still writable, the right size
        assert a.sum() == 7 * a.size


def test_a_failing_read_propagates_after_the_thread_is_done():
    out = _fresh(10 * 4096)
    seen = []

    def read(a, b, view):
        seen.append(a)
        if a >= 3 * 4096:
            raise OSError("disk gone")
        view[:] = 1

    with pytest.raises(OSError, match="disk gone"):
        prefault.read_in_pieces(read, out, 4096, depth=3)
    assert seen == [0, 4096, 2 * 4096, 3 * 4096]
    assert not [t for t in threading.enumerate() if t.name.startswith("dstore-prefault")]
