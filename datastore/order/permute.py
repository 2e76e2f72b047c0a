"""A keyed bijection of [0, n): position of an epoch's order -> sample id in O(1), no table.

`Permutation(n, key)` maps any array of positions to the ids at those positions of one pseudo-random
permutation of ``range(n)``, vectorised in numpy, without ever building the permutation: a rank
computes only its own part of an epoch's order (O(N/P) memory) and every rank agrees on the whole
of it, whatever the number of ranks. It is a balanced Feistel network over the smallest even number
of bits ``2h`` with ``4**h >= n`` (so the domain is under 4n), made a bijection of [0, n) by
cycle-walking: a value that lands at or beyond n is permuted again until it falls inside (each step
stays a bijection of the domain, so the walk ends, and what it reaches is a bijection of [0, n)).

Round function: the splitmix64 finaliser of (right half + round key), masked to h bits; the round
keys come from numpy's SeedSequence of the caller's key, so different (seed, epoch) give unrelated
permutations. Eight rounds: well past the four that make a Feistel network a pseudo-random
permutation (Luby-Rackoff); the tests check uniformity of positions and pairwise order statistics.
"""

from __future__ import annotations

import numpy as np

ROUNDS = 8
"""Feistel rounds."""

CHUNK = 1 << 20
"""Positions mapped per pass: bounds the temporaries at a few tens of bytes times this."""

_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser (a bijective avalanche of 64 bits), in place on a uint64 array."""
    x ^= x >> np.uint64(30)
    x *= _M1
    x ^= x >> np.uint64(27)
    x *= _M2
    x ^= x >> np.uint64(31)
    return x


class Permutation:
    """One keyed permutation of ``range(n)``; `perm[positions]` gives the ids at those positions.

    Args:
        n: the domain size (>= 0).
        key: a sequence of non-negative ints (e.g. (seed, epoch, stream)) the permutation is a pure
            function of, with n.
    """

    def __init__(self, n: int, key):
        self.n = int(n)
        if self.n < 0:
            raise ValueError(f"n={n} must be >= 0")
        bits = max(2, int(self.n - 1).bit_length()) if self.n > 1 else 2
        self.half = (bits + 1) // 2
        self._mask = np.uint64((1 << self.half) - 1)
        self._keys = np.random.SeedSequence([int(k) for k in key] + [self.n]).generate_state(ROUNDS, dtype=np.uint64)

    def __len__(self) -> int:
        return self.n

    @property
    def size(self) -> int:
        """n, as an index array's ``size`` (dstore.order.plan takes either)."""
        return self.n

    def _rounds(self, x: np.ndarray, inverse: bool) -> np.ndarray:
        """One pass of the Feistel network (or its inverse) over the 2h-bit domain."""
        h, mask = np.uint64(self.half), self._mask
        left, right = x >> h, x & mask
        keys = self._keys[::-1] if inverse else self._keys
        for k in keys:
            if inverse:  # undo (L, R) -> (R, L ^ F(R)): from (L', R') back to (R' ^ F(L'), L')
                left, right = right ^ (_mix(left + k) & mask), left
            else:
                left, right = right, left ^ (_mix(right + k) & mask)
        return (left << h) | right

    def _walk(self, x: np.ndarray, inverse: bool) -> np.ndarray:
        x = self._rounds(x, inverse)
        out = np.nonzero(x >= self.n)[0]
        while out.size:  # cycle-walking: values outside [0, n) go round again
            y = self._rounds(x[out], inverse)
            x[out] = y
            out = out[y >= self.n]
        return x

    def _apply(self, values, inverse: bool) -> np.ndarray:
        v = np.asarray(values)
        flat = v.reshape(-1)
        if flat.size and (int(flat.min()) < 0 or int(flat.max()) >= self.n):
            raise IndexError(f"value outside [0, {self.n}) given to a permutation of {self.n}")
        res = np.empty(flat.size, dtype=np.int64)
        for a in range(0, flat.size, CHUNK):
            res[a : a + CHUNK] = self._walk(flat[a : a + CHUNK].astype(np.uint64), inverse).astype(np.int64)
        return res.reshape(v.shape)

    def __getitem__(self, positions) -> np.ndarray:
        """The ids at `positions` (an int, a slice or an int array; int64 result of the same shape)."""
        if isinstance(positions, slice):
            positions = np.arange(*positions.indices(self.n), dtype=np.int64)
        if np.ndim(positions) == 0:
            return self._apply(np.asarray([positions]), False)[0]
        return self._apply(positions, False)

    def position_of(self, ids) -> np.ndarray:
        """The positions holding `ids` (the inverse map)."""
        return self._apply(ids, True)

    def __array__(self, dtype=None, copy=None):
        """The whole permutation (O(n) memory: for tests and small n)."""
        out = self[0 : self.n]
        return out if dtype is None else out.astype(dtype)
