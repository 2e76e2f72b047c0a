"""One grammar for sizes, rates and durations in flags, and one way of printing them.

Reading (every size, rate and time flag and variable): a number, optionally with an exponent, then
a unit. Sizes: B, k/K, M, G, T, P (powers of 1000; kB, MB, GB, TB, PB alike) or KiB, MiB, GiB, TiB,
PiB (powers of 1024), in any case: `8G`, `8GB`, `512MiB`, `1.5e9`. Rates: a size per second, `1G/s`,
`500MB/s`, `2GiB/s`, or operations per second, `800/s`. Durations: ns, us (µs), ms, s, min, h;
`0` alone needs no unit.

Printing (every command's output): SI, powers of 1000, three significant digits: `38.0 kB`,
`2.20 MB`, `412 MB/s`, `1.25 s`, `3.40 ms` (the units of disk and network figures, and of the
benchmark tables), rounded to three digits before the unit is chosen (9996 B is `10.0 kB`, 0.9996 s
`1.00 s`): what is printed reads back. Binary units are accepted on input but never printed.
"""

from __future__ import annotations

import math
import re

from dstore.errors import ConfigError

_NUM = r"([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)"
_SIZE_UNITS = {
    "": 1,
    "b": 1,
    "k": 10**3,
    "kb": 10**3,
    "m": 10**6,
    "mb": 10**6,
    "g": 10**9,
    "gb": 10**9,
    "t": 10**12,
    "tb": 10**12,
    "p": 10**15,
    "pb": 10**15,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
    "pib": 2**50,
}
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
        x = float(m.group(1)) * _SIZE_UNITS[m.group(2).lower()]
        if not math.isfinite(x):  # 1e400: a float's infinity, no number of bytes
            raise ConfigError(f"{name}={text!r} is too large: a size is at most ~1e308 bytes")
        value = int(x)
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


def _round3(x: float) -> tuple[str, int]:
    """`abs(x)` rounded to three significant digits: (its digits, e.g. "100", and the power of ten of
    the first). Rounded first, as decimal text, so that the unit and the decimals are chosen from
    the rounded value (9996 is 1.00e4: `10.0 kB`, never `10.00 kB`; 0.9996 s is `1.00 s`)."""
    mantissa, exp = f"{abs(x):.2e}".split("e")
    return mantissa.replace(".", ""), int(exp)


def _rounded(x: float) -> float:
    """`abs(x)` rounded to three significant digits, as the printed figure will be."""
    return float(f"{abs(x):.2e}")


def _in_unit(x: float, digits: str, exp: int, unit_exp: int) -> str:
    """The three `digits` (first one at 10**exp) written in a unit of 10**unit_exp, exp - unit_exp in 0..2."""
    whole = exp - unit_exp + 1  # digits before the point
    text = digits[:whole] + ("." + digits[whole:] if whole < 3 else "")
    return ("-" if x < 0 else "") + text


def _three_digits(x: float) -> str:
    """`x` to three significant digits (`38.0`, `2.20`, `412`), rounded first (9.996 -> `10.0`)."""
    if x == 0:
        return "0"
    digits, exp = _round3(x)
    if not 0 <= exp <= 2:
        return f"{x:.3g}"
    return _in_unit(x, digits, exp, 0)


_SIZES = ("kB", "MB", "GB", "TB", "PB")


def fmt_size(n: float) -> str:
    """Bytes for people: `512 B`, `38.0 kB`, `2.20 MB`, `1.50 GB` (SI).

    Rounded first, then the unit chosen (`_round3`): the mantissa is always in [1, 1000) with
    three significant digits, bytes below 1000 are whole, and what rounds to 1000 of a unit is
    shown as 1.00 of the next (999.6 -> `1.00 kB`, 999_999 -> `1.00 MB`). From 1000 PB, whole PB.
    """
    if n is None or (isinstance(n, float) and not math.isfinite(n)):
        return str(n)
    if round(abs(n)) < 1000:
        return f"{round(n):.0f} B"
    digits, exp = _round3(n)
    if exp >= 18:
        return f"{n / 1e15:.0f} PB"
    return f"{_in_unit(n, digits, exp, exp // 3 * 3)} {_SIZES[exp // 3 - 1]}"


def fmt_rate(bytes_per_s: float) -> str:
    """Bytes per second for people: `412 MB/s`, `1.20 GB/s` (SI); `unlimited` for infinity."""
    if math.isinf(bytes_per_s):
        return "unlimited"
    return fmt_size(bytes_per_s) + "/s"


def fmt_seconds(s: float) -> str:
    """A duration for people: `850 us`, `3.40 ms`, `1.25 s`, `12.5 min`, `15.0 h` (three significant
    digits, rounded before the unit is chosen: 0.9996 s is `1.00 s`, not `1e+03 ms`). Seconds up to
    600 s, minutes up to 600 min, then hours; below 1 us, ns."""
    if s == 0:
        return "0 s"
    if not math.isfinite(s):
        return f"{s} s"
    digits, exp = _round3(s)
    if exp < -9:
        return f"{s * 1e9:.3g} ns"
    if exp < 0:  # ns (-9..-7), us (-6..-4), ms (-3..-1)
        unit_exp = exp // 3 * 3
        return f"{_in_unit(s, digits, exp, unit_exp)} {({-9: 'ns', -6: 'us', -3: 'ms'})[unit_exp]}"
    if _rounded(s) < 600:
        return f"{_in_unit(s, digits, exp, 0)} s"
    if _rounded(s / 60) < 600:
        return f"{_three_digits(s / 60)} min"
    hours = s / 3600
    return f"{_three_digits(hours)} h" if _rounded(hours) < 1000 else f"{hours:.0f} h"
