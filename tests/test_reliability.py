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

from datastore.errors import ConfigError, FormatError
from datastore.formats import ContainerExistsError, create_writer, open_container
from datastore.ingest import ingest
from formats_helpers import random_samples, write_samples
from ingest_helpers import small_jpegs
from mpirun import REPO


def run_ingest(source, output, **kw):
    kw.setdefault("progress", False)
    return ingest(os.fspath(source), os.fspath(output), comm=MPI.COMM_SELF, **kw)


def dstore(*args, cwd=None, timeout=60, user=None) -> subprocess.CompletedProcess:
    """`dstore ARGS` as a separate process (one rank); a hang fails the test with its output."""
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    try:
        return subprocess.run([sys.executable, "-m", "tools", *map(str, args)], capture_output=True, text=True,
                              cwd=cwd or REPO, env=env, timeout=timeout, user=user)
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"HANG: dstore {' '.join(map(str, args))} did not finish in {timeout}s\n"
                             f"--- stdout ---\n{exc.stdout}\n--- stderr ---\n{exc.stderr}") from None


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
