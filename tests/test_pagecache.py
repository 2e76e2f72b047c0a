"""dstore.memory.pagecache: evict() runs on real containers of every backend and returns their files'
total size; a missing path and an unopenable file are named in the error; without posix_fadvise
it warns and does nothing. (Whether the kernel really dropped the pages is not asserted: it may
keep them.) No MPI."""

import os

import pytest
from support.formats import BACKENDS, build, random_samples

from dstore.formats import ContainerNotFoundError, open_container
from dstore.memory import pagecache


def _sizes(paths):
    return sum(os.path.getsize(p) for p in paths)


@pytest.mark.parametrize("backend", BACKENDS)
def test_evict_covers_every_file_of_the_container(tmp_path, backend):
    path = build(tmp_path, backend, random_samples(20))
    files = pagecache.container_files(path)
    assert files and all(os.path.isfile(f) for f in files)
    assert len(set(files)) == len(files)
    if os.path.isdir(path):
        assert {os.path.join(r, n) for r, _, ns in os.walk(path) for n in ns} <= set(files)
    assert pagecache.evict(path) == _sizes(files)
    with open_container(path) as r:  # still readable afterwards (from storage now)
        assert r.num_samples == 20


def test_sharded_manifest_file_includes_shards_elsewhere(tmp_path):
    from support.formats import write_samples

    from dstore.formats import write_manifest

    samples = random_samples(6)
    (tmp_path / "a").mkdir()
    (tmp_path / "m").mkdir()
    shards = [
        write_samples(tmp_path / "a" / "s0.h5", "hdf5", samples[:3]),
        write_samples(tmp_path / "a" / "s1.zarr", "zarr", samples[3:]),
    ]
    mfile = write_manifest(tmp_path / "m" / "c.json", shards)
    files = pagecache.container_files(mfile)
    assert files[0] == os.fspath(mfile)
    assert os.fspath(shards[0]) in files and any(f.startswith(os.fspath(shards[1])) for f in files)
    assert pagecache.evict(mfile) == _sizes(files)


def test_missing_path_is_named(tmp_path):
    with pytest.raises(ContainerNotFoundError, match="nope.h5"):
        pagecache.evict(tmp_path / "nope.h5")


def test_unopenable_file_is_named(tmp_path):
    path = build(tmp_path, "zarr", random_samples(5))
    os.symlink(tmp_path / "gone", os.path.join(path, "dangling"))  # listed, but cannot be opened
    with pytest.raises(FileNotFoundError, match="dangling"):
        pagecache.evict(path)


def test_without_posix_fadvise_warns_and_does_nothing(tmp_path, monkeypatch):
    path = build(tmp_path, "hdf5", random_samples(5))
    monkeypatch.delattr(os, "posix_fadvise", raising=False)
    with pytest.warns(RuntimeWarning, match="posix_fadvise"):
        assert pagecache.evict(path) == 0
