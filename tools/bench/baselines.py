"""What users read with today, over the same samples as the store: a torch DataLoader over the image
folder (one file per sample, as ImageFolder reads it), and per-sample random reads with h5py and zarr.

Every pass is shuffled and split over ranks as torch's DistributedSampler splits it
(`common.rank_split`), and reads raw bytes, as the store's delivery does; decoding is measured
separately (store_bench, training_view).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import numpy as np

from dstore.codec.decode import decode_image, resize
from dstore.errors import ConfigError
from dstore.tools.bench.common import Measurement, evict_on_nodes, measure, rank_split
from dstore.tools.bench.layouts import chunk_bytes

if TYPE_CHECKING:
    import torch

# --- datasets (module level, so DataLoader workers can pickle them under any start method) ----------


class FileBytesDataset:
    """ImageFolder's access pattern without its decode: item i is file i's bytes and its label.

    Args:
        files: one path per sample.
        labels: one label per sample.
        decode: also decode the image and resize it to `size`, as StoreLoader does (same functions).
        size: (H, W) to resize decoded images to.
    """

    def __init__(self, files, labels, decode: bool = False, size=(224, 224)):
        self.files = list(files)
        self.labels = np.asarray(labels, dtype=np.int64)
        self.decode = decode
        self.size = size

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i):
        with open(self.files[i], "rb") as fh:
            data = fh.read()
        if self.decode:
            return decode_resized(data, self.size, self.files[i]), int(self.labels[i])
        return np.frombuffer(data, dtype=np.uint8), int(self.labels[i])


class ContainerSampleDataset:
    """A map-style dataset over a container's `data`/`offsets` arrays read with h5py or zarr directly,
    one slice per sample: what a user writes today to train from an HDF5 file or a Zarr store.

    The file is opened lazily in each process (DataLoader workers each open their own handle).

    Args:
        path: the HDF5 file or the Zarr v3 group directory.
        backend: `h5py` or `zarr`.
        offsets, labels: the container's index arrays (read once by the caller).
        decode, size: also decode the image and resize it to `size` (as FileBytesDataset).
    """

    def __init__(self, path: str, backend: str, offsets, labels, decode: bool = False, size=(224, 224)):
        if backend not in ("h5py", "zarr"):
            raise ConfigError(f"backend={backend!r} is not one of ('h5py', 'zarr')")
        self.path = os.fspath(path)
        self.backend = backend
        self.offsets = np.asarray(offsets, dtype=np.int64)
        self.labels = np.asarray(labels, dtype=np.int64)
        self.decode = decode
        self.size = size
        self._data = None
        self._pid = None

    def __len__(self) -> int:
        return len(self.labels)

    def _array(self):
        if self._data is None or self._pid != os.getpid():
            if self.backend == "h5py":
                import h5py

                data = h5py.File(self.path, "r", locking=False)["data"]
                kind = h5py.Dataset
            else:
                import zarr

                data = zarr.open_group(self.path, mode="r")["data"]
                kind = zarr.Array
            if not isinstance(data, kind):
                raise ConfigError(
                    f"{self.path}: its 'data' is a {type(data).__name__}, not an array; "
                    "delete the copy to have it written again"
                )
            self._data = data
            self._pid = os.getpid()
        return self._data

    def __getitem__(self, i) -> tuple[np.ndarray | torch.Tensor, int]:
        # (asarray: no copy; h5py and zarr return an ndarray for a slice, which their types do not say)
        data = np.asarray(self._array()[int(self.offsets[i]) : int(self.offsets[i + 1])])
        if self.decode:
            return decode_resized(data, self.size, f"{self.path}[{i}]"), int(self.labels[i])
        return data, int(self.labels[i])

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_data"] = None  # handles do not cross processes
        return state


def decode_resized(data, size, name: str):
    """Decode and resize exactly as StoreLoader does (reduced-DCT JPEG decode, bilinear resize) into a
    CHW uint8 tensor, so that every loader in the training view does the same work per sample."""
    import torch

    arr = decode_image(data, channels=3, min_size=size, name=name)
    return torch.from_numpy(np.array(resize(np.ascontiguousarray(arr), size))).permute(2, 0, 1)


def collate_list(items):
    """Keeps a batch as a list of (array, label): raw samples have different lengths."""
    return items


def nbytes_of(item) -> int:
    return int(item[0].nbytes)


# --- passes ---------------------------------------------------------------------------------------


def dataloader_pass(
    comm, dataset, *, name: str, cache: str, evict_paths, batch_size: int, num_workers: int, seed: int, epoch: int = 0
) -> Measurement:
    """One shuffled epoch of `dataset` through a torch DataLoader on every rank at once.

    Args:
        comm: the ranks; each reads its DistributedSampler-like share.
        dataset: a map-style dataset whose items are (array, label).
        name: the measurement's name.
        cache: `cold` evicts `evict_paths` first; `warm` does not.
        evict_paths: the files (or directories) the dataset reads.
        batch_size: the GLOBAL batch size; each rank loads batch_size // ranks per step.
        num_workers: DataLoader worker processes per rank (0: read in the main process).
        seed, epoch: the shuffle.
    """
    from torch.utils.data import DataLoader

    rank, size = comm.Get_rank(), comm.Get_size()
    if cache == "cold":
        evict_on_nodes(comm, evict_paths)
    indices = rank_split(len(dataset), rank, size, seed, epoch).tolist()
    per_rank = max(1, batch_size // size)

    def run():
        loader = DataLoader(
            dataset,
            batch_size=per_rank,
            sampler=indices,
            num_workers=num_workers,
            collate_fn=collate_list,
            prefetch_factor=4 if num_workers else None,
        )
        n = b = 0
        for batch in loader:
            n += len(batch)
            b += sum(nbytes_of(it) for it in batch)
        return n, b

    return measure(comm, name, "baseline", cache, run, batch_size=batch_size, num_workers=num_workers)


def per_sample_pass(
    comm,
    path: str,
    backend: str,
    offsets,
    labels,
    *,
    name: str,
    cache: str,
    seed: int,
    epoch: int = 0,
    limit: int | None = None,
) -> Measurement:
    """Per-sample random reads of this rank's shuffled share with h5py or zarr, in the main process,
    one slice `data[off[i]:off[i+1]]` per sample, with the library's defaults (h5py's 1 MiB chunk cache).

    Args:
        path: the HDF5 file or Zarr group whose `data` is read; its layout decides much of the rate
            (tools/bench/layouts.py), so `name` says which layout it is.
        limit: read at most this many samples per rank (for slow layouts; the rate is what matters).
    """
    rank, size = comm.Get_rank(), comm.Get_size()
    if cache == "cold":
        evict_on_nodes(comm, [path])
    ds = ContainerSampleDataset(path, backend, offsets, labels)
    indices = rank_split(len(ds), rank, size, seed, epoch)
    if limit is not None:
        indices = indices[:limit]
    ds._array()  # open outside the timed pass, as a training script does once

    def run():
        b = 0
        for i in indices:
            b += ds[i][0].nbytes
        return len(indices), b

    return measure(
        comm,
        name,
        "baseline",
        cache,
        run,
        backend=backend,
        path=os.path.abspath(path),
        chunk_bytes=chunk_bytes(path, backend),
    )
