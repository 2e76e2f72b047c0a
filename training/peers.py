"""`dstore train --loader webdataset|litdata`: the training set read by one of the store's peers,
as `dstore bench --peers` reads it (tools/bench/peers.py: WebDataset's composable pipeline with
shard shuffle and `shuffle(1000)`, 1 MiB reads, in the rank's process; LitData's
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

import os
import time

import numpy as np

from dstore.errors import ChecksumError, ConfigError
from dstore.formats import checksum
from dstore.store import Batch
from dstore.tools.bench.peer_data import PEER_LOADERS, copies_dir

__all__ = ["PEER_LOADERS", "PeerSource", "copies_dir"]


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

    def __init__(self, comm, reader, *, loader: str, batch_size: int, seed: int = 0,
                 sample_range: tuple[int, int] | None = None):
        from dstore.tools.bench import peer_data, peers  # here: the peers' libraries load only when used

        if loader not in PEER_LOADERS:
            raise ConfigError(f"loader={loader!r} is not one of {PEER_LOADERS}")
        why = peers.missing(loader)
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
        copy = peer_data.find_copy(reader, where, loader, seed=self.seed)
        if loader == "webdataset":
            self._peer = peers._WebDataset(comm, copy, 0, True, self.per_rank, self.seed)
        else:
            # its default maps chunks in place, which a FUSE mount refuses (ENODEV): its posix path
            # there, chosen as LitData's users choose it, with LITDATA_POSIX_FAST=0 (train_e2e sets it)
            posix = os.environ.get("LITDATA_POSIX_FAST") == "0"
            self._peer = peers._LitData(comm, copy, 0, self.per_rank, self.seed, os.path.join(where, "litdata-cache"),
                                        posix)
        self._samples = None  # the peer's samples, pass after pass
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
            for samples, labels, ids in self._peer.epoch(self.seed * 1000 + self._pass):
                for x, lab, i in zip(samples, np.asarray(labels).tolist(), np.asarray(ids).tolist()):
                    if i < 0:
                        raise ConfigError(f"--loader {self.loader}: its copy of {self.reader.path} does not name "
                                          "its samples; delete it to have it written again")
                    if self.start <= i < self.stop:
                        found = True
                        yield np.frombuffer(x, dtype=np.uint8) if isinstance(x, bytes) else x, lab, i
            self._pass += 1
            self.stats["peer_passes"] = self._pass
            if not found:
                raise ConfigError(f"--loader {self.loader}: this rank's part of the copy holds none of samples "
                                  f"[{self.start}, {self.stop})")

    def _batch(self, epoch: int, s: int) -> Batch:
        t0 = time.perf_counter()
        got = [next(self._samples) for _ in range(self.per_rank)]
        samples = [g[0] for g in got]
        ids = np.array([g[2] for g in got], dtype=np.int64)
        labels = np.array([g[1] for g in got], dtype=np.int64)
        bad = [int(i) for i, x in zip(ids.tolist(), samples) if checksum(x) != int(self.reader.checksums[i])]
        if bad or not np.array_equal(labels, self.reader.labels[ids]):
            raise ChecksumError(f"--loader {self.loader}: samples {bad or ids.tolist()} of its copy of "
                                f"{self.reader.path} differ from the container's (bytes or labels): a stale copy; "
                                "delete it to have it written again", bad or ids.tolist())
        self.stats["read_s"] += time.perf_counter() - t0
        self.stats["samples_read"] += len(samples)
        self.stats["bytes_read"] += int(sum(x.size for x in samples))
        return Batch(samples=samples, labels=labels, ids=ids, epoch=epoch, step=s, pad=np.zeros(len(ids), bool))

    def epoch(self, epoch: int):
        """Yields this rank's `steps_per_epoch` batches of `epoch` (from the saved step if resuming into it)."""
        first = self._step if epoch == self._epoch else 0
        if self._samples is None:
            self._samples = self._stream()
        for s in range(first, self.steps_per_epoch):
            batch = self._batch(epoch, s)
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
