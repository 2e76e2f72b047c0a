"""What a store's first batch costs a parallel file system (issue 24): every operation is a round
trip and part of a job's budget of operations per second, so the container's open and the first
step's reads are counted through a real `dstore pfs` mount (its counters; no timings asserted).

The mount's tests are skipped, with the reason, where FUSE is not available.
"""

from __future__ import annotations

import os
import re

import numpy as np
import pytest
from support.formats import random_samples, write_samples

from dstore.formats import open_container
from dstore.tools.pfs import PfsModel, fuse_available, pfs_mount

REASON = fuse_available()
needs_fuse = pytest.mark.skipif(REASON is not None, reason=f"needs FUSE: {REASON}")


@pytest.fixture(scope="module")
def container(tmp_path_factory):
    # ~3 MB of data between the file's head and its index: metadata in two places, as in a real container
    samples = random_samples(60, seed=5, max_bytes=100_000)
    path = write_samples(tmp_path_factory.mktemp("fb") / "c.h5", "hdf5", samples, chunk_bytes=1 << 20)
    return path, samples


@needs_fuse
def test_opening_an_hdf5_container_costs_a_few_requests(container):
    path, samples = container
    src, name = os.path.split(path)
    with pfs_mount(src, model=PfsModel()) as mnt:
        with open_container(mnt.path(name), index=False) as r:
            offsets = r.offsets  # the index, read on first use
            got = r.read_bytes(int(offsets[1]), int(offsets[2]))
    s = mnt.stats
    assert s is not None  # the mount wrote its figures
    # HDF5 reads its metadata item by item (about 25 requests for this file); read in blocks, the
    # head and the tail (index, names, attributes) are one request each, plus the sample's
    assert s["reads"] <= 4, s
    assert s["opens"] <= 2, s
    assert got.tobytes() == samples[1][0]
    assert np.array_equal(np.diff(offsets), [len(x[0]) for x in samples])


_STREAM = (
    "import sys, zlib\n"
    "from mpi4py import MPI\n"
    "import numpy as np\n"
    "from dstore.formats import open_container\n"
    "from dstore.store.data_store import DataStore\n"
    "comm = MPI.COMM_WORLD\n"
    "seen = []\n"
    "with DataStore(comm, sys.argv[1], batch_size=16, seed=3, population='stream') as st:\n"
    "    for e in range(2):\n"
    "        for b in st.epoch(e):\n"
    "            seen += [(e, int(i), zlib.crc32(memoryview(x).cast('B'))) for i, x in zip(b.ids, b.samples)]\n"
    "rows = comm.gather(seen)\n"
    "if comm.rank == 0:\n"
    "    with open_container(sys.argv[2]) as r:\n"
    "        crc = r.checksums\n"
    "        for e in range(2):\n"
    "            got = sorted((i, c) for rs in rows for (ee, i, c) in rs if ee == e)\n"
    "            assert got == [(i, int(crc[i])) for i in range(r.num_samples)], e\n"
    "    print('OK exactly once', flush=True)\n"
)


@pytest.mark.mpi
@needs_fuse
def test_a_streamed_store_opens_the_container_once_per_rank(container, tmp_path):
    # Its storage and population threads read with the rank's own reader (HDF5: positioned reads
    # of one descriptor) rather than each opening the container again: three requests per thread
    # per rank before the first batch. Every sample is still delivered once per epoch, its bytes
    # the container's (CRC32 of what each rank delivered against the container's checksums).
    from support.mpirun import run_mpi

    path, _ = container
    src, name = os.path.split(path)
    script = tmp_path / "stream.py"
    script.write_text(_STREAM)
    with pfs_mount(src, model=PfsModel()) as mnt:
        res = run_mpi(2, ["python", str(script), mnt.path(name), path], timeout=120)  # 4 threads of each
    assert "OK exactly once" in res.stdout, res.stdout + res.stderr
    assert mnt.stats is not None and mnt.stats["opens"] <= 2, mnt.stats  # one per rank


_FIRST = (
    "import sys, zlib\n"
    "from mpi4py import MPI\n"
    "import numpy as np\n"
    "from dstore.order import shuffle\n"
    "from dstore.formats import open_container\n"
    "from dstore.store.data_store import DataStore\n"
    "comm, B = MPI.COMM_WORLD, 16\n"
    "def epoch(st, e):\n"
    "    got = [(int(i), zlib.crc32(memoryview(x).cast('B'))) for b in st.epoch(e) for i, x in zip(b.ids, b.samples)]\n"
    "    return sorted(sum(comm.allgather(got), []))\n"
    "def expect(r, e, first):\n"
    "    ids = shuffle.global_order(r.num_samples, 3, e)[first * B:]\n"
    "    return sorted((int(i), int(r.checksums[i])) for i in ids)\n"
    "r = open_container(sys.argv[1])\n"
    "st = DataStore(comm, sys.argv[1], batch_size=B, seed=3, population='stream')\n"
    "if sys.argv[2] == 'resume':\n"
    "    sd = st.state_dict()\n"
    "    sd.update(epoch=1, step=2, position=2 * B)\n"
    "    st.load_state_dict(sd)\n"
    "    with st:\n"
    "        assert epoch(st, 1) == expect(r, 1, 2)\n"
    "        assert epoch(st, 2) == expect(r, 2, 0)\n"
    "else:  # epoch 3 first: the first step read ahead (epoch 0's) is not asked for\n"
    "    with st:\n"
    "        assert epoch(st, 3) == expect(r, 3, 0)\n"
    "        assert epoch(st, 0) == expect(r, 0, 0)\n"
    "if comm.rank == 0:  # one line (two ranks' prints could interleave); a rank that failed exits non-zero\n"
    "    print('OK', sys.argv[2], flush=True)\n"
)


@pytest.mark.mpi
@pytest.mark.parametrize("how", ["resume", "other-epoch"])
def test_the_first_step_read_ahead_serves_exactly_its_own_step(container, tmp_path, how):
    # The stream reads the first step's samples before its plan is made; a resumed store reads the
    # resumed step's, and a store whose first epoch is another serves that epoch exactly as well
    # (each delivered sample once, the positions of the global order from the step on, the
    # container's bytes). Local files: no mount needed.
    from support.mpirun import run_mpi

    path, _ = container
    script = tmp_path / "first.py"
    script.write_text(_FIRST)
    res = run_mpi(2, ["python", str(script), path, how], timeout=120)
    assert f"OK {how}" in res.stdout, res.stdout + res.stderr


@pytest.mark.mpi
def test_the_first_batch_tool_reports_every_loader(tmp_path):
    # tools/bench/first_batch.py (docs/benchmarks.md's before/after figures) on a tiny generated set:
    # a row per loader with one figure per pass; WebDataset's skipped with the reason where absent
    from support.mpirun import run_mpi

    from dstore.training.peers import missing

    res = run_mpi(
        2,
        [
            "python",
            "-m",
            "dstore.tools.bench.first_batch",
            "--data-dir",
            str(tmp_path),
            "--count",
            "48",
            "--rung",
            "local",
            "--repeats",
            "2",
            "--batch-size",
            "16",
        ],
        timeout=120,
    )
    rows = {line.split(" | ")[0].strip("| "): line for line in res.stdout.splitlines() if line.startswith("| ")}
    for name in ("store (stream)", "store (preload)"):
        # the median, then both passes, of the first batch and of epoch 0
        assert name in rows and re.search(
            r"\| [\d.]+ \([\d.]+, [\d.]+\) \| [\d.]+ \([\d.]+, [\d.]+\) \|", rows[name]
        ), res.stdout
    wds = [n for n in rows if n.startswith("WebDataset")]
    assert (len(wds) == 1) if missing("webdataset") is None else "Skipped WebDataset" in res.stdout, res.stdout
