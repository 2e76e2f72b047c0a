"""`dstore bench --peers` (the store beside WebDataset and LitData): shuffle quality on known orders,
the tar shards hold the container's samples in the archive's order, and a tiny run under mpiexec -n 2
whose every loader delivers every sample once per epoch (the peers' rows only where installed)."""

import json
import tarfile

import numpy as np
import pytest
from store_scenarios import scenarios
from support.mpirun import run_mpi

from dstore.tools.bench import peer_data, peers
from dstore.tools.bench.shuffle_quality import global_batches, ideal_distinct, quality


def test_shuffle_quality_tells_a_class_sorted_stream_from_a_shuffled_one():
    labels = np.repeat(np.arange(10), 200)  # 2,000 samples, class-sorted
    batches = [labels[s : s + 64] for s in range(0, labels.size, 64)]
    q = quality(batches, 10)
    assert q["distinct"] < 2.1 and q["majority"] > 0.9 and q["correlation"] > 0.6
    rng = np.random.default_rng(0)
    mixed = rng.permutation(labels)
    q = quality([mixed[s : s + 64] for s in range(0, labels.size, 64)], 10)
    assert abs(q["distinct"] - ideal_distinct(10, 64)) < 0.1 and q["majority"] == 0.0
    assert abs(q["correlation"]) < 0.2


def test_global_batches_join_the_ranks_steps_and_stop_at_the_shortest():
    a = [np.array([1, 2]), np.array([3])]
    b = [np.array([4]), np.array([5]), np.array([6])]
    out = global_batches([a, b])
    assert [x.tolist() for x in out] == [[1, 2, 4], [3, 5]]


def test_a_missing_peer_is_named_with_how_to_install_it():
    why = peers.missing("no_such_peer_module_24")
    assert why is not None and "no_such_peer_module_24 is not installed" in why and "peers" in why
    assert peers.missing("numpy") is None


def _member_bytes(tar: tarfile.TarFile, member: tarfile.TarInfo) -> bytes:
    f = tar.extractfile(member)
    assert f is not None, member.name  # None: not a regular file
    return f.read()


def test_tar_shards_hold_the_samples_in_the_archive_order(tmp_path):
    from dstore.formats import open_container

    path = scenarios.make_container(str(tmp_path / "c.h5"), n=40)
    with open_container(path) as r:
        labels = np.asarray(r.labels)
        order = peer_data.archive_order(labels, "sorted", 0)
        assert np.all(np.diff(labels[order]) >= 0)
        shards = peer_data.write_tars(path, order, str(tmp_path / "wds"), per_shard=16)
        assert len(shards) == 3
        seen = []
        for s in shards:
            with tarfile.open(s) as tar:
                members = tar.getmembers()
                for m in members[::2]:
                    i = int(m.name.split(".")[0])
                    data = _member_bytes(tar, m)
                    cls = _member_bytes(tar, members[members.index(m) + 1])
                    assert data == r.sample(i)[0].tobytes() and int(cls) == labels[i]
                    seen.append(i)
        assert seen == order.tolist()
    shuffled = peer_data.archive_order(labels, "shuffled", 0)
    assert sorted(shuffled.tolist()) == list(range(40)) and shuffled.tolist() != list(range(40))


@pytest.mark.mpi
def test_a_tiny_peers_run_delivers_every_sample_of_every_epoch(tmp_path):
    out, data = tmp_path / "out", tmp_path / "data"
    res = run_mpi(
        2,
        [
            "dstore",
            "bench",
            "--peers",
            "local",
            "--count",
            "48",
            "--batch-size",
            "16",
            "--consume",
            "20000",
            "--sides",
            "32,48",
            "--mean-kb",
            "2",
            "--workers",
            "0",
            "--no-dali",
            "--out",
            str(out),
            "--data-dir",
            str(data),
        ],
        timeout=240,
    )
    got = json.loads((out / "peers.json").read_text())
    rows = {r["name"]: r for r in got["rungs"][0]["loaders"]}
    want = {"store (preload)", "store (stream)"}
    if peers.missing("webdataset") is None:
        want |= {
            "WebDataset, 0 workers, DataPipeline, 1 MiB buffer",
            "WebDataset, 0 workers, WebDataset class as shipped: 8 KiB reads",
        }
    else:
        assert "webdataset is not installed" in res.stdout
    assert want <= set(rows), sorted(rows)
    for name in want:  # 2 epochs of 48 samples, every rank together
        assert sum(rows[name]["samples"]) == 2 * 48, (name, rows[name]["samples"])
        assert rows[name]["au_at"]["20000"] > 0 and rows[name]["first_batch_s"] > 0
    q = {r["name"]: r for r in got["quality"]}
    assert q["store (preload), class-sorted archive"]["distinct"] > 1  # the store's order ignores the archive's
    assert "| store (stream) |" in (out / "peers.md").read_text()


def test_the_sorted_training_set_is_class_sorted_and_the_store_trains_on_it(tmp_path):
    from mpi4py import MPI

    from dstore.formats import open_container
    from dstore.store.data_store import DataStore
    from dstore.tools.bench import sorted_training

    path, shards, hx, hy = sorted_training.write_sets(str(tmp_path), seed=0)
    with open_container(path) as r:
        labels = np.asarray(r.labels)
        assert np.all(np.diff(labels) >= 0) and r.num_samples + hy.size == 1797
        assert len(shards) == -(-r.num_samples // 120)
    with DataStore(MPI.COMM_SELF, path, batch_size=sorted_training.BATCH, seed=0) as st:
        got = sorted_training.train(lambda e: ((b.samples, b.labels) for b in st.epoch(e)), 1, 0, hx, hy)
    assert got["accuracy"][0] > 0.8  # one shuffled epoch of digits: a linear model learns them
