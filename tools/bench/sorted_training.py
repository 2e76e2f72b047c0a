"""What shuffle quality does to a model: the same small model trained on a class-sorted archive
through WebDataset's buffer and through the store, held-out accuracy side by side.

Data: scikit-learn's digits (1,797 real 8x8 images, 10 classes, shipped with it); 20% held out (a
seeded split), the rest written class-sorted as a raw container and as tar shards (what packing a
folder of class directories as it lies gives). Model: logistic regression (a linear layer on the 64
pixels), SGD with momentum, batch 64, the same initial weights for every loader. One process.

    python -m dstore.tools.bench.sorted_training --out DIR [--epochs 5] [--seed 0]
"""

from __future__ import annotations

import argparse
import json
import os

import numpy as np

from dstore.tools.bench import peer_data, peers

BATCH = 64


def write_sets(out_dir: str, seed: int):
    """(class-sorted container path, its tar shards, held-out images float32[n, 64], held-out labels)."""
    from dstore.formats import create_writer
    from dstore.ingest.digits import digits_arrays

    images, labels = digits_arrays()
    perm = np.random.default_rng([seed, 3]).permutation(labels.size)
    cut = labels.size // 5
    held, train = perm[:cut], perm[cut:]
    train = train[np.argsort(labels[train], kind="stable")]  # class-sorted
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, "digits-class-sorted.h5")
    with create_writer(
        path,
        "hdf5",
        encoding="raw",
        raw_dtype="uint8",
        raw_shape=(8, 8, 1),
        class_names=[str(i) for i in range(10)],
        overwrite=True,
        source="digits, class-sorted",
    ) as w:
        for i in train.tolist():
            w.append(images[i].tobytes(), int(labels[i]), f"digits[{i}]", source_index=i)
    shards = peer_data.write_tars(path, np.arange(train.size), os.path.join(out_dir, "digits-wds"), per_shard=120)
    x = images[held].reshape(held.size, 64).astype(np.float32) / 255.0
    return path, shards, x, labels[held]


def _features(samples) -> np.ndarray:
    return np.stack([np.frombuffer(bytes(s), dtype=np.uint8) for s in samples]).astype(np.float32) / 255.0


def train(batches_of_epoch, epochs: int, seed: int, held_x, held_y) -> dict:
    """Trains a fresh linear model on `batches_of_epoch(e)` (lists of sample bytes, labels); returns
    the held-out accuracy after each epoch."""
    import torch

    torch.manual_seed(seed)
    model = torch.nn.Linear(64, 10)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    acc = []
    hx, hy = torch.from_numpy(held_x), torch.from_numpy(held_y)
    for e in range(epochs):
        for samples, labels, *_ in batches_of_epoch(e):
            x = torch.from_numpy(_features(samples))
            loss = torch.nn.functional.cross_entropy(model(x), torch.as_tensor(np.asarray(labels), dtype=torch.long))
            opt.zero_grad()
            loss.backward()
            opt.step()
        with torch.no_grad():
            acc.append(float((model(hx).argmax(1) == hy).float().mean()))
    return {"accuracy": acc}


def run(out_dir: str, epochs: int = 5, seed: int = 0) -> list[dict]:
    """Every loader over the class-sorted set (one process); returns the rows."""
    from mpi4py import MPI

    from dstore.store.data_store import DataStore

    path, shards, hx, hy = write_sets(out_dir, seed)
    comm = MPI.COMM_SELF
    rows = []

    def archive(e):  # no shuffle at all: the floor
        from dstore.formats import open_container

        with open_container(path) as r:
            for lo in range(0, r.num_samples, BATCH):
                hi = min(lo + BATCH, r.num_samples)
                yield [r.sample(i)[0] for i in range(lo, hi)], np.asarray(r.labels[lo:hi])

    rows.append({"name": "the archive's order (no shuffle)", **train(archive, epochs, seed, hx, hy)})
    with DataStore(comm, path, batch_size=BATCH, seed=seed) as st:
        rows.append(
            {
                "name": "store (global shuffle)",
                **train(lambda e: ((b.samples, b.labels) for b in st.epoch(e)), epochs, seed, hx, hy),
            }
        )
    if peers.missing("webdataset") is None:
        for workers in (0, 2):
            w = peers.WebDatasetPeer(comm, shards, workers, True, BATCH, seed)
            rows.append(
                {
                    "name": f"WebDataset shard shuffle + shuffle({peers.SHUFFLE_BUFFER}), {workers} workers",
                    **train(w.epoch, epochs, seed, hx, hy),
                }
            )
            w.close()
    with open(os.path.join(out_dir, "sorted-training.json"), "w") as fh:
        json.dump({"epochs": epochs, "seed": seed, "held_out": int(hy.size), "rows": rows}, fh, indent=1)
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m dstore.tools.bench.sorted_training", description=(__doc__ or "").split("\n")[0]
    )
    p.add_argument("--out", required=True)
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    for r in run(a.out, a.epochs, a.seed):
        print(f"{r['name']}: held-out accuracy " + " ".join(f"{x:.3f}" for x in r["accuracy"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
