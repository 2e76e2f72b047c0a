"""Before and after: the loader (StoreLoader(workers=N), the trainer's transform at 224) against the
decoder alone (simplejpeg's full decode in N threads, no decoded image kept, the better of two
passes), with whichever dstore is on the path, so that an older checkout can be measured by the
same program. Prints one JSON line.

    DSTORE_NATIVE_AFTER=1 python tools/measure/loader_ab.py syn480.h5 2
    PYTHONPATH=/tmp/oldpath python tools/measure/loader_ab.py syn480.h5 2   # /tmp/oldpath/dstore -> an old datastore/

(an old checkout needs its `training` and `tools` linked inside its `datastore/`, as the editable
install lays them out). 6 warm-up epochs (workers started, kernels loaded), then 3 timed.
"""

import json
import os
import sys
import time

from mpi4py import MPI

import dstore
from dstore.loader.store_loader import StoreLoader
from dstore.store.data_store import DataStore
from dstore.training.augment import ImageTransform, default_augmentation

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import decoder_alone


def main(argv: list[str]) -> int:
    path, n = argv[0], int(argv[1])
    s = (224, 224)
    pad, flip = default_augmentation(s)
    tf = ImageTransform(
        size=s, channels=3, mean=(0.45,) * 3, std=(0.25,) * 3, train=True, pad=pad, flip=flip, normalize=False
    )
    with DataStore(MPI.COMM_SELF, path, batch_size=64, seed=0) as st:
        blobs = []
        for b in st.epoch(0):
            blobs += [bytes(x) for x in b.samples]

        best = decoder_alone.rate(blobs, n)
        with StoreLoader(st, transform=tf, workers=n, resize_on="worker") as ld:
            for e in range(6):  # warm-up: workers started, kernels loaded (DSTORE_NATIVE_AFTER=1)
                for _ in ld.epoch(e):
                    pass
            native = getattr(ld.workers, "native", None)
            t0, k = time.perf_counter(), 0
            for e in range(6, 9):
                for x, _ in ld.epoch(e):
                    k += len(x)
            rate = k / (time.perf_counter() - t0)
    print(
        json.dumps(
            {
                "code": os.path.dirname(dstore.__file__),
                "workers": n,
                "loader": rate,
                "decoder": best,
                "ratio": rate / best,
                "native": native,
            }
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
