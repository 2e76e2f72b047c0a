"""The watchdog's rules (dstore.runtime.watchdog, NOTE [ Waits on another node ]) with a probe that
answers as told: no MPI here; the faults themselves are tests/test_faults.py's, on an emulated cluster."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from dstore.runtime import watchdog
from dstore.runtime.watchdog import Watchdog, span

HOSTS = ["n1", "n1", "n2", "n2", "n3"]


class Probe:
    """Answers `silent` with the ranks in `dead`, after `delay` seconds."""

    def __init__(self, dead=(), delay=0.0):
        self.dead, self.delay, self.asked = set(dead), delay, []

    def progress(self):
        pass

    def silent(self, ranks, timeout):
        self.asked.append(list(ranks))
        time.sleep(self.delay)
        return [r for r in ranks if r in self.dead]


class Recorded(Watchdog):
    """A watchdog whose end is recorded instead of ending the process."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.ended = threading.Event()
        self.line = ""

    def _end(self, msg, delay=None):
        self.line = msg
        self.ended.set()
        self._stop.set()  # the thread ends, as the real end ends the process


def dog(probe, bound=0.2):
    return Recorded(0, HOSTS, probe, bound, period=0.02).start()


def test_span():
    assert span([3, 2]) == "2-3"
    assert span([0, 4, 6, 7, 9]) == "0, 4, 6-7, 9"
    assert span([]) == ""


def test_silent_node_named():
    w = dog(Probe(dead=[2, 3]))
    try:
        with w.waiting("an agreement of 5 ranks"):
            assert w.ended.wait(5)
    finally:
        w.stop()
    assert w.line.startswith("no answer from node n2 (ranks 2-3) for ")
    assert "an agreement of 5 ranks waiting" in w.line and "$DSTORE_WAIT_BOUND=0.2 s" in w.line
    assert w._probe.asked[0] == [2, 3, 4]  # every rank on another host, none of its own


def test_slow_gets_end_the_job_though_the_node_answers():
    w = dog(Probe())
    try:
        with w.waiting("a batch's gets", np.array([4, 1])):
            assert w.ended.wait(5)
    finally:
        w.stop()
    assert w.line.startswith("no answer from node n3 (ranks 4) for ") and "delivers too little" in w.line


def test_a_busy_collective_waits_on():
    w = dog(Probe())
    try:
        with w.waiting("an agreement of 5 ranks"):
            time.sleep(0.8)  # four bounds: probed, everyone answers, it waits on
        assert not w.ended.is_set() and w.probes >= 2
    finally:
        w.stop()


def test_a_short_wait_is_never_probed():
    w = dog(Probe(dead=[2]))
    try:
        for _ in range(20):
            with w.waiting("a batch's gets", [2]):
                time.sleep(0.01)
        time.sleep(0.3)
        assert w.probes == 0 and not w.ended.is_set()
    finally:
        w.stop()


def test_lost_connection_names_the_node():
    w = dog(Probe())
    try:
        with pytest.raises(ConnectionError):  # a rank of this host: not named, the error goes on
            with w.waiting("a batch's gets", [1]):
                raise ConnectionError("reset")
        with pytest.raises(ConnectionError):  # (the real end never returns)
            with w.waiting("a batch's gets", [0, 3]):
                raise ConnectionError("Connection reset by remote peer")
    finally:
        w.stop()
    assert w.line.startswith("node n2 (ranks 2-3) lost: a get from it failed (Connection reset by remote peer)")


def test_guarded_uses_the_latest_open_watchdog():
    w = dog(Probe())
    watchdog.register(w)
    try:
        with watchdog.guarded("x"):
            assert w._wait is not None and w._wait[1] == "x"
        assert w._wait is None
    finally:
        watchdog.unregister(w)
        w.stop()
    assert watchdog.current() is None
    with watchdog.guarded("nothing open"):
        pass
