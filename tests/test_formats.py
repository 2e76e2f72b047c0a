"""Container formats: one conformance suite run against every backend (HDF5, Zarr v3, sharded over
each), hypothesis round trips, and damaged containers failing with errors that name what is wrong."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.formats import (
    BACKENDS,
    SUFFIX,
    build,
    data_file,
    random_samples,
    replace_array,
    set_attr,
    write_samples,
)

from dstore.errors import ConfigError, FormatError, IncompleteContainerError
from dstore.formats import (
    FORMATS,
    ContainerExistsError,
    ContainerNotFoundError,
    ShardedReader,
    checksum,
    create_writer,
    detect_format,
    open_container,
    write_manifest,
)

SAMPLES = random_samples(40, seed=1)


@pytest.fixture(params=BACKENDS, scope="module")
def backend(request):
    return request.param


@pytest.fixture(scope="module")
def shared(tmp_path_factory, backend):
    """A container that tests only read (built once per backend)."""
    # chunk_bytes small, so samples straddle chunk boundaries and the streaming path is exercised.
    return build(tmp_path_factory.mktemp(backend), backend, SAMPLES, chunk_bytes=4096)


@pytest.fixture
def container(tmp_path, backend):
    """A container of its own, for tests that damage it."""
    return build(tmp_path, backend, SAMPLES, chunk_bytes=4096)


class TestConformance:
    """What every backend must do, whatever its storage."""

    def test_samples_round_trip(self, shared, backend):
        with open_container(shared) as r:
            assert len(r) == r.info.num_samples == len(SAMPLES)
            assert r.info.class_names == ("a", "b", "c") and r.info.encoding == "jpeg"
            assert detect_format(shared) == backend.split("-")[0]
            for i, (data, label, name, src) in enumerate(SAMPLES):
                got, got_label = r.sample(i)
                assert got.dtype == np.uint8 and got.tobytes() == data
                assert got_label == label == r.labels[i]
                assert r.name(i) == name
                assert r.source_index[i] == src
                assert r.checksums[i] == checksum(data)
            assert r.offsets[-1] == r.total_bytes == r.info.total_bytes == sum(len(s[0]) for s in SAMPLES)
            assert r.offsets.dtype == np.int64 and r.labels.dtype == np.int64
            assert r.checksums.dtype == np.uint32 and r.source_index.dtype == np.int64

    @pytest.mark.parametrize("start,stop", [(0, 40), (0, 0), (40, 40), (3, 4), (5, 33), (13, 27), (39, 40)])
    def test_read_range_is_concatenation(self, shared, start, stop):
        want = b"".join(s[0] for s in SAMPLES[start:stop])
        with open_container(shared) as r:
            assert r.read_range(start, stop).tobytes() == want
            out = np.full(len(want), 7, dtype=np.uint8)
            assert r.read_range(start, stop, out=out) is out
            assert out.tobytes() == want

    def test_read_bytes_any_range(self, shared):
        whole = b"".join(s[0] for s in SAMPLES)
        rng = np.random.default_rng(0)
        with open_container(shared) as r:
            for _ in range(30):
                lo, hi = sorted(int(x) for x in rng.integers(0, len(whole) + 1, 2))
                assert r.read_bytes(lo, hi).tobytes() == whole[lo:hi]
            with pytest.raises(ConfigError, match="byte range"):
                r.read_bytes(0, len(whole) + 1)

    def test_bad_arguments_are_named(self, shared):
        with open_container(shared) as r:
            with pytest.raises(ConfigError, match="sample index 40 is out of range"):
                r.sample(40)
            with pytest.raises(ConfigError, match="sample range"):
                r.read_range(5, 2)
            with pytest.raises(ConfigError, match="out must be"):
                r.read_range(0, 2, out=np.empty(3, dtype=np.float32))

    def test_close_twice_and_use_after_close(self, shared):
        r = open_container(shared)
        r.close()
        r.close()
        with pytest.raises(ConfigError, match="closed"):
            r.read_bytes(0, 1)

    def test_missing_marker_is_incomplete(self, container):
        set_attr(container, "complete", delete=True)
        with pytest.raises(IncompleteContainerError, match="completion marker") as err:
            open_container(container)
        assert os.path.basename(container) in str(err.value)

    def test_unknown_version(self, container):
        set_attr(container, "version", 99)
        with pytest.raises(FormatError, match="version 99"):
            open_container(container)


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_names_nul_rejected_surrogates_escaped(tmp_path, fmt):
    path = tmp_path / f"n{SUFFIX[fmt]}"
    with create_writer(path, fmt, encoding="png", class_names=["x"]) as w:
        with pytest.raises(ConfigError, match="NUL"):
            w.append(b"a", 0, "bad\x00name")
        w.append(b"b", 0, os.fsdecode(b"caf\xe9.png"))  # a Latin-1 file name on a UTF-8 system
    with open_container(path) as r:
        assert len(r) == 1 and r.name(0) == "caf\\udce9.png"


def test_formats_registry():
    assert set(FORMATS) == {"hdf5", "zarr"}
    with pytest.raises(ConfigError, match="fmt='tar'"):
        create_writer("x.tar", "tar", encoding="jpeg", class_names=[])


@pytest.mark.parametrize("fmt", sorted(FORMATS))
class TestWriter:
    def test_zero_samples(self, tmp_path, fmt):
        path = write_samples(tmp_path / f"empty.{fmt}", fmt, [])
        with open_container(path) as r:
            assert len(r) == 0 and r.offsets.tolist() == [0] and r.read_range(0, 0).size == 0

    def test_streams_in_chunks(self, tmp_path, fmt):
        # Samples larger and smaller than a chunk; the data set is many chunks long.
        samples = random_samples(60, seed=2, max_bytes=700)
        path = write_samples(tmp_path / f"s.{fmt}", fmt, samples, chunk_bytes=256)
        with open_container(path) as r:
            assert r.read_range(0, 60).tobytes() == b"".join(s[0] for s in samples)

    def test_all_zero_chunks(self, tmp_path, fmt):
        # Zarr by default does not store a chunk that is all fill value; dstore's writer stores every
        # chunk (a one-chunk `data` too), so zeros are read back from the file.
        samples = [(b"\x01" * 10, 0, "a", 0), (bytes(300), 0, "zeros", 1), (b"\x02" * 10, 0, "b", 2)]
        path = write_samples(tmp_path / f"z{SUFFIX[fmt]}", fmt, samples, chunk_bytes=64)
        with open_container(path) as r:
            assert [r.sample(i)[0].tobytes() for i in range(3)] == [s[0] for s in samples]
            assert r.read_range(0, 3).tobytes() == b"".join(s[0] for s in samples)
        zeros = write_samples(tmp_path / f"one{SUFFIX[fmt]}", fmt, [(bytes(40), 0, "z", 0)])
        if fmt == "zarr":
            assert os.path.isfile(os.path.join(zeros, "data", "c", "0"))
        with open_container(zeros) as r:
            assert r.sample(0)[0].tobytes() == bytes(40) and r.read_range(0, 1).tobytes() == bytes(40)

    def test_extend_writes_what_appends_write(self, tmp_path, fmt):
        # Batches of every shape: samples larger than a chunk, whole chunks inside a batch (handed to
        # the backend without a copy), empty samples and batches, checksums given or computed.
        samples = random_samples(80, seed=5, max_bytes=700)
        one = write_samples(tmp_path / f"one{SUFFIX[fmt]}", fmt, samples, chunk_bytes=256)
        cuts = [0, 0, 1, 5, 5, 30, 31, 70, 80]
        path = tmp_path / f"many{SUFFIX[fmt]}"
        with create_writer(path, fmt, encoding="jpeg", class_names=("a", "b", "c"), chunk_bytes=256) as w:
            for b, (lo, hi) in enumerate(zip(cuts, cuts[1:])):
                part = samples[lo:hi]
                data = np.frombuffer(b"".join(x[0] for x in part), np.uint8)
                w.extend(
                    data,
                    [len(x[0]) for x in part],
                    [x[1] for x in part],
                    [x[2] for x in part],
                    [x[3] for x in part],
                    checksums=[checksum(x[0]) for x in part] if b % 2 else None,
                )
            assert w.num_samples == 80
        with open_container(one) as a, open_container(str(path)) as b:
            for key in ("offsets", "labels", "checksums", "source_index"):
                assert np.array_equal(getattr(a, key), getattr(b, key)), key
            assert [a.name(i) for i in range(80)] == [b.name(i) for i in range(80)]
            assert a.read_range(0, 80).tobytes() == b.read_range(0, 80).tobytes() == b"".join(x[0] for x in samples)

    def test_caller_checksums_are_checked_for_type_and_range(self, tmp_path, fmt):
        with create_writer(tmp_path / f"c{SUFFIX[fmt]}", fmt, encoding="png", class_names=["x"]) as w:
            assert w.append(b"abc", 0, "a", checksum=checksum(b"abc")) == 0
            for bad, match in (
                (-1, "checksum=-1 is not a CRC32"),
                (1 << 32, "is not a CRC32"),
                ("12", "must be an int"),
                (1.0, "must be an int"),
            ):
                with pytest.raises(ConfigError, match=match):
                    w.append(b"abc", 0, "b", checksum=bad)  # pyright: ignore[reportArgumentType] - "12", 1.0: refused
            with pytest.raises(ConfigError, match="checksums: -3 is not a CRC32"):
                w.extend(b"ab", [1, 1], [0, 0], ["b", "c"], checksums=[1, -3])
            with pytest.raises(ConfigError, match="checksums has 1 entries but sizes has 2"):
                w.extend(b"ab", [1, 1], [0, 0], ["b", "c"], checksums=[1])
            with pytest.raises(ConfigError, match="sizes sum to 3 bytes but data has 2"):
                w.extend(b"ab", [1, 2], [0, 0], ["b", "c"])
            with pytest.raises(ConfigError, match="names has 1 entries"):
                w.extend(b"ab", [1, 1], [0, 0], ["b"])
            with pytest.raises(ConfigError, match="NUL"):
                w.extend(b"ab", [1, 1], [0, 0], ["b", "c\x00"])
            assert w.num_samples == 1  # nothing of a refused batch was kept
        with open_container(str(tmp_path / f"c{SUFFIX[fmt]}")) as r:
            assert len(r) == 1 and r.total_bytes == 3

    def test_large_range_read_into_out(self, tmp_path, fmt):
        # Over a MiB: HDF5 reads straight into `out` (below that it slices and copies).
        rng = np.random.default_rng(4)
        samples = [(rng.integers(0, 256, 700_000, dtype=np.uint8).tobytes(), 0, f"{i}", i) for i in range(4)]
        path = write_samples(tmp_path / f"l{SUFFIX[fmt]}", fmt, samples, chunk_bytes=1 << 20)
        with open_container(path) as r:
            out = np.empty(2_100_000, dtype=np.uint8)
            assert r.read_range(1, 4, out=out) is out
            assert out.tobytes() == b"".join(s[0] for s in samples[1:])

    def test_raw_encoding_and_extra_attrs(self, tmp_path, fmt):
        arr = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
        path = tmp_path / f"raw.{fmt}"
        with create_writer(
            path,
            fmt,
            encoding="raw",
            raw_dtype="float32",
            raw_shape=(2, 3, 4),
            class_names=["x"],
            source="/data/src",
            extra_attrs={"seed": 5, "order": "shuffled"},
        ) as w:
            assert w.append(arr, 0, "a.npy", 0) == 0
            assert w.append(memoryview(arr.tobytes()), 0, "b.npy", 1) == 1
        with open_container(path) as r:
            assert r.info.raw_dtype == "float32" and r.info.raw_shape == (2, 3, 4)
            assert r.info.source == "/data/src" and r.info.extra == {"seed": 5, "order": "shuffled"}
            assert np.array_equal(r.sample(1)[0].view(np.float32).reshape(2, 3, 4), arr)

    def test_exception_aborts_and_leaves_nothing(self, tmp_path, fmt):
        path = tmp_path / f"a.{fmt}"
        w = create_writer(path, fmt, encoding="png", class_names=["x"], chunk_bytes=64)
        with pytest.raises(RuntimeError, match="boom"):
            with w:
                for i in range(20):
                    w.append(b"x" * 50, 0, f"{i}")
                raise RuntimeError("boom")
        assert os.listdir(tmp_path) == []
        with pytest.raises(ContainerNotFoundError):
            open_container(path)
        w.abort()  # twice is fine
        with pytest.raises(ConfigError, match="aborted"):
            w.append(b"x", 0, "late")

    def test_temporary_is_not_a_container_until_commit(self, tmp_path, fmt):
        path = tmp_path / f"t.{fmt}"
        w = create_writer(path, fmt, encoding="png", class_names=["x"])
        w.append(b"abc", 0, "one")
        (tmp,) = [n for n in os.listdir(tmp_path) if n != f".{path.name}.lock"]  # the writer's lock beside it
        assert tmp.startswith(".") and not path.exists()
        # HDF5: the reader reads the file itself, as another process would (HDF5 does not share this
        # process's open writer with it): not yet flushed, it is a truncated file
        with pytest.raises(IncompleteContainerError if fmt == "zarr" else FormatError):
            open_container(tmp_path / tmp) if fmt == "zarr" else _open_as_hdf5(tmp_path / tmp)
        assert w.commit() == str(path)
        assert os.listdir(tmp_path) == [path.name]
        with pytest.raises(ConfigError, match="committed"):
            w.commit()
        w.abort()  # after commit: nothing happens
        assert path.exists()

    def test_exists_and_overwrite(self, tmp_path, fmt):
        path = write_samples(tmp_path / f"o.{fmt}", fmt, SAMPLES[:3])
        with pytest.raises(ContainerExistsError, match="overwrite"):
            create_writer(path, fmt, encoding="jpeg", class_names=["a"])
        write_samples(path, fmt, SAMPLES[:5], overwrite=True)
        with open_container(path) as r:
            assert len(r) == 5
        assert sorted(os.listdir(tmp_path)) == [os.path.basename(path)]

    def test_bad_writer_arguments(self, tmp_path, fmt):
        with pytest.raises(ConfigError, match="encoding='gif'"):
            create_writer(tmp_path / "x", fmt, encoding="gif", class_names=[])
        with pytest.raises(ConfigError, match="raw_dtype and raw_shape"):
            create_writer(tmp_path / "x", fmt, encoding="raw", class_names=[])
        with pytest.raises(ConfigError, match="reserved"):
            create_writer(tmp_path / "x", fmt, encoding="png", class_names=[], extra_attrs={"version": 2})
        with pytest.raises(ConfigError, match="does not exist"):
            create_writer(tmp_path / "no" / "x", fmt, encoding="png", class_names=[])
        assert os.listdir(tmp_path) == []


def _open_as_hdf5(path):
    from dstore.formats.hdf5 import HDF5Reader

    return HDF5Reader(path)


@pytest.mark.parametrize("fmt", sorted(FORMATS))
@pytest.mark.parametrize(
    "damage,match",
    [
        ("missing", r"missing array\(s\) \['labels'\]"),
        ("offsets-not-monotonic", "offsets are not monotonic"),
        ("offsets-end", r"offsets\[-1\]=.* but data has"),
        ("labels-length", r"labels has shape \(39,\), expected \(40,\)"),
    ],
)
def test_inconsistent_index_is_a_format_error(tmp_path, fmt, damage, match):
    path = write_samples(tmp_path / f"d.{fmt}", fmt, SAMPLES)
    with open_container(path) as r:
        offsets, labels = r.offsets.copy(), r.labels.copy()
    if damage == "missing":
        replace_array(path, "labels", None)
    elif damage == "offsets-not-monotonic":
        offsets[5], offsets[6] = offsets[6] + 1, offsets[5]
        replace_array(path, "offsets", offsets)
    elif damage == "offsets-end":
        offsets[-1] -= 1
        replace_array(path, "offsets", offsets)
    else:
        replace_array(path, "labels", labels[:-1])
    with pytest.raises(FormatError, match=match) as err:
        open_container(path)
    assert str(path) in str(err.value)


def _damage_source_index(path: str, damage: str) -> None:
    """Gives the HDF5 or Zarr container at `path` a `source_index` one entry short ("length"), or
    one whose stored chunk does not decode ("unreadable": reading it fails)."""
    with open_container(path, check_labels=False) as r:
        values = np.arange(r.num_samples, dtype=np.int64)
    if damage == "length":
        replace_array(path, "source_index", values[:-1])
    elif detect_format(path) == "hdf5":
        import h5py

        with h5py.File(path, "r+", locking=False) as f:
            del f["source_index"]
            d = f.create_dataset("source_index", data=values, chunks=(max(values.size, 1),), compression="gzip")
            chunk = d.id.get_chunk_info(0)
            at, size = int(chunk.byte_offset), int(chunk.size)
        with open(path, "r+b") as f:
            f.seek(at)
            f.write(b"\xff" * size)
    else:
        replace_array(path, "source_index", values)
        with open(os.path.join(path, "source_index", "c", "0"), "wb") as f:
            f.write(b"not zstd" * 8)


@pytest.mark.parametrize("damage", ["length", "unreadable"])
def test_an_open_reads_no_source_index(tmp_path, backend, damage):
    # What a store opens reads offsets, labels and checksums only (issue 20): a damaged source_index
    # (never read at open) does not stop it; asking for it, and so `verify`, is a FormatError naming the file.
    from mpi4py import MPI

    from dstore.store.data_store import DataStore
    from dstore.verify import verify_container

    path = build(tmp_path, backend, SAMPLES, chunk_bytes=4096)
    target = data_file(path, 0)[0]  # the container, or its first shard
    _damage_source_index(target, damage)
    with open_container(path) as r:
        assert "source_index" not in vars(r)
        assert r.read_range(0, len(SAMPLES)).tobytes() == b"".join(s[0] for s in SAMPLES)
        with pytest.raises(FormatError, match="source_index") as err:
            r.source_index  # noqa: B018 - read on demand
        assert target in str(err.value)
    with DataStore(MPI.COMM_SELF, path, batch_size=8, seed=1) as st:
        got = sorted(int(i) for b in st.epoch(0) for i in b.ids)
    assert got == list(range(len(SAMPLES)))
    with pytest.raises(FormatError, match="source_index") as err:
        verify_container(path)
    assert target in str(err.value)


def test_source_index_is_read_when_asked_for(tmp_path, backend):
    path = build(tmp_path, backend, SAMPLES)
    with open_container(path) as r:
        assert "source_index" not in vars(r)
        assert r.source_index.dtype == np.int64 and r.source_index.tolist() == [s[3] for s in SAMPLES]
        r.drop_index()
        assert "source_index" not in vars(r)


@pytest.mark.parametrize("keep", [0.5, 0.02])
def test_truncated_hdf5_names_the_file(tmp_path, keep):
    path = write_samples(tmp_path / "t.h5", "hdf5", SAMPLES)
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        f.truncate(int(size * keep))
    with pytest.raises(FormatError, match="truncated") as err:
        open_container(path)
    assert path in str(err.value)


@pytest.mark.parametrize("member", ["data", "labels", "source_index"])
def test_hdf5_member_that_is_a_group_names_the_file(tmp_path, member):
    import h5py

    path = write_samples(tmp_path / "g.h5", "hdf5", SAMPLES)
    with h5py.File(path, "r+", locking=False) as f:
        del f[member]
        f.create_group(member)
    with pytest.raises(FormatError, match=f"'{member}' must be an HDF5 dataset, got a Group") as err:
        with open_container(path) as r:
            r.source_index  # noqa: B018 - read on first use
    assert path in str(err.value)


def test_detect_format_errors(tmp_path):
    with pytest.raises(ContainerNotFoundError, match="no such container"):
        open_container(tmp_path / "nothing.h5")
    assert issubclass(ContainerNotFoundError, FileNotFoundError)
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(FormatError, match="notes.txt: not an HDF5 file"):
        open_container(tmp_path / "notes.txt")
    with pytest.raises(FormatError, match="neither manifest.json"):
        open_container(tmp_path)


class TestManifest:
    def test_shards_must_agree(self, tmp_path):
        a = write_samples(tmp_path / "a.h5", "hdf5", SAMPLES[:3])
        b = write_samples(tmp_path / "b.h5", "hdf5", SAMPLES[3:6], class_names=("a", "b", "z"))
        with pytest.raises(ConfigError, match=r"b.h5 disagrees with shard .*a.h5 on \['class_names'\]"):
            write_manifest(tmp_path / "m.json", [a, b])
        with pytest.raises(ConfigError, match="at least one shard"):
            write_manifest(tmp_path / "m.json", [])
        assert not (tmp_path / "m.json").exists()

    def test_json_file_manifest_and_mixed_backends(self, tmp_path):
        a = write_samples(tmp_path / "a.h5", "hdf5", SAMPLES[:10])
        b = write_samples(tmp_path / "b.zarr", "zarr", SAMPLES[10:])
        m = write_manifest(tmp_path / "all.json", [a, b], extra_attrs={"note": "x"})
        with open_container(m) as r:
            assert len(r) == 40 and r.info.extra == {"note": "x"}
            assert r.read_range(8, 12).tobytes() == b"".join(s[0] for s in SAMPLES[8:12])
            assert isinstance(r, ShardedReader) and r.shard_of(10) == (1, 0)
        with pytest.raises(ContainerExistsError):
            write_manifest(m, [a])

    def test_shard_that_changed_is_a_format_error(self, tmp_path):
        root = build(tmp_path, "sharded-hdf5", SAMPLES)
        shard = os.path.join(root, "shard-00001.h5")
        write_samples(shard, "hdf5", SAMPLES[:2], overwrite=True)
        with pytest.raises(FormatError, match=r"shard 1 .* has 2 samples"):
            open_container(root)


samples_strategy = st.lists(
    st.tuples(
        st.binary(max_size=300),
        st.integers(0, 2),
        st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=12),
        st.integers(-1, 2**40),
    ),
    max_size=25,
)


def _round_trip(backend, samples, chunk):
    with tempfile.TemporaryDirectory() as tmp:
        path = build(Path(tmp), backend, samples, chunk_bytes=chunk)
        with open_container(path) as r:
            assert len(r) == len(samples)
            for i, (data, label, name, src) in enumerate(samples):
                got, got_label = r.sample(i)
                assert (got.tobytes(), got_label, r.name(i), int(r.source_index[i])) == (data, label, name, src)
            assert r.read_range(0, len(samples)).tobytes() == b"".join(s[0] for s in samples)


@pytest.mark.parametrize("backend", ["hdf5", "zarr"])
@settings(max_examples=25, deadline=None)
@given(samples=samples_strategy, chunk=st.sampled_from([64, 1 << 20]))
def test_round_trip_property(backend, samples, chunk):
    _round_trip(backend, samples, chunk)


@pytest.mark.parametrize("backend", ["sharded-hdf5", "sharded-zarr"])
@settings(max_examples=8, deadline=None)
@given(samples=samples_strategy.filter(bool), chunk=st.sampled_from([64, 1 << 20]))
def test_round_trip_property_sharded(backend, samples, chunk):
    _round_trip(backend, samples, chunk)
