"""A sample's random draws as a pure function of its key (seed, epoch, sample id[, source]):
`KeyedDraws`, the few Generator methods an augmentation draws from, in plain Python integers.

Why not `numpy.random.default_rng(key)`: in a decode worker, between two decodes that evict the
caches, making that Generator took 107 us per sample and the trainer's three draws from it 62 us,
against about 20 us for both in a tight loop (measured here): a tenth of a worker's time per 224px
sample. A keyed splitmix64 stream is a few integer operations per draw, the same on every machine,
in threads and in worker processes alike.

The stream: the key's values are folded into one 64-bit state by splitmix64's finaliser, then
draw k is the finaliser of state + k * golden (the splitmix64 sequence). `integers(lo, hi)` maps a
draw to [lo, hi) by multiply-and-shift (Lemire; a bias below (hi - lo) / 2^64), `random()` takes
its top 53 bits.
"""

from __future__ import annotations

from typing import overload

_MASK = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15


def _finalise(z: int) -> int:
    """splitmix64's output function of a 64-bit state."""
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return z ^ (z >> 31)


class KeyedDraws:
    """Random draws determined by `key` alone (integers, e.g. seed, epoch, sample id): the subset of
    numpy's Generator that augmentations use (`integers`, `random`, `uniform`), scalars or tuples."""

    __slots__ = ("_state",)

    def __init__(self, *key: int):
        state = 0x243F6A8885A308D3
        for k in key:
            state = _finalise(((state ^ (int(k) & _MASK)) + _GOLDEN) & _MASK)
        self._state = state

    def next64(self) -> int:
        """The stream's next 64-bit value."""
        self._state = (self._state + _GOLDEN) & _MASK
        return _finalise(self._state)

    @overload
    def integers(self, low: int, high: int, size: None = None) -> int: ...
    @overload
    def integers(self, low: int, high: int, size: int) -> tuple[int, ...]: ...
    def integers(self, low: int, high: int, size: int | None = None) -> int | tuple[int, ...]:
        """An integer in [low, high) (a tuple of `size` with size given), as numpy's Generator.integers."""
        n = int(high) - int(low)
        if n <= 0:
            raise ValueError(f"integers: high={high} must be above low={low}")
        if size is None:
            return int(low) + ((self.next64() * n) >> 64)
        return tuple(int(low) + ((self.next64() * n) >> 64) for _ in range(int(size)))

    def random(self) -> float:
        """A float in [0, 1) (53 random bits)."""
        return (self.next64() >> 11) * (1.0 / (1 << 53))

    @overload
    def uniform(self, low: float, high: float, size: None = None) -> float: ...
    @overload
    def uniform(self, low: float, high: float, size: int) -> tuple[float, ...]: ...
    def uniform(self, low: float, high: float, size: int | None = None) -> float | tuple[float, ...]:
        """A float in [low, high) (a tuple of `size` with size given)."""
        if size is None:
            return low + (high - low) * self.random()
        return tuple(low + (high - low) * self.random() for _ in range(int(size)))


def draws_for(transform, key):
    """What a seeded `transform` draws sample `key` from: a KeyedDraws where it says it takes one
    (a true `keyed` attribute, as ImageTransform), else numpy's Generator seeded with `key`. The
    one rule of the decode threads (dstore.loader.store_loader) and the decode workers (dstore.loader.decode_worker)."""
    if getattr(transform, "keyed", False):
        return KeyedDraws(*key)
    import numpy as np

    return np.random.default_rng(list(key))
