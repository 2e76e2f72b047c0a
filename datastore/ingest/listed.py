"""Image files named by a CSV of labels (`--labels FILE.csv`): a flat folder such as ImageNet's
validation set, or any list of files, stored as the original file bytes.

The CSV's first two columns are a file path and its label; a first row whose first cell is one of
HEADER_WORDS (`path`, `file`, `filename`, `image`, ...) is a header. Paths are relative to the
source directory (absolute ones are taken as they are); the CSV's rows are the samples, in that
order, and files it does not name are not read. Labels follow dstore.ingest.labels (integers are
class indices, anything else a class name; `classes=FILE` fixes the names and their order). A
listed file that is missing or not a valid image is a bad sample (`on_error`), named by its path.
"""

from __future__ import annotations

import csv
import os

from dstore.errors import ConfigError, SampleError
from dstore.ingest.folder import VALIDATE, FileSamples, encoding_from_extensions
from dstore.ingest.labels import class_names_option, resolve_labels

HEADER_WORDS = ("path", "file", "filename", "file_name", "image", "image_id", "imageid", "name")


def read_labels_csv(path: str) -> list[tuple[str, str]]:
    """(file path, label text) per row of a labels CSV, its header row left out.

    Raises:
        SampleError: naming the CSV and the row if it cannot be read, a row has fewer than two
            columns, a path is empty or repeated, or no row is left.
    """
    rows: list[tuple[str, str]] = []
    seen: dict[str, int] = {}
    try:
        with open(path, newline="", encoding="utf-8") as f:
            for n, row in enumerate(csv.reader(f), start=1):
                if not row or not any(cell.strip() for cell in row):
                    continue
                if n == 1 and row[0].strip().lower() in HEADER_WORDS:
                    continue
                if len(row) < 2 or not row[0].strip():
                    raise SampleError(f"{path}: row {n} is not path,label: {row!r}")
                name = row[0].strip()
                if name in seen:
                    raise SampleError(f"{path}: row {n} lists {name!r} again (first in row {seen[name]})")
                seen[name] = n
                rows.append((name, row[1].strip()))
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise SampleError(f"{path}: cannot read the labels CSV: {exc}") from exc
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
        self.root = os.path.abspath(os.fspath(root))
        if not os.path.isdir(self.root):
            raise SampleError(f"{self.root}: not a directory (with --labels, SOURCE is the folder the CSV's "
                              "paths are relative to)")
        self.validate = validate
        self.labels_path = os.path.abspath(os.fspath(labels))
        rows = read_labels_csv(self.labels_path)
        self._files = [name for name, _ in rows]
        self._labels, self.class_names = resolve_labels([value for _, value in rows], self.labels_path,
                                                        class_names_option(classes))
        self.encoding = encoding_from_extensions(self._files)
        self.description = f"{self.root} (labels: {self.labels_path})"
