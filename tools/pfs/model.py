"""The parallel-file-system model, without FUSE: units, parameters, the shared token bucket, jitter.

Pure Python and thread-safe, so it is tested directly (tests/test_pfs_model.py) and the FUSE layer
(tools/pfs/fs.py) only calls `Model.charge_read` / `Model.charge_meta` from its request threads.
"""

from __future__ import annotations

import dataclasses
import math
import random
import re
import threading
import time

from dstore.errors import ConfigError
from dstore.runtime.units import parse_byte_rate, parse_duration

UNLIMITED = math.inf

MAX_DELAY_S = 10.0
"""The longest a request may wait in the model (latencies and burst are bounded by it, and a
request's wait for tokens is cut to it): libfuse ends its loop on SIGTERM only once every request
in flight returns, so an unbounded wait made a mount that no signal could end."""

_NUM = r"([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)"
_NO_CAP = ("unlimited", "inf", "none")


def parse_time(text: str, name: str = "time") -> float:
    """`2ms`, `500us`, `0.5s`, `0` -> seconds (dstore.runtime.units' grammar). A non-zero number needs its unit.

    Raises:
        ConfigError: naming `name` and the value.
    """
    return parse_duration(text, name)


def parse_bandwidth(text: str, name: str = "bandwidth") -> float:
    """`500MB/s`, `1G/s`, `2GiB/s`, `unlimited` -> bytes per second (inf for no cap).

    dstore.runtime.units' size grammar per second: MB is 10^6 bytes, MiB 2^20. Raises ConfigError naming
    `name` otherwise."""
    s = str(text).strip().lower()
    if s in _NO_CAP:
        return UNLIMITED
    value = parse_byte_rate(text, name)
    if value <= 0:
        raise ConfigError(f"{name}={text!r} must be > 0 (or 'unlimited')")
    return value


def parse_rate(text: str, name: str = "iops") -> float:
    """`800/s`, `800`, `unlimited` -> operations per second (inf for no cap)."""
    s = str(text).strip().lower()
    if s in _NO_CAP:
        return UNLIMITED
    m = re.fullmatch(_NUM + r"\s*(/s)?", s)
    if not m:
        raise ConfigError(f"{name}={text!r}: expected operations per second such as 800/s, or 'unlimited'")
    value = float(m.group(1))
    if value <= 0:
        raise ConfigError(f"{name}={text!r} must be > 0 (or 'unlimited')")
    return value


def format_time(seconds: float) -> str:
    if seconds == 0:
        return "0"
    if seconds < 1e-3:
        return f"{seconds * 1e6:g}us"
    if seconds < 1:
        return f"{seconds * 1e3:g}ms"
    return f"{seconds:g}s"


def format_bandwidth(bps: float) -> str:
    if math.isinf(bps):
        return "unlimited"
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if bps >= scale:
            return f"{bps / scale:g}{unit}/s"
    return f"{bps:g}B/s"


def format_rate(ops: float) -> str:
    return "unlimited" if math.isinf(ops) else f"{ops:g}/s"


@dataclasses.dataclass(frozen=True)
class PfsModel:
    """What the modelled file system costs.

    Attributes:
        latency: seconds added to every read request (a network round trip to the object server).
        open_latency: seconds added to every open, stat (getattr) and readdir (the metadata server).
        iops: operations per second for the whole mount (reads and metadata operations alike), shared
            by every process reading through it; inf for no cap.
        bandwidth: bytes per second for the whole mount, shared likewise; inf for no cap.
        jitter: each delay is drawn uniformly in [d * (1 - jitter), d * (1 + jitter)]; 0 for none.
        seed: seed of the jitter draws (deterministic sequence of draws).
        burst: seconds' worth of tokens the buckets hold when idle (how far a pause can be caught up).
        max_read: bytes per read request the kernel may send (a Lustre client sends 1-4 MiB RPCs).
    """

    latency: float = 0.0
    open_latency: float = 0.0
    iops: float = UNLIMITED
    bandwidth: float = UNLIMITED
    jitter: float = 0.0
    seed: int = 0
    burst: float = 0.01
    max_read: int = 1 << 20

    def __post_init__(self):
        for name in ("latency", "open_latency", "burst"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or not 0 <= v <= MAX_DELAY_S:
                raise ConfigError(f"{name}={v!r} must be a number of seconds in [0, {MAX_DELAY_S:g}s]")
        for name in ("iops", "bandwidth"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or not v > 0:
                raise ConfigError(f"{name}={v!r} must be > 0 (inf for no cap)")
        if not isinstance(self.jitter, (int, float)) or not 0 <= self.jitter <= 1:
            raise ConfigError(f"jitter={self.jitter!r} must be in [0, 1] (a fraction of each delay)")
        if not isinstance(self.max_read, int) or not 4096 <= self.max_read <= (1 << 24):
            raise ConfigError(f"max_read={self.max_read!r} must be an integer of bytes in [4096, 16 MiB]")

    @property
    def is_local(self) -> bool:
        """No delay and no cap: the file system's own overhead only."""
        return self.latency == 0 and self.open_latency == 0 and math.isinf(self.iops) and math.isinf(self.bandwidth)

    def describe(self) -> str:
        """`latency=2ms,open_latency=2ms,iops=2000/s,bandwidth=1GB/s` (the spec syntax, parseable back)."""
        parts = [
            f"latency={format_time(self.latency)}",
            f"open_latency={format_time(self.open_latency)}",
            f"iops={format_rate(self.iops)}",
            f"bandwidth={format_bandwidth(self.bandwidth)}",
        ]
        if self.jitter:
            parts.append(f"jitter={self.jitter:g}")
        return ",".join(parts)

    def to_dict(self) -> dict:
        """JSON-safe (inf as null)."""
        d = dataclasses.asdict(self)
        for k in ("iops", "bandwidth"):
            if math.isinf(d[k]):
                d[k] = None
        return d

    def to_args(self) -> list[str]:
        """The `dstore pfs` options that give this model."""
        return [
            "--latency",
            format_time(self.latency) if self.latency else "0",
            "--open-latency",
            format_time(self.open_latency) if self.open_latency else "0",
            "--iops",
            repr(self.iops) if not math.isinf(self.iops) else "unlimited",
            "--bandwidth",
            f"{self.bandwidth!r}B/s" if not math.isinf(self.bandwidth) else "unlimited",
            "--jitter",
            repr(float(self.jitter)),
            "--seed",
            str(self.seed),
            "--burst",
            repr(float(self.burst)) + "s",
            "--max-read",
            str(self.max_read),
        ]


DEFAULTS = PfsModel(latency=2e-3, open_latency=2e-3, iops=2000.0, bandwidth=1e9)
"""Defaults of `dstore pfs`: a job's share of a busy Lustre file system (docs/storage.md says why)."""

SPEC_KEYS = {
    "latency": parse_time,
    "open_latency": parse_time,
    "iops": parse_rate,
    "bandwidth": parse_bandwidth,
    "jitter": None,
    "seed": None,
}


def parse_spec(spec: str, *, base: PfsModel | None = None) -> PfsModel:
    """`pfs:latency=2ms,iops=2000,bandwidth=1GB/s` (any subset of keys; `pfs` alone for the defaults,
    `local` for no delay and no cap) -> PfsModel. Keys not given keep `base` (default: DEFAULTS),
    except that `open_latency` follows `latency` unless given.

    Raises:
        ConfigError: naming the bad key or value and what is allowed.
    """
    s = spec.strip()
    if s in ("local", "pfs:local"):
        return PfsModel()
    if s != "pfs" and not s.startswith("pfs:"):
        raise ConfigError(f"storage {spec!r}: expected pfs:KEY=VALUE,... (keys: {', '.join(SPEC_KEYS)}) or 'local'")
    base = base or DEFAULTS
    values: dict = {}
    body = s[4:] if s.startswith("pfs:") else ""
    for item in filter(None, (x.strip() for x in body.split(","))):
        key, eq, value = item.partition("=")
        key = key.strip().replace("-", "_")
        if not eq or key not in SPEC_KEYS:
            raise ConfigError(f"storage {spec!r}: {item!r} is not KEY=VALUE with KEY one of {', '.join(SPEC_KEYS)}")
        if key == "jitter":
            try:
                values[key] = float(value)
            except ValueError:
                raise ConfigError(f"storage {spec!r}: jitter={value!r} must be a fraction in [0, 1]") from None
        elif key == "seed":
            try:
                values[key] = int(value)
            except ValueError:
                raise ConfigError(f"storage {spec!r}: seed={value!r} must be an integer") from None
        else:
            try:
                values[key] = SPEC_KEYS[key](value, key)
            except ConfigError as exc:
                raise ConfigError(f"storage {spec!r}: {exc}") from None
    if "latency" in values and "open_latency" not in values:
        values["open_latency"] = values["latency"]
    try:
        return dataclasses.replace(base, **values)
    except ConfigError as exc:
        raise ConfigError(f"storage {spec!r}: {exc}") from None


class TokenBucket:
    """Tokens at `rate` per second, holding at most `capacity`; one bucket shared by every thread.

    `reserve(cost)` takes the tokens at once (the level may go below zero: a debt), and returns how
    long the caller must wait before its request may proceed. Requests are served in the order they
    reserve, and the long-run rate never exceeds `rate` plus one initial `capacity`.
    """

    def __init__(self, rate: float, capacity: float, clock=time.monotonic):
        if not rate > 0:
            raise ConfigError(f"token bucket rate={rate!r} must be > 0")
        self.rate = float(rate)
        self.capacity = float(max(capacity, 0.0))
        self.clock = clock
        self._level = self.capacity
        self._t = clock()
        self._lock = threading.Lock()

    def reserve(self, cost: float) -> float:
        """Takes `cost` tokens; returns the seconds to wait before using them (0 if available now)."""
        if math.isinf(self.rate):
            return 0.0
        with self._lock:
            now = self.clock()
            self._level = min(self.capacity, self._level + (now - self._t) * self.rate)
            self._t = now
            self._level -= cost
            return 0.0 if self._level >= 0 else -self._level / self.rate


@dataclasses.dataclass
class Counters:
    """What the file system served (updated under a lock by the request threads)."""

    reads: int = 0
    read_bytes: int = 0
    opens: int = 0
    stats: int = 0
    readdirs: int = 0
    delay_seconds: float = 0.0
    """Seconds spent waiting in the model (latency + waits for tokens), summed over requests."""
    busy_seconds: float = 0.0
    """Seconds spent serving requests (model waits + the source reads), summed over requests."""

    @property
    def ops(self) -> int:
        return self.reads + self.opens + self.stats + self.readdirs

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["ops"] = self.ops
        d["delay_seconds"] = round(self.delay_seconds, 6)
        d["busy_seconds"] = round(self.busy_seconds, 6)
        return d


class Model:
    """The live model of one mount: the shared buckets, the seeded jitter and the counters."""

    def __init__(self, params: PfsModel, clock=time.monotonic, sleep=time.sleep):
        self.params = params
        self.clock = clock
        self.sleep = sleep
        inf = math.isinf
        self._iops = None if inf(params.iops) else TokenBucket(params.iops, max(1.0, params.iops * params.burst), clock)
        self._bw = (
            None if inf(params.bandwidth) else TokenBucket(params.bandwidth, params.bandwidth * params.burst, clock)
        )
        self._rng = random.Random(params.seed)
        self._lock = threading.Lock()
        self.counters = Counters()

    def _jittered(self, delay: float) -> float:
        if delay <= 0 or not self.params.jitter:
            return delay
        with self._lock:
            u = self._rng.uniform(-1.0, 1.0)
        return delay * (1.0 + self.params.jitter * u)

    def _pay(self, latency: float, nbytes: int) -> float:
        wait = 0.0
        if self._iops is not None:
            wait = self._iops.reserve(1.0)
        if self._bw is not None and nbytes:
            wait = max(wait, self._bw.reserve(float(nbytes)))
        total = min(wait + self._jittered(latency), MAX_DELAY_S)  # see MAX_DELAY_S: a signal must end the mount
        if total > 0:
            self.sleep(total)
        return total

    def charge_meta(self, kind: str) -> float:
        """One metadata operation (`open`, `stat` or `readdir`): waits for its iops token and the
        open latency. Returns the seconds waited."""
        t0 = self.clock()
        waited = self._pay(self.params.open_latency, 0)
        with self._lock:
            c = self.counters
            if kind == "open":
                c.opens += 1
            elif kind == "readdir":
                c.readdirs += 1
            else:
                c.stats += 1
            c.delay_seconds += waited
            c.busy_seconds += self.clock() - t0
        return waited

    def charge_read(self, nbytes: int) -> float:
        """One read request of `nbytes`: waits for its iops and bandwidth tokens and the latency."""
        return self._pay(self.params.latency, nbytes)

    def count_read(self, nbytes: int, waited: float, seconds: float) -> None:
        with self._lock:
            c = self.counters
            c.reads += 1
            c.read_bytes += nbytes
            c.delay_seconds += waited
            c.busy_seconds += seconds
