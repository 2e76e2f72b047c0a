"""Extra fields served by the store (`DataStore(fields=[...])`, dstore.store.fieldstore): a CLIP-style
round trip from WebDataset shards on 2 ranks against webdataset's own reading, a detection-style
one from ingest_items, a resume from 2 ranks to 1, a damaged field byte while streaming or tiered,
and the memory budget counting the fields."""

from __future__ import annotations

import json
from pathlib import Path

import h5py
import numpy as np
import pytest
from mpi4py import MPI
from support.formats import plain_array, plain_values
from support.ingest import clip_shards, png_bytes

from dstore.errors import ChecksumError
from dstore.formats import create_writer, open_container
from dstore.ingest import ingest, ingest_items
from dstore.loader.store_loader import StoreLoader
from dstore.store import fieldstore
from dstore.store.data_store import DataStore

SCENARIO = Path(__file__).resolve().parent / "store_scenarios" / "fields_scenario.py"


def detection_items(n: int) -> list:
    """Image + boxes (JSON) + a caption per item, some without fields (stored missing: served as None)."""
    return [
        (png_bytes(4, k), k % 3, f"img{k}.png", {"boxes": [[k, 0, 4, 4], [1, 1, k % 5, 2]], "txt": f"obj {k}"})
        if k % 7
        else (png_bytes(4, k), k % 3, f"img{k}.png")
        for k in range(n)
    ]


@pytest.mark.mpi
def test_clip_style_webdataset_served_on_two_ranks_is_webdatasets_reading(tmp_path):
    """Image + caption (+ json) WebDataset shards, ingested, served on 2 ranks (fields by RMA gets:
    node views off), population stream: every sample once per epoch, its image and caption bytes
    those webdataset.WebDataset yields for its key; the loader's decoded captions likewise."""
    wds = pytest.importorskip("webdataset", reason="the reference reader: pip install webdataset==1.0.2")
    from support.mpirun import run_mpi

    src = tmp_path / "wds"
    src.mkdir()
    shards = clip_shards(wds, src, 9, long_captions=True)
    out = str(tmp_path / "clip.h5")
    ingest(str(src), out, comm=MPI.COMM_SELF, progress=False, seed=3)
    reference = {
        s["__key__"]: [s["png"].hex(), s["txt"].hex(), s["json"].hex() if "json" in s else None]
        for s in wds.WebDataset(shards, shardshuffle=False, empty_check=False)
    }
    ref = tmp_path / "ref.json"
    ref.write_text(json.dumps(reference))
    res = run_mpi(
        2,
        ["python", "-m", "mpi4py", str(SCENARIO), "clip", out, str(ref), "stream"],
        timeout=150,
        env={"DSTORE_NODE_VIEWS": "0"},
    )
    assert "clip ok: 18 samples on 2 ranks" in res.stdout, res.stdout + res.stderr


def test_detection_style_items_served_with_their_boxes(tmp_path):
    """Image + boxes JSON through ingest_items (Zarr), served by the store: each batch's boxes and
    captions are its samples' items', decoded; fields not asked for are not in the batch."""
    items = detection_items(11)
    out = str(tmp_path / "det.zarr")
    ingest_items(iter(items), out, comm=MPI.COMM_SELF, progress=False, fmt="zarr")
    with open_container(out) as c:
        source = c.source_index.copy()
    with DataStore(MPI.COMM_SELF, out, batch_size=4, seed=1, fields=["boxes", "txt"]) as st:
        assert st.fields == ("boxes", "txt")
        with StoreLoader(st, fields=["boxes"]) as ld:
            seen = []
            for batch in ld:
                assert set(batch) == {"image", "label", "boxes"}
                for i, boxes in zip(ld.last_ids.tolist(), batch["boxes"]):
                    item = items[int(source[i])]
                    assert boxes == (item[3]["boxes"] if len(item) == 4 else None)
                    seen.append(i)
            assert sorted(seen) == list(range(11))
        for b in st.epoch(1):  # the store's own batches: the bytes as stored
            assert b.fields is not None
            for i, s, t in zip(b.ids.tolist(), b.samples, b.fields["txt"]):
                item = items[int(source[i])]
                assert bytes(s) == item[0] and t == (item[3]["txt"].encode() if len(item) == 4 else None)


@pytest.mark.mpi
def test_resume_mid_epoch_from_two_ranks_on_one_gives_the_same_fields(tmp_path):
    """Two ranks serve 2 steps of epoch 0 with fields and save; one rank loads that state: it serves
    exactly the samples not yet served, in the uninterrupted run's order, each with its own fields."""
    from support.mpirun import run_mpi

    items = detection_items(23)
    out = str(tmp_path / "det.h5")
    ingest_items(iter(items), out, comm=MPI.COMM_SELF, progress=False)
    saved = tmp_path / "saved.json"
    run_mpi(2, ["python", "-m", "mpi4py", str(SCENARIO), "save", out, str(saved), "2"], timeout=120)
    doc = json.loads(saved.read_text())
    first = [i for i, _, _ in doc["served"]]
    assert len(first) == 8 and doc["state"]["nranks"] == 2
    with open_container(out) as c:
        want = {
            i: (
                bytes(c.sample(i)[0]),
                *(None if c.field_missing(n, i, i + 1)[0] else c.field_bytes(n, i) for n in ("txt", "boxes")),
            )
            for i in range(c.num_samples)
        }
    for i, image, fields in doc["served"]:  # the two ranks' part: each sample's own fields (None: missing)
        got = [None if fields[n] is None else bytes.fromhex(fields[n]) for n in ("txt", "boxes")]
        assert (bytes.fromhex(image), *got) == want[i]
    with DataStore(MPI.COMM_SELF, out, batch_size=4, seed=9, fields=["txt", "boxes"]) as st:
        whole = [(b.step, b.ids.tolist()) for b in st.epoch(0)]  # the uninterrupted order
        st.load_state_dict(doc["state"])
        rest = []
        for b in st.epoch(0):
            assert b.fields is not None
            for i, s, t, x in zip(b.ids.tolist(), b.samples, b.fields["txt"], b.fields["boxes"]):
                assert (bytes(s), t, x) == want[i]
                rest.append(i)
    assert rest == [i for step, ids in whole if step >= 2 for i in ids]
    assert sorted(first + rest) == list(range(23))


def _damaged(tmp_path) -> str:
    """A container whose sample 3's `txt` value has one byte flipped on disk."""
    path = str(tmp_path / "bad.h5")
    with create_writer(
        path, "hdf5", encoding="raw", raw_dtype="uint8", raw_shape=[64], class_names=["a"], fields={"txt": "text"}
    ) as w:
        for k in range(12):
            w.append(bytes([k]) * 64, 0, f"s{k}", fields={"txt": f"caption {k}"})
    with h5py.File(path, "r+") as f:
        at = int(plain_values(f, "fields/txt/offsets", 3))
        plain_array(f, "fields/txt/data")[at] = plain_values(f, "fields/txt/data", at) ^ 0x20
    return path


@pytest.mark.parametrize(
    "options", [{"population": "stream"}, {"memory_budget": 600, "storage_lookahead": 0}], ids=["stream", "tiered"]
)
def test_a_damaged_field_byte_is_an_error_naming_sample_and_field(tmp_path, options):
    """A flipped byte of a caption on disk: the store refuses to serve it (ChecksumError naming the
    container, the sample and the field), while streaming or tiered alike; without fields asked
    for, the images are served as before (the fields are not read)."""
    path = _damaged(tmp_path)
    with pytest.raises(ChecksumError, match=r"bad\.h5: sample 3 \(s3\): field 'txt' does not match its checksum"):
        with DataStore(MPI.COMM_SELF, path, batch_size=4, fields=["txt"], **options) as st:
            for _ in st.epoch(0):
                pass
    with DataStore(MPI.COMM_SELF, path, batch_size=4, **options) as st:
        if "memory_budget" in options:
            assert st.tier["resident_fraction"] < 1  # the images are tiered indeed
        assert sorted(i for b in st.epoch(0) for i in b.ids.tolist()) == list(range(12))
        assert all(b.fields is None for b in st.epoch(1))


@pytest.mark.mpi
def test_a_damaged_field_byte_while_streaming_on_two_ranks_stops_both(tmp_path):
    """Two ranks streaming: the rank that reads the damaged caption and the other both raise the
    error naming the sample and the field; nothing is served."""
    from support.mpirun import run_mpi

    path = _damaged(tmp_path)
    res = run_mpi(2, ["python", "-m", "mpi4py", str(SCENARIO), "damaged", path, "stream"], timeout=120)
    for r in range(2):
        assert f"rank {r} raised ChecksumError: {path}: sample 3 (s3): field 'txt' does not match" in res.stdout, (
            res.stdout + res.stderr
        )
    assert "served" not in res.stdout


def test_budget_counts_the_served_fields():
    """The fields' window and a step's buffer are in the rank's needs; none without fields."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        path = str(Path(tmp) / "c.h5")
        with create_writer(
            path,
            "hdf5",
            encoding="raw",
            raw_dtype="uint8",
            raw_shape=[8],
            class_names=["a"],
            fields={"txt": "text", "j": "json"},
        ) as w:
            for k in range(10):
                w.append(bytes(8), 0, f"s{k}", fields={"txt": "t" * (k + 1), "j": [k]})
        plain = DataStore(MPI.COMM_SELF, path, batch_size=4)
        served = DataStore(MPI.COMM_SELF, path, batch_size=4, fields=["txt"])
        try:
            need, least = served.memory_needs()
            assert need - plain.memory_needs()[0] == served.plan.field_bytes == least - plain.memory_needs()[1]
            assert served.plan.field_bytes == 55 + (10 + 9 + 8 + 7 + 6)  # all 10 values, a step's 5 largest
            assert plain.plan.field_bytes == 0
        finally:
            plain.close()
            served.close()


def test_window_place_finds_each_value_in_its_owners_window():
    """Pure: owners by block, displacements after the rank's earlier fields, lengths from offsets."""
    sizes = np.array([[3, 0, 2, 5, 1], [1, 1, 4, 0, 2]])
    offsets = np.concatenate([np.zeros((2, 1), np.int64), np.cumsum(sizes, axis=1)], axis=1)
    bounds = np.array([0, 2, 5])
    ids = np.array([4, 0, 3, 2])
    owner, disp, length = fieldstore.window_place(offsets, bounds, ids)
    # rank 1 holds field 0 of samples 2..4 (2+5+1 bytes) then field 1 of them
    assert owner.tolist() == [1, 0, 1, 1] * 2
    assert length.tolist() == [1, 3, 5, 2, 2, 1, 0, 4]
    assert disp.tolist() == [7, 0, 2, 0, 8 + 4, 3 + 0, 8 + 4, 8 + 0]


def test_a_mix_refuses_fields_in_one_line(tmp_path):
    from dstore.errors import ConfigError
    from dstore.store.mixed import MixedStore

    path = _damaged(tmp_path)
    with pytest.raises(ConfigError, match=r"fields=\['txt'\]: a MixedStore does not serve extra fields"):
        MixedStore(MPI.COMM_SELF, [(path, 1.0), (path, 1.0)], batch_size=4, fields=["txt"])


def test_a_source_without_windows_has_its_fields_read_from_storage(tmp_path):
    """DirectSource (reads its samples from storage, holds no windows): StoreLoader(fields=) reads
    each batch's values from the container instead, the same values the store would serve."""
    from dstore.training.data import DirectSource

    items = detection_items(9)
    out = str(tmp_path / "det.h5")
    ingest_items(iter(items), out, comm=MPI.COMM_SELF, progress=False)
    with open_container(out) as c:
        src = DirectSource(MPI.COMM_SELF, c, batch_size=4, seed=3)
        with StoreLoader(src, fields=["txt", "boxes"]) as ld:
            for batch in ld:
                ids = ld.last_ids.tolist()
                assert batch["txt"] == [c.field("txt", i) for i in ids]
                assert batch["boxes"] == [c.field("boxes", i) for i in ids]
