"""One grammar for sizes, rates and durations in flags, and one way of printing them.

Reading (every size, rate and time flag and variable): a number, optionally with an exponent, then
a unit. Sizes: B, k/K, M, G, T (powers of 1000; kB, MB, GB, TB alike) or KiB, MiB, GiB, TiB
(powers of 1024), in any case: `8G`, `8GB`, `512MiB`, `1.5e9`. Rates: a size per second, `1G/s`,
`500MB/s`, `2GiB/s`, or operations per second, `800/s`. Durations: ns, us (µs), ms, s, min, h;
`0` alone needs no unit.

Printing (every command's output): SI, powers of 1000, three significant digits: `38.0 kB`,
`2.20 MB`, `412 MB/s`, `1.25 s`, `3.4 ms` (the units of disk and network figures, and of the
benchmark tables). Binary units are accepted on input but never printed.
"""

from __future__ import annotations

import math
import re

from dstore.errors import ConfigError

_NUM = r"([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)"
_SIZE_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9,
               "t": 10**12, "tb": 10**12, "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}
_TIME_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "min": 60.0, "h": 3600.0}
SIZE_HELP = "bytes, or a number with k, M, G, T (x1000) or KiB, MiB, GiB, TiB (x1024), e.g. 8G, 512MiB"


def parse_size(text, name: str = "size") -> int:
    """`8G`, `1.5GiB`, `500MB`, `4096` (or an int) -> bytes.

    Raises:
        ConfigError: naming `name` and the value, for anything else or a negative size.
    """
    if isinstance(text, int) and not isinstance(text, bool):
        value = text
    elif hasattr(text, "__index__") and not isinstance(text, (bool, str)):  # numpy integers
        value = int(text)
    else:
        m = re.fullmatch(r"\s*" + _NUM + r"\s*([a-zA-Z]*)\s*", str(text))
        if m is None or m.group(2).lower() not in _SIZE_UNITS:
            raise ConfigError(f"{name}={text!r} is not a size: use {SIZE_HELP}")
        value = int(float(m.group(1)) * _SIZE_UNITS[m.group(2).lower()])
    if value < 0:
        raise ConfigError(f"{name}={text!r} must not be negative")
    return value


def parse_byte_rate(text, name: str = "bandwidth") -> float:
    """`1G/s`, `500MB/s`, `2GiB/s` -> bytes per second (the size grammar, then `/s`)."""
    m = re.fullmatch(r"\s*(.*?)\s*/\s*s\s*", str(text))
    if m is None:
        raise ConfigError(f"{name}={text!r}: expected bytes per second such as 500MB/s, 1G/s, 2GiB/s")
    try:
        return float(parse_size(m.group(1), name))
    except ConfigError:
        raise ConfigError(f"{name}={text!r}: expected bytes per second such as 500MB/s, 1G/s, 2GiB/s") from None


def parse_duration(text, name: str = "time") -> float:
    """`2ms`, `500us`, `0.5s`, `2min`, `0` -> seconds; a non-zero number needs its unit."""
    s = str(text).strip().lower()
    m = re.fullmatch(_NUM + r"\s*(ns|us|µs|ms|s|min|h)?", s)
    if not m:
        raise ConfigError(f"{name}={text!r}: expected a duration such as 2ms, 500us, 0.01s or 2min")
    value = float(m.group(1))
    if m.group(2) is None:
        if value != 0:
            raise ConfigError(f"{name}={text!r} has no unit: write e.g. {text}ms or {text}s")
        return 0.0
    return value * _TIME_UNITS[m.group(2)]


def _three_digits(x: float) -> str:
    return f"{x:.3g}" if abs(x) >= 100 or x == 0 else (f"{x:.2f}" if abs(x) < 10 else f"{x:.1f}")


def fmt_size(n: float) -> str:
    """Bytes for people: `512 B`, `38.0 kB`, `2.20 MB`, `1.50 GB` (SI)."""
    if n is None or (isinstance(n, float) and not math.isfinite(n)):
        return str(n)
    if abs(n) < 1000:
        return f"{n:.0f} B"
    for unit in ("kB", "MB", "GB", "TB", "PB"):
        n /= 1000.0
        if abs(n) < 999.5 or unit == "PB":
            return f"{_three_digits(n)} {unit}"
    return f"{n} PB"  # pragma: no cover


def fmt_rate(bytes_per_s: float) -> str:
    """Bytes per second for people: `412 MB/s`, `1.20 GB/s` (SI); `unlimited` for infinity."""
    if math.isinf(bytes_per_s):
        return "unlimited"
    return fmt_size(bytes_per_s) + "/s"


def fmt_seconds(s: float) -> str:
    """A duration for people: `850 us`, `3.40 ms`, `1.25 s`, `12.5 min`."""
    if s == 0:
        return "0 s"
    if abs(s) < 1e-3:
        return f"{_three_digits(s * 1e6)} us"
    if abs(s) < 1:
        return f"{_three_digits(s * 1e3)} ms"
    if abs(s) < 600:
        return f"{_three_digits(s)} s"
    return f"{_three_digits(s / 60)} min"
