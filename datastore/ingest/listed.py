"""Image files named by a CSV of labels (`--labels FILE.csv`): a flat folder such as ImageNet's
validation set, or any list of files, stored as the original file bytes.

The CSV (UTF-8, with or without the byte-order mark Excel's "CSV UTF-8" writes) has a file path in
its first column and a label in its second. Paths are relative to the source directory (absolute
ones are taken as they are); the CSV's rows are the samples, in that order, and files it does not
name are not read. Labels follow dstore.ingest.labels (ASCII-digit integers are class indices,
anything else a class name; `classes=FILE` fixes the names and their order).

The first row is a header (left out) if (checked in this order; the last two are said at ingest):
- its path cell is one of HEADER_WORDS (`path`, `file`, `filename`, `image`, ..., any case);
- its path cell names nothing under the source directory and does not end like the next row's
  (`photo` over `a.jpg`), and either its label cell is not an integer label while every other
  row's is (`photo,class_idx` over `a.jpg,3`), or the next row's path names a file there
  (`photo,breed` over `a.jpg,beagle`): two `lstat`s, never a scan of every row. A first row naming
  a file that exists, or a missing one named like the next (`gone.jpg`), is data.

Two rows naming the same file (after `os.path.realpath`: `./a.jpg`, `a.jpg`, `x/../a.jpg` and a
symbolic link to `a.jpg` are one; in object storage after `normpath`) with different labels are
refused naming both rows; with the same label the file is one sample (said at ingest). A listed
file that is missing, not a regular file (a directory, FIFO, device, socket: refused by `os.stat`
before it is opened) or not a valid image is a bad sample (`on_error`), named by its path.
"""

from __future__ import annotations

import csv
import io
import os
import posixpath

from dstore.errors import ConfigError, SampleError
from dstore.ingest.folder import VALIDATE, FileSamples, encoding_from_extensions
from dstore.ingest.labels import as_index, class_names_option, label_text, resolve_labels
from dstore.ingest.remote import Prefetched, Remote, is_url

HEADER_WORDS = (
    "path",
    "file",
    "filename",
    "file_name",
    "filepath",
    "file_path",
    "image",
    "image_id",
    "imageid",
    "image_path",
    "img",
    "name",
    "id",
)


def _header_reason(rows: list[tuple[int, list[str]]], root: str, exists=None) -> str | None:
    """Why the first of `rows` ((row number, cells), non-empty rows) is a header, or None if it is data.
    `exists(path)`: whether a path of the CSV names something (default: below the directory `root`)."""

    def names_a_file(name: str) -> bool:
        return exists(name) if exists is not None else os.path.lexists(os.path.join(root, name))

    first = rows[0][1]
    path_cell = first[0].strip()
    if path_cell.lower() in HEADER_WORDS:
        return ""
    if len(first) < 2 or len(rows) < 2 or not path_cell or names_a_file(path_cell):
        return None  # a first row naming a file is data, whatever its label
    rest = [cells for _, cells in rows[1:]]
    nxt = rest[0][0].strip()
    if os.path.splitext(path_cell)[1].lower() == os.path.splitext(nxt)[1].lower():
        return None  # a missing file named like the others (`gone.jpg` over `a.jpg`) is data: a bad sample
    if as_index(first[1]) is None and all(len(c) >= 2 and as_index(c[1]) is not None for c in rest):
        return (
            f"{path_cell!r} names nothing in {root} and its label {label_text(first[1])!r} is not an "
            "integer while every other row's is"
        )
    if nxt and names_a_file(nxt):
        return f"{path_cell!r} names nothing in {root} while row {rows[1][0]}'s {nxt!r} does"
    return None


def read_labels_csv(
    path: str, root: str = ".", notes: list[str] | None = None, *, exists=None, data: bytes | None = None
) -> list[tuple[int, str, str]]:
    """(row number, file path, label text) per sample row of a labels CSV, its header row left out.

    Args:
        path: the CSV.
        root: the directory its relative paths start from (header detection looks there).
        notes: where remarks on a header found by its content and on rows listing a file again go.
        exists: whether a path of the CSV names a file (default: an `lstat` below `root`); for an
            object-store prefix, a lookup in its listing.
        data: the CSV's bytes, where they were read already (a CSV in object storage).

    Raises:
        SampleError: naming the CSV and the row if it cannot be read, a row has fewer than two
            columns, a path is empty, a file is listed twice with different labels, or no row is left.
    """
    if data is None:
        try:
            with open(path, "rb") as f:
                data = f.read()
        except OSError as exc:
            raise SampleError(f"{path}: cannot read the labels CSV: {exc}") from exc
    try:
        # Decoded whole, so that a byte that is not UTF-8 is found at its place in the file.
        text = data.decode("utf-8-sig")
        raw = [
            (n, row)
            for n, row in enumerate(csv.reader(io.StringIO(text, newline="")), start=1)
            if row and any(cell.strip() for cell in row)
        ]
    except UnicodeDecodeError as exc:
        body = data[3:] if data.startswith(b"\xef\xbb\xbf") else data  # exc.start counts from after a BOM
        line = body.count(b"\n", 0, exc.start) + 1
        raise SampleError(
            f'{path}: the labels CSV is not UTF-8 (line {line}: {exc.reason}); save it as UTF-8 (Excel: "CSV UTF-8")'
        ) from exc
    except (OSError, csv.Error) as exc:
        raise SampleError(f"{path}: cannot read the labels CSV: {exc}") from exc
    if raw:
        reason = _header_reason(raw, root, exists)
        if reason is not None:
            if reason and notes is not None:
                notes.append(f"{path}: row {raw[0][0]} {raw[0][1]!r} is taken as a header: {reason}")
            raw = raw[1:]
    rows: list[tuple[int, str, str]] = []
    seen: dict[str, tuple[int, str, str]] = {}
    repeats: list[str] = []
    for n, row in raw:
        if len(row) < 2 or not row[0].strip():
            raise SampleError(f"{path}: row {n} is not path,label: {row!r}")
        name, label = row[0].strip(), row[1].strip()
        # a local file by where its links lead (a link and its target are one file), an object by its key
        key = (
            os.path.normpath(os.path.join(root, name))
            if exists is not None
            else os.path.realpath(os.path.join(root, name))
        )
        if key in seen:
            m, first_name, first_label = seen[key]
            if label != first_label and (as_index(label) is None or as_index(label) != as_index(first_label)):
                raise SampleError(
                    f"{path}: rows {m} and {n} list the same file ({first_name!r}, {name!r}) with "
                    f"different labels ({first_label!r}, {label!r}); keep one row"
                )
            repeats.append(f"row {n} ({name!r}) repeats row {m} ({first_name!r})")
            continue
        seen[key] = (n, name, label)
        rows.append((n, name, label))
    if repeats and notes is not None:
        notes.append(
            f"{path}: {len(repeats)} row(s) list a file again with the same label, kept once (so a "
            f"sample's source index is not its row's position after them): {'; '.join(repeats[:3])}"
            + (" ..." if len(repeats) > 3 else "")
        )
    if not rows:
        raise SampleError(f"{path}: the labels CSV lists no file")
    return rows


class ListedSource(FileSamples):
    """The files a labels CSV names, below `root`.

    Args:
        root: the directory the CSV's relative paths start from.
        labels: the CSV (path,label).
        classes: class names in label order (a file, one per line, or a sequence), or None.
        validate: as for an image folder (dstore.ingest.folder.VALIDATE).
    """

    kind = "list"
    list_on_root = True

    def __init__(self, root: str, *, labels: str, classes=None, validate: str = "header"):
        super().__init__()
        if validate not in VALIDATE:
            raise ConfigError(f"validate={validate!r} is not one of {VALIDATE}")
        self.validate = validate
        root, labels = os.fspath(root), os.fspath(labels)
        self.labels_path = labels if is_url(labels) else os.path.abspath(labels)
        data = Remote(labels).read(labels) if is_url(labels) else None
        if is_url(root):
            self.remote, self.root, self._prefetched = Remote(root), root.rstrip("/"), Prefetched()
            listing = self.remote.listing(self.root)
            if not listing:
                raise SampleError(f"{self.root}: no objects below this prefix (check the bucket and the prefix)")
            rows = read_labels_csv(
                self.labels_path,
                self.root,
                self.notes,
                data=data,
                exists=lambda name: posixpath.normpath(name) in listing,
            )
            outside = next(
                ((n, p) for n, p, _ in rows if posixpath.isabs(p) or posixpath.normpath(p).startswith("../")), None
            )
            if outside is not None:
                raise SampleError(
                    f"{self.labels_path}: row {outside[0]} names {outside[1]!r}, outside the prefix "
                    f"{self.root}; with a URL SOURCE every path is relative to it"
                )
        else:
            self.root = os.path.abspath(root)
            if not os.path.isdir(self.root):
                raise SampleError(
                    f"{self.root}: not a directory (with --labels, SOURCE is the folder the CSV's "
                    "paths are relative to)"
                )
            rows = read_labels_csv(self.labels_path, self.root, self.notes, data=data)
        self._files = [name for _, name, _ in rows]
        self._labels, self.class_names = resolve_labels(
            [value for _, _, value in rows],
            self.labels_path,
            class_names_option(classes),
            notes=self.notes,
            place=lambda k: f"row {rows[k][0]}",
        )
        self.encoding = encoding_from_extensions(self._files)
        self.description = f"{self.root} (labels: {self.labels_path})"
