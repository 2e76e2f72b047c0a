"""A DataStore serving extra fields (dstore.store.fieldstore) on any communicator: under
`mpiexec -n N python -m mpi4py fields_scenario.py MODE CONTAINER ARG...`, or called in-process.

Modes:
  clip CONTAINER REFERENCE POPULATION: every rank's batches of one epoch (the store's bytes, then a
      StoreLoader's decoded captions for another) gathered to rank 0, which checks that every sample
      comes exactly once and that its image and its caption/json bytes are the reference's (a JSON
      file {key: [image hex, txt hex, json hex or null]} that webdataset's own reading gave).
  damaged CONTAINER POPULATION: each rank prints the error its store raised (or that it served).
  save CONTAINER OUT STEPS: serves STEPS steps of epoch 0 with fields, then writes the store's
      state_dict and every rank's (id, field bytes) delivered so far to OUT (rank 0; JSON).
"""

from __future__ import annotations

import json
import sys

from mpi4py import MPI

from dstore.loader.store_loader import StoreLoader
from dstore.store.data_store import DataStore


def served(batches, names) -> list:
    """(container id, image bytes hex, {field: bytes hex}) of each entry of `batches` (pads left out)."""
    rows = []
    for b in batches:
        for j, (i, s) in enumerate(zip(b.ids.tolist(), b.samples)):
            if not b.pad[j]:
                value = {n: None if b.fields[n][j] is None else b.fields[n][j].hex() for n in names}  # None: missing
                rows.append((int(i), bytes(s).hex(), value))
    return rows


def clip(comm, container: str, reference: str, population: str) -> None:
    names = ["txt", "json"]
    with DataStore(comm, container, batch_size=6, seed=5, population=population, fields=names) as store:
        mine = served(store.epoch(0), names)
        with StoreLoader(store, fields=["txt"], ahead=2) as loader:
            captions = []
            for batch in loader.epoch(1):
                captions += [
                    (int(i), t)
                    for i, t, p in zip(loader.last_ids.tolist(), batch["txt"], loader.last_pad.tolist())
                    if not p
                ]
        keys = {i: store.container.name(i).rsplit("/", 1)[1].split(".")[0] for i, _, _ in mine}
    rows = comm.gather((mine, captions, keys), root=0)
    if comm.Get_rank() != 0:
        return
    with open(reference) as f:
        ref = json.load(f)
    names_of = {i: k for _, _, keys in rows for i, k in keys.items()}
    got = [r for mine, _, _ in rows for r in mine]
    ids = sorted(i for i, _, _ in got)
    if ids != list(range(len(ref))):
        raise AssertionError(f"epoch 0 delivered ids {ids}, not each of {len(ref)} samples once")
    for i, image, fields in got:
        want = ref[names_of[i]]
        if image != want[0] or fields["txt"] != want[1] or fields["json"] != want[2]:
            raise AssertionError(f"sample {i} ({names_of[i]}): served image/fields differ from webdataset's")
    caps = sorted(c for _, captions, _ in rows for c in captions)
    if [i for i, _ in caps] != list(range(len(ref))):
        raise AssertionError(f"the loader's epoch 1 delivered ids {[i for i, _ in caps]}")
    for i, text in caps:
        if text != bytes.fromhex(ref[names_of[i]][1]).decode("utf-8"):
            raise AssertionError(f"sample {i}: the loader's caption {text!r} is not webdataset's")
    print(f"clip ok: {len(ref)} samples on {comm.Get_size()} ranks")


def save(comm, container: str, out: str, steps: int) -> None:
    names = ["txt", "boxes"]
    with DataStore(comm, container, batch_size=4, seed=9, fields=names) as store:
        rows = []
        for k, b in enumerate(store.epoch(0)):
            rows += served([b], names)  # copied out: the batch's views are valid until the next one
            if k + 1 >= steps:
                break
        state = store.state_dict()
    got = comm.gather(rows, root=0)
    if comm.Get_rank() == 0:
        with open(out, "w") as f:
            json.dump({"state": state, "served": [r for part in got for r in part]}, f)


def damaged(comm, container: str, population: str) -> None:
    """Prints what each rank raised when its store reads a damaged field (or that it served)."""
    try:
        with DataStore(comm, container, batch_size=4, population=population, fields=["txt"]) as store:
            for _ in store.epoch(0):
                pass
    except Exception as exc:  # noqa: BLE001 - the scenario reports it for the test to check
        print(f"rank {comm.Get_rank()} raised {type(exc).__name__}: {exc}", flush=True)
        return
    print(f"rank {comm.Get_rank()} served the damaged field", flush=True)


if __name__ == "__main__":
    mode, *args = sys.argv[1:]
    if mode == "clip":
        clip(MPI.COMM_WORLD, args[0], args[1], args[2])
    elif mode == "save":
        save(MPI.COMM_WORLD, args[0], args[1], int(args[2]))
    elif mode == "damaged":
        damaged(MPI.COMM_WORLD, args[0], args[1])
    else:
        raise SystemExit(f"unknown mode {mode!r}")
