"""One check for every boolean, integer and number option (config objects, flags, config files and
environment variables alike), so `"false"` means one thing everywhere (issue 39).

The rule: an option's value is a value of its kind, or that value's text (as an environment variable
or a file would give it). A boolean is True/False (numpy's too), 1/0, or one of the texts
`1 true yes on` / `0 false no off` (any case); an integer is an int (numpy's too) or its decimal
text, never a bool or a float; a number is an int or float or its text, finite unless said. Any
other value is a ConfigError in one line naming the option, its value and what is allowed. Bounds
are checked here too, so a seed, a count or a thread number out of range is refused the same way.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from dstore.errors import ConfigError

TRUE = ("1", "true", "yes", "on")
FALSE = ("0", "false", "no", "off")
"""The texts of True and of False (compared lower-cased and stripped)."""

MAX_SEED = 2**63
"""Seeds are below this (a container records its ingest's seed as an int64 attribute)."""

MAX_BUFFERS = 1024
"""The most batches or steps a store or a loader may hold in flight (`prefetch`, `storage_lookahead`,
`ahead`), and the most threads it may start: each is an object, a buffer and a request of its own."""


def boolean(name: str, value: Any) -> bool:
    """`value` as a bool by the module's rule; ConfigError naming `name` otherwise."""
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (int, np.integer)) and value in (0, 1):
        return bool(value)
    if isinstance(value, str):
        text = value.strip().lower()
        if text in TRUE:
            return True
        if text in FALSE:
            return False
    raise ConfigError(f"{name}={value!r} must be a boolean: True/False, or one of {'/'.join(TRUE + FALSE)}")


def _bounds(value, minimum, maximum) -> str:
    """The bound `value` breaks (both where it is not a number or breaks none)."""
    low = minimum is not None and (value is None or value < minimum)
    high = maximum is not None and (value is None or value > maximum)
    if value is None and minimum is not None and maximum is not None:
        return f" in [{minimum}, {maximum}]"
    return f" >= {minimum}" if low else f" <= {maximum}" if high else ""


def integer(name: str, value: Any, minimum: int | None = None, maximum: int | None = None, *, why: str = "") -> int:
    """`value` as an int in [minimum, maximum] (None: unbounded); ConfigError naming `name`, with
    `why` (the reason for the bound) appended."""
    number = value
    if isinstance(value, str):
        try:
            number = int(value.strip(), 10)
        except ValueError:
            number = None
    if isinstance(number, (bool, np.bool_)) or not isinstance(number, (int, np.integer)):
        number = None
    if number is None or _bounds(number, minimum, maximum):
        raise ConfigError(f"{name}={value!r} must be an integer{_bounds(number, minimum, maximum)}{why}")
    return int(number)


def optional_integer(
    name: str, value: Any, minimum: int | None = None, maximum: int | None = None, *, why: str = ""
) -> int | None:
    """None, or `value` checked as `integer` does."""
    return None if value is None else integer(name, value, minimum, maximum, why=why)


def number(
    name: str,
    value: Any,
    minimum: float | None = None,
    maximum: float | None = None,
    *,
    finite: bool = True,
    why: str = "",
) -> float:
    """`value` as a float in [minimum, maximum], finite unless `finite=False` (nan is never taken);
    ConfigError naming `name` otherwise."""
    x = None
    if not isinstance(value, (bool, np.bool_)) and isinstance(value, (int, float, np.integer, np.floating, str)):
        try:
            x = float(value)
        except (ValueError, OverflowError):
            x = None
    if x is not None and (math.isnan(x) or (finite and math.isinf(x))):
        x = None
    if x is None or _bounds(x, minimum, maximum):
        raise ConfigError(
            f"{name}={value!r} must be a {'finite ' if finite else ''}number{_bounds(x, minimum, maximum)}{why}"
        )
    return x


def seed(name: str, value: Any, limit: int = MAX_SEED) -> int:
    """`value` as a seed: an integer in [0, limit) (limit a power of two); ConfigError naming `name`."""
    try:
        return integer(name, value, 0, limit - 1)
    except ConfigError:
        raise ConfigError(f"{name}={value!r} must be an integer seed in [0, 2**{limit.bit_length() - 1})") from None


def _any_number(name: str, value: Any) -> float:
    """`value` (or its text) as a float of any value, nan and inf included: the kind only, a config
    checks its bounds and finiteness itself."""
    if not isinstance(value, (bool, np.bool_)) and isinstance(value, (int, float, np.integer, np.floating, str)):
        try:
            return float(value)
        except (ValueError, OverflowError):
            pass
    raise ConfigError(f"{name}={value!r} must be a number")


_KINDS = {"bool": boolean, "int": integer, "float": _any_number}


def typed(config: Any, names=None) -> dict[str, Any]:
    """Each field of the dataclass `config` whose annotation is `bool`, `int` or `float` (or one of
    them `| None`, where None stays None) checked as its kind by this module's rule: {name: value}
    of the normalised values (bounds, finiteness too, are the config's own to check). `names`: only these fields.
    A config that calls this cannot leave a new boolean or number unchecked by omission."""
    out = {}
    for f in dataclasses.fields(config):
        if names is not None and f.name not in names:
            continue
        kind = str(f.type).replace(" ", "")
        optional = kind.endswith("|None")
        check = _KINDS.get(kind.removesuffix("|None"))
        if check is None:
            continue
        value = getattr(config, f.name)
        out[f.name] = None if (optional and value is None) else check(f.name, value)
    return out
