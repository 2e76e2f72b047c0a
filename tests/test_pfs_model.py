"""The parallel-file-system model without FUSE: units, specs, validation, the shared token bucket, jitter."""

from __future__ import annotations

import math
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dstore.errors import ConfigError
from dstore.tools.pfs.model import (
    DEFAULTS,
    Model,
    PfsModel,
    TokenBucket,
    parse_bandwidth,
    parse_rate,
    parse_spec,
    parse_time,
)


@pytest.mark.parametrize(
    "text, seconds", [("2ms", 2e-3), ("500us", 5e-4), ("0.5s", 0.5), ("0", 0.0), ("1.5 ms", 1.5e-3), ("250ns", 2.5e-7)]
)
def test_parse_time(text, seconds):
    assert parse_time(text) == pytest.approx(seconds)


@pytest.mark.parametrize(
    "text, bps", [("500MB/s", 5e8), ("1GB/s", 1e9), ("2GiB/s", 2 * 2**30), ("10kb/s", 1e4), ("unlimited", math.inf)]
)
def test_parse_bandwidth(text, bps):
    assert parse_bandwidth(text) == pytest.approx(bps)


@pytest.mark.parametrize("text, ops", [("800/s", 800.0), ("800", 800.0), ("unlimited", math.inf)])
def test_parse_rate(text, ops):
    assert parse_rate(text) == ops


@pytest.mark.parametrize(
    "fn, text, needle",
    [
        (parse_time, "2", "has no unit"),
        (parse_time, "2 lightyears", "expected a duration"),
        (parse_bandwidth, "500MB", "expected bytes per second"),
        (parse_bandwidth, "0MB/s", "must be > 0"),
        (parse_rate, "fast", "expected operations per second"),
        (parse_rate, "0/s", "must be > 0"),
    ],
)
def test_bad_units_name_the_parameter(fn, text, needle):
    with pytest.raises(ConfigError, match=needle) as e:
        fn(text, "--knob")
    assert "--knob" in str(e.value)


def test_spec_subset_and_defaults():
    m = parse_spec("pfs:latency=2ms,iops=2000,bandwidth=1GB/s")
    assert (m.latency, m.open_latency, m.iops, m.bandwidth) == (2e-3, 2e-3, 2000, 1e9)
    m = parse_spec("pfs:iops=300")
    assert m.iops == 300 and m.latency == DEFAULTS.latency
    m = parse_spec("pfs:latency=8ms,open_latency=1ms")
    assert (m.latency, m.open_latency) == (8e-3, 1e-3)
    assert parse_spec("pfs") == DEFAULTS
    assert parse_spec("local").is_local
    # describe() reads back as the same model
    m = parse_spec("pfs:latency=0.5ms,iops=1500,bandwidth=700MB/s,jitter=0.2")
    assert parse_spec("pfs:" + m.describe()) == m


@pytest.mark.parametrize(
    "spec, needle",
    [
        ("pfs:latncy=2ms", "'latncy=2ms' is not KEY=VALUE"),
        ("pfs:latency=2", "latency='2' has no unit"),
        ("pfs:bandwidth=1GB", "bandwidth='1GB'"),
        ("nfs:latency=2ms", "expected pfs:"),
        ("pfs:jitter=2", "jitter=2.0 must be in"),
        ("pfs:iops", "'iops' is not KEY=VALUE"),
    ],
)
def test_spec_errors_name_the_key(spec, needle):
    with pytest.raises(ConfigError, match=needle):
        parse_spec(spec)


@pytest.mark.parametrize(
    "kw, name",
    [
        ({"latency": -1}, "latency"),
        ({"iops": 0}, "iops"),
        ({"bandwidth": -5}, "bandwidth"),
        ({"jitter": 1.5}, "jitter"),
        ({"max_read": 100}, "max_read"),
        ({"open_latency": math.inf}, "open_latency"),
    ],
)
def test_model_validation_names_the_parameter(kw, name):
    with pytest.raises(ConfigError, match=f"^{name}="):
        PfsModel(**kw)


class FakeClock:
    """A clock only the test moves; sleep() advances it, so the model's waits are exact."""

    def __init__(self):
        self.t = 100.0
        self.lock = threading.Lock()

    def __call__(self):
        return self.t

    def sleep(self, s):
        with self.lock:
            self.t += s


@settings(max_examples=60, deadline=None)
@given(rate=st.floats(1, 1e6), capacity=st.floats(0, 50), costs=st.lists(st.floats(0.1, 20), min_size=1, max_size=60))
def test_bucket_never_exceeds_its_rate(rate, capacity, costs):
    """Back-to-back reservations: the last one may start no earlier than (total - capacity) / rate."""
    clock = FakeClock()
    b = TokenBucket(rate, capacity, clock)
    waits = [b.reserve(c) for c in costs]
    assert waits == sorted(waits)  # FIFO: later requests never start earlier
    assert waits[-1] == pytest.approx(max(0.0, (sum(costs) - capacity) / rate), rel=1e-9, abs=1e-12)


def test_bucket_refills_while_idle_up_to_capacity():
    clock = FakeClock()
    b = TokenBucket(100.0, 5.0, clock)
    assert [b.reserve(1) for _ in range(5)] == [0.0] * 5
    assert b.reserve(1) == pytest.approx(0.01)
    clock.t += 10.0  # a long pause refills only up to capacity
    assert [b.reserve(1) for _ in range(5)] == [0.0] * 5
    assert b.reserve(1) == pytest.approx(0.01)


def test_model_charges_latency_iops_and_bandwidth():
    clock = FakeClock()
    m = Model(PfsModel(latency=2e-3, open_latency=5e-3, iops=100, bandwidth=1e6, burst=0.0), clock, clock.sleep)
    t0 = clock.t
    m.charge_meta("open")  # 1 token (free: the bucket holds 1) + 5 ms
    for _ in range(10):
        w = m.charge_read(50_000)
        m.count_read(50_000, w, w)
    c = m.counters
    assert (c.opens, c.reads, c.read_bytes, c.ops) == (1, 10, 500_000, 11)
    # serialised by the fake clock: every request waits for its tokens and then its latency
    assert clock.t - t0 >= 10 * 2e-3 + 5e-3 + 0.5
    assert c.delay_seconds == pytest.approx(clock.t - t0)


def test_jitter_is_seeded_and_bounded():
    def draws(seed):
        clock = FakeClock()
        m = Model(PfsModel(latency=1e-3, jitter=0.5, seed=seed), clock, clock.sleep)
        return [m.charge_read(10) for _ in range(50)]

    a, b, c = draws(1), draws(1), draws(2)
    assert a == b and a != c
    assert all(0.5e-3 <= x <= 1.5e-3 for x in a) and max(a) - min(a) > 0.5e-3


def test_buckets_are_shared_by_threads():
    """Many threads reserving at once: the total granted never runs ahead of the rate."""
    clock = FakeClock()
    b = TokenBucket(1000.0, 1.0, clock)
    out = []

    def worker():
        for _ in range(200):
            out.append(b.reserve(1.0))

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(out) == 1600
    assert max(out) == pytest.approx((1600 - 1) / 1000.0)
