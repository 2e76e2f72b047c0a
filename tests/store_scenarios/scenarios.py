"""DataStore scenarios that run unchanged on any communicator: COMM_SELF inside pytest, or
COMM_WORLD under `mpiexec -n N python -m mpi4py scenarios.py CONTAINER NAME...`.

Every check is collective: each rank gathers what it delivered (ids, CRC32 of the bytes, pads) to
rank 0, which compares against the container and the pure reference order and raises on any
difference; `python -m mpi4py` then ends the whole job, so a failure never hangs.
"""

from __future__ import annotations

import os
import pickle
import sys
import zlib
from typing import Any

import numpy as np

from dstore.errors import ConfigError, MemoryBudgetError
from dstore.formats import create_writer, open_container
from dstore.order import shuffle
from dstore.runtime import rc
from dstore.store.data_store import DataStore

BATCH = 12  # global batch size used throughout; N below is not a multiple of it nor of 1..4 ranks


def make_container(path, n=157, seed=0, encoding="image", fmt="hdf5", large=20000, small=2000, **options):
    """A container with varied sample sizes (empty ones included, every fifth up to `large` bytes,
    the others up to `small`); returns its path. `options` go to the writer (e.g. chunk_bytes)."""
    rng = np.random.default_rng(seed)
    with create_writer(path, fmt, encoding=encoding, class_names=[f"c{i}" for i in range(5)], **options) as w:
        for i in range(n):
            size = 0 if i % 11 == 3 else int(rng.integers(1, small if i % 5 else large))
            w.append(rng.integers(0, 256, size, dtype=np.uint8).tobytes(), int(rng.integers(0, 5)), f"s{i}", i)
    return path


def _crc(a) -> int:
    return zlib.crc32(memoryview(a).cast("B")) & 0xFFFFFFFF


def run_epoch(store, epoch, steps=None):
    """Consumes `steps` batches (all if None); returns (ids, crcs, pads, labels, step numbers)."""
    ids, crcs, pads, labels, stepno = [], [], [], [], []
    for k, b in enumerate(store.epoch(epoch)):
        ids.append(b.ids)
        crcs.append(np.array([_crc(x) for x in b.samples], dtype=np.int64))
        pads.append(b.pad)
        labels.append(b.labels)
        stepno.append(np.full(b.ids.size, b.step))
        assert len(b.samples) == b.ids.size == b.labels.size > 0
        if steps is not None and k + 1 >= steps:
            break  # what a trainer does after saving a checkpoint at this step

    def cat(x, t):
        return np.concatenate(x) if x else np.zeros(0, t)

    return (cat(ids, np.int64), cat(crcs, np.int64), cat(pads, bool), cat(labels, np.int64), cat(stepno, np.int64))


def check_delivery(
    comm, reader, got, *, epoch, policy, seed, drop_last, start=0, stop=None, first_step=0, steps_per_epoch=None
):
    """Collective: the ranks' deliveries are every (kept) sample once, byte-identical, in the
    reference global order for the global policy. Raises AssertionError on rank 0, then all ranks."""
    rows = comm.gather(got, root=0)
    err = None
    if comm.rank == 0:
        try:
            stop = reader.num_samples if stop is None else stop
            n = stop - start
            ids = np.concatenate([r[0] for r in rows])
            crcs = np.concatenate([r[1] for r in rows])
            pads = np.concatenate([r[2] for r in rows])
            labels = np.concatenate([r[3] for r in rows])
            steps = np.concatenate([r[4] for r in rows])
            if not np.array_equal(crcs, reader.checksums[ids].astype(np.int64)):
                bad = ids[crcs != reader.checksums[ids]]
                raise AssertionError(f"bytes differ from the container for samples {bad[:10]}")
            if not np.array_equal(labels, reader.labels[ids]):
                raise AssertionError("labels differ from the container")
            real = ids[~pads]
            if policy == "global":
                order = shuffle.global_order(n, seed, epoch) + start
                kept = (n // BATCH) * BATCH if drop_last else n
                want = order[first_step * BATCH : kept]
                # Rebuild the global sequence: step by step, ranks in rank order.
                seq = (
                    np.concatenate(
                        [np.concatenate([r[0][(r[4] == s) & ~r[2]] for r in rows]) for s in np.unique(steps)]
                    )
                    if ids.size
                    else ids
                )
                if not np.array_equal(seq, want):
                    raise AssertionError(
                        f"epoch {epoch}: global sequence differs from the reference "
                        f"order (got {seq[:8]}..., want {want[:8]}...)"
                    )
            else:
                if first_step == 0 and not np.array_equal(np.sort(real), np.arange(start, stop)):
                    raise AssertionError(f"{policy}: not every sample exactly once")
            if steps_per_epoch is not None:
                for r in rows:
                    if np.unique(r[4]).size != steps_per_epoch - first_step:
                        raise AssertionError("ranks took different numbers of steps")
        except AssertionError as exc:
            err = str(exc)
    err = comm.bcast(err, root=0)
    if err:
        raise AssertionError(err)


def check_stats(store, got, reader):
    """Collective: gather_stats() agrees with what was delivered."""
    rows = store.gather_stats()
    if len(rows) != store.size or [r["rank"] for r in rows] != list(range(store.size)):
        raise AssertionError(f"gather_stats rows: {rows}")
    mine = rows[store.rank]
    nbytes = int(np.diff(reader.offsets)[got[0]].sum())
    if (
        (mine["samples"], mine["pads"], mine["steps"]) != (got[0].size, int(got[2].sum()), store.steps_per_epoch)
        or mine["bytes_local"] + mine["bytes_node"] + mine["bytes_remote"] + mine["bytes_storage"] != nbytes
        or mine["samples_local"] + mine["samples_node"] + mine["samples_remote"] + mine["samples_storage"]
        != got[0].size
    ):
        raise AssertionError(f"stats disagree with the deliveries: {mine}")
    if store.size == 1 and (mine["samples_remote"] or mine["gets"] or mine["samples_node"]):
        raise AssertionError("one rank fetched remote samples")
    if not store.node_views and mine["samples_node"]:
        raise AssertionError(f"node_views=False served {mine['samples_node']} samples from a peer's window")


def scenario_exactly_once(comm, path):
    """All policies x drop_last x 2 epochs x prefetch 0/2: every sample once, bytes identical."""
    reader = open_container(path)
    for policy in ("global", "local", "partial"):
        for drop_last in (False, True):
            for prefetch in (0, 2):
                with DataStore(
                    comm,
                    reader,
                    batch_size=BATCH,
                    seed=7,
                    shuffle=policy,
                    drop_last=drop_last,
                    prefetch=prefetch,
                    partial_fraction=0.5,
                ) as st:
                    for epoch in (0, 1):
                        got = run_epoch(st, epoch)
                        check_delivery(
                            comm,
                            reader,
                            got,
                            epoch=epoch,
                            policy=policy,
                            seed=7,
                            drop_last=drop_last,
                            steps_per_epoch=st.steps_per_epoch,
                        )
                        check_stats(st, got, reader)
                    assert st.stats is not None
                    if policy == "local" and st.stats.samples_remote != 0:
                        raise AssertionError("local policy moved samples between ranks")
    reader.close()


def scenario_dynamic(comm, path):
    """Dynamic population delivers what preload does; epoch 0 is served without remote gets."""
    reader = open_container(path)
    for policy, drop_last in (("global", False), ("global", True), ("local", False), ("partial", True)):
        with (
            DataStore(
                comm, path, batch_size=BATCH, seed=3, shuffle=policy, population="dynamic", drop_last=drop_last
            ) as dyn,
            DataStore(comm, reader, batch_size=BATCH, seed=3, shuffle=policy, drop_last=drop_last) as pre,
        ):
            for epoch in (0, 1, 2):
                a, b = run_epoch(dyn, epoch), run_epoch(pre, epoch)
                for x, y in zip(a, b):
                    if not np.array_equal(x, y):
                        raise AssertionError(f"dynamic != preload ({policy}, epoch {epoch})")
                assert dyn.stats is not None
                if epoch == 0 and policy in ("global", "local") and dyn.stats.samples_remote:
                    raise AssertionError("dynamic epoch 0 fetched remote samples")
                check_delivery(
                    comm,
                    reader,
                    a,
                    epoch=epoch,
                    policy=policy,
                    seed=3,
                    drop_last=drop_last,
                    steps_per_epoch=dyn.steps_per_epoch,
                )
            assert dyn.stats is not None
            if dyn.stats.population_bytes != int(dyn.layout.nbytes[comm.rank]):
                raise AssertionError(
                    f"dynamic population read {dyn.stats.population_bytes} bytes, owns {dyn.layout.nbytes[comm.rank]}"
                )
    reader.close()


def checkpoint_bytes(sd: dict) -> bytes:
    """`sd` as a checkpoint holds it: torch.save where torch is already imported (in pytest), else
    pickle, after checking it is what torch.load(weights_only=True) takes back (its promise: plain
    ints, strs and floats). Importing torch costs a few CPU seconds in each of N ranks, and the
    bytes torch writes for such a dict do not depend on the number of ranks."""
    bad = {k: type(v).__name__ for k, v in sd.items() if type(v) not in (int, str, float)}
    if bad:
        raise AssertionError(f"state_dict holds values a weights_only load refuses: {bad}")
    if "torch" in sys.modules:
        import io

        import torch

        buf = io.BytesIO()
        torch.save(sd, buf)
        return b"T" + buf.getvalue()
    return b"P" + pickle.dumps(sd)


def checkpoint_state(blob: bytes) -> dict:
    """The state dict `checkpoint_bytes` wrote (torch.load(weights_only=True) for torch's bytes)."""
    if blob[:1] == b"T":
        import io

        import torch

        return torch.load(io.BytesIO(blob[1:]), weights_only=True)
    return pickle.loads(blob[1:])


def scenario_resume(comm, path):
    """A mid-epoch state resumes on another number of ranks with the same global order: nothing
    lost, nothing repeated. Saved on all ranks and resumed on a sub-communicator of one rank fewer
    (and the reverse), through a checkpoint's bytes, preload and dynamic."""
    reader = open_container(path)
    sub_size = max(1, comm.size - 1)
    sub = comm.Split(0 if comm.rank < sub_size else 1, comm.rank)
    empty = (
        np.zeros(0, np.int64),
        np.zeros(0, np.int64),
        np.zeros(0, bool),
        np.zeros(0, np.int64),
        np.zeros(0, np.int64),
    )
    try:
        for drop_last, population, shrink in (
            (False, "preload", True),
            (True, "dynamic", True),
            (False, "dynamic", False),
        ):
            save_comm, load_comm = (comm, sub) if shrink else (sub, comm)
            first = empty
            blob = None
            if save_comm is comm or comm.rank < sub_size:
                with DataStore(
                    save_comm, reader, batch_size=BATCH, seed=11, drop_last=drop_last, population=population
                ) as st:
                    run_epoch(st, 0)
                    first = run_epoch(st, 1, steps=5)
                    sd = st.state_dict()
                    if (sd["epoch"], sd["step"]) != (1, 5):
                        raise AssertionError(f"state after 5 steps of epoch 1 is {sd}")
                    blob = checkpoint_bytes(sd)
            blob = comm.bcast(blob, root=0)
            rest = empty
            if load_comm is comm or comm.rank < sub_size:
                with DataStore(
                    load_comm, reader, batch_size=BATCH, seed=0, drop_last=drop_last, population=population
                ) as st2:
                    st2.load_state_dict(checkpoint_state(blob))
                    rest = run_epoch(st2, 1)
                    if st2.seed != 11 or st2.state_dict()["epoch"] != 2:
                        raise AssertionError("seed/epoch not restored")
            both = tuple(np.concatenate([x, y]) for x, y in zip(first, rest))
            check_delivery(comm, reader, both, epoch=1, policy="global", seed=11, drop_last=drop_last)
    finally:
        sub.Free()
    reader.close()


def scenario_budget(comm, path):
    """Over budget: every rank raises the same clear MemoryBudgetError (no hang), by argument and
    by environment variable; a replicated copy that does not fit fails the same way."""
    reader = open_container(path)
    total = int(reader.offsets[-1])
    cases = [dict(memory_budget=total // (4 * comm.size), overflow="error"), dict(memory_budget="1KB", replicate=True)]
    os.environ["DSTORE_MEMORY_BUDGET"] = "2KiB"
    cases.append(dict(overflow="error"))
    try:
        for kw in cases:
            try:
                with DataStore(comm, reader, batch_size=BATCH, **kw):
                    pass
            except MemoryBudgetError as exc:
                msg = str(exc)
                if "needs" not in msg or "budget" not in msg:
                    raise AssertionError(f"unclear message: {msg}") from None
                if not kw.get("replicate") and "ranks" not in msg:
                    raise AssertionError(f"message does not say how many ranks fit: {msg}") from None
                if kw == dict(overflow="error") and "DSTORE_MEMORY_BUDGET=2KiB" not in msg:
                    raise AssertionError(f"message does not name the env var: {msg}") from None
                msgs = comm.allgather(msg)
                if len(set(msgs)) != 1:
                    raise AssertionError(f"ranks disagree: {msgs}") from None
            else:
                raise AssertionError(f"no MemoryBudgetError for {kw}")
    finally:
        del os.environ["DSTORE_MEMORY_BUDGET"]
    # Served overflow: a budget below the buffers alone is still refused, saying so.
    try:
        with DataStore(comm, reader, batch_size=BATCH, memory_budget="2KiB"):
            pass
    except MemoryBudgetError as exc:
        if "even with nothing resident" not in str(exc) or "buffers" not in str(exc):
            raise AssertionError(f"unclear message: {exc}") from None
    else:
        raise AssertionError("no MemoryBudgetError for a budget below the buffers")
    # A generous budget works.
    with DataStore(comm, reader, batch_size=BATCH, memory_budget=10 * total + 10**6) as st:
        run_epoch(st, 0)
    reader.close()


def scenario_replicate_and_range(comm, path):
    """replicate=True and sample_range serve exactly once and byte-identical."""
    reader = open_container(path)
    with DataStore(comm, reader, batch_size=BATCH, seed=5, replicate=True) as st:
        got = run_epoch(st, 0)
        check_delivery(comm, reader, got, epoch=0, policy="global", seed=5, drop_last=False)
        assert st.stats is not None
        if st.stats.samples_remote or st.stats.gets:
            raise AssertionError("replicated store issued gets")
    for policy in ("global", "local"):
        with DataStore(comm, reader, batch_size=BATCH, seed=5, sample_range=(20, 131), shuffle=policy) as st:
            got = run_epoch(st, 2)
            if st.num_samples != 111:
                raise AssertionError("num_samples of a sample_range")
            check_delivery(comm, reader, got, epoch=2, policy=policy, seed=5, drop_last=False, start=20, stop=131)
    reader.close()


def scenario_preload_pieces(comm, path):
    """Preload in pieces (dstore.store.prefault) leaves each rank's window byte-identical to its block,
    with pieces smaller than a sample, than a block, and larger than every block, and with empty
    blocks (a range of empty samples); replicate's shared copy too."""
    from dstore.store import prefault

    reader = open_container(path)
    empty = [i for i in range(reader.num_samples) if reader.offsets[i + 1] == reader.offsets[i]]
    saved = prefault.PIECE_BYTES
    try:
        for piece in (1000, 4096, 40_000, 1 << 30):
            prefault.PIECE_BYTES = piece
            kws: tuple[dict[str, Any], ...] = (
                dict(),
                dict(sample_range=(20, 131)),
                dict(sample_range=(empty[0], empty[0] + 1)),
                dict(replicate=True),
            )
            for kw in kws:
                with DataStore(comm, reader, batch_size=max(comm.size, 1), seed=3, **kw) as st:
                    assert st.windows is not None
                    if st.replicate:
                        have, lo, hi = st.windows.view, 0, st.num_samples
                    else:
                        have = st.windows.arena.local
                        lo, hi = int(st.bounds[st.rank]), int(st.bounds[st.rank + 1])
                    assert have is not None  # replicated: the node's copy
                    want = reader.read_range(st.start + lo, st.start + hi)
                    if not np.array_equal(have, want):
                        raise AssertionError(f"rank {comm.rank}: window differs from its block ({piece=}, {kw})")
                    got = run_epoch(st, 0)
                    start, stop = kw.get("sample_range", (0, None))
                    check_delivery(
                        comm, reader, got, epoch=0, policy="global", seed=3, drop_last=False, start=start, stop=stop
                    )
    finally:
        prefault.PIECE_BYTES = saved
    reader.close()


def scenario_parallel_population(comm, path):
    """A preload with several reads in flight (dstore.store.preload) fills every window byte-identical
    to a one-thread preload: a rank's block, a replicated copy's node part, and a tiered window's
    resident samples, with pieces smaller than a sample and than a block."""
    from dstore.store import preload

    saved = preload.PARALLEL_PIECE, preload.PRELOAD_SCRATCH
    tier_reader = open_container(tier_container(path))
    try:
        preload.PARALLEL_PIECE, preload.PRELOAD_SCRATCH = 3000, 9000
        runs: tuple[tuple[str, bool, dict[str, Any]], ...] = (
            (path, False, dict()),
            (path, False, dict(replicate=True)),
            (tier_container(path), True, dict()),
        )
        for reader, tiered, kw in runs:
            windows = []
            for threads in (1, 3):
                args = dict(batch_size=BATCH, seed=4, population_threads=threads, **kw)
                with _tiered(comm, tier_reader, **args) if tiered else DataStore(comm, reader, **args) as st:
                    assert st.windows is not None
                    if tiered:
                        check_tier(comm, st, run_epoch(st, 0), tier_reader)
                    have = st.windows.view if st.replicate else st.windows.arena.local
                    assert have is not None  # replicated: the node's copy
                    windows.append(have.copy())
                    if not tiered:
                        got = run_epoch(st, 0)
                        check_delivery(comm, st.container, got, epoch=0, policy="global", seed=4, drop_last=False)
                        continue
                    # the resident samples of this rank's window are the container's bytes
                    mine = np.nonzero((st.layout.owner == st.rank) & st.windows.resident & (st.sizes > 0))[0]
                    for i in mine.tolist():
                        d = int(st.layout.disp[i])
                        if not np.array_equal(windows[-1][d : d + int(st.sizes[i])], tier_reader.sample(i)[0]):
                            raise AssertionError(f"rank {comm.rank}: resident sample {i} differs ({threads=})")
            if not np.array_equal(windows[0], windows[1]):
                raise AssertionError(f"rank {comm.rank}: 3-thread population differs from 1-thread ({kw}, {tiered=})")
    finally:
        preload.PARALLEL_PIECE, preload.PRELOAD_SCRATCH = saved
        tier_reader.close()


def expected_split(store, ids):
    """(samples served from node peers' windows, samples fetched with gets) for `ids` delivered to
    this rank, from the owners: node peers are the ranks of this rank's run of
    $DSTORE_RANKS_PER_NODE (all ranks when unset: one machine)."""
    k = rc.RANKS_PER_NODE.get() or store.size
    owners = store.layout.owner[ids]
    others = owners != store.rank
    node = int(np.count_nonzero(others & (owners // k == store.rank // k))) if store.node_views else 0
    return node, int(np.count_nonzero(others)) - node


def scenario_node_views(comm, path):
    """With node views, node peers' samples are served in place (no get) and equal what a get-only
    store serves; the two deliver the same ids in the same order. Under mpiexec the other scenarios
    run with DSTORE_NODE_VIEWS=0 and without, and with runs of ranks standing for nodes, so every
    path is covered."""
    reader = open_container(path)
    for policy in ("global", "partial"):
        got = {}
        for views in (True, False):
            with DataStore(comm, reader, batch_size=BATCH, seed=4, shuffle=policy, node_views=views) as st:
                got[views] = run_epoch(st, 1)
                check_stats(st, got[views], reader)
                mine = st.stats
                assert mine is not None
                want = expected_split(st, got[views][0])
                if (mine.samples_node, mine.samples_remote) != want:
                    raise AssertionError(f"rank {comm.rank}: expected (node, remote) samples {want}, stats say {mine}")
                if want[1] == 0 and mine.gets:
                    raise AssertionError(f"rank {comm.rank}: gets issued with nothing to fetch: {mine}")
        for a, b in zip(got[True], got[False]):
            if not np.array_equal(a, b):
                raise AssertionError(f"rank {comm.rank}: node views and gets delivered differently ({policy})")
        check_delivery(comm, reader, got[True], epoch=1, policy=policy, seed=4, drop_last=False)
    reader.close()


def scenario_mixed_nodes(comm, path):
    """Under DSTORE_RANKS_PER_NODE=k (runs of k ranks stand for nodes), node peers' samples are
    served in place and the other "nodes'" with gets, in the same batches; delivery stays exact."""
    reader = open_container(path)
    with DataStore(comm, reader, batch_size=BATCH, seed=9) as st:
        got = run_epoch(st, 1)
        check_stats(st, got, reader)
        want = expected_split(st, got[0])
        assert st.stats is not None
        if (st.stats.samples_node, st.stats.samples_remote) != want:
            raise AssertionError(f"rank {comm.rank}: expected (node, remote) samples {want}, stats say {st.stats}")
        k = rc.RANKS_PER_NODE.get() or 0
        node, remote = comm.allreduce(want[0]), comm.allreduce(want[1])
        if 1 < k < comm.size and not (node and remote):  # the point of this run: both kinds in one epoch
            raise AssertionError(
                f"{k} ranks per node on {comm.size} ranks served {node} node / {remote} remote samples"
            )
        check_delivery(comm, reader, got, epoch=1, policy="global", seed=9, drop_last=False)
    reader.close()


def tier_container(path):
    """The container scenario_tiered uses beside `path` (made by the caller: make_tier_container)."""
    return os.path.splitext(path)[0] + "-tier.h5"


def make_tier_container(path):
    """1201 samples of 0..8,000 bytes beside `path`, for scenario_tiered; returns its path."""
    return make_container(tier_container(path), n=1201, seed=1, large=8000, small=8000)


def _tiered(comm, reader, fraction=0.45, **kw):
    """A store whose budget keeps about `fraction` of each rank's share resident (overflow served)."""
    probe = DataStore(comm, reader, **kw)
    budget = probe.tier_overhead() + int(fraction * int(probe.layout.nbytes.max()))
    probe.close()
    return DataStore(comm, reader, memory_budget=budget, **kw)


def check_tier(comm, st, got, reader):
    """Collective: the store is tiered; a sample is resident in one window or none (ranks agree on
    the set; each window holds only its own resident samples within budget); this rank read from
    storage exactly the non-resident samples it delivered, each byte once."""
    if st.windows.resident is None:
        raise AssertionError("the store is not tiered")
    masks = comm.allgather(st.windows.resident)
    if any(not np.array_equal(m, masks[0]) for m in masks):
        raise AssertionError("ranks disagree on the resident set")
    res = st.windows.resident
    if not 0.2 < st.tier["resident_fraction"] < 0.8:
        raise AssertionError(f"resident fraction {st.tier['resident_fraction']}")
    mine = np.nonzero((st.layout.owner == st.rank) & res)[0]
    if int(st.layout.nbytes[st.rank]) != int(st.sizes[mine].sum()):
        raise AssertionError("window size differs from its resident samples' bytes")
    ranges = sorted(st.windows.storage.epoch_ranges)
    if any(a[1] > b[0] for a, b in zip(ranges, ranges[1:])):
        raise AssertionError(f"rank {comm.rank}: a byte was read from storage twice in one epoch")
    ids = np.unique(got[0]) - st.start
    want = int(st.sizes[ids[~res[ids]]].sum())
    if sum(b - a for a, b in ranges) != want or st.stats.bytes_storage < want:
        raise AssertionError(
            f"rank {comm.rank}: read {sum(b - a for a, b in ranges)} bytes from storage, "
            f"its non-resident deliveries hold {want}"
        )
    total = comm.allreduce(sum(b - a for a, b in ranges))
    kept = np.unique(np.concatenate(comm.allgather(ids)))
    if total != int(st.sizes[kept[~res[kept]]].sum()):
        raise AssertionError("the ranks together did not read exactly the non-resident bytes")


def scenario_tiered(comm, path):
    """Data larger than the budget (about 45% resident): every policy and population delivers what
    a fully resident store delivers (same ids, order and bytes), each epoch reads exactly the
    non-resident bytes from storage once; overflow="error" refuses; a mid-epoch state resumes on
    another number of ranks (another resident set) with nothing lost or repeated. Runs on
    tier_container(path) (more, smaller samples: buffers small beside a rank's share)."""
    reader = open_container(tier_container(path))
    for policy, population, drop_last, lookahead in (
        ("global", "preload", False, 4),
        ("global", "dynamic", True, 0),
        ("local", "preload", True, 1),
        ("partial", "dynamic", False, 2),
    ):
        kw: dict[str, Any] = dict(
            batch_size=BATCH, seed=6, shuffle=policy, population=population, drop_last=drop_last, partial_fraction=0.5
        )
        with _tiered(comm, reader, storage_lookahead=lookahead, **kw) as st, DataStore(comm, reader, **kw) as full:
            for epoch in (0, 1):
                got, ref = run_epoch(st, epoch), run_epoch(full, epoch)
                check_tier(comm, st, got, reader)
                check_stats(st, got, reader)
                for x, y in zip(got, ref):
                    if not np.array_equal(x, y):
                        raise AssertionError(f"tiered != resident ({policy}, {population}, epoch {epoch})")
                check_delivery(
                    comm,
                    reader,
                    got,
                    epoch=epoch,
                    policy=policy,
                    seed=6,
                    drop_last=drop_last,
                    steps_per_epoch=st.steps_per_epoch,
                )
    try:
        with _tiered(comm, reader, batch_size=BATCH, overflow="error"):
            pass
    except MemoryBudgetError:
        pass
    else:
        raise AssertionError("overflow='error' served data larger than the budget")
    sub_size = max(1, comm.size - 1)
    sub = comm.Split(0 if comm.rank < sub_size else 1, comm.rank)
    try:
        with _tiered(comm, reader, fraction=0.6, batch_size=BATCH, seed=2) as st:
            first = run_epoch(st, 1, steps=4)
            sd = st.state_dict()  # (its torch.save round trip is scenario_resume's)
        rest = tuple(np.zeros(0, t) for t in (np.int64, np.int64, bool, np.int64, np.int64))
        if comm.rank < sub_size:
            with _tiered(sub, reader, fraction=0.3, batch_size=BATCH) as st2:
                st2.load_state_dict(comm.bcast(sd))
                rest = run_epoch(st2, 1)
        else:
            comm.bcast(None)
        both = tuple(np.concatenate([x, y]) for x, y in zip(first, rest))
        check_delivery(comm, reader, both, epoch=1, policy="global", seed=2, drop_last=False)
    finally:
        sub.Free()
    reader.close()


def scenario_errors(comm, path):
    """Bad arguments are ConfigErrors naming the parameter; close() is safe twice."""
    reader = open_container(path)
    for kw, name in (
        (dict(batch_size=0), "batch_size"),
        (dict(batch_size=BATCH, shuffle="x"), "shuffle"),
        (dict(batch_size=BATCH, population="x"), "population"),
        (dict(batch_size=BATCH, sample_range=(5, 2)), "sample_range"),
        (dict(batch_size=10**6, drop_last=True), "batch_size"),
        (dict(batch_size=BATCH, prefetch=-1), "prefetch"),
    ):
        try:
            DataStore(comm, reader, **kw)
        except ConfigError as exc:
            if name not in str(exc):
                raise AssertionError(f"{kw}: message {exc} does not name {name}") from None
        else:
            raise AssertionError(f"no ConfigError for {kw}")
    if comm.size > 1:  # ranks that disagree fail together, naming the argument, instead of hanging
        try:
            DataStore(comm, reader, batch_size=BATCH, seed=comm.rank).populate()
        except ConfigError as exc:
            if "seed" not in str(exc) or "differ between ranks" not in str(exc):
                raise AssertionError(f"unclear message: {exc}") from None
        else:
            raise AssertionError("no ConfigError for different seeds on different ranks")
    st = DataStore(comm, reader, batch_size=BATCH)
    with st:
        it = st.epoch(0)
        next(it)  # leave an epoch open: close() must end it
    st.close()
    reader.close()


SCENARIOS = {name[len("scenario_") :]: fn for name, fn in globals().items() if name.startswith("scenario_")}


def main(argv, table=None):
    """Runs the scenarios named in argv[1:] (all of `table`, default SCENARIOS) on argv[0]."""
    import faulthandler

    from mpi4py import MPI

    # A hang becomes a traceback of every rank (the launcher's timeout is the backstop).
    faulthandler.dump_traceback_later(rc.SCENARIO_TIMEOUT.get(), exit=True)
    table = SCENARIOS if table is None else table
    path, names = argv[0], argv[1:] or list(table)
    comm = MPI.COMM_WORLD
    for name in names:
        table[name](comm, path)
        comm.Barrier()
        if comm.rank == 0:
            print(f"OK {name} on {comm.size} ranks", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
