"""Run under mpiexec by test_scale as `scale_run.py CONTAINER RESULTS_DIR`: each rank opens a store
and records whether its container reader read the index (only the first rank of each node may, and
drops it for the shared copy), whether its offsets/labels are the node's shared copy (read-only),
and the ids it delivered in epoch 1, as RESULTS_DIR/rank<r>.json."""

import json
import os
import sys

import numpy as np
from mpi4py import MPI

from dstore.formats import open_container
from dstore.store.data_store import DataStore

path, out = sys.argv[1], sys.argv[2]
comm = MPI.COMM_WORLD
with open_container(path) as ref:
    want_off, want_lab = ref.offsets[3:] - ref.offsets[3], ref.labels[3:]
with DataStore(comm, path, batch_size=8, seed=5, sample_range=(3, ref.num_samples)) as st:
    index = st._index
    assert index is not None  # open while the store is
    row = {
        "loaded": st.container.index_loaded,
        "node_size": index.node_size,
        "bytes_read": index.bytes_read,
        "writable": bool(st.offsets.flags.writeable),
        "same": bool(np.array_equal(st.offsets, want_off) and np.array_equal(st.labels, want_lab)),
        "ids": [int(i) for b in st.epoch(1) for i, p in zip(b.ids, b.pad) if not p],
    }
with open(os.path.join(out, f"rank{comm.Get_rank()}.json"), "w") as f:
    json.dump(row, f)
