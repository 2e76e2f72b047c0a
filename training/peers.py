"""The store's peers, WebDataset and LitData, read as their users read them (`WebDatasetPeer`,
`LitDataPeer`: what `dstore bench --peers` measures, tools/bench/peers.py), and `dstore train
--loader webdataset|litdata` over them (`PeerSource`: WebDataset's composable pipeline with shard
shuffle and `shuffle(1000)`, 1 MiB reads, in the rank's process; LitData's
`StreamingDataset(shuffle=True)`), so that `train_e2e --loaders` compares whole training jobs.

The peer reads the copies of the container that its writer left beside it (tools/bench/peer_data:
tar shards or LitData chunks of every sample, each named by its index in the container; `train_e2e`
writes them before it mounts anything). What a peer user does for DDP is done here too: the peer's
stream is repeated pass after pass (each pass seeded anew) and cut into `steps_per_epoch` batches
of `batch_size / ranks` samples on every rank (WebDataset's `.repeat().with_epoch(n)`), so every
rank takes the same number of steps; samples outside the training range (the held-out tail) are
dropped. Every delivered sample is checked against the container's checksum, as the store checks
what it reads, so a stale copy fails naming the sample instead of training on other bytes. The
held-out and tournament sets are read from the container (training.data.DirectSource).
"""

from __future__ import annotations

import dataclasses
import importlib
import itertools
import os
import time
import zlib
from collections.abc import Iterator

import numpy as np

from dstore.errors import ChecksumError, ConfigError
from dstore.formats import checksum

# No MPI at module level: the peers' DataLoader workers (spawned) unpickle this module's helpers.
PEER_LOADERS = ("webdataset", "litdata")
"""`dstore train --loader` names of the peers."""
LITDATA_KEY = "#index"
"""The marker suffix of LitData copies whose items hold their sample index (older ones are rewritten)."""
SHUFFLE_BUFFER = 1000
"""WebDataset's `shuffle(1000)`: the buffer its documentation and examples use."""
WDS_BUFFER = 1 << 20
"""The buffered read: WebDataset's `GOPEN_BUFFER` of 1 MiB, which its composable pipeline's opener
(`tarfile_to_samples` -> gopen) honours. As shipped, the `WebDataset` class opens local shards with
a plain `open(path, "rb")` (webdataset/cache.py, StreamingOpen), so the tar reader's 512-byte
blocks reach the file system as 8 KiB reads whatever GOPEN_BUFFER says."""


def missing(module: str) -> str | None:
    """Why `module` cannot be used here (None: it imports)."""
    try:
        __import__(module)
    except Exception as exc:  # noqa: BLE001 - any import failure is a reason to skip the row
        return (
            f"{module} is not installed ({type(exc).__name__}: {exc}); bash tools/setup_peers.sh (docs/benchmarks.md)"
        )
    return None


def _collate(samples):
    """(list of sample bytes, int64 labels, int64 sample indices) of a batch of (key, bytes, label)
    triples (the tar members are named by the sample's index in the container: peer_data.write_tars)."""
    return (
        [s[1] for s in samples],
        np.array([int(s[2]) for s in samples], dtype=np.int64),
        np.array([int(s[0]) for s in samples], dtype=np.int64),
    )


@dataclasses.dataclass(frozen=True)
class _RankSplit:
    """WebDataset's nodesplitter for this rank: every `size`-th shard from `rank` (a class: the
    DataLoader's spawned workers pickle it)."""

    rank: int
    size: int

    def __call__(self, src):
        return itertools.islice(src, self.rank, None, self.size)


class WebDatasetPeer:
    """WebDataset over tar shards as its users read it: the composable pipeline with 1 MiB reads
    (`buffered`) or the `WebDataset` class as shipped; shard shuffle + `shuffle(1000)`, split by rank
    (and worker); `epoch(e)` yields (sample bytes, labels, sample indices) batches of `batch`."""

    def __init__(self, comm, shards, workers, buffered, batch, seed):
        self.comm, self.shards, self.workers, self.batch, self.seed = comm, shards, workers, batch, seed
        self.buffered = buffered
        if buffered:  # read by gopen when it opens a shard (in the worker processes too)
            os.environ["GOPEN_BUFFER"] = str(WDS_BUFFER)

    def epoch(self, e):
        # from its modules: webdataset's own stubs (__init__.pyi) do not re-export these names
        from webdataset.compat import WebDataset, WebLoader
        from webdataset.filters import batched, detshuffle, shuffle, to_tuple
        from webdataset.pipeline import DataPipeline
        from webdataset.shardlists import SimpleShardList, split_by_worker
        from webdataset.tariterators import tarfile_to_samples

        split = _RankSplit(self.comm.Get_rank(), self.comm.Get_size())
        seed = self.seed * 1000 + e  # a fresh pipeline per epoch seeded with it: what set_epoch gives
        if self.buffered:  # the composable pipeline of WebDataset's documentation
            ds = DataPipeline(
                SimpleShardList(self.shards),
                split,
                split_by_worker,
                detshuffle(len(self.shards), seed=seed),
                tarfile_to_samples(),
                shuffle(SHUFFLE_BUFFER, seed=seed + 1),
                to_tuple("__key__", "jpg", "cls"),
                batched(self.batch, collation_fn=_collate, partial=True),
            )
        else:  # the WebDataset class, as shipped
            ds = (
                WebDataset(
                    self.shards,
                    shardshuffle=len(self.shards),
                    seed=seed,
                    detshuffle=True,
                    nodesplitter=split,
                    empty_check=False,
                )
                .shuffle(SHUFFLE_BUFFER, seed=seed + 1)
                .to_tuple("__key__", "jpg", "cls")
                .batched(self.batch, collation_fn=_collate, partial=True)
            )
            # webdataset's stubs type each step of the chain as FluidInterface; it returns the WebDataset
            if not isinstance(ds, DataPipeline):
                raise TypeError(f"webdataset's chain gave a {type(ds).__name__}, not a pipeline")
        it = ds if self.workers == 0 else WebLoader(ds, batch_size=None, num_workers=self.workers)
        yield from it

    def close(self):
        os.environ.pop("GOPEN_BUFFER", None)


def _lit_collate(items):
    """(samples, labels, sample indices: -1 in copies written before they held them)."""
    return (
        [np.frombuffer(x["data"], dtype=np.uint8) for x in items],
        np.array([int(x["label"]) for x in items]),
        np.array([int(x.get("index", -1)) for x in items], dtype=np.int64),
    )


class LitDataPeer:
    """LitData's StreamingDataset(shuffle=True) + StreamingDataLoader over an optimized directory
    (`posix`: LITDATA_POSIX_FAST=0); `epoch(e)` yields (samples, labels, sample indices)."""

    def __init__(self, comm, path, workers, batch, seed, cache_dir, posix):
        # by name: an optional peer (tools/setup_peers.sh) that the type check's environment lacks
        litdata = importlib.import_module("litdata")

        os.environ.update(WORLD_SIZE=str(comm.Get_size()), GLOBAL_RANK=str(comm.Get_rank()), NNODES="1")
        if posix:
            os.environ["LITDATA_POSIX_FAST"] = "0"
        else:
            os.environ.pop("LITDATA_POSIX_FAST", None)
        self.ds = litdata.StreamingDataset(path, shuffle=True, seed=seed, cache_dir=cache_dir)
        self.dl = litdata.StreamingDataLoader(self.ds, batch_size=batch, num_workers=workers, collate_fn=_lit_collate)

    def epoch(self, e):
        yield from self.dl

    def close(self):
        os.environ.pop("LITDATA_POSIX_FAST", None)


def copies_dir(container_path: str) -> str:
    """Where the peers' copies of a container lie: `peers/` beside it (as `dstore bench --peers`
    writes them under its data directory: tools/bench/peer_data)."""
    return os.path.join(os.path.dirname(os.path.abspath(container_path)), "peers")


def find_copy(reader, out_dir: str, loader: str, *, seed: int, kind: str = "shuffled"):
    """The tar shards (`webdataset`) or LitData directory (`litdata`) of `reader`'s container in
    `out_dir`, checked to be copies of it: the marker its writer left (tools/bench/peer_data) names
    the container's offsets (CRC32, as layouts.source_key writes it) and the seed; not its path,
    which differs through a mount. Raises ConfigError naming what to run where missing or stale."""
    stem = os.path.join(out_dir, os.path.splitext(os.path.basename(os.path.normpath(reader.path)))[0])
    d = f"{stem}.wds-{kind}" if loader == "webdataset" else f"{stem}.litdata-{kind}"
    offsets = np.ascontiguousarray(reader.offsets, dtype=np.int64)
    want = f"#{int(offsets[-1])}#{zlib.crc32(offsets.tobytes()):08x}#seed{seed}#"
    try:
        with open(d + ".done") as fh:
            marker = fh.read()
    except OSError:
        marker = ""
    if want not in marker or (loader == "litdata" and not marker.endswith(LITDATA_KEY)):
        raise ConfigError(
            f"--loader {loader}: no current copy of {reader.path} at {d} (seed {seed}); write it with "
            f"python -m dstore.tools.bench.train_e2e (it writes the copies beside the container) or "
            f"dstore bench --peers --container {reader.path}"
        )
    if loader == "webdataset":
        return sorted(os.path.join(d, n) for n in os.listdir(d) if n.endswith(".tar"))
    return d


class PeerSource:
    """A DataStore look-alike over a peer loader (see the module docstring).

    Args:
        comm: this trainer's communicator (rank and size; the peer splits its shards by them).
        reader: the open container (not owned): labels and checksums, and where the copies are.
        loader: "webdataset" or "litdata".
        batch_size: the global batch; each rank takes batch_size // ranks samples a step.
        seed: the peer's seed (pass p of the peer is seeded seed * 1000 + p, as the bench's epochs).
        sample_range: the training samples (start, stop); others are dropped.
    """

    def __init__(
        self, comm, reader, *, loader: str, batch_size: int, seed: int = 0, sample_range: tuple[int, int] | None = None
    ):
        if loader not in PEER_LOADERS:
            raise ConfigError(f"loader={loader!r} is not one of {PEER_LOADERS}")
        why = missing(loader)
        if why:
            raise ConfigError(f"--loader {loader}: {why}")
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        self.reader, self.info, self.loader = reader, reader.info, loader
        self.batch_size, self.seed = int(batch_size), int(seed)
        self.per_rank = self.batch_size // self.size
        if self.per_rank < 1:
            raise ConfigError(f"--loader {loader}: batch_size={batch_size} gives no sample per rank on {self.size}")
        self.start, self.stop = sample_range or (0, reader.num_samples)
        self.num_samples = self.stop - self.start
        self.steps_per_epoch = max(1, self.num_samples // self.batch_size)
        where = copies_dir(reader.path)
        copy = find_copy(reader, where, loader, seed=self.seed)
        self._peer: WebDatasetPeer | LitDataPeer | None
        if loader == "webdataset":
            self._peer = WebDatasetPeer(comm, copy, 0, True, self.per_rank, self.seed)
        else:
            # its default maps chunks in place, which a FUSE mount refuses (ENODEV): its posix path
            # there, chosen as LitData's users choose it, with LITDATA_POSIX_FAST=0 (train_e2e sets it)
            posix = os.environ.get("LITDATA_POSIX_FAST") == "0"
            self._peer = LitDataPeer(
                comm, copy, 0, self.per_rank, self.seed, os.path.join(where, "litdata-cache"), posix
            )
        self._samples: Iterator[tuple] | None = None  # the peer's samples, pass after pass
        self._pass = 0
        self._epoch, self._step = 0, 0
        self.stats = {"read_s": 0.0, "bytes_read": 0, "samples_read": 0, "peer_passes": 0}

    def state_dict(self) -> dict:
        """(seed, epoch, step) of the next batch (a resumed peer restarts its stream: its own order)."""
        return {"seed": self.seed, "epoch": self._epoch, "step": self._step}

    def load_state_dict(self, state: dict) -> None:
        self._epoch, self._step = int(state["epoch"]), int(state["step"])

    def _stream(self):
        """(bytes, label, index) of the training samples the peer delivers, pass after pass."""
        while True:
            found = False
            if self._peer is None:
                raise ValueError(f"--loader {self.loader}: the source is closed")
            for samples, labels, ids in self._peer.epoch(self.seed * 1000 + self._pass):
                for x, lab, i in zip(samples, np.asarray(labels).tolist(), np.asarray(ids).tolist()):
                    if i < 0:
                        raise ConfigError(
                            f"--loader {self.loader}: its copy of {self.reader.path} does not name "
                            "its samples; delete it to have it written again"
                        )
                    if self.start <= i < self.stop:
                        found = True
                        yield np.frombuffer(x, dtype=np.uint8) if isinstance(x, bytes) else x, lab, i
            self._pass += 1
            self.stats["peer_passes"] = self._pass
            if not found:
                raise ConfigError(
                    f"--loader {self.loader}: this rank's part of the copy holds none of samples "
                    f"[{self.start}, {self.stop})"
                )

    def _batch(self, stream: Iterator[tuple], epoch: int, s: int):
        from dstore.store.data_store import Batch  # here: it initialises MPI (see the imports)

        t0 = time.perf_counter()
        got = [next(stream) for _ in range(self.per_rank)]
        samples = [g[0] for g in got]
        ids = np.array([g[2] for g in got], dtype=np.int64)
        labels = np.array([g[1] for g in got], dtype=np.int64)
        bad = [int(i) for i, x in zip(ids.tolist(), samples) if checksum(x) != int(self.reader.checksums[i])]
        if bad or not np.array_equal(labels, self.reader.labels[ids]):
            raise ChecksumError(
                f"--loader {self.loader}: samples {bad or ids.tolist()} of its copy of "
                f"{self.reader.path} differ from the container's (bytes or labels): a stale copy; "
                "delete it to have it written again",
                bad or ids.tolist(),
            )
        self.stats["read_s"] += time.perf_counter() - t0
        self.stats["samples_read"] += len(samples)
        self.stats["bytes_read"] += int(sum(x.size for x in samples))
        return Batch(samples=samples, labels=labels, ids=ids, epoch=epoch, step=s, pad=np.zeros(len(ids), bool))

    def epoch(self, epoch: int):
        """Yields this rank's `steps_per_epoch` batches of `epoch` (from the saved step if resuming into it)."""
        first = self._step if epoch == self._epoch else 0
        if self._samples is None:
            self._samples = self._stream()
        stream = self._samples
        for s in range(first, self.steps_per_epoch):
            batch = self._batch(stream, epoch, s)
            self._epoch, self._step = epoch, s + 1
            yield batch
        self._epoch, self._step = epoch + 1, 0

    def close(self) -> None:
        peer, self._peer = self._peer, None
        if peer is not None:
            peer.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False
