"""The streaming preload (population="stream", dstore.store.stream): the piece plan (pure), and epoch 0
served while the windows fill under real mpiexec: the same deliveries as a preload (order,
exactly-once, bytes), a read of its own checked against the container's checksums."""

from pathlib import Path

import numpy as np
import pytest
from store_scenarios import scenarios
from support.formats import plain_values
from support.mpirun import run_mpi

from dstore.order import plan, shuffle
from dstore.order.policy import POLICIES
from dstore.store import preload, stream

SCEN_DIR = Path(__file__).resolve().parent / "store_scenarios"


@pytest.mark.parametrize("seed", range(6))
def test_the_piece_plan_reads_every_piece_once_earliest_first_and_says_what_each_sample_waits_for(seed):
    rng = np.random.default_rng(seed)
    n, nranks, piece = int(rng.integers(1, 300)), int(rng.integers(1, 5)), int(rng.integers(1, 5000))
    sizes = rng.integers(0, 3000, n) * (rng.random(n) > 0.1)  # some empty
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(sizes, out=offsets[1:])
    bounds = np.sort(np.concatenate([[0, n], rng.integers(0, n + 1, nranks - 1)]))
    use = rng.integers(0, 20, n)
    orders, need = stream.plan_pieces(offsets, bounds, piece, use)
    for r in range(nranks):
        lo, hi = int(bounds[r]), int(bounds[r + 1])
        rel = offsets[lo : hi + 1] - offsets[lo]
        cuts = preload.sample_cuts(offsets, lo, hi, piece)  # the preload's pieces: whole samples
        count = cuts.size - 1
        assert sorted(orders[r].tolist()) == list(range(count))  # every piece once
        pos = {int(j): k for k, j in enumerate(orders[r])}
        earliest = []
        for j in orders[r].tolist():  # a piece's first use: the least of the (non-empty) samples it holds
            held = [i for i in range(lo, hi) if cuts[j] <= rel[i - lo] < rel[i + 1 - lo] <= cuts[j + 1]]
            earliest.append(min(use[held]) if held else np.iinfo(np.int64).max)
        assert earliest == sorted(earliest)
        for i in range(lo, hi):
            a, b = int(rel[i - lo]), int(rel[i + 1 - lo])
            if a == b:
                assert need[i] == 0
                continue
            j = int(np.searchsorted(cuts, a, side="right")) - 1
            assert cuts[j] <= a < b <= cuts[j + 1], (i, a, b)  # a sample lies in one piece
            assert need[i] == pos[j] + 1, (i, a, b)


def test_first_use_is_the_step_of_the_global_order():
    order = np.random.default_rng(0).permutation(50)
    use = POLICIES["global"].first_use(order, np.array([0, 20, 50]), 8, 7)
    assert np.array_equal(use[order], np.arange(50) // 8)
    local = POLICIES["local"].first_use(order, np.array([0, 20, 50]), 8, 7)
    assert local.min() == 0 and local.max() == 6


def _plan_pieces_before(offsets, bounds, piece, use):
    """dstore.store.stream.plan_pieces as it was before each rank planned its own block (the reference)."""
    need = np.zeros(offsets.size - 1, dtype=np.int64)
    orders = []
    for r in range(bounds.size - 1):
        lo, hi = int(bounds[r]), int(bounds[r + 1])
        rel = offsets[lo : hi + 1] - offsets[lo]
        cuts = preload.sample_cuts(offsets, lo, hi, max(1, int(piece)))
        count = cuts.size - 1
        full = np.nonzero(np.diff(rel) > 0)[0]
        which = np.searchsorted(cuts, rel[full], side="right") - 1
        earliest = np.full(count, np.iinfo(np.int64).max, dtype=np.int64)
        np.minimum.at(earliest, which, use[lo + full])
        order = np.argsort(earliest, kind="stable")
        pos = np.empty(count, dtype=np.int64)
        pos[order] = np.arange(count, dtype=np.int64)
        need[lo + full] = pos[which] + 1
        orders.append(order)
    return orders, need


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("policy", ["global", "local", "partial"])
def test_each_rank_plans_its_own_block_and_looks_up_the_rest_as_the_whole_plan_did(seed, policy):
    rng = np.random.default_rng(seed)
    n, nranks, piece = int(rng.integers(1, 400)), int(rng.integers(1, 5)), int(rng.integers(1, 6000))
    bs = int(rng.integers(1, 40))
    sizes = rng.integers(0, 3000, n) * (rng.random(n) > 0.1)  # some empty
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(sizes, out=offsets[1:])
    bounds = plan.block_bounds(offsets, nranks)
    steps = plan.steps_per_epoch(n, bs, False)
    epoch = int(rng.integers(0, 3))
    order = POLICIES[policy].order(n, bounds, 7, epoch, 0.3)
    use = POLICIES[policy].first_use(order, bounds, bs, steps)  # the whole epoch's, as the stream built it
    orders, need = _plan_pieces_before(offsets, bounds, piece, use)
    assert np.array_equal(stream.plan_pieces(offsets, bounds, piece, use)[1], need)
    blocks = []
    for r in range(nranks):
        lo, hi = int(bounds[r]), int(bounds[r + 1])
        mine = POLICIES[policy].block_first_use(n, bounds, r, 7, epoch, bs, steps, 0.3)
        assert np.array_equal(mine, use[lo:hi])
        own, cuts, place = stream.plan_block(offsets, lo, hi, piece, mine)
        assert np.array_equal(own, orders[r])  # the same read order of the rank's pieces
        blocks.append((cuts, place))
    waits = stream.PieceWaits(offsets, bounds, blocks)
    ids = np.arange(n)
    assert np.array_equal(waits[ids], need) and np.array_equal(waits[ids[::-2]], need[::-2])


@pytest.fixture(scope="module")
def container(tmp_path_factory):
    return scenarios.make_container(str(tmp_path_factory.mktemp("stream") / "uneven.h5"), n=157)


@pytest.mark.mpi
@pytest.mark.parametrize("nprocs,views", [(2, "1"), (3, "0")])
def test_epoch_0_served_while_streaming_is_the_preloads_under_mpiexec(container, nprocs, views):
    # views "0": every sample of another rank comes with an RMA get, as from another node.
    res = run_mpi(
        nprocs,
        ["python", "-m", "mpi4py", str(SCEN_DIR / "stream_scenarios.py"), container],
        timeout=150,
        env={"DSTORE_NODE_VIEWS": views},
    )
    for name in ("stream_order", "stream_abandoned"):
        assert f"OK {name} on {nprocs} ranks" in res.stdout, res.stdout + res.stderr


_CORRUPT = (
    "import sys\n"
    "from mpi4py import MPI\n"
    "from store_scenarios import stream_scenarios\n"
    "from dstore.store.data_store import DataStore\n"
    "stream_scenarios.slow_stream(pause=0.05)\n"
    "try:\n"
    "    with DataStore(MPI.COMM_WORLD, sys.argv[1], batch_size=12, seed=1, population='stream') as st:\n"
    "        for b in st.epoch(0):\n"
    "            pass\n"
    "except Exception as exc:\n"
    "    print(f'\\nrank {MPI.COMM_WORLD.rank} raised {type(exc).__name__}: {exc}', flush=True)\n"
    "    raise\n"
    "print('finished', flush=True)\n"
)


@pytest.mark.mpi
def test_a_sample_read_while_streaming_is_checked_against_its_checksum(tmp_path):
    # A byte of the first sample of epoch 0 changed in the file (HDF5, unfiltered): the rank that
    # delivers it reads it itself (the stream is slowed, so it is not in its owner's window yet);
    # the checksum catches it and every rank raises, naming the sample.
    import h5py

    path = scenarios.make_container(str(tmp_path / "c.h5"), n=157)
    sizes = np.diff(scenarios.open_container(path).offsets)
    first = next(int(i) for i in shuffle.global_order(157, 1, 0) if sizes[i] > 0)
    with h5py.File(path, "r") as f:
        at = f["data"].id.get_offset() + int(plain_values(f, "offsets", first))
    with open(path, "r+b") as fh:
        fh.seek(at)
        byte = fh.read(1)
        fh.seek(at)
        fh.write(bytes([byte[0] ^ 0xFF]))
    script = tmp_path / "read.py"
    script.write_text(_CORRUPT)
    res = run_mpi(2, ["python", str(script), path], timeout=60, check=False)
    out = res.stdout + res.stderr
    assert res.returncode != 0 and "finished" not in res.stdout, out
    for r in (0, 1):
        line = next((x for x in res.stdout.splitlines() if x.startswith(f"rank {r} raised")), None)
        assert line is not None, out
        assert "checksum" in line and f"{first} (s{first})" in line and path in line, line
