"""The streaming preload (population="stream", dstore.store.stream) on any communicator: COMM_SELF in
pytest, or COMM_WORLD under `mpiexec -n N python -m mpi4py stream_scenarios.py CONTAINER NAME...`.

The stream is slowed (a pause after each piece, pieces of a few KiB) so that epoch 0 really is
served while the windows fill: some of its samples come from the windows, some are read by the
rank that delivers them. Every check is collective (scenarios.check_delivery)."""

from __future__ import annotations

import sys
import time

import numpy as np
from store_scenarios import scenarios
from store_scenarios.scenarios import BATCH, check_delivery, run_epoch

from dstore.formats import open_container
from dstore.store import preload as preload_mod
from dstore.store.data_store import DataStore

PAUSE = 0.004  # seconds after each piece read by the stream


def slow_stream(piece=4096, pause=PAUSE):
    """Makes every stream read pieces of `piece` bytes and pause after each (the test's stand-in
    for slow storage: the reads themselves are real)."""
    real = preload_mod.preload
    preload_mod.PARALLEL_PIECE = piece
    preload_mod.prefault.PIECE_BYTES = max(piece, 4096)

    def preload(*args, done=None, **kw):
        def slow(k):
            time.sleep(pause)
            if done is not None:
                done(k)

        return real(*args, done=slow, **kw)

    preload_mod.preload = preload


def _counts(comm, store):
    st = store.stats
    mine = (st.samples_storage, st.samples_local + st.samples_node + st.samples_remote, st.samples)
    return np.sum(comm.allgather(mine), axis=0)


def scenario_stream_order(comm, path):
    """Stream delivers what preload does, every epoch, every policy; exactly once, bytes equal;
    epoch 0 mixes reads of its own with window samples, later epochs read nothing."""
    slow_stream()
    reader = open_container(path)
    for policy, drop_last in (("global", False), ("global", True), ("local", False), ("partial", True)):
        kw = dict(batch_size=BATCH, seed=5, shuffle=policy, drop_last=drop_last)
        with (
            DataStore(comm, reader, **kw) as pre,
            DataStore(comm, path, population="stream", population_threads=2, **kw) as stream,
        ):
            for epoch in (0, 1, 2):
                a, b = run_epoch(stream, epoch), run_epoch(pre, epoch)
                for x, y in zip(a, b):
                    if not np.array_equal(x, y):
                        raise AssertionError(f"stream != preload ({policy}, epoch {epoch})")
                check_delivery(
                    comm,
                    reader,
                    a,
                    epoch=epoch,
                    policy=policy,
                    seed=5,
                    drop_last=drop_last,
                    steps_per_epoch=stream.steps_per_epoch,
                )
                storage, windows, total = _counts(comm, stream)
                assert stream.stats is not None
                if storage + windows + sum(comm.allgather(stream.stats.pads)) < total:
                    raise AssertionError(f"epoch {epoch}: samples neither from storage nor windows")
                if epoch == 0 and policy == "global" and not (storage > 0 and windows > 0):
                    raise AssertionError(f"epoch 0 did not mix own reads ({storage}) and windows ({windows})")
                if epoch > 0 and storage:
                    raise AssertionError(f"epoch {epoch} read {storage} samples from storage")
            if stream.stats.population_bytes != int(stream.layout.nbytes[comm.rank]):
                raise AssertionError(
                    f"the stream read {stream.stats.population_bytes} bytes of its block, "
                    f"owns {stream.layout.nbytes[comm.rank]}"
                )
    reader.close()


def scenario_stream_abandoned(comm, path):
    """Epoch 0 abandoned after 2 steps while streaming, then resumed and the next epochs: the
    same deliveries as a preload store doing the same; close() while streaming ends cleanly."""
    slow_stream(pause=0.02)
    reader = open_container(path)
    kw = dict(batch_size=BATCH, seed=2)
    with DataStore(comm, reader, **kw) as pre, DataStore(comm, path, population="stream", **kw) as stream:
        for st in (stream, pre):
            run_epoch(st, 0, steps=2)
        sd = stream.state_dict()
        for st in (stream, pre):
            st.load_state_dict(sd)
        a, b = run_epoch(stream, 0), run_epoch(pre, 0)
        if not all(np.array_equal(x, y) for x, y in zip(a, b)):
            raise AssertionError("resumed stream epoch differs from preload")
        check_delivery(
            comm,
            reader,
            a,
            epoch=0,
            policy="global",
            seed=2,
            drop_last=False,
            first_step=2,
            steps_per_epoch=stream.steps_per_epoch,
        )
    with DataStore(comm, path, population="stream", **kw) as early:
        run_epoch(early, 0, steps=1)  # closed while (probably) still streaming: must not hang
    reader.close()


SCENARIOS = {"stream_order": scenario_stream_order, "stream_abandoned": scenario_stream_abandoned}


if __name__ == "__main__":
    scenarios.main(sys.argv[1:], SCENARIOS)
