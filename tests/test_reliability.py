"""Faults and bad input (issue 11): nothing lost, nothing hangs, every user error is one clear line.

Each test reproduces one defect with real files (and, where it matters, a real `dstore` process with
a timeout, so a hang is a failure that prints the output)."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
from mpi4py import MPI
from support.fixtures import tmpfs
from support.formats import plain_values, random_samples, replace_array, write_samples
from support.ingest import small_jpegs
from support.mpirun import REPO

from dstore.errors import ConfigError, FormatError
from dstore.formats import ContainerExistsError, create_writer, open_container
from dstore.ingest import ingest


def run_ingest(source, output, **kw):
    kw.setdefault("progress", False)
    return ingest(os.fspath(source), os.fspath(output), comm=MPI.COMM_SELF, **kw)


def dstore(*args, cwd=None, timeout=60, user=None) -> subprocess.CompletedProcess:
    """`dstore ARGS` as a separate process (one rank); a hang fails the test with its output."""
    try:
        return subprocess.run(
            [sys.executable, "-m", "dstore.tools", *map(str, args)],
            capture_output=True,
            text=True,
            cwd=cwd or REPO,
            timeout=timeout,
            user=user,
        )
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(
            f"HANG: dstore {' '.join(map(str, args))} did not finish in {timeout}s\n"
            f"--- stdout ---\n{exc.stdout}\n--- stderr ---\n{exc.stderr}"
        ) from None


def tree(root) -> dict[str, bytes]:
    """Every file below `root` with its bytes (what must survive a refused command)."""
    out = {}
    for dirpath, _, files in os.walk(root):
        for name in files:
            path = os.path.join(dirpath, name)
            with open(path, "rb") as f:
                out[os.path.relpath(path, root)] = f.read()
    return out


def one_clear_error(res: subprocess.CompletedProcess, *needles: str) -> None:
    """The command failed with one `dstore: error:` line naming every needle, and no traceback."""
    assert res.returncode != 0, res.stdout + res.stderr
    assert "Traceback" not in res.stderr, res.stderr
    assert "dstore: error:" in res.stderr, res.stderr
    for needle in needles:
        assert needle in res.stderr, (needle, res.stderr)


# --- defect 2: --overwrite replaces only our own containers ----------------------------------------


@pytest.fixture()
def images(tmp_path):
    root = tmp_path / "src"
    small_jpegs(str(root), 6)
    return root


@pytest.mark.parametrize("fmt", ["hdf5", "zarr"])
def test_overwrite_refuses_the_source_itself(images, fmt):
    before = tree(images)
    res = dstore("ingest", images, images, "--format", fmt, "--overwrite", "--no-progress")
    one_clear_error(res, str(images))
    assert tree(images) == before


def test_overwrite_refuses_a_directory_holding_the_source(images, tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    before = tree(tmp_path)
    res = dstore("ingest", "src", ".", "--format", "zarr", "--overwrite", "--no-progress", cwd=tmp_path)
    one_clear_error(res, "src")
    assert tree(tmp_path) == before


def test_output_inside_the_source_is_refused(images):
    with pytest.raises(ConfigError, match="inside the source"):
        run_ingest(images, images / "class000" / "out.h5")
    assert not (images / "class000" / "out.h5").exists()


@pytest.mark.parametrize("fmt", ["hdf5", "zarr"])
@pytest.mark.parametrize("victim", ["file", "directory", "h5_without_our_attrs", "zarr_of_someone_else"])
def test_overwrite_refuses_what_is_not_our_container(images, tmp_path, fmt, victim):
    out = tmp_path / "out"
    if victim == "file":
        out.write_bytes(b"precious")
    elif victim == "directory":
        out.mkdir()
        (out / "a.txt").write_text("precious")
    elif victim == "h5_without_our_attrs":
        import h5py

        with h5py.File(out, "w") as f:
            f["x"] = np.arange(3)
    else:
        import zarr

        zarr.open_group(str(out), mode="w", zarr_format=3).create_array("x", shape=(3,), dtype="i8")
    before = tree(tmp_path) if out.is_dir() else out.read_bytes()
    with pytest.raises(ContainerExistsError, match=str(out)):
        run_ingest(images, out, fmt=fmt, overwrite=True)
    assert (tree(tmp_path) if out.is_dir() else out.read_bytes()) == before
    # The writer alone refuses as well (library users of create_writer are protected too).
    with pytest.raises(ContainerExistsError, match="not a dstore container"):
        create_writer(out, fmt, encoding="jpeg", class_names=["a"], overwrite=True)


@pytest.mark.parametrize("old,new", [("hdf5", "hdf5"), ("zarr", "zarr"), ("hdf5", "zarr"), ("zarr", "hdf5")])
def test_overwrite_replaces_our_own_container(images, tmp_path, old, new):
    out = tmp_path / "out"
    run_ingest(images, out, fmt=old)
    run_ingest(images, out, fmt=new, overwrite=True, seed=3)
    with open_container(out) as r:
        assert len(r) == 6 and r.info.extra["ingest_seed"] == 3


def test_overwrite_of_a_sharded_container(images, tmp_path):
    out = tmp_path / "sharded"
    run_ingest(images, out, shards=2)
    run_ingest(images, out, shards=2, overwrite=True, seed=5)
    with open_container(out) as r:
        assert len(r) == 6 and r.info.extra["ingest_seed"] == 5
    # A file of someone else's where a shard would go is not replaced.
    (out / "manifest.json").unlink()
    shard = next(out.glob("shard-00000-*"))
    import shutil

    shutil.rmtree(shard) if shard.is_dir() else shard.unlink()
    shard.write_bytes(b"precious")
    with pytest.raises(ContainerExistsError, match=shard.name):
        run_ingest(images, out, shards=2, overwrite=True)
    assert shard.read_bytes() == b"precious"


# --- defect 7: a FIFO where a container or shard should be never hangs ------------------------------


@pytest.mark.parametrize("name,command", [("c.h5", "info"), ("c", "verify")])
def test_a_fifo_as_container_is_refused(tmp_path, name, command):
    fifo = tmp_path / name
    os.mkfifo(fifo)
    one_clear_error(dstore(command, fifo, timeout=30), str(fifo), "not a regular file")


def test_a_fifo_as_a_shard_or_manifest_is_refused(tmp_path):
    import json

    shard = write_samples(tmp_path / "s0.h5", "hdf5", random_samples(5))
    with open_container(shard) as r:
        attrs = {
            "version": 1,
            "encoding": "jpeg",
            "class_names": ["a", "b", "c"],
            "num_samples": 10,
            "total_bytes": 2 * r.total_bytes,
            "source": "",
        }
        entry = {"num_samples": 5, "total_bytes": r.total_bytes}
    os.mkfifo(tmp_path / "s1.h5")
    (tmp_path / "m.json").write_text(
        json.dumps(
            {
                "format": "dstore-sharded",
                "version": 1,
                "attrs": attrs,
                "complete": True,
                "shards": [dict(entry, path="s0.h5"), dict(entry, path="s1.h5")],
            }
        )
    )
    for command in ("info", "verify"):
        one_clear_error(dstore(command, tmp_path / "m.json", timeout=30), "s1.h5", "not a regular file")
    os.mkfifo(tmp_path / "fifo.json")
    one_clear_error(dstore("info", tmp_path / "fifo.json", timeout=30), "fifo.json", "not a regular file")


def test_a_fifo_as_a_zarr_chunk_is_refused(tmp_path):
    path = write_samples(tmp_path / "c.zarr", "zarr", random_samples(40, max_bytes=4000), chunk_bytes=16384)
    chunk = os.path.join(path, "data", "c", "1")
    os.remove(chunk)
    os.mkfifo(chunk)
    one_clear_error(dstore("verify", path, timeout=30), chunk)


# --- defect 5: symlink loops are reported, links to ancestors do not duplicate images --------------


def test_a_file_symlink_loop_is_a_bad_sample_not_a_crash(images, tmp_path):
    loop = images / "class001" / "loop.jpg"
    os.symlink("loop.jpg", loop)
    report = run_ingest(images, tmp_path / "out.h5", on_error="skip")
    assert report.samples == 6
    assert [(w, r) for w, r in report.skipped if "loop" in r] == [(str(loop), "symbolic link loop")]
    from dstore.errors import SampleError

    with pytest.raises(SampleError, match=f"{loop}: symbolic link loop"):
        run_ingest(images, tmp_path / "out2.h5")


@pytest.mark.parametrize("target", ["root", "root_parent", "other_class", "own_class"])
def test_a_symlink_to_an_ancestor_or_another_class_duplicates_nothing(images, tmp_path, target):
    link = images / "class000" / "sub"
    dest = {
        "root": images,
        "root_parent": images.parent,
        "other_class": images / "class002",
        "own_class": images / "class000",
    }[target]
    os.symlink(dest, link)
    report = run_ingest(images, tmp_path / "out.h5", on_error="skip", keep_order=True)
    assert report.samples == 6, report.summary()
    with open_container(tmp_path / "out.h5") as r:
        names = [r.name(i) for i in range(len(r))]
    assert len(set(names)) == 6 and not any("sub/" in n for n in names)
    assert [w for w, _ in report.skipped] == [str(link)], report.skipped
    from dstore.errors import SampleError

    with pytest.raises(SampleError, match=str(link)):
        run_ingest(images, tmp_path / "out2.h5")


def test_a_symlink_to_a_directory_outside_the_root_is_followed(images, tmp_path):
    extra = tmp_path / "elsewhere"
    small_jpegs(str(extra), 3, seed=7, num_classes=1)
    os.symlink(extra / "class000", images / "class001" / "more")
    report = run_ingest(images, tmp_path / "out.h5")
    assert report.samples == 9 and not report.skipped


# --- defect 6: declared sizes are checked against the file before anything is allocated ------------


def hostile_hdf5(path, *, data_bytes: int, num_samples: int = 1) -> str:
    """A small HDF5 file whose attributes and dataset shapes declare `data_bytes` of data and
    `num_samples` samples, none of it stored (reads would give fill values)."""
    import h5py

    with h5py.File(path, "w") as f:
        f.create_dataset("data", shape=(data_bytes,), dtype=np.uint8, chunks=(1 << 20,))
        for key, dtype in (("labels", np.int64), ("checksums", np.uint32), ("source_index", np.int64)):
            f.create_dataset(key, shape=(num_samples,), dtype=dtype, chunks=(min(num_samples, 1 << 16),))
        offsets = f.create_dataset(
            "offsets", shape=(num_samples + 1,), dtype=np.int64, chunks=(min(num_samples + 1, 1 << 16),)
        )
        offsets[-1] = data_bytes
        f.create_dataset("names", shape=(num_samples,), dtype=h5py.string_dtype(), chunks=(min(num_samples, 1 << 16),))
        f.attrs.update(
            version=1,
            encoding="jpeg",
            class_names=["a"],
            num_samples=num_samples,
            total_bytes=data_bytes,
            source="",
            complete=True,
        )
    return os.fspath(path)


@pytest.mark.parametrize("fmt", ["hdf5", "zarr"])
def test_a_short_source_index_fails_verify_not_info(tmp_path, fmt):
    # An open reads no source_index (issue 20): `info` (and a store) do not see the damage; `verify` reads it.
    path = write_samples(tmp_path / f"c.{fmt}", fmt, random_samples(20, seed=4))
    replace_array(path, "source_index", np.arange(19, dtype=np.int64))
    res = dstore("info", path)
    assert res.returncode == 0, res.stdout + res.stderr
    one_clear_error(dstore("verify", path), path, "source_index has shape (19,), expected (20,)")


@pytest.mark.parametrize("command", ["info", "verify"])
def test_hdf5_declaring_a_terabyte_is_refused_quickly(tmp_path, command):
    path = hostile_hdf5(tmp_path / "big.h5", data_bytes=1 << 40)
    assert os.path.getsize(path) < 100_000
    one_clear_error(dstore(command, path, timeout=60), path, "declares")


def test_hdf5_declaring_many_samples_is_refused(tmp_path):
    path = hostile_hdf5(tmp_path / "many.h5", data_bytes=1 << 20, num_samples=(1 << 25))
    with pytest.raises(FormatError, match="declares"):
        open_container(path)


def test_zarr_declaring_a_terabyte_is_refused(tmp_path):
    import json

    path = write_samples(tmp_path / "c.zarr", "zarr", random_samples(5))
    meta = json.loads((tmp_path / "c.zarr" / "data" / "zarr.json").read_text())
    meta["shape"] = [1 << 40]
    (tmp_path / "c.zarr" / "data" / "zarr.json").write_text(json.dumps(meta))
    group = json.loads((tmp_path / "c.zarr" / "zarr.json").read_text())
    group["attributes"]["total_bytes"] = 1 << 40
    (tmp_path / "c.zarr" / "zarr.json").write_text(json.dumps(group))
    with pytest.raises(FormatError, match="declares"):
        open_container(path)


def _limited(code: str, timeout: float = 60) -> subprocess.CompletedProcess:
    """Runs `code` in a fresh interpreter with 3 GB of address space: a hostile size that drives an
    allocation fails (or times out) instead of taking the machine."""
    env = dict(os.environ, PYTHONPATH=str(REPO / "tests"))
    try:
        return subprocess.run(
            ["bash", "-c", f'ulimit -v 3000000; exec "{sys.executable}" -c "$0"', code],
            capture_output=True,
            text=True,
            env=env,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        raise AssertionError(f"HANG or runaway allocation: {code}") from None


REFUSE_CODE = "from dstore.ingest import open_source\nfrom dstore.errors import SampleError\n"


def test_a_huge_label_in_npz_and_cifar_is_refused(tmp_path):
    from support.ingest import cifar_batch, write_pickle

    np.savez(tmp_path / "a.npz", x=np.zeros((3, 4, 4), np.uint8), y=np.array([0, 1, 2**40]))
    batch = cifar_batch(3)
    batch[b"labels"] = [0, 1, 2**40]
    write_pickle(str(tmp_path / "data_batch_1"), batch)
    for spec in (tmp_path / "a.npz", tmp_path / "data_batch_1"):
        res = _limited(
            REFUSE_CODE + f"try:\n    open_source({str(spec)!r})\nexcept SampleError as e:\n    print('REFUSED', e)\n"
        )
        assert "REFUSED" in res.stdout and str(2**40) in res.stdout, res.stdout + res.stderr


# --- defect 4: any number of class names, in both backends -------------------------------------------


@pytest.mark.parametrize("fmt", ["hdf5", "zarr"])
def test_twenty_two_thousand_classes(tmp_path, fmt):
    names = [f"n{i:08d}_some_long_class_description" for i in range(21841)]
    samples = [(b"x" * 10, 21840 - i, f"s{i}", i) for i in range(3)]
    path = write_samples(tmp_path / f"c.{fmt}", fmt, samples, class_names=names)
    with open_container(path) as r:
        assert r.info.class_names == tuple(names) and r.labels.tolist() == [21840, 21839, 21838]


def test_old_hdf5_with_class_names_in_an_attribute_is_still_read(tmp_path):
    import h5py

    path = write_samples(tmp_path / "c.h5", "hdf5", random_samples(4))
    with h5py.File(path, "r+") as f:
        if "class_names" in f:
            del f["class_names"]
        f.attrs["class_names"] = np.array(["a", "b", "c"], dtype=h5py.string_dtype())
    with open_container(path) as r:
        assert r.info.class_names == ("a", "b", "c")


# --- defect 8: user errors are one clear line, never a traceback --------------------------------

NO_DAC = ["setpriv", "--bounding-set=-dac_override,-dac_read_search", "--inh-caps=-dac_override,-dac_read_search"]
"""Runs a command as this root user without the capabilities that bypass file permissions."""


def dstore_without_dac(*args, cwd=None) -> subprocess.CompletedProcess:
    import shutil

    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv to drop the permission-bypassing capabilities")
    return subprocess.run(
        NO_DAC + [sys.executable, "-m", "dstore.tools", *map(str, args)],
        capture_output=True,
        text=True,
        cwd=cwd or REPO,
        timeout=60,
    )


@pytest.fixture()
def read_only_dir(tmp_path):
    """A read-only file system (a tmpfs mounted ro): writes fail with EROFS."""
    with tmpfs(tmp_path / "ro", "ro,size=1m") as mnt:
        yield mnt


@pytest.mark.parametrize("fmt", ["hdf5", "zarr"])
def test_read_only_output_is_one_line(images, read_only_dir, fmt):
    out = read_only_dir / "out"
    one_clear_error(
        dstore("ingest", images, out, "--format", fmt, "--no-progress"), str(read_only_dir), "Read-only file system"
    )


def test_unwritable_output_and_unreadable_source_are_one_line(images, tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir()
    os.chmod(locked, 0o555)
    one_clear_error(
        dstore_without_dac("ingest", images, locked / "out.h5", "--no-progress"), str(locked), "Permission denied"
    )
    os.chmod(images, 0)
    try:
        one_clear_error(
            dstore_without_dac("ingest", images, tmp_path / "out.h5", "--no-progress"), str(images), "Permission denied"
        )
    finally:
        os.chmod(images, 0o755)


@pytest.mark.parametrize("fmt", ["hdf5", "zarr"])
def test_non_utf8_class_directory(images, tmp_path, fmt):
    bad = os.path.join(os.fsencode(images), b"caf\xe9")
    os.rename(os.fsencode(images / "class002"), bad)
    report = run_ingest(images, tmp_path / "out", fmt=fmt)
    assert report.samples == 6 and any("caf\\udce9" in note and "UTF-8" in note for note in report.notes)
    with open_container(tmp_path / "out") as r:
        assert r.info.class_names == ("caf\\udce9", "class000", "class001")


def _set_attr(path, key, value):
    import h5py

    with h5py.File(path, "r+") as f:
        f.attrs[key] = value


@pytest.mark.parametrize(
    "key,value",
    [
        ("version", "one"),
        ("version", 1.5),
        ("num_samples", "many"),
        ("num_samples", -3),
        ("total_bytes", "x"),
        ("raw_dtype", "no-such-type"),
        ("raw_dtype", "object"),
        ("raw_shape", "abc"),
        ("raw_shape", [-4, 2]),
    ],
)
def test_bad_attributes_are_named(tmp_path, key, value):
    path = write_samples(
        tmp_path / "c.h5", "hdf5", [(bytes(12), 0, "a", 0)], encoding="raw", raw_dtype="uint8", raw_shape=(3, 4)
    )
    _set_attr(path, key, value)
    with pytest.raises(FormatError, match=key):
        open_container(path)
    if (key, value) == ("version", "one"):  # the command line, once (a process costs about 1.5 s)
        one_clear_error(dstore("info", path), path, key)


def test_a_manifest_naming_itself_or_its_directory(tmp_path):
    import json

    shard = write_samples(tmp_path / "s.h5", "hdf5", random_samples(3))
    with open_container(shard) as r:
        attrs = {
            "version": 1,
            "encoding": "jpeg",
            "class_names": ["a", "b", "c"],
            "num_samples": 3,
            "total_bytes": r.total_bytes,
            "source": "",
        }
    for mpath, shard_path in ((tmp_path / "m.json", "m.json"), (tmp_path / "d" / "manifest.json", ".")):
        mpath.parent.mkdir(exist_ok=True)
        mpath.write_text(
            json.dumps(
                {
                    "format": "dstore-sharded",
                    "version": 1,
                    "attrs": attrs,
                    "complete": True,
                    "shards": [{"path": shard_path, "num_samples": 3, "total_bytes": attrs["total_bytes"]}],
                }
            )
        )
        with pytest.raises(FormatError, match="itself a manifest"):
            open_container(mpath)
        one_clear_error(dstore("verify", mpath), "itself a manifest")


def test_labels_outside_the_class_names_are_refused_where_data_is_loaded(tmp_path):
    samples = random_samples(6)
    samples[4] = (samples[4][0], 7, samples[4][2], 4)
    path = write_samples(tmp_path / "c.h5", "hdf5", samples)
    with pytest.raises(FormatError, match=r"sample 4 .*label 7.*3 class names"):
        open_container(path)
    from dstore.verify import container_info, verify_container

    assert container_info(path)["labels_outside_classes"] == 1  # info and verify still report them
    assert [b.index for b in verify_container(path).bad] == [4]


# --- defect 9: verify narrows an unreadable read to the samples really bad ---------------------------


def _overlapping(offsets, lo, hi) -> list[int]:
    """Samples with at least one byte in [lo, hi) (an empty sample holds none, so it is never bad)."""
    return [
        i for i in range(len(offsets) - 1) if offsets[i] < hi and offsets[i + 1] > lo and offsets[i + 1] > offsets[i]
    ]


def test_verify_narrows_a_truncated_zarr_chunk(tmp_path):
    from dstore.verify import verify_container

    chunk = 1 << 16
    path = write_samples(tmp_path / "c.zarr", "zarr", random_samples(300, max_bytes=4000), chunk_bytes=chunk)
    with open_container(path) as r:
        offsets = r.offsets.tolist()
    with open(os.path.join(path, "data", "c", "3"), "r+b") as f:
        f.truncate(chunk // 2)
    bad = [b.index for b in verify_container(path).bad]
    assert bad == _overlapping(offsets, 3 * chunk + chunk // 2, 4 * chunk)
    assert 0 < len(bad) < 40


def test_verify_narrows_a_corrupt_gzip_chunk(tmp_path):
    import h5py

    from dstore.verify import verify_container

    chunk = 1 << 16
    src = write_samples(tmp_path / "plain.h5", "hdf5", random_samples(300, max_bytes=4000))
    path = str(tmp_path / "gzip.h5")
    with h5py.File(src, "r") as a, h5py.File(path, "w") as b:
        for key in a:
            if key == "data":
                b.create_dataset("data", data=plain_values(a, "data"), chunks=(chunk,), compression="gzip")
            else:
                a.copy(key, b)
        b.attrs.update(a.attrs)
        info = b["data"].id.get_chunk_info(2)
        offsets = plain_values(b, "offsets").tolist()
    with open(path, "r+b") as f:
        f.seek(info.byte_offset + info.size // 2)
        f.write(bytes(range(256)) * 4)
    bad = [b.index for b in verify_container(path).bad]
    assert bad == _overlapping(offsets, 2 * chunk, 3 * chunk)
    assert 0 < len(bad) < 60


# --- defect 8 (checkpoints): an unusable checkpoint is a named error that never suggests unpickling code


class _Payload:
    def __reduce__(self):
        return (os.system, ("echo pwned",))


@pytest.mark.parametrize("kind", ["empty", "truncated", "not_a_checkpoint", "wrong_dict", "malicious"])
def test_unusable_checkpoints_are_named(tmp_path, kind):
    torch = pytest.importorskip("torch")
    from dstore.training.checkpoint import load_checkpoint, save_checkpoint

    path = tmp_path / "checkpoint.pt"
    if kind == "empty":
        path.write_bytes(b"")
    elif kind == "truncated":
        save_checkpoint(path, {"model": {"w": torch.zeros(1000)}, "epoch": 1})
        path.write_bytes(path.read_bytes()[:300])
    elif kind == "not_a_checkpoint":
        path.write_text("hello")
    elif kind == "wrong_dict":
        torch.save({"w": torch.zeros(3)}, path)
    else:
        torch.save({"model": _Payload()}, path)
    with pytest.raises(ConfigError, match=str(path)) as err:
        load_checkpoint(path, required=("model", "epoch"))
    assert "weights_only=False" not in str(err.value) and "pwned" not in str(err.value)


def test_a_fifo_as_an_array_source_is_refused(tmp_path):
    os.mkfifo(tmp_path / "x.npz")
    os.mkfifo(tmp_path / "y.npy")
    for name in ("x.npz", "y.npy"):
        res = _limited(
            REFUSE_CODE + f"try:\n    open_source({str(tmp_path / name)!r})\n"
            "except SampleError as e:\n    print('REFUSED', e)\n",
            timeout=20,
        )
        assert "REFUSED" in res.stdout and "not a regular file" in res.stdout, res.stdout + res.stderr


@pytest.fixture()
def tiny_fs(tmp_path):
    """A 100 KiB tmpfs: writes fail with ENOSPC."""
    with tmpfs(tmp_path / "tiny", "size=100k") as mnt:
        yield mnt


@pytest.mark.parametrize("fmt", ["hdf5", "zarr"])
def test_disk_full_is_one_line_and_leaves_nothing(tiny_fs, fmt):
    np.save(tiny_fs.parent / "x.npy", np.random.default_rng(0).integers(0, 256, (300, 32, 32), dtype=np.uint8))
    res = dstore("ingest", tiny_fs.parent / "x.npy", tiny_fs / "out", "--format", fmt, "--no-progress")
    one_clear_error(res, str(tiny_fs / "out"), "No space left on device")
    assert os.listdir(tiny_fs) == []


# --- faults the issue found already handled, kept by a test ------------------------------------------


def test_a_manifest_pointing_at_a_system_file_is_refused(tmp_path):
    import json

    (tmp_path / "m.json").write_text(
        json.dumps(
            {
                "format": "dstore-sharded",
                "version": 1,
                "complete": True,
                "attrs": {"version": 1, "encoding": "jpeg", "class_names": [], "num_samples": 1, "total_bytes": 1},
                "shards": [{"path": "/etc/passwd", "num_samples": 1, "total_bytes": 1}],
            }
        )
    )
    one_clear_error(dstore("info", tmp_path / "m.json"), "/etc/passwd", "not an HDF5 file")


KILL_SCRIPT = """
import os, signal, sys
from mpi4py import MPI
from dstore.ingest import ingest
from dstore.ingest.folder import FolderSource

if MPI.COMM_WORLD.rank == 1:  # rank 1 dies by SIGKILL at its third sample, mid-ingest
    load, seen = FolderSource.load, []

    def dying_load(self, i):
        seen.append(i)
        if len(seen) == 3:
            os.kill(os.getpid(), signal.SIGKILL)
        return load(self, i)

    FolderSource.load = dying_load
ingest(sys.argv[1], sys.argv[2], progress=False)
"""


@pytest.mark.mpi
def test_kill_9_of_a_rank_during_ingest_ends_the_job_and_leaves_no_container(images, tmp_path):
    from support.mpirun import run_mpi

    small_jpegs(str(images), 60, seed=1)
    script = tmp_path / "kill.py"
    script.write_text(KILL_SCRIPT)
    out = tmp_path / "out" / "c.h5"
    out.parent.mkdir()
    res = run_mpi(2, ["python", str(script), str(images), str(out)], timeout=90, check=False)
    assert res.returncode != 0 and "signal 9" in res.stdout + res.stderr, res.stdout + res.stderr
    assert [n for n in os.listdir(out.parent) if not n.startswith(".")] == []  # at most a dot-temporary
