"""The HDF5 reader's direct path (preadv at the chunks' file offsets) against h5py itself: the same
bytes for any range on chunked, contiguous, empty and partly written files; filtered files fall
back to h5py; a file cut short fails with an error naming the file and the byte range."""

from __future__ import annotations

import os

import h5py
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.formats import plain_values, random_samples, write_samples

from dstore.errors import FormatError
from dstore.formats import open_container
from dstore.formats.hdf5 import HDF5Reader
from dstore.formats.objects import LocalFile
from dstore.store import prefault

SAMPLES = random_samples(60, seed=3)
WHOLE = b"".join(s[0] for s in SAMPLES)


def _h5py_bytes(path: str) -> bytes:
    with h5py.File(path, "r", locking=False) as f:
        return plain_values(f, "data", ()).tobytes()


def _copy_with_data(src: str, dst: str, data: np.ndarray, skip_chunks=(), **create) -> str:
    """A copy of container `src` made with plain h5py, its `data` written with `create` options
    (e.g. compression="gzip", chunks=(n,)), leaving chunks `skip_chunks` unwritten."""
    with h5py.File(src, "r", locking=False) as fin, h5py.File(dst, "w", locking=False) as fout:
        for key in fin:
            if key != "data":
                fin.copy(key, fout)
        dset = fout.create_dataset("data", shape=data.shape, dtype=np.uint8, **create)
        chunk = dset.chunks[0] if dset.chunks else max(data.size, 1)
        for lo in range(0, data.size, chunk):
            if lo // chunk not in skip_chunks:
                dset[lo : lo + chunk] = data[lo : lo + chunk]
        for key, value in fin.attrs.items():
            fout.attrs[key] = value
    return dst


@pytest.fixture(scope="module")
def chunked(tmp_path_factory):
    # 1000-byte chunks: about 100 of them, samples straddling many boundaries.
    return write_samples(tmp_path_factory.mktemp("h5") / "c.h5", "hdf5", SAMPLES, chunk_bytes=1000)


@pytest.fixture(scope="module")
def contiguous(tmp_path_factory):
    # Everything fits in one buffer: the writer stores a contiguous dataset of the exact size.
    return write_samples(tmp_path_factory.mktemp("h5") / "s.h5", "hdf5", SAMPLES)


def _layout(path: str) -> int:
    with h5py.File(path, "r", locking=False) as f:
        return f["data"].id.get_create_plist().get_layout()


def test_layouts_are_what_the_tests_assume(chunked, contiguous):
    assert _layout(chunked) == h5py.h5d.CHUNKED and _layout(contiguous) == h5py.h5d.CONTIGUOUS
    with h5py.File(chunked, "r", locking=False) as f:
        assert f["data"].id.get_num_chunks() > 50
    for path in (chunked, contiguous):
        assert _h5py_bytes(path) == WHOLE
        with HDF5Reader(path) as r:
            assert r._direct is not None


@pytest.mark.parametrize("which", ["chunked", "contiguous"])
@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_any_range_matches_h5py(request, which, data):
    path = request.getfixturevalue(which)
    lo = data.draw(st.integers(0, len(WHOLE)))
    hi = data.draw(st.integers(lo, len(WHOLE)))
    with HDF5Reader(path) as r:
        assert r.read_bytes(lo, hi).tobytes() == WHOLE[lo:hi]
        out = np.full(hi - lo, 7, dtype=np.uint8)
        assert r.read_bytes(lo, hi, out=out) is out and out.tobytes() == WHOLE[lo:hi]


def test_pieces_into_fresh_memory(chunked):
    # What the store's preload does: read_in_pieces over views of one fresh array.
    with HDF5Reader(chunked) as r:
        out = np.empty(r.total_bytes, dtype=np.uint8)
        prefault.read_in_pieces(lambda a, b, view: r.read_bytes(a, b, out=view), out, piece=4096)
        assert out.tobytes() == WHOLE
        assert r.read_range(0, len(r)).tobytes() == WHOLE


def test_gzip_file_in_our_layout_falls_back_to_h5py(tmp_path, chunked):
    path = _copy_with_data(
        chunked, str(tmp_path / "gz.h5"), np.frombuffer(WHOLE, dtype=np.uint8), chunks=(1000,), compression="gzip"
    )
    with HDF5Reader(path) as r:
        assert r._direct is None
        assert r.read_range(0, len(r)).tobytes() == WHOLE
        for i in range(len(r)):
            assert r.sample(i)[0].tobytes() == SAMPLES[i][0]
        out = np.empty(len(WHOLE) - 10, dtype=np.uint8)
        assert r.read_bytes(5, len(WHOLE) - 5, out=out).tobytes() == WHOLE[5:-5]


def test_an_unwritten_chunk_is_an_error_never_the_fill_value(tmp_path, chunked):
    # HDF5 reads a chunk never written as fill values (zeros): samples that are not the ingested
    # ones. dstore writes every chunk, so a missing one is refused at open, naming the chunk.
    data = np.frombuffer(WHOLE, dtype=np.uint8)
    path = _copy_with_data(
        chunked, str(tmp_path / "hole.h5"), data, skip_chunks={2, 3, 7}, chunks=(1000,), maxshape=(None,)
    )
    assert _h5py_bytes(path)[2000:4000] == bytes(2000)  # what a reader trusting HDF5 would serve
    with pytest.raises(FormatError, match=r"hole\.h5: data chunk 2 \(bytes \[2000, 3000\).*never written \(3 "):
        HDF5Reader(path)


def test_empty_container(tmp_path):
    path = write_samples(tmp_path / "e.h5", "hdf5", [])
    with open_container(path) as r:
        assert len(r) == 0 and r.read_range(0, 0).size == 0 and r.read_bytes(0, 0).size == 0


def test_data_cut_short_after_open_names_file_and_range(tmp_path):
    path = write_samples(tmp_path / "t.h5", "hdf5", SAMPLES, chunk_bytes=1000)
    with HDF5Reader(path) as r:
        assert r._direct is not None  # unfiltered chunks: read directly
        with open(path, "r+b") as f:
            f.truncate(r._direct._starts[-1] - 10)  # the last chunks' bytes are gone
        assert r.read_bytes(0, 1000).tobytes() == WHOLE[:1000]
        with pytest.raises(FormatError, match=r"bytes \[\d+, \d+\).*truncated") as err:
            r.read_range(0, len(r))
        assert path in str(err.value)


def test_close_twice_closes_the_descriptor(chunked):
    r = HDF5Reader(chunked)
    assert r._direct is not None and isinstance(r._direct.file, LocalFile)  # a local file, read directly
    fd = r._direct.file.fd
    os.fstat(fd)
    r.close()
    r.close()
    with pytest.raises(OSError):
        os.fstat(fd)
