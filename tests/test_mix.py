"""Mixing by proportion: the pure plan (dstore.order.mix) by property tests, and MixedStore end to end in
process and under mpiexec -n 1, 2, 3 (tests/store_scenarios/mix_scenario.py)."""

from __future__ import annotations

import json
import math
from collections import Counter
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dstore.errors import ConfigError
from dstore.order import mix

SCEN = Path(__file__).resolve().parent / "store_scenarios" / "mix_scenario.py"

sizes_st = st.lists(st.integers(1, 40), min_size=1, max_size=4)


def _reference_counts(e: int, w) -> list[int]:
    """Largest remainder, written out by hand: floors, then +1 by descending remainder, lower index first."""
    share = [Fraction(e * x, sum(w)) for x in w]
    counts = [math.floor(s) for s in share]
    rest = sorted(range(len(w)), key=lambda k: (-(share[k] - counts[k]), k))
    for k in rest[: e - sum(counts)]:
        counts[k] += 1
    return counts


@settings(max_examples=60, deadline=None)
@given(e=st.integers(1, 500), w=st.lists(st.integers(0, 9), min_size=1, max_size=5).filter(any))
def test_counts_are_the_largest_remainder_rounding(e, w):
    counts = mix.mix_counts(e, w)
    assert counts.sum() == e
    assert counts.tolist() == _reference_counts(e, w)
    assert all(abs(c - Fraction(e * x, sum(w))) < 1 for c, x in zip(counts.tolist(), w))


def _draw_mix(data, sources: int):
    """Weights (not all 0), an epoch size (None: the sources' total), a seed and an epoch."""
    w = data.draw(st.lists(st.integers(0, 5), min_size=sources, max_size=sources).filter(any))
    e_size = data.draw(st.one_of(st.none(), st.integers(1, 200)))
    return w, e_size, data.draw(st.integers(0, 9)), data.draw(st.integers(0, 5))


@settings(max_examples=40, deadline=None)
@given(sizes=sizes_st, data=st.data())
def test_an_epoch_holds_each_sources_count_whole_passes_and_a_subset(sizes, data):
    w, e_size, seed, epoch = _draw_mix(data, len(sizes))
    src, ids = mix.mix_plan(sizes, w, seed, epoch, e_size)
    total = sum(sizes) if e_size is None else e_size
    counts = _reference_counts(total, w)
    assert src.size == ids.size == total
    assert np.bincount(src, minlength=len(sizes)).tolist() == counts
    for k, n in enumerate(sizes):
        got = Counter(ids[src == k].tolist())
        q, r = divmod(counts[k], n)
        assert all(0 <= i < n for i in got)
        # every sample q times (whole passes), r of them once more (a subset without repeats)
        times = [got[i] for i in range(n)]
        assert set(times) <= {q, q + 1} and times.count(q + 1) == r
    again = mix.mix_plan(sizes, w, seed, epoch, e_size)
    assert np.array_equal(again[0], src) and np.array_equal(again[1], ids)


@settings(max_examples=40, deadline=None)
@given(sizes=sizes_st, data=st.data())
def test_the_mix_at_some_positions_is_the_whole_plan_there(sizes, data):
    w, e_size, seed, epoch = _draw_mix(data, len(sizes))
    src, ids = mix.mix_plan(sizes, w, seed, epoch, e_size)
    pos = np.asarray(data.draw(st.lists(st.integers(0, src.size - 1), max_size=40)), dtype=np.int64)
    for p in (np.arange(src.size), pos):
        got = mix.mix_at(sizes, w, seed, epoch, p, e_size)
        assert np.array_equal(got[0], src[p]) and np.array_equal(got[1], ids[p])


def test_a_subsampled_source_rotates_so_every_sample_is_seen():
    n, r = 25, 7  # 7 of 25 per epoch: rounds of 4 epochs (28 draws, 3 samples twice)
    for rnd in range(3):
        seen = Counter()
        for epoch in range(4 * rnd, 4 * rnd + 4):
            src, ids = mix.mix_plan([n, 50], [r, 50], 3, epoch, r + 50)
            part = ids[src == 0]
            assert part.size == r and len(set(part.tolist())) == r  # without replacement inside an epoch
            seen.update(part.tolist())
        assert sorted(seen) == list(range(n)) and sorted(seen.values()) == [1] * 22 + [2] * 3


def test_orders_differ_by_epoch_and_seed():
    a = mix.mix_plan([30, 20], [1, 1], 0, 0)
    assert not np.array_equal(a[1], mix.mix_plan([30, 20], [1, 1], 0, 1)[1])
    assert not np.array_equal(a[1], mix.mix_plan([30, 20], [1, 1], 1, 0)[1])


@pytest.mark.parametrize(
    "weights,msg",
    [
        ([1, -1], "source 1"),
        ([0, 0], "all be 0"),
        ([1, float("nan")], "source 1"),
        (["x", 1], "source 0: weight 'x' must be a number"),
        ([1], "1 weights for 2"),
    ],
)
def test_bad_weights_are_named(weights, msg):
    with pytest.raises(ConfigError, match=msg):
        mix.mix_plan([3, 4], weights, 0, 0)


@pytest.mark.parametrize("weight", [float("nan"), float("inf"), -float("inf"), -0.5, "nan"])
def test_a_bad_weight_is_refused_naming_the_container_and_the_weight(sources, weight):
    # before any store is built (nothing read): one line, the source's container and its weight
    from mpi4py import MPI

    from dstore.store.mixed import MixedStore

    with pytest.raises(ConfigError) as err:
        MixedStore(MPI.COMM_SELF, [(sources[0], 0.7), (sources[1], weight)], batch_size=4)
    msg = str(err.value)
    assert f"source 1 ({sources[1]}): weight {float(weight)!r} must be a finite number >= 0" == msg


def test_weights_all_zero_are_refused_naming_them(sources):
    from mpi4py import MPI

    from dstore.store.mixed import MixedStore

    with pytest.raises(ConfigError, match=r"the weights \[0.0, 0.0\] must not all be 0"):
        MixedStore(MPI.COMM_SELF, [(sources[0], 0), (sources[1], 0.0)], batch_size=4)


def test_huge_finite_weights_are_ratios_like_any_other():
    # their float sum overflows, their exact shares do not (mix_counts uses Fractions)
    assert mix.mix_counts(10, [1e308, 1e308]).tolist() == [5, 5]


def test_bad_epoch_size_and_sizes_are_named():
    with pytest.raises(ConfigError, match="epoch_size"):
        mix.mix_plan([3, 4], [1, 1], 0, 0, 0)
    with pytest.raises(ConfigError, match="at least one sample"):
        mix.mix_plan([3, 0], [1, 1], 0, 0)


# ---------------------------------------------------------------- MixedStore


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    from store_scenarios import mix_scenario

    return mix_scenario.make_sources(tmp_path_factory.mktemp("mix"))


def _load(path):
    return json.loads(Path(path).read_text())


def test_mixed_store_in_process_counts_bytes_and_resume(sources, tmp_path):
    from mpi4py import MPI
    from store_scenarios import mix_scenario

    full = mix_scenario.run(MPI.COMM_SELF, sources, "full", str(tmp_path / "full.json"))
    mix_scenario.check_counts(full, sources)
    mix_scenario.run(MPI.COMM_SELF, sources, "save", str(tmp_path / "a.json"))
    rest = mix_scenario.run(MPI.COMM_SELF, sources, "load", str(tmp_path / "a.json"))
    assert rest["entries"] and full["entries"] == _load(tmp_path / "a.json")["entries"] + rest["entries"]


@pytest.mark.mpi
def test_mixed_store_same_order_on_1_2_3_ranks_and_resume_on_another_count(sources, tmp_path):
    from support.mpirun import run_mpi

    runs = {}
    for n in (1, 2, 3):
        out = tmp_path / f"full{n}.json"
        run_mpi(n, ["python", "-m", "mpi4py", str(SCEN), *sources, "full", str(out)], timeout=120)
        runs[n] = _load(out)
    assert runs[1]["entries"] == runs[2]["entries"] == runs[3]["entries"]
    assert runs[3]["stats"][0]["sources"][1]["samples"] > 0  # per-source stats reported on every rank
    # saved mid-epoch on 2 ranks, resumed on 3: the rest of the same order, nothing lost or repeated
    saved = tmp_path / "saved.json"
    run_mpi(2, ["python", "-m", "mpi4py", str(SCEN), *sources, "save", str(saved)], timeout=120)
    run_mpi(3, ["python", "-m", "mpi4py", str(SCEN), *sources, "load", str(saved)], timeout=120)
    rest = _load(str(saved) + ".rest")
    assert runs[1]["entries"] == _load(saved)["entries"] + rest["entries"]


def test_a_loader_decodes_each_entry_by_its_sources_encoding(sources):
    # raw arrays and JPEG files in one batch: each decoded by its own container's encoding
    import torch
    from mpi4py import MPI

    from dstore.codec.decode import decode_sample
    from dstore.formats import open_container
    from dstore.loader.store_loader import StoreLoader
    from dstore.store.mixed import MixedStore

    readers = [open_container(p) for p in sources]
    with (
        MixedStore(MPI.COMM_SELF, [(sources[0], 0.7), (sources[1], 0.3)], batch_size=16, seed=1) as store,
        StoreLoader(store, decode_threads=2) as loader,
    ):
        seen = set()
        sched, srcs, ids = store.schedule(0)  # the mix's entries of this rank, step by step
        for s, (images, labels) in enumerate(loader.epoch(0)):
            assert images.dtype == torch.uint8 and tuple(images.shape[1:]) == (3, 8, 8)
            assert loader.last_ids.tolist() == ids[sched.step(s)].tolist()
            for img, src, sid in zip(images, srcs[sched.step(s)].tolist(), ids[sched.step(s)].tolist()):
                r = readers[src]
                want = decode_sample(r.sample(sid)[0], r.info)
                assert np.array_equal(img.permute(1, 2, 0).numpy(), want)
                seen.add(src)
            assert labels.tolist() == [
                int(readers[k].labels[i]) for k, i in zip(srcs[sched.step(s)], ids[sched.step(s)])
            ]
        assert seen == {0, 1}
    for r in readers:
        r.close()


def test_refusals_name_the_argument(sources):
    from mpi4py import MPI

    from dstore import DataStore, MixedStore

    mixed = [(sources[0], 0.7), (sources[1], 0.3)]
    with pytest.raises(ConfigError, match="MixedStore"):
        DataStore(MPI.COMM_SELF, mixed, batch_size=4)
    with pytest.raises(ConfigError, match="shuffle='local'"):
        MixedStore(MPI.COMM_SELF, mixed, batch_size=4, shuffle="local")
    with pytest.raises(ConfigError, match="per source"):
        MixedStore(MPI.COMM_SELF, mixed, batch_size=4, sample_range=(0, 5))
    with pytest.raises(ConfigError, match="source 1"):
        MixedStore(MPI.COMM_SELF, [(sources[0], 1), (sources[1], -1)], batch_size=4)
    with (
        MixedStore(MPI.COMM_SELF, mixed, batch_size=4) as a,
        MixedStore(MPI.COMM_SELF, [(sources[0], 0.5), (sources[1], 0.5)], batch_size=4) as b,
    ):
        with pytest.raises(ConfigError, match="weights"):
            b.load_state_dict(a.state_dict())
        with (
            DataStore(MPI.COMM_SELF, sources[0], batch_size=4) as one,
            pytest.raises(ConfigError, match="not a MixedStore state"),
        ):
            b.load_state_dict(one.state_dict())


def test_a_mixed_stores_schedule_is_its_part_of_the_whole_plan(tmp_path):
    from mpi4py import MPI
    from support.formats import write_samples

    from dstore.order import plan
    from dstore.store.mixed import MixedStore

    paths = [
        write_samples(tmp_path / f"s{k}.h5", "hdf5", [(bytes([k, i % 256]), i % 3, f"s{i}", i) for i in range(n)])
        for k, n in enumerate((37, 11))
    ]
    with MixedStore(MPI.COMM_SELF, [(paths[0], 0.7), (paths[1], 0.3)], batch_size=8, seed=5, epoch_size=60) as store:
        for nranks in (1, 3, 4, 5):  # 5: the short last step pads
            for r in range(nranks):
                store.rank, store.size = r, nranks  # the schedule is a pure function of these (no communication)
                for e in (0, 1):
                    want_src, want_ids = mix.mix_plan(store.sizes, store.weights, 5, e, 60)
                    ref = plan.global_schedule(np.arange(60, dtype=np.int64), 8, nranks, r, False)
                    sched, src, ids = store.schedule(e)
                    assert np.array_equal(sched.ids, ref.ids) and np.array_equal(sched.ptr, ref.ptr)
                    assert np.array_equal(sched.pad, ref.pad)
                    assert np.array_equal(src, want_src[ref.ids]) and np.array_equal(ids, want_ids[ref.ids])
        store.rank, store.size = 0, 1


# ---------------------------------------------------------------- a source over the memory budget

TIER_WEIGHTS = (0.9, 0.1)
"""The large source (400 samples) gets 44 entries an epoch: most of the mix's steps hold none of it
(an empty step of its store's schedule, which its storage tier once failed on with an IndexError)."""


@pytest.fixture(scope="module")
def raw_sources(tmp_path_factory):
    """[40 raw samples (7.7 kB), 400 raw samples (77 kB)], 192 bytes each."""
    from support.formats import raw_container

    tmp = tmp_path_factory.mktemp("mixraw")
    return [
        raw_container(tmp / "a.h5", n=40, shape=(8, 8, 3), seed=1),
        raw_container(tmp / "c.h5", n=400, shape=(8, 8, 3), seed=2),
    ]


@settings(max_examples=100)
@given(st.lists(st.integers(0, 5), min_size=1, max_size=12), st.data())
def test_step_sums_count_an_empty_step_as_zero(counts, data):
    # a source's steps in a mix: any of them may hold none of its entries, the last ones too
    from dstore.store.storage import step_sums

    ptr = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    values = np.asarray(
        data.draw(st.lists(st.integers(0, 10**6), min_size=int(ptr[-1]), max_size=int(ptr[-1]))), dtype=np.int64
    )
    want = [int(values[ptr[s] : ptr[s + 1]].sum()) for s in range(len(counts))]
    assert step_sums(values, ptr).tolist() == want


def _entries_are_the_plan(result: dict, sources) -> None:
    """Each epoch's entries are mix_plan's order exactly: every planned (source, sample) once, none other."""
    from dstore.formats import open_container

    sizes = [open_container(p).num_samples for p in sources]
    for e in (0, 1):
        src, ids = mix.mix_plan(sizes, TIER_WEIGHTS, 5, e)
        got = [(s, i) for ep, _, s, i, _ in result["entries"] if ep == e]
        assert got == list(zip(src.tolist(), ids.tolist()))


def test_a_source_over_the_budget_is_served_from_storage_in_process(raw_sources, tmp_path, monkeypatch):
    # 40 kB on one rank: the 77 kB source keeps about 40% resident, the rest is read from storage;
    # every byte is checked against the container (mix_scenario), every planned entry delivered once.
    from mpi4py import MPI
    from store_scenarios import mix_scenario

    monkeypatch.setenv("DSTORE_MEMORY_BUDGET", "40kB")
    full = mix_scenario.run(MPI.COMM_SELF, raw_sources, "full", str(tmp_path / "full.json"), TIER_WEIGHTS)
    mix_scenario.check_counts(full, raw_sources, TIER_WEIGHTS)
    _entries_are_the_plan(full, raw_sources)
    stats = full["stats"][0]["sources"]
    assert stats[1]["samples_storage"] > 0 and stats[0]["samples_storage"] == 0


@pytest.mark.mpi
def test_a_source_over_the_budget_is_served_from_storage_on_2_ranks(raw_sources, tmp_path):
    from support.mpirun import run_mpi

    out = tmp_path / "tiered.json"
    run_mpi(
        2,
        ["python", "-m", "mpi4py", str(SCEN), *raw_sources, "full", str(out)],
        timeout=120,
        env={"DSTORE_MEMORY_BUDGET": "20kB", "MIX_WEIGHTS": ",".join(map(str, TIER_WEIGHTS))},
    )
    got = _load(out)
    _entries_are_the_plan(got, raw_sources)
    assert all(rank["sources"][1]["samples_storage"] > 0 for rank in got["stats"])


@pytest.mark.parametrize("enter", [True, False])
def test_a_streamed_mix_serves_the_preloaded_mixs_bytes(sources, enter):
    # each source's stream reads in the mix's steps, never its own schedule's first step: populated
    # by the mix (with) or by the first epoch (schedule given), the batches are the preloaded mix's
    from mpi4py import MPI

    from dstore.store.mixed import MixedStore

    def epochs(population):
        store = MixedStore(
            MPI.COMM_SELF, [(sources[0], 0.6), (sources[1], 0.4)], batch_size=8, seed=2, population=population
        )
        if enter:
            store.__enter__()
        try:
            return [
                (b.sources.tolist(), b.ids.tolist(), [bytes(x) for x in b.samples])
                for e in (0, 1)
                for b in store.epoch(e)
            ]
        finally:
            store.close()

    assert epochs("stream") == epochs("preload")
