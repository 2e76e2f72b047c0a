"""Before and after, on the one-image-one-label path: the store alone (batches of raw bytes, samples/s)
and a StoreLoader decoding in threads (no transform beyond a resize, images/s), with whichever dstore
is on the path, so that an older checkout is measured by the same program. Prints one JSON line; run
the two alternately on the same data and compare within one run (a shared machine varies 2x).

    python tools/measure/store_ab.py syn480.h5
    PYTHONPATH=/tmp/oldpath python tools/measure/store_ab.py syn480.h5   # /tmp/oldpath/dstore -> an old datastore/

One warm-up epoch each, then the best of `passes` passes of `epochs` epochs.
"""

import json
import os
import sys
import time

from mpi4py import MPI

import dstore
from dstore.loader.store_loader import StoreLoader
from dstore.store.data_store import DataStore


def best_rate(run, passes: int) -> float:
    """The best samples/s of `passes` calls of `run()` (which returns the samples it delivered)."""
    best = 0.0
    for _ in range(passes):
        t0 = time.perf_counter()
        n = run()
        best = max(best, n / (time.perf_counter() - t0))
    return best


def main(argv: list[str]) -> int:
    path = argv[0]
    epochs = int(argv[1]) if len(argv) > 1 else 20
    passes = int(argv[2]) if len(argv) > 2 else 3
    with DataStore(MPI.COMM_SELF, path, batch_size=32, seed=0) as st:
        e = [0]

        def store_only():
            n = 0
            for _ in range(epochs):
                for b in st.epoch(e[0]):
                    n += len(b)
                e[0] += 1
            return n

        store_only()  # warm-up
        store_rate = best_rate(store_only, passes)
        with StoreLoader(st, decode_threads=2, size=(64, 64), channels=3) as ld:

            def loader():
                n = 0
                for x, _ in ld.epoch(e[0]):
                    n += len(x)
                e[0] += 1
                return n

            loader()  # warm-up
            loader_rate = best_rate(loader, passes)
    print(
        json.dumps(
            {
                "code": os.path.dirname(dstore.__file__),
                "store_samples_per_s": round(store_rate),
                "loader_images_per_s": round(loader_rate, 1),
            }
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
