"""Data from the wild at ingest's edges (issue 29): label text, labels CSVs as people write them,
and image folders listed exactly as torchvision's ImageFolder lists them."""

from __future__ import annotations

import ast
import csv
import os
import re
import stat
import tempfile

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.ingest import ingest_here, jpeg_bytes, png_bytes

from dstore.errors import SampleError
from dstore.formats import open_container
from dstore.ingest.folder import IMAGE_EXTENSIONS, FolderSource
from dstore.ingest.labels import as_index, resolve_labels
from dstore.ingest.listed import ListedSource, read_labels_csv

# --- labels: what an integer is, and saying when they are not all integers -----------------------


@pytest.mark.parametrize(
    "text, index",
    [
        ("3", 3),
        (" 03 ", 3),
        ("0", 0),
        (7, 7),
        ("+3", None),
        ("5.0", None),
        ("-1", None),
        ("", None),
        ("²", None),
        ("٣", None),
        (True, None),
        ("3e0", None),
        (-2, None),
    ],
)
def test_an_integer_label_is_ascii_digits_only(text, index):
    assert as_index(text) == index


@pytest.mark.parametrize("odd", ["+3", "5.0", "²", "x"])
def test_one_non_integer_among_integers_is_said_in_one_line(odd):
    values = ["0", "1", "2", "10", odd, "1"]
    notes: list[str] = []
    labels, names = resolve_labels(values, "l.csv", notes=notes, place=lambda k: f"row {k + 2}")
    assert names == tuple(sorted({v.strip() for v in values}))  # class names by their text, sorted
    assert [names[k] for k in labels] == values
    assert len(notes) == 1 and f"(row 6: {odd!r}" in notes[0] and "not all integers" in notes[0], notes
    # All integers: the label is the value, the names "0".."max", and nothing to say.
    notes.clear()
    labels, names = resolve_labels(["0", "2", "10"], "l.csv", notes=notes)
    assert labels == [0, 2, 10] and names == tuple(str(k) for k in range(11)) and notes == []
    # Numbers that are not integers (a float column) are class names too, and that is said; words are not.
    assert resolve_labels([1.0, 2.0, 10.0], "t.parquet", notes=notes)[1] == ("1.0", "10.0", "2.0")
    assert len(notes) == 1 and "(sample 0: '1.0'; 3 of 3 not)" in notes[0], notes
    notes.clear()
    assert resolve_labels(["cat", "dog", "nan"], "t.parquet", notes=notes)[1] == ("cat", "dog", "nan") and not notes


@pytest.mark.parametrize(
    "bad, says",
    [
        ("-1", "row 4: label '-1' is negative; class indices start at 0"),
        ("", "row 4 has an empty label"),
        ("  ", "row 4 has an empty label"),
    ],
)
def test_a_negative_or_empty_label_is_refused_naming_the_row(bad, says):
    with pytest.raises(SampleError, match=f"l.csv: {says}"):
        resolve_labels(["0", "1", bad, "2"], "l.csv", place=lambda k: f"row {k + 2}")


def test_an_empty_label_among_names_is_refused_and_a_unicode_digit_never_crashes():
    with pytest.raises(SampleError, match="sample 1 has an empty label"):
        resolve_labels(["cat", "", "dog"], "shard.tar")
    # `²`.isdigit() is True and int('²') raises: with class names given it is a name or an error.
    with pytest.raises(SampleError, match="sample 1: label '²' is not one of the 2 class names"):
        resolve_labels(["0", "²"], "shard.tar", ["cat", "dog"])
    assert resolve_labels(["1", "0", "²"], "x", ["a", "b", "²"])[0] == [1, 0, 2]


# --- labels CSVs as people write them -----------------------------------------------------------


@pytest.fixture()
def flat(tmp_path):
    """A flat folder of 6 JPEGs a0..a5.jpg, plus a sub-directory."""
    root = tmp_path / "flat"
    (root / "sub").mkdir(parents=True)
    for k in range(6):
        (root / f"a{k}.jpg").write_bytes(jpeg_bytes(seed=k))
    return root


def write_rows(path, rows, *, bom=False):
    with open(path, "w", newline="", encoding="utf-8-sig" if bom else "utf-8") as f:
        csv.writer(f).writerows(rows)
    return str(path)


def test_a_byte_order_mark_does_not_hide_the_header(flat, tmp_path):
    rows = [("path", "label")] + [(f"a{k}.jpg", "cat" if k % 2 else "dog") for k in range(6)]
    labels = write_rows(tmp_path / "excel.csv", rows, bom=True)
    report = ingest_here(flat, tmp_path / "o.h5", labels=labels, on_error="skip")
    assert report.samples == 6 and not report.skipped
    with open_container(tmp_path / "o.h5") as c:
        assert c.info.class_names == ("cat", "dog")  # the header is no class


@pytest.mark.parametrize(
    "header, values, says",
    [
        (("photo", "breed"), ["beagle", "pug"], "'photo' names nothing in .* while row 2's 'a0.jpg' does"),
        (("photo", "class_idx"), ["0", "1"], "its label 'class_idx' is not an integer while every other row's is"),
        (("ID", "label"), ["0", "1"], None),
    ],
)
def test_a_header_is_found_by_its_content_and_said(flat, tmp_path, header, values, says):
    rows = [header] + [(f"a{k}.jpg", values[k % 2]) for k in range(6)]
    src = ListedSource(flat, labels=write_rows(tmp_path / "h.csv", rows))
    assert len(src) == 6 and src.class_names == tuple(sorted(set(values)))
    if says is None:
        assert src.notes == []
    else:
        assert len(src.notes) == 1 and "row 1" in src.notes[0], src.notes
        assert re.search(says, src.notes[0]), src.notes


def test_a_csv_that_is_not_utf8_is_refused_with_the_remedy(flat, tmp_path):
    for bom in (b"", b"\xef\xbb\xbf"):
        (tmp_path / "latin.csv").write_bytes(bom + "path,label\na0.jpg,cat\na1.jpg,caf\xe9\n".encode("cp1252"))
        with pytest.raises(SampleError, match=r"latin.csv: the labels CSV is not UTF-8 \(line 3: .*save it as UTF-8"):
            ListedSource(flat, labels=str(tmp_path / "latin.csv"))


def test_a_first_row_naming_a_file_is_data_whatever_its_label(flat, tmp_path):
    rows = [("a0.jpg", "label"), ("a1.jpg", "0"), ("a2.jpg", "1")]
    src = ListedSource(flat, labels=write_rows(tmp_path / "d.csv", rows))
    assert len(src) == 3 and src.class_names == ("0", "1", "label")
    assert any("not all integers (row 1: 'label'" in n for n in src.notes), src.notes


def test_a_missing_first_file_named_like_the_others_is_data_not_a_header(flat, tmp_path):
    rows = [("gone.jpg", "x"), ("a0.jpg", "0"), ("a1.jpg", "1")]
    src = ListedSource(flat, labels=write_rows(tmp_path / "g.csv", rows))
    assert len(src) == 3 and src.name(0) == "gone.jpg"
    with pytest.raises(SampleError, match="gone.jpg: cannot read"):
        src.load(0)


def test_one_file_under_two_spellings(flat, tmp_path):
    same = write_rows(
        tmp_path / "same.csv", [("a0.jpg", "0"), ("a1.jpg", "1"), ("./a0.jpg", "00"), ("sub/../a1.jpg", "1")]
    )
    notes: list[str] = []
    assert [r[1] for r in read_labels_csv(same, str(flat), notes)] == ["a0.jpg", "a1.jpg"]
    assert (
        len(notes) == 1 and "2 row(s) list a file again" in notes[0] and "row 3 ('./a0.jpg') repeats row 1" in notes[0]
    )
    report = ingest_here(flat, tmp_path / "s.h5", labels=same, keep_order=True)
    assert report.samples == 2
    clash = write_rows(tmp_path / "clash.csv", [("a0.jpg", "0"), ("a1.jpg", "1"), ("./a0.jpg", "1")])
    with pytest.raises(
        SampleError,
        match=r"clash.csv: rows 1 and 3 list the same file \('a0.jpg', './a0.jpg'\) "
        r"with different labels \('0', '1'\)",
    ):
        ingest_here(flat, tmp_path / "c.h5", labels=clash)


@pytest.mark.timeout(120)
def test_a_fifo_a_device_or_a_directory_listed_is_refused_by_name(flat, tmp_path):
    os.mkfifo(flat / "pipe.jpg")
    kinds = {"pipe.jpg": "a FIFO", "/dev/zero": "a character device", "sub": "a directory"}
    for name, kind in kinds.items():
        rows = [("a0.jpg", "0"), (name, "1"), ("a1.jpg", "1")]
        with pytest.raises(SampleError, match=f"{os.path.join(flat, name)}: not a regular file \\({kind}\\)"):
            ingest_here(flat, tmp_path / "x.h5", labels=write_rows(tmp_path / "x.csv", rows))
    rows = [(f"a{k}.jpg", str(k % 2)) for k in range(6)] + [(name, "0") for name in kinds]
    report = ingest_here(flat, tmp_path / "k.h5", labels=write_rows(tmp_path / "k.csv", rows), on_error="skip")
    assert report.samples == 6
    assert sorted(reason for _, reason in report.skipped) == sorted(
        f"not a regular file ({k}); list image files only" for k in kinds.values()
    )


# --- image folders: torchvision's ImageFolder is the reference --------------------------------------
#
# The reference is torchvision's own find_classes / make_dataset: imported where torchvision is
# installed, else read from its folder.py named by TORCHVISION_FOLDER_PY (torchvision cannot
# be installed next to our torch; `pip download torchvision==0.24.1 --no-deps` and unzip it), else
# the transcription below of torchvision 0.24.1's torchvision/datasets/folder.py.

TV_IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")


def tv_find_classes(directory):
    classes = sorted(entry.name for entry in os.scandir(directory) if entry.is_dir())
    if not classes:
        raise FileNotFoundError(f"Couldn't find any class folder in {directory}.")
    return classes, {cls_name: i for i, cls_name in enumerate(classes)}


def tv_make_dataset(directory, class_to_idx=None, extensions=None, is_valid_file=None, allow_empty=False):
    directory = os.path.expanduser(directory)
    if class_to_idx is None:
        _, class_to_idx = tv_find_classes(directory)
    instances, available = [], set()
    for target_class in sorted(class_to_idx.keys()):
        class_index = class_to_idx[target_class]
        target_dir = os.path.join(directory, target_class)
        if not os.path.isdir(target_dir):
            continue
        for root, _, fnames in sorted(os.walk(target_dir, followlinks=True)):
            for fname in sorted(fnames):
                path = os.path.join(root, fname)
                if path.lower().endswith(tuple(extensions or ())):
                    instances.append((path, class_index))
                    available.add(target_class)
    empty = set(class_to_idx.keys()) - available
    if empty and not allow_empty:
        raise FileNotFoundError(f"Found no valid file for the classes {', '.join(sorted(empty))}. ")
    return instances


def _from_folder_py(path):
    """find_classes, make_dataset and IMG_EXTENSIONS taken from torchvision's folder.py source (the
    module itself cannot be imported without the torchvision package)."""
    from collections.abc import Callable
    from pathlib import Path
    from typing import Optional, Union, cast

    with open(path) as f:
        tree = ast.parse(f.read())
    keep = {"has_file_allowed_extension", "find_classes", "make_dataset", "IMG_EXTENSIONS"}
    body: list[ast.stmt] = [
        n
        for n in tree.body
        if (isinstance(n, ast.FunctionDef) and n.name in keep)
        or (isinstance(n, ast.Assign) and any(getattr(t, "id", None) in keep for t in n.targets))
    ]
    namespace = {
        "os": os,
        "Path": Path,
        "Callable": Callable,
        "Optional": Optional,
        "Union": Union,
        "cast": cast,
        "Any": object,
    }
    # The functions' own source, run as written: the test follows torchvision's code, not our reading of it.
    exec(compile(ast.Module(body=body, type_ignores=[]), path, "exec"), namespace)
    return namespace["find_classes"], namespace["make_dataset"], namespace["IMG_EXTENSIONS"]


def torchvision_reference():
    """(find_classes, make_dataset, IMG_EXTENSIONS, what they are)."""
    try:
        from torchvision.datasets import folder  # pyright: ignore[reportMissingImports]

        return folder.find_classes, folder.make_dataset, folder.IMG_EXTENSIONS, "torchvision"
    except ImportError:
        pass
    path = os.environ.get("TORCHVISION_FOLDER_PY")
    if path:
        return (*_from_folder_py(path), path)
    return tv_find_classes, tv_make_dataset, TV_IMG_EXTENSIONS, "transcription of torchvision 0.24.1"


def torchvision_listing(root, *, allow_empty=True):
    """[(path relative to root, label)], class names: what torchvision.datasets.ImageFolder(root) lists."""
    find_classes, make_dataset, exts, _ = torchvision_reference()
    classes, class_to_idx = find_classes(root)
    samples = make_dataset(root, class_to_idx, extensions=exts, allow_empty=allow_empty)
    return [(os.path.relpath(p, root).replace(os.sep, "/"), k) for p, k in samples], tuple(classes)


def ours(root, on_error="skip"):
    src = FolderSource(root, on_error=on_error, validate="none")
    return [(src.name(i), src.label(i)) for i in range(len(src))], src.class_names


def test_the_default_extensions_are_torchvisions():
    assert IMAGE_EXTENSIONS == torchvision_reference()[2] == TV_IMG_EXTENSIONS


_DIR = st.text(alphabet="ab-_ B", min_size=1, max_size=3)
_NAME = st.builds(lambda hidden, d: "." + d if hidden else d, st.booleans(), _DIR)
_FILE = st.builds(
    lambda hidden, stem, ext: ("." if hidden else "") + stem + ext,
    st.booleans(),
    st.text(alphabet="ab-_ Bx", max_size=2),
    st.sampled_from([".jpg", ".JPG", ".jpeg", ".png", ".PnG", ".webp", ".tiff", ".gif", ".txt", ".jpg.txt"]),
)
_TREE = st.lists(st.tuples(_NAME, st.lists(_NAME, max_size=2), _FILE), max_size=14)


def build_tree(root, entries, top_files=()):
    for cls, sub, name in entries:
        directory = os.path.join(root, cls, *sub)
        try:
            os.makedirs(directory, exist_ok=True)
            with open(os.path.join(directory, name), "ab"):
                pass
        except (FileExistsError, IsADirectoryError, NotADirectoryError):
            continue  # a file where a directory is wanted, or the reverse: not this tree's point
    for name in top_files:
        with open(os.path.join(root, name), "ab"):
            pass


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_TREE, st.lists(_FILE, max_size=2))
def test_the_listing_is_torchvisions_on_random_trees(entries, top_files):
    with tempfile.TemporaryDirectory() as tmp:
        root = os.path.join(tmp, "root")
        os.makedirs(root)
        build_tree(root, entries, top_files)
        try:
            want, classes = torchvision_listing(root)
        except FileNotFoundError:
            want, classes = [], ()
        if not want:
            with pytest.raises(SampleError, match="no class directories|no image files"):
                ours(root)
            return
        assert ours(root) == (want, classes)
        try:
            torchvision_listing(root, allow_empty=False)
            empty_class = False
        except FileNotFoundError:
            empty_class = True
        if empty_class:
            with pytest.raises(SampleError, match="empty class folder"):
                ours(root, on_error="raise")
        else:
            assert ours(root, on_error="raise") == (want, classes)


def test_source_index_is_torchvisions_dataset_index(tmp_path):
    root = tmp_path / "tree"
    files = [
        "cat/0.JPG",
        "cat/x/1.jpg",
        "cat/x-y/2.png",
        "cat/x y/3.jpeg",
        "cat/x/z/4.jpg",
        "cat/b.gif",
        "cat/.hidden.png",
        "dog/.ipynb_checkpoints/5.jpg",
        "dog/6.jpg",
        ".cache/7.png",
        "Zebra/8.jpg",
        "notes.txt",
    ]
    for k, rel in enumerate(files):
        os.makedirs(root / os.path.dirname(rel), exist_ok=True)
        data = png_bytes(seed=k) if rel.lower().endswith(".png") else jpeg_bytes(seed=k)
        (root / rel).write_bytes(data if not rel.endswith((".gif", ".txt")) else b"GIF89a")
    want, classes = torchvision_listing(str(root))
    report = ingest_here(root, tmp_path / "o.h5", seed=3)
    assert report.samples == len(want) == 10
    with open_container(tmp_path / "o.h5") as c:
        assert c.info.class_names == classes == (".cache", "Zebra", "cat", "dog")
        assert c.info.extra["ingest_order"] == "seeded"
        for j in range(c.num_samples):
            i = int(c.source_index[j])
            data, label = c.sample(j)
            assert (c.name(j), label) == want[i], (j, i)
            assert bytes(data) == (root / want[i][0]).read_bytes()
    notes = "\n".join(report.notes)
    assert "hidden entries (a leading '.') are taken" in notes
    assert "1 class folder(s) ['.cache'], 3 file(s) ['.cache/7.png', 'cat/.hidden.png', 'dog/.ipynb" in notes
    assert "1 image file(s) with extension .gif are not taken" in notes


def test_a_fifo_in_a_class_keeps_every_other_sample_at_its_torchvision_index(tmp_path):
    root = tmp_path / "tree"
    for k, rel in enumerate(["a/0.jpg", "a/2.jpg", "b/3.jpg"]):
        os.makedirs(root / os.path.dirname(rel), exist_ok=True)
        (root / rel).write_bytes(jpeg_bytes(seed=k))
    os.mkfifo(root / "a" / "1.jpg")
    assert stat.S_ISFIFO(os.stat(root / "a" / "1.jpg").st_mode)
    with pytest.raises(SampleError, match="1.jpg: not a regular file"):
        ingest_here(root, tmp_path / "r.h5")
    want, _ = torchvision_listing(str(root))
    report = ingest_here(root, tmp_path / "s.h5", on_error="skip")
    assert report.skipped == [(str(root / "a" / "1.jpg"), "not a regular file (a FIFO); list image files only")]
    with open_container(tmp_path / "s.h5") as c:
        got = {int(c.source_index[j]): (c.name(j), c.sample(j)[1]) for j in range(c.num_samples)}
    assert got == {i: w for i, w in enumerate(want) if i != 1}


def test_an_entry_torchvision_would_list_but_ingest_skips_is_said(tmp_path):
    root = tmp_path / "tree"
    for k, rel in enumerate(["a/0.jpg", "b/1.jpg"]):
        os.makedirs(root / os.path.dirname(rel), exist_ok=True)
        (root / rel).write_bytes(jpeg_bytes(seed=k))
    os.symlink(root / "b", root / "a" / "again")  # torchvision would list b/1.jpg twice
    src = FolderSource(str(root), on_error="skip")
    assert [src.name(i) for i in range(len(src))] == ["a/0.jpg", "b/1.jpg"]
    assert any(
        "would list were skipped while listing (first " + str(root / "a" / "again") in n
        and "not its torchvision index" in n
        for n in src.notes
    ), src.notes


@pytest.mark.skipif(
    not os.environ.get("TORCHVISION_FOLDER_PY"), reason="TORCHVISION_FOLDER_PY (torchvision's folder.py) not given"
)
def test_the_transcription_is_torchvisions_code(tmp_path):
    find_classes, make_dataset, exts = _from_folder_py(os.environ["TORCHVISION_FOLDER_PY"])
    assert exts == TV_IMG_EXTENSIONS
    build_tree(
        str(tmp_path),
        [
            (".a", [], "x.jpg"),
            ("a", ["b-c"], "y.PNG"),
            ("a", ["b", "c"], ".z.jpeg"),
            ("a", [], "w.gif"),
            ("B", [], "v.webp"),
        ],
    )
    classes, idx = find_classes(str(tmp_path))
    assert (classes, idx) == tv_find_classes(str(tmp_path))
    assert make_dataset(str(tmp_path), idx, extensions=exts) == tv_make_dataset(str(tmp_path), idx, extensions=exts)
