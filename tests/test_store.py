"""DataStore end to end: the same scenarios (tests/store_scenarios/scenarios.py) in-process on
COMM_SELF and under real `mpiexec -n 1..4` on uneven data, plus an error on one rank ending the job."""

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from store_scenarios import scenarios
from support.formats import plain_values
from support.mpirun import run_mpi

SCEN_DIR = Path(__file__).resolve().parent / "store_scenarios"


@pytest.fixture(scope="module")
def container(tmp_path_factory):
    # 157 samples of 0..20,000 bytes, some empty: not a multiple of the batch (12) nor of 1..4 ranks.
    path = scenarios.make_container(str(tmp_path_factory.mktemp("store") / "uneven.h5"))
    scenarios.make_tier_container(path)  # beside it, for the tiered scenario
    return path


@pytest.mark.parametrize("name", sorted(scenarios.SCENARIOS))
def test_scenario_in_process_on_comm_self(container, name):
    import torch  # noqa: F401  (here scenario_resume's state goes through torch.save/load(weights_only=True))
    from mpi4py import MPI

    scenarios.SCENARIOS[name](MPI.COMM_SELF, container)


@pytest.mark.mpi
@pytest.mark.parametrize(
    "nprocs,views,per_node", [(1, "1", ""), (2, "1", ""), (2, "0", ""), (3, "0", ""), (4, "1", "2"), (4, "0", "")]
)
def test_scenarios_under_mpiexec(container, nprocs, views, per_node):
    # views "0": DSTORE_NODE_VIEWS=0, every sample of another rank comes with an RMA get (what
    # other nodes' samples always do); "1": this node's ranks' samples are served in place.
    # per_node "2": runs of 2 ranks stand for nodes, so one batch mixes in-place and fetched samples.
    res = run_mpi(
        nprocs,
        ["python", "-m", "mpi4py", str(SCEN_DIR / "scenarios.py"), container],
        timeout=150,
        env={"DSTORE_NODE_VIEWS": views, "DSTORE_RANKS_PER_NODE": per_node},
    )
    for name in scenarios.SCENARIOS:
        assert f"OK {name} on {nprocs} ranks" in res.stdout, res.stdout + res.stderr


@pytest.mark.mpi
def test_error_inside_an_epoch_on_one_rank_ends_the_job(container, tmp_path):
    # Rank 1 fails mid-epoch inside `with store:`; its exit must not wait in the collective
    # Win.Free while the others wait in the next epoch's collective: the job must end, non-zero.
    script = tmp_path / "fail.py"
    script.write_text(
        "from mpi4py import MPI\n"
        "from dstore.store.data_store import DataStore\n"
        f"with DataStore(MPI.COMM_WORLD, {container!r}, batch_size=12) as st:\n"
        "    for b in st.epoch(0):\n"
        "        if st.rank == 1 and b.step == 3:\n"
        "            raise RuntimeError('boom on rank 1')\n"
        "    for b in st.epoch(1):\n"
        "        pass\n"
    )
    res = run_mpi(3, ["python", "-m", "mpi4py", str(script)], timeout=60, check=False)
    assert res.returncode != 0
    assert "boom on rank 1" in res.stderr


def test_zarr_container_in_process(tmp_path):
    from mpi4py import MPI

    path = scenarios.make_container(str(tmp_path / "uneven.zarr"), n=61, fmt="zarr")
    scenarios.scenario_exactly_once(MPI.COMM_SELF, path)
    scenarios.scenario_dynamic(MPI.COMM_SELF, path)


@pytest.mark.parametrize("tiered", [False, True])
def test_a_parallel_population_names_the_sample_of_a_truncated_chunk(tmp_path, monkeypatch, caplog, tiered):
    # The preload with several reads in flight (dstore.store.preload), pieces smaller than a chunk:
    # a truncated Zarr data chunk fails one piece on a worker thread; the error names the container
    # and the sample (index and source name), as the one-thread preload's does.
    import os
    import re

    from mpi4py import MPI

    from dstore.errors import FormatError
    from dstore.store import preload
    from dstore.store.data_store import DataStore

    monkeypatch.setattr(preload, "PARALLEL_PIECE", 20_000)
    monkeypatch.setattr(preload, "PRELOAD_SCRATCH", 20_000)
    path = scenarios.make_container(
        str(tmp_path / "c.zarr"), n=1201, seed=1, large=8000, small=8000, fmt="zarr", chunk_bytes=1 << 16
    )
    kw = dict(batch_size=12, seed=3, population_threads=3)
    probe = DataStore(MPI.COMM_SELF, path, **kw)
    off = probe.offsets
    budget = probe.tier_overhead() + int(0.5 * int(off[-1])) if tiered else None
    probe.close()
    os.truncate(os.path.join(path, "data", "c", "3"), 1000)  # samples with bytes in [3*64K + 1000, 4*64K)
    broken = np.nonzero((off[1:] > 3 * 65536 + 1000) & (off[:-1] < 4 * 65536))[0]
    with caplog.at_level("WARNING", logger="dstore.store"), pytest.raises(FormatError) as info:
        with DataStore(MPI.COMM_SELF, path, memory_budget=budget, **kw):
            pass
    assert tiered == ("exceeds the memory budget" in caplog.text), caplog.text
    msg = str(info.value)
    assert path in msg and "truncated" in msg, msg
    named = [int(i) for i, j in re.findall(r"(\d+) \(s(\d+)\)", msg) if i == j]  # index (source name)
    assert named and set(named) <= set(broken.tolist()), msg


def test_the_delivery_check_catches_loss_repeats_and_bad_bytes(container):
    # The scenarios' oracle must be able to fail: feed it a correct epoch, then damaged copies.
    from mpi4py import MPI

    from dstore.formats import open_container
    from dstore.store.data_store import DataStore

    reader = open_container(container)
    with DataStore(MPI.COMM_SELF, reader, batch_size=scenarios.BATCH, seed=1) as st:
        got = scenarios.run_epoch(st, 0)
    kw: dict[str, Any] = dict(epoch=0, policy="global", seed=1, drop_last=False)
    scenarios.check_delivery(MPI.COMM_SELF, reader, got, **kw)
    ids, crcs, pads, labels, steps = got
    swapped = ids.copy()
    swapped[[0, 1]] = swapped[[1, 0]]
    damaged = [
        (swapped, crcs[[1, 0] + list(range(2, crcs.size))], pads, labels[[1, 0] + list(range(2, labels.size))], steps),
        (ids[1:], crcs[1:], pads[1:], labels[1:], steps[1:]),  # a sample lost
        (ids.copy(), crcs ^ (np.arange(crcs.size) == 7), pads, labels, steps),  # one byte wrong
        (
            np.r_[ids, ids[:1]],
            np.r_[crcs, crcs[:1]],
            np.r_[pads, False],
            np.r_[labels, labels[:1]],
            np.r_[steps, steps[-1:]],
        ),  # a repeat
    ]
    for bad in damaged:
        with pytest.raises(AssertionError):
            scenarios.check_delivery(MPI.COMM_SELF, reader, bad, **kw)
    reader.close()


_FAILING_READ = (
    "import sys\n"
    "from mpi4py import MPI\n"
    "from dstore.store.data_store import DataStore\n"
    "try:\n"
    "    with DataStore(MPI.COMM_WORLD, sys.argv[1], batch_size=12, population=sys.argv[2],\n"
    "                   replicate=sys.argv[3] == '1') as st:\n"
    "        for e in (0, 1):\n"
    "            for b in st.epoch(e):\n"
    "                pass\n"
    "except Exception as exc:\n"
    "    print(f'\\nrank {MPI.COMM_WORLD.rank} raised {type(exc).__name__}: {exc}', flush=True)\n"
    "    raise\n"
    "print('finished', flush=True)\n"
)


def _gzip_hdf5_with_a_corrupt_chunk(tmp_path) -> str:
    """The scenarios' container rewritten with gzip-compressed 64 KiB data chunks (what a user's own
    HDF5 may hold), chunk 1 (rank 0's block on 2 ranks) overwritten in its middle."""
    import h5py

    src = scenarios.make_container(str(tmp_path / "src.h5"))
    path = str(tmp_path / "c.h5")
    with h5py.File(src, "r") as a, h5py.File(path, "w") as b:
        for k, v in a.attrs.items():
            b.attrs[k] = v
        for name in a:
            if name == "data":
                b.create_dataset("data", data=plain_values(a, "data"), chunks=(1 << 16,), compression="gzip")
            else:
                a.copy(name, b)
    with h5py.File(path, "r") as b:
        info = b["data"].id.get_chunk_info(1)
    with open(path, "r+b") as fh:
        fh.seek(info.byte_offset + info.size // 2)
        fh.write(b"\xff" * 64)
    return path


@pytest.mark.mpi
@pytest.mark.parametrize(
    "fault,population,replicate",
    [
        ("zarr", "preload", "0"),
        ("zarr", "dynamic", "0"),
        ("zarr", "preload", "1"),
        ("gzip", "preload", "0"),
        ("zarr", "stream", "0"),
    ],
)
def test_a_truncated_chunk_in_one_ranks_block_ends_the_job_on_every_rank(tmp_path, fault, population, replicate):
    # Issue 11 defect 1: one rank's read fails (a truncated Zarr data chunk, or a corrupt gzip chunk
    # of an HDF5 file, holding only samples of rank 0's block); that rank used to call the
    # collective Win.Free while the other waited in publish(): a hang. Run as a plain script (no
    # `-m mpi4py` to abort the job): every rank must raise an error naming the container and the
    # samples, and the job must end.
    import os

    if fault == "zarr":
        path = scenarios.make_container(str(tmp_path / "c.zarr"), fmt="zarr", chunk_bytes=1 << 16)
        os.truncate(os.path.join(path, "data", "c", "1"), 1000)
    else:
        path = _gzip_hdf5_with_a_corrupt_chunk(tmp_path)
    script = tmp_path / "read.py"
    script.write_text(_FAILING_READ)
    res = run_mpi(2, ["python", str(script), path, population, replicate], timeout=60, check=False)
    out = res.stdout + res.stderr
    assert res.returncode != 0, out
    assert "finished" not in res.stdout, out
    for r in (0, 1):
        line = next((x for x in res.stdout.splitlines() if x.startswith(f"rank {r} raised")), None)
        assert line is not None, out
        assert "FormatError" in line and path in line, line
        assert ("truncated" if fault == "zarr" else "filter returned failure") in line, line
        assert "sample" in line and "(s" in line, line  # names the samples: index and source name


_FAILING_STORAGE = (
    "import os, sys\n"
    "import numpy as np\n"
    "from mpi4py import MPI\n"
    "from dstore.store.data_store import DataStore\n"
    "comm = MPI.COMM_WORLD\n"
    "path, chunk = sys.argv[1], 1 << 16\n"
    "probe = DataStore(comm, path, batch_size=12)\n"
    "budget = probe.tier_overhead() + int(0.4 * int(probe.layout.nbytes.max()))\n"
    "probe.close()\n"
    "try:\n"
    "    with DataStore(comm, path, batch_size=12, memory_budget=budget, seed=3) as st:\n"
    "        off = st.offsets\n"
    "        # a non-resident sample that ends its chunk: truncating the chunk at its start breaks it alone\n"
    "        k = off[:-1] // chunk\n"
    "        ok = ~st.windows.resident & (st.sizes > 0) & (off[1:] >= (k + 1) * chunk)\n"
    "        i = int(np.nonzero(ok)[0][len(np.nonzero(ok)[0]) // 2])\n"
    "        comm.Barrier()\n"
    "        if comm.rank == 0:\n"
    "            os.truncate(os.path.join(path, 'data', 'c', str(k[i])), int(off[i] - k[i] * chunk))\n"
    "            print(f'\\nbroken sample {i}', flush=True)\n"
    "        comm.Barrier()\n"
    "        for e in (0, 1):\n"
    "            for b in st.epoch(e):\n"
    "                pass\n"
    "except Exception as exc:\n"
    "    print(f'\\nrank {comm.rank} raised {type(exc).__name__}: {exc}', flush=True)\n"
    "    raise\n"
    "print('finished', flush=True)\n"
)


@pytest.mark.mpi
def test_a_storage_read_failing_mid_epoch_on_one_rank_ends_the_job_on_every_rank(tmp_path):
    # The tiered store reads non-resident samples during the epoch. One non-resident sample is
    # broken after population, so exactly one rank's storage read fails mid-epoch: it stops and
    # waits in the epoch-end agreement, where the others meet it; every rank raises the error
    # naming that sample, even in a plain script (no `-m mpi4py`).
    path = scenarios.make_container(
        str(tmp_path / "c.zarr"), n=1201, seed=1, large=8000, small=8000, fmt="zarr", chunk_bytes=1 << 16
    )
    script = tmp_path / "read.py"
    script.write_text(_FAILING_STORAGE)
    res = run_mpi(3, ["python", str(script), path], timeout=90, check=False)
    out = res.stdout + res.stderr
    assert res.returncode != 0, out
    assert "finished" not in res.stdout, out
    i = int(next(x for x in res.stdout.splitlines() if x.startswith("broken sample")).split()[-1])
    lines = [x for x in res.stdout.splitlines() if " raised " in x]
    assert sorted(x.split()[1] for x in lines) == ["0", "1", "2"], out
    assert all("FormatError" in x and path in x and f"sample {i} (s{i})" in x for x in lines), out
    assert sum("(on rank " in x for x in lines) == 2, out  # one rank failed; the others were told


_DISAGREEING = (
    "import sys\n"
    "from mpi4py import MPI\n"
    "from dstore.store.data_store import DataStore\n"
    "comm, path = MPI.COMM_WORLD, sys.argv[1]\n"
    "r = comm.rank\n"
    "cases = {\n"
    "    'batch_size below the ranks on one rank': dict(batch_size=12 if r else 1),\n"
    "    'sample_range bad on one rank': dict(batch_size=12, sample_range=(0, 10**9) if r else None),\n"
    "    'prefetch differs': dict(batch_size=12, prefetch=r),\n"
    "}\n"
    "for name, kw in cases.items():\n"
    "    try:\n"
    "        with DataStore(comm, path, **kw) as st:\n"
    "            for b in st.epoch(0):\n"
    "                pass\n"
    "    except Exception as exc:\n"
    "        print(f'\\n{name} | rank {r} | {type(exc).__name__}: {exc}', flush=True)\n"
    "# node_views may differ: it only says how this rank reads its node peers' samples\n"
    "with DataStore(comm, path, batch_size=12, node_views=r == 0) as st:\n"
    "    n = sum(len(b) for b in st.epoch(0))\n"
    "    print(f'\\nnode_views differ | rank {r} | served {comm.allreduce(n)}', flush=True)\n"
    "    try:\n"
    "        for b in st.epoch(1 + r):\n"
    "            pass\n"
    "    except Exception as exc:\n"
    "        print(f'\\nepochs differ | rank {r} | {type(exc).__name__}: {exc}', flush=True)\n"
    "print(f'\\nrank {r} finished', flush=True)\n"
)


@pytest.mark.mpi
def test_ranks_that_disagree_fail_together_or_are_served_alike(container, tmp_path):
    # Issue 11 defect 3, in a plain script (no `-m mpi4py` to abort the job): an argument bad on
    # one rank only, or different arguments that change the plan, raise on every rank (they hung:
    # the others waited in populate()); node_views differing works (it deadlocked); ranks in
    # different epochs raise on every rank (they served wrong batches silently).
    script = tmp_path / "disagree.py"
    script.write_text(_DISAGREEING)
    res = run_mpi(2, ["python", str(script), container], timeout=90, check=False)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out
    lines = res.stdout.splitlines()
    for r in (0, 1):
        assert f"rank {r} finished" in lines, out

    def said(case: str, r: int) -> str:  # "" where the line is missing: each check below then fails
        return next((x.split(" | ", 2)[2] for x in lines if x.startswith(f"{case} | rank {r} |")), "")

    for r in (0, 1):
        assert "ConfigError" in said("batch_size below the ranks on one rank", r) and "batch_size" in said(
            "batch_size below the ranks on one rank", r
        ), out
        assert "sample_range" in said("sample_range bad on one rank", r), out
        assert "differ between ranks" in said("prefetch differs", r) and "prefetch" in said("prefetch differs", r), out
        assert said("node_views differ", r) == "served 158", out  # 157 samples and one pad
        assert "ConfigError" in said("epochs differ", r) and "different epochs" in said("epochs differ", r), out


_PROGRESS = (
    "import sys, time\n"
    "from mpi4py import MPI\n"
    "from dstore.store.data_store import DataStore\n"
    "comm, path, period = MPI.COMM_WORLD, sys.argv[1], sys.argv[2]\n"
    "r = comm.rank\n"
    "kw = {} if period == 'auto' else dict(progress_period=float(period))\n"
    "with DataStore(comm, path, batch_size=12, node_views=False, **kw) as st:\n"
    "    running = st._progress is not None\n"
    "    waits = []\n"
    "    for k, b in enumerate(st.epoch(0)):\n"
    "        if r == 0 and k == 0:\n"
    "            t = time.perf_counter()\n"
    "            while time.perf_counter() - t < 1.0:  # compute without MPI calls: rank 1 reads rank 0's window\n"
    "                sum(range(10000))\n"
    "    calls = st._progress.calls if running else 0\n"
    "    wait = st.stats.wait_seconds\n"
    "print(f'\\nrank {r} | running {running} | calls {calls} | wait {wait:.3f}', flush=True)\n"
)


@pytest.mark.mpi
@pytest.mark.parametrize("period,nodes,expect", [("auto", "1", True), ("auto", "", False), ("0", "1", False)])
def test_a_progress_thread_drives_gets_from_ranks_on_other_nodes(container, tmp_path, period, nodes, expect):
    # Issue 11 ("Also"): without shared memory a get completes only when its target calls into MPI,
    # so a rank computing for long without MPI calls stalled the others' gets (docs/reliability.md).
    # The store runs a progress thread while it holds windows where some rank is on another node
    # ($DSTORE_RANKS_PER_NODE=1 makes each rank a node here) or shared memory is forbidden; on one
    # node it runs none, and progress_period=0 turns it off. The thread's effect on the waits is
    # measured (tools/measure/progress.py), not asserted: timings are not tested.
    script = tmp_path / "progress.py"
    script.write_text(_PROGRESS)
    env = {"DSTORE_RANKS_PER_NODE": nodes} if nodes else {}
    res = run_mpi(2, ["python", str(script), container, period], timeout=90, env=env)
    lines = [x for x in res.stdout.splitlines() if x.startswith("rank ")]
    assert len(lines) == 2, res.stdout + res.stderr
    for line in lines:
        assert f"running {expect}" in line, line
        if expect:
            assert int(line.split("calls ")[1].split(" ")[0]) > 0, line  # it ran while rank 0 computed


def test_progress_period_is_checked_by_name(container):
    from mpi4py import MPI

    from dstore.errors import ConfigError
    from dstore.store.data_store import DataStore

    for bad in (-1, "fast", float("nan")):
        with pytest.raises(ConfigError, match="progress_period"):
            DataStore(MPI.COMM_SELF, container, batch_size=12, progress_period=bad)
