"""Ingest checked against the source's own reader (design.md, "The source's own reader is the
reference"): WebDataset shards against `webdataset`, Parquet / `datasets` directories against
Hugging Face `datasets`. Same samples, same order (ingest asked for source order), same bytes,
same labels and class names, same splits. Property tests on small generated sources."""

from __future__ import annotations

import functools
import io
import os
import tarfile
import tempfile

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from mpi4py import MPI
from support.ingest import png_bytes

from dstore.errors import SampleError
from dstore.formats import open_container
from dstore.ingest import ingest

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # datasets reads local files only here; never the network

# Few examples, no deadline, the same examples on every run: quick and steady in CI.
CI = settings(
    max_examples=6,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@functools.cache
def image(k: int) -> bytes:
    """A distinct tiny PNG per k."""
    return png_bytes(3, k)


def stored(path) -> tuple[list[tuple[bytes, int]], tuple[str, ...], list[str]]:
    """([(bytes, label)] in the container's order, class names, sample names)."""
    with open_container(str(path)) as c:
        rows = [(bytes(c.sample(j)[0]), int(c.sample(j)[1])) for j in range(c.num_samples)]
        return rows, tuple(c.info.class_names), [c.name(j) for j in range(c.num_samples)]


def run(source, output, **kw):
    return ingest(str(source), str(output), comm=MPI.COMM_SELF, progress=False, keep_order=True, **kw)


# A WebDataset sample: its label, whether it has a .json field, whether a macOS ._ copy follows its image.
wds_sample = st.tuples(st.integers(0, 4), st.booleans(), st.booleans())


@CI
@given(samples=st.lists(wds_sample, min_size=1, max_size=9), per_shard=st.integers(1, 4))
def test_webdataset_shards_as_webdataset_reads_them(samples, per_shard):
    wds = pytest.importorskip("webdataset", reason="webdataset is the reference: pip install webdataset==1.0.2")
    with tempfile.TemporaryDirectory() as tmp:
        shards, src = [], os.path.join(tmp, "shards")
        os.mkdir(src)
        for first in range(0, len(samples), per_shard):
            shards.append(os.path.join(src, f"shard-{first // per_shard:06d}.tar"))
            with tarfile.open(shards[-1], "w") as tf:
                for k in range(first, min(first + per_shard, len(samples))):
                    label, has_json, mac = samples[k]
                    members = (
                        [(f"s{k:04d}.png", image(k))]
                        + [(f"._s{k:04d}.png", b"\0\5\26\7")] * mac
                        + [(f"s{k:04d}.cls", str(label).encode())]
                        + [(f"s{k:04d}.json", b"{}")] * has_json
                    )
                    for name, data in members:
                        info = tarfile.TarInfo(name)
                        info.size = len(data)
                        tf.addfile(info, io.BytesIO(data))
        report = run(src, os.path.join(tmp, "c.h5"))
        reference = list(wds.WebDataset(shards, shardshuffle=False, empty_check=False))
        rows, classes, names = stored(os.path.join(tmp, "c.h5"))
        assert [n.rsplit("/", 1)[1].split(".")[0] for n in names] == [s["__key__"] for s in reference]
        assert rows == [(s["png"], int(s["cls"])) for s in reference]
        with open_container(os.path.join(tmp, "c.h5")) as c:  # a .json member is kept as field `json`
            assert [c.field_bytes("json", j) if "json" in c.field_names else b"" for j in range(c.num_samples)] == [
                s.get("json", b"") for s in reference
            ]
        assert classes == tuple(str(k) for k in range(max(label for label, _, _ in samples) + 1))
        assert len(report.ignored) == sum(mac for _, _, mac in samples)  # webdataset skips them too
        assert any("fields stored: json (json)" in n for n in report.notes) == any(j for _, j, _ in samples)


# A split: the number of rows of each of its files.
split_files = st.lists(st.integers(1, 3), min_size=1, max_size=3)
LAYOUTS = ("sharded", "split dirs", "split file names", "save_to_disk")


@CI
@given(
    layout=st.sampled_from(LAYOUTS),
    splits=st.dictionaries(st.sampled_from(("train", "validation", "test")), split_files, min_size=1, max_size=3),
    names=st.sampled_from((("cat", "dog", "emu"), ("1", "2", "3"), ("zebra", "ant"))),
    keyword=st.integers(0, 3),
)
@example(layout="split dirs", splits={"test": [1], "train": [2, 1]}, names=("1", "2", "3"), keyword=1)
@example(layout="sharded", splits={"validation": [1], "train": [1, 2]}, names=("cat", "dog"), keyword=0)
def test_datasets_directories_as_datasets_reads_them(layout, splits, names, keyword):
    datasets = pytest.importorskip("datasets", reason="Hugging Face datasets is the reference: pip install datasets")
    pytest.importorskip("pyarrow")
    datasets.disable_progress_bars()
    features = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(names=list(names))})
    with tempfile.TemporaryDirectory() as tmp:
        root, k = os.path.join(tmp, "src"), 0
        parts = {}
        for split, sizes in splits.items():
            parts[split] = []
            for rows in sizes:
                parts[split].append(
                    datasets.Dataset.from_dict(
                        {
                            "image": [{"bytes": image(k + r), "path": None} for r in range(rows)],
                            "label": [(k + r) % len(names) for r in range(rows)],
                        },
                        features=features,
                    )
                )
                k += rows
        if layout == "save_to_disk":
            whole = datasets.DatasetDict({s: datasets.concatenate_datasets(p) for s, p in parts.items()})
            whole.save_to_disk(root, num_shards={s: len(p) for s, p in parts.items()})
            reference = datasets.load_from_disk(root)
        else:
            for split, files in parts.items():
                word = datasets.data_files.SPLIT_KEYWORDS[split]
                word = word[keyword % len(word)]
                for f, part in enumerate(files):
                    name = {
                        "sharded": f"data/{split}-{f:05d}-of-{len(files):05d}.parquet",
                        "split dirs": f"{word}/part-{f}.parquet",
                        "split file names": f"{word}-{f}.parquet",
                    }[layout]
                    os.makedirs(os.path.dirname(os.path.join(root, name)), exist_ok=True)
                    part.to_parquet(os.path.join(root, name))
            reference = datasets.load_dataset(root, cache_dir=os.path.join(tmp, "cache"))
        reference = {str(s): d.cast_column("image", datasets.Image(decode=False)) for s, d in reference.items()}
        if len(reference) > 1:
            with pytest.raises(SampleError, match=f"holds the splits {', '.join(reference)};"):
                run(root, os.path.join(tmp, "mixed.h5"))
        for split, ref in reference.items():
            out = os.path.join(tmp, f"{split}.h5")
            run(root, out, split=split)
            rows, classes, _ = stored(out)
            assert rows == [(r["image"]["bytes"], r["label"]) for r in ref], (layout, split)
            assert classes == tuple(ref.features["label"].names)


DIRS = ("data", "train", "test", "val", "x-train", "my_dev", "training", ".hidden", "__cache__", "sub")
FILES = (
    "train-00000-of-00002.parquet",
    "test-00000-of-00001.parquet",
    "a.parquet",
    "train_1.parquet",
    "foo-test.parquet",
    "eval.parquet",
    "README.md",
    "dataset_info.json",
    "validation-2.arrow",
    ".x.parquet",
    "train-training-3.parquet",
    "valid.parquet",
)


@settings(CI, max_examples=20)  # no files written but empty ones: cheap
@given(
    tree=st.lists(
        st.tuples(st.lists(st.sampled_from(DIRS), max_size=2), st.sampled_from(FILES)), min_size=1, max_size=8
    )
)
def test_split_files_as_datasets_finds_them(tree):
    """The splits and each split's files, in order (duplicates too), of a random directory tree:
    dstore.ingest.splits.hub_splits against datasets' own get_data_patterns and DataFilesDict."""
    data_files = pytest.importorskip("datasets.data_files", reason="Hugging Face datasets is the reference")
    from dstore.ingest.splits import hub_splits

    with tempfile.TemporaryDirectory() as root:
        for dirs, name in tree:
            os.makedirs(os.path.join(root, *dirs), exist_ok=True)
            open(os.path.join(root, *dirs, name), "wb").close()
        try:
            found = data_files.DataFilesDict.from_patterns(data_files.get_data_patterns(root), base_path=root)
        except FileNotFoundError:  # no data file at all (only hidden or metadata files)
            found = {}
        reference = {
            str(s): [os.path.relpath(p, root).replace(os.sep, "/") for p in files] for s, files in found.items()
        }
        assert hub_splits(root) == reference
