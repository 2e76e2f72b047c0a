"""simplejpeg alone on a set of samples: the baseline the loader is measured against. No dstore
import, so that `loader_ab.py` can use it with an older dstore on the path.

Each thread decodes its share in a loop and keeps no output, as the loader does (keeping every
decoded image made each decode write fresh pages, a fifth of its rate), and the better of two
passes is taken (the conservative direction for a loader / decoder ratio).
"""

from __future__ import annotations

import concurrent.futures
import time

import simplejpeg


def rate(blobs: list, threads: int, mins: list | None = None) -> float:
    """Samples/s of simplejpeg decoding `blobs` in `threads` threads, at full scale or, with `mins`,
    at (min_height, min_width) per sample; the best of two passes."""
    mins = mins if mins is not None else [(0, 0)] * len(blobs)

    def share(k: int) -> None:
        for b, (mh, mw) in zip(blobs[k::threads], mins[k::threads]):
            simplejpeg.decode_jpeg(b, min_height=mh, min_width=mw)

    best = 0.0
    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        for _ in range(2):
            t0 = time.perf_counter()
            list(pool.map(share, range(threads)))
            best = max(best, len(blobs) / (time.perf_counter() - t0))
    return best


def cpu_rate(blobs: list) -> float:
    """Samples per CPU-second of simplejpeg's full decode of `blobs` in this thread (thread CPU time:
    a per-core figure that a loaded machine's other processes do not lower); the best of two passes."""
    best = 0.0
    for _ in range(2):
        t0 = time.thread_time()
        for b in blobs:
            simplejpeg.decode_jpeg(b)
        best = max(best, len(blobs) / (time.thread_time() - t0))
    return best
