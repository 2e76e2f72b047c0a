"""Class labels of sources that name them per sample (a CSV column, a tar member, a table column):
the rule that turns the values found into label indices and class names (no MPI here).

What counts as an integer label: an int, or a text of ASCII digits only (`3`, `03`), surrounding
blanks stripped. Not one: `+3`, `5.0`, `3e0`, `²` or `٣` (Unicode digits, which `str.isdigit`
accepts and `int()` may not), a bool. The rule, one for every source that parses labels from text:

- An empty label is refused (naming the source and the sample): it is never a class.
- Every value an integer: the label is the value itself and the class names are "0".."max" (so a
  held-out CSV missing a class keeps the training set's indices). A negative integer (`-1`) among
  them is refused: class indices start at 0.
- Otherwise the values are class names: `class_names` (given, e.g. read from a file, in their
  order) or else the sorted distinct texts; a sample's label is its name's position. If some of
  the values were integers or numbers (`5.0`), the switch is said in one line (a note naming the
  first value that is not an integer): they are class names there, so `10` sorts before `2`.
- With `class_names` given, an integer value (an int, as a table's integer column holds, not text)
  is the class index, as `datasets`' ClassLabel has it: with names ("1", "2", "3") the value 1 is
  "2", never the class named "1". Text is looked up as a name first, then read as an index.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable

import numpy as np

from dstore.errors import ConfigError, SampleError
from dstore.ingest.source import check_label_count

_ASCII_INT = re.compile(r"[0-9]+")
_NEGATIVE_INT = re.compile(r"-[0-9]+")


def label_text(value) -> str:
    """A label value as text (stripped): what class names are made of."""
    return str(value).strip()


def as_index(value) -> int | None:
    """`value` as a class index if it is an integer label (see the module docstring), else None;
    negative integers are None too (the caller decides whether that is an error)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if value >= 0 else None
    text = label_text(value)
    return int(text) if _ASCII_INT.fullmatch(text) else None


def _is_negative_int(value) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return value < 0
    return _NEGATIVE_INT.fullmatch(label_text(value)) is not None


def _is_number(value) -> bool:
    """True for a number that is not an integer label (`5.0`, `+3`, `1e3`, a float): its text as a
    class name sorts `10.0` before `2.0`, which is worth saying."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return True
    try:
        float(label_text(value))
    except ValueError:
        return False
    return label_text(value).isascii() and label_text(value).lower() not in (
        "nan",
        "inf",
        "-inf",
        "+inf",
        "infinity",
        "-infinity",
        "+infinity",
    )


def _sample(k: int) -> str:
    return f"sample {k}"


def _unwrapped(values: list, where: str, notes: list[str] | None, place: Callable[[int], str]) -> list:
    """`values` with labels of a list column that are each one integer (`[2]`) taken as that integer
    (said in `notes`); SampleError naming the first other list or struct (dict) value: its text would
    be a class name (`[10]` sorted before `[2]`), never what the source meant."""
    nested = [k for k, v in enumerate(values) if isinstance(v, (list, tuple, dict, np.ndarray))]
    if not nested:
        return values
    for k in nested:
        v = values[k]
        items = list(v.values()) if isinstance(v, dict) else list(v)
        one = items[0] if len(items) == 1 else None
        if (
            isinstance(v, dict)
            or isinstance(one, (bool, np.bool_))
            or not isinstance(one, (int, np.integer))
            or one < 0
        ):
            kind = "struct" if isinstance(v, dict) else "list"
            raise SampleError(
                f"{where}: {place(k)}: label {label_text(v)!r} is a {kind}, not a class index or name: "
                "give a label column of integers or class names (a list of one integer is taken)"
            )
    if notes is not None:
        notes.append(
            f"{where}: labels are lists of one integer ({place(nested[0])}: {label_text(values[nested[0]])!r}); "
            "each list's integer is taken as the class index"
        )
    out = list(values)
    for k in nested:
        out[k] = int(out[k][0])
    return out


def resolve_labels(
    values: list, where: str, class_names=None, *, notes: list[str] | None = None, place: Callable[[int], str] = _sample
) -> tuple[list[int], tuple[str, ...]]:
    """(label per value, class names) for the per-sample label `values` of source `where`.

    Args:
        values: ints or strings, one per sample.
        where: the source, for messages.
        class_names: the classes in label order, or None (see the module docstring).
        notes: where the one-line remark on a switch from integers to class names is appended.
        place: value k's position for messages (e.g. `row 7` of a CSV); default `sample k`.

    Raises:
        SampleError: an empty value, a negative integer among integers, a value that is not one of
            `class_names`, or integer labels implying too many classes.
    """
    values = _unwrapped(values, where, notes, place)
    for k, v in enumerate(values):
        if v is None or label_text(v) == "":
            raise SampleError(
                f"{where}: {place(k)} has an empty label (every sample needs a class index or a class name)"
            )
    if class_names is not None:
        names = tuple(str(c) for c in class_names)
        index = {n: k for k, n in enumerate(names)}
        if len(index) != len(names):
            raise ConfigError(f"{where}: the class names given repeat a name")
        labels = []
        for j, v in enumerate(values):
            text = label_text(v)
            k = as_index(v)
            if isinstance(v, int) and not isinstance(v, bool):
                if k is None or k >= len(names):
                    raise SampleError(
                        f"{where}: {place(j)}: label {v} is not a class index 0..{len(names) - 1} of "
                        f"the {len(names)} class names"
                        + (" (datasets writes -1 for 'no label': a test split without labels?)" if v == -1 else "")
                    )
                labels.append(k)
            elif text in index:
                labels.append(index[text])
            elif k is not None and k < len(names):
                labels.append(k)
            else:
                raise SampleError(
                    f"{where}: {place(j)}: label {text!r} is not one of the {len(names)} class "
                    "names given (nor an index below their count)"
                )
        return labels, names
    maybe = [as_index(v) for v in values]
    other = next((k for k, i in enumerate(maybe) if i is None and not _is_negative_int(values[k])), None)
    if other is None:
        negative = next((k for k, i in enumerate(maybe) if i is None), None)
        if negative is not None:
            raise SampleError(
                f"{where}: {place(negative)}: label {label_text(values[negative])!r} is negative; "
                "class indices start at 0: fix that label"
            )
        ints = [int(i) for i in maybe if i is not None]
        if ints:
            top = max(ints)
            check_label_count(where, top)
            return ints, tuple(str(k) for k in range(top + 1))
    names = tuple(sorted({label_text(v) for v in values}))
    index = {n: k for k, n in enumerate(names)}
    integers = sum(i is not None or _is_negative_int(v) for i, v in zip(maybe, values))
    if notes is not None and other is not None and (integers or any(_is_number(v) for v in values)):
        notes.append(
            f"{where}: labels are not all integers ({place(other)}: {label_text(values[other])!r}; "
            f"{len(values) - integers} of {len(values)} not); the {len(names)} classes are named by "
            "their text, sorted, so an integer label is not its class index (fix that label if it "
            "is a typo)"
        )
    return [index[label_text(v)] for v in values], names


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
