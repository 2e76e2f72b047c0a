"""Class labels of sources that name them per sample (a CSV column, a tar member, a table column):
the rule that turns the values found into label indices and class names (no MPI here).

- Every value a non-negative integer (`3`, `"3"`): the label is the value itself and the class
  names are "0".."max" (so a held-out CSV missing a class keeps the training set's indices).
- Otherwise the values are class names: `class_names` (given, e.g. read from a file, in their
  order) or else the sorted distinct values; a sample's label is its name's position.
"""

from __future__ import annotations

import os

from dstore.errors import ConfigError, SampleError
from dstore.ingest.source import check_label_count


def _as_index(value) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if value >= 0 else None
    text = str(value).strip()
    return int(text) if text.isdigit() else None


def resolve_labels(values: list, where: str, class_names=None) -> tuple[list[int], tuple[str, ...]]:
    """(label per value, class names) for the per-sample label `values` of source `where`.

    Args:
        values: ints or strings, one per sample.
        where: the source, for messages.
        class_names: the classes in label order, or None (see the module docstring).

    Raises:
        SampleError: a value that is not one of `class_names`, or integer labels implying too many classes.
    """
    if class_names is not None:
        names = tuple(str(c) for c in class_names)
        index = {n: k for k, n in enumerate(names)}
        if len(index) != len(names):
            raise ConfigError(f"{where}: the class names given repeat a name")
        labels = []
        for v in values:
            text = str(v).strip()
            k = _as_index(v)
            if text in index:
                labels.append(index[text])
            elif k is not None and k < len(names):
                labels.append(k)
            else:
                raise SampleError(f"{where}: label {text!r} is not one of the {len(names)} class names given")
        return labels, names
    maybe = [_as_index(v) for v in values]
    ints = [i for i in maybe if i is not None]
    if values and len(ints) == len(maybe):
        top = max(ints)
        check_label_count(where, top)
        return ints, tuple(str(k) for k in range(top + 1))
    names = tuple(sorted({str(v).strip() for v in values}))
    index = {n: k for k, n in enumerate(names)}
    return [index[str(v).strip()] for v in values], names


def read_class_names(path: str) -> tuple[str, ...]:
    """Class names from a text file, one per line (blank lines ignored), in label order.

    Raises:
        SampleError: naming the file if it cannot be read or holds no name.
    """
    try:
        with open(path, encoding="utf-8") as f:
            names = tuple(line.strip() for line in f if line.strip())
    except (OSError, UnicodeDecodeError) as exc:
        raise SampleError(f"{path}: cannot read the class names: {exc}") from exc
    if not names:
        raise SampleError(f"{path}: no class names (one per line)")
    return names


def class_names_option(classes) -> tuple[str, ...] | None:
    """`classes` as given to a source: None, a file of names (one per line) or a sequence of names."""
    if classes is None:
        return None
    if isinstance(classes, (str, os.PathLike)):
        return read_class_names(os.fspath(classes))
    return tuple(str(c) for c in classes)
