"""A tiered store's epochs read from a container in object storage against the same container on
local disk: samples/s, bytes read from storage, storage reads and the requests they made (one rank;
docs/storage.md, "Containers in object storage").

    python -m dstore.tools.measure.object_tier c.h5 --moto            # a moto S3 server on this machine
    python -m dstore.tools.measure.object_tier c.h5 --url s3://b/c.h5  # a copy already there (AWS_* env)

With `--moto` the container is uploaded to moto's server on a free local port and every HTTP request
the server receives is counted (HEAD, LIST and GET alike); with `--url` only the ranged GETs this
process makes are counted. Each setting builds a store whose budget keeps about `--resident` of the
bytes resident (the rest read from storage in every epoch, coalesced runs, `--lookahead` steps
ahead), runs `--epochs` epochs and reports the median of all but the first. A local server has no
network latency, no bandwidth limit and a small per-request cost: its figures show the requests and
bytes a job makes, not what a cloud bucket would take.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import socket
import statistics
import threading
import time

from mpi4py import MPI

from dstore.formats.objects import ObjectFile
from dstore.store.data_store import DataStore


class _Requests(logging.Handler):
    """Counts the requests moto's server logs (werkzeug's access log, one record per request)."""

    def __init__(self):
        super().__init__()
        self.count = 0
        self._lock = threading.Lock()

    def emit(self, record):
        with self._lock:
            self.count += 1


def _moto(path: str) -> tuple[str, object, _Requests]:
    from moto.server import ThreadedMotoServer

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    os.environ.update(
        {
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}",
        }
    )
    import fsspec

    fs = fsspec.filesystem("s3")
    fs.mkdir("measure")
    key = f"measure/{os.path.basename(path.rstrip('/'))}"
    fs.put(path, key, recursive=os.path.isdir(path))
    counter = _Requests()
    log = logging.getLogger("werkzeug")
    log.addHandler(counter)
    log.setLevel(logging.INFO)
    log.propagate = False
    return f"s3://{key}", server, counter


def epochs(container: str, n: int, batch_size: int, resident: float, lookahead: int, counter) -> dict:
    """One setting's figures (see the module docstring)."""
    comm = MPI.COMM_SELF
    kw = dict(batch_size=batch_size, seed=1, storage_lookahead=lookahead)
    with DataStore(comm, container, **kw) as probe:
        budget = probe.tier_overhead() + int(resident * int(probe.layout.nbytes.max()))
    t0 = time.perf_counter()
    with DataStore(comm, container, memory_budget=budget, **kw) as st:
        setup = time.perf_counter() - t0
        storage = st.windows.storage if st.windows is not None else None
        if storage is None:
            raise SystemExit(f"{container}: the store is not tiered (budget {budget} bytes): lower --resident")
        rows = []
        for e in range(n):
            r0, q0, h0 = ObjectFile.total_requests, storage.reads, counter.count if counter else 0
            t = time.perf_counter()
            samples = sum(b.ids.size for b in st.epoch(e))
            dt = time.perf_counter() - t
            s = st.stats
            assert s is not None  # set by the epoch just run
            rows.append(
                {
                    "seconds": dt,
                    "samples_per_s": samples / dt,
                    "bytes_storage": s.bytes_storage,
                    "samples_storage": s.samples_storage,
                    "storage_reads": storage.reads - q0,
                    "ranged_gets": ObjectFile.total_requests - r0,
                    "server_requests": (counter.count - h0) if counter else None,
                }
            )
        kept = rows[1:] or rows
        out = {k: statistics.median(r[k] for r in kept) if kept[0][k] is not None else None for k in kept[0]}
        out.update(
            container=container,
            setup_s=setup,
            resident_fraction=st.tier["resident_fraction"],
            samples=st.num_samples if hasattr(st, "num_samples") else None,
        )
        return out


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").partition("\n")[0])
    p.add_argument("container", help="the local container")
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--moto", action="store_true", help="upload it to a moto S3 server on a free local port")
    where.add_argument("--url", help="its copy in object storage")
    p.add_argument("--epochs", type=int, default=4, help="epochs per setting (the first dropped)")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--resident", type=float, default=0.4, help="fraction of the bytes kept resident")
    p.add_argument("--lookahead", type=int, default=4, help="storage_lookahead (steps of reads in flight)")
    p.add_argument("--out", default=None, help="write the figures as JSON here")
    args = p.parse_args(argv)
    server, counter, url = None, None, args.url
    if args.moto:
        url, server, counter = _moto(args.container)
    try:
        rows = [
            epochs(args.container, args.epochs, args.batch_size, args.resident, args.lookahead, None),
            epochs(url, args.epochs, args.batch_size, args.resident, args.lookahead, counter),
        ]
    finally:
        if server is not None:
            server.stop()  # type: ignore[attr-defined]
    print(
        "| container | resident | epoch s | samples/s | storage samples | storage MB | storage reads | "
        "ranged GETs | server requests |\n|---|---|---|---|---|---|---|---|---|"
    )
    for r in rows:
        print(
            f"| {r['container']} | {r['resident_fraction']:.2f} | {r['seconds']:.3f} | {r['samples_per_s']:.0f} | "
            f"{r['samples_storage']:.0f} | {r['bytes_storage'] / 1e6:.2f} | {r['storage_reads']:.0f} | "
            f"{r['ranged_gets']:.0f} | {'-' if r['server_requests'] is None else int(r['server_requests'])} |"
        )
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
