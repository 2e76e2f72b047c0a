"""A hypothesis state machine over one store on one rank: iterate some steps, save, reopen with
other prefetch / population / overflow budget and load, abandon an epoch and resume, close. The
invariant after every rule: each batch holds exactly the samples the reference global order puts
at that position, with the container's bytes (resume is checked at every reachable point, not at
a few fixed ones)."""

from __future__ import annotations

import zlib

import numpy as np
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from store_scenarios import scenarios

from dstore.formats import open_container
from dstore.order import shuffle

N, BATCH, SEED = 61, 8, 4
STEPS = -(-N // BATCH)  # the last batch is short (drop_last=False)
SETTINGS = st.fixed_dictionaries(
    {
        "prefetch": st.sampled_from([0, 1, 3]),
        "population": st.sampled_from(["preload", "dynamic"]),
        "tiered": st.booleans(),
    }
)


@pytest.fixture(scope="module")
def container(tmp_path_factory):
    return scenarios.make_container(
        str(tmp_path_factory.mktemp("stateful") / "c.h5"), n=N, seed=3, large=3000, small=3000
    )


def _open(path, prefetch, population, tiered):
    from mpi4py import MPI

    from dstore.store.data_store import DataStore

    kw = dict(batch_size=BATCH, seed=SEED, prefetch=prefetch, population=population)
    if tiered:  # a budget that keeps about half the samples resident: the rest are read from storage
        probe = DataStore(MPI.COMM_SELF, path, **kw)
        kw["memory_budget"] = probe.tier_overhead() + int(0.5 * int(probe.layout.nbytes.max()))
        probe.close()
    return DataStore(MPI.COMM_SELF, path, **kw).__enter__()


class StoreMachine(RuleBasedStateMachine):
    """The model is the position (epoch, step) of the next batch; the store must deliver it."""

    path: str = ""

    def __init__(self):
        super().__init__()
        self.reader = open_container(self.path)
        self.store = None
        self.saved = None  # (state_dict, position) of the last save
        self.bad = None

    @initialize(opts=SETTINGS)
    def start(self, opts):
        self.store = _open(self.path, **opts)
        self.pos = (0, 0)
        self.it = self.store.epoch(0)

    def _expect(self, batch) -> None:
        e, s = self.pos
        want = shuffle.global_order(N, SEED, e)[s * BATCH : (s + 1) * BATCH]
        crcs = [zlib.crc32(x) for x in batch.samples]
        if (batch.epoch, batch.step) != (e, s) or not np.array_equal(batch.ids, want):
            self.bad = f"at {self.pos}: got epoch {batch.epoch} step {batch.step} ids {batch.ids}, want {want}"
        elif crcs != self.reader.checksums[want].tolist():
            self.bad = f"at {self.pos}: bytes differ from the container"

    @rule(k=st.integers(1, 2 * STEPS))
    def iterate(self, k):
        assert self.store is not None  # opened by the initialize rule, which runs first
        for _ in range(k):
            batch = next(self.it, None)
            if batch is None:  # the epoch ended: the next one starts at its step 0
                self.it = self.store.epoch(self.pos[0])
                batch = next(self.it)
            self._expect(batch)
            e, s = self.pos
            self.pos = (e, s + 1) if s + 1 < STEPS else (e + 1, 0)
            if self.bad:
                return

    @rule()
    def save(self):
        assert self.store is not None
        self.saved = (self.store.state_dict(), self.pos)

    @precondition(lambda self: self.saved is not None)
    @rule(opts=SETTINGS)
    def reopen_and_load(self, opts):
        assert self.store is not None and self.saved is not None  # (the precondition)
        self.store.close()
        self.store = _open(self.path, **opts)
        sd, self.pos = self.saved
        self.store.load_state_dict(sd)
        self.it = self.store.epoch(self.pos[0])

    @rule()
    def abandon_and_resume(self):
        assert self.store is not None
        self.it.close()  # an epoch left mid-way (a trainer that stops to checkpoint)
        self.store.load_state_dict(self.store.state_dict())
        self.it = self.store.epoch(self.pos[0])

    @invariant()
    def delivered_exactly(self):
        assert self.bad is None, self.bad

    def teardown(self):
        if self.store is not None:
            self.store.close()
        self.reader.close()


def test_any_sequence_of_steps_saves_reopens_and_abandons_serves_the_exact_order(container):
    StoreMachine.path = container
    run = StoreMachine.TestCase
    run.settings = settings(max_examples=12, stateful_step_count=8, deadline=None)
    run("runTest").runTest()
