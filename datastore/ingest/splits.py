"""The splits of a Hugging Face data set directory, found as `datasets` finds them (no MPI, no pyarrow).

Two layouts:

- A `DatasetDict` saved with `save_to_disk`: `dataset_dict.json` lists the splits, in order; each
  split is a subdirectory whose `state.json` lists its Arrow files, in order.
- A Hub-style directory of data files: the rules of `datasets.data_files.get_data_patterns`
  (datasets 2.16 to 5.x, fsspec >= 2023.12), tried in this order, the first that matches wins:
  1. `data/{split}-00000-of-00004*.*` (the layout `push_to_hub` writes), any split name;
  2. a directory named for a split (`train/`, `data/val/`, `x-test/`...);
  3. a file named for a split (`train-0.parquet`, `data/my_valid.parquet`...);
  4. every file is the split `train`.
  The keywords are `datasets`' own (`training` is `train`, `dev`/`val`/`valid` are `validation`,
  `eval`/`testing`/`evaluation` are `test`). Within a split the files are in `datasets`' order: the
  files of each pattern sorted by path, pattern after pattern. Hidden files and directories, `__x__`
  directories and `datasets`' metadata files (README.md, dataset_info.json...) are not data.

Where we differ from `datasets`, on purpose: a file two of a split's patterns match is read once
(`datasets` reads its rows twice), and said in the notes; data files in no split (`datasets` drops
them without a word) are listed as ignored. `datasets`' rules for `*.eval` logs and `task.toml`
tasks are not followed (they name no table files).
"""

from __future__ import annotations

import json
import os
import re

from dstore.errors import SampleError

SPLIT_KEYWORDS = {
    "train": ("train", "training"),
    "validation": ("validation", "valid", "dev", "val"),
    "test": ("test", "testing", "eval", "evaluation"),
}
"""`datasets.data_files.SPLIT_KEYWORDS`: the words that name each default split, in its order."""

_SEP = "-._ 0-9"  # datasets' NON_WORDS_CHARS: what may stand around a keyword
_IN_FILE_NAME = ("**/{kw}[{sep}]*", "**/*[{sep}]{kw}[{sep}]*")
_IN_DIR_NAME = ("**/{kw}/**", "**/{kw}[{sep}]*/**", "**/*[{sep}]{kw}/**", "**/*[{sep}]{kw}[{sep}]*/**")
_SHARDED = re.compile(r"data/(?P<split>[^/]+)-[0-9]{5}-of-[0-9]{5}[^/]*\.[^/]*")
_SPLIT_NAME = re.compile(r"^\w+(\.\w+)*$")  # datasets.naming._split_re
NOT_DATA = frozenset(
    {"README.md", "config.json", "dataset_info.json", "dataset_infos.json", "dummy_data.zip", "dataset_dict.json"}
)
"""`datasets.data_files.FILES_TO_IGNORE`: metadata files no pattern takes as data."""


def glob_regex(pattern: str) -> re.Pattern:
    """A compiled regex for an fsspec glob `pattern` over a relative posix path: `**` spans
    directories (`**/` also none), `*` does not, `[...]` is a character class."""
    out, i = [], 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif pattern[i] == "*":
            out.append("[^/]*")
            i += 1
        elif pattern[i] == "[":
            end = pattern.index("]", i)
            out.append(pattern[i : end + 1])
            i = end + 1
        else:
            out.append(re.escape(pattern[i]))
            i += 1
    return re.compile("".join(out) + r"\Z")


def all_files(root: str) -> list[str]:
    """Every file below `root` that a pattern may take, as sorted relative posix paths."""
    found = []
    for directory, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if not d.startswith((".", "__"))]  # hidden and special directories
        rel = os.path.relpath(directory, root).replace(os.sep, "/")
        for name in files:
            if not name.startswith(".") and name not in NOT_DATA:
                found.append(name if rel == "." else f"{rel}/{name}")
    return sorted(found)


def data_files(paths) -> list[str]:
    """Of a listing's relative posix paths (an object-store prefix's keys), those `all_files` would
    give for the same tree: not in a hidden or `__x__` directory, not hidden, not metadata; sorted."""
    found = []
    for p in paths:
        *dirs, name = p.split("/")
        if not any(d.startswith((".", "__")) for d in dirs) and not name.startswith(".") and name not in NOT_DATA:
            found.append(p)
    return sorted(found)


def _keyword_splits(paths: list[str], bases: tuple[str, ...]) -> dict[str, list[str]]:
    """{split: the paths its keyword patterns take, pattern after pattern} for splits taking any."""
    out = {}
    for split, keywords in SPLIT_KEYWORDS.items():
        taken = []
        for kw in keywords:
            for base in bases:
                rx = glob_regex(base.format(kw=kw, sep=_SEP))
                taken += [p for p in paths if rx.match(p)]
        if taken:
            out[split] = taken
    return out


def hub_splits(root: str, files: list[str] | None = None) -> dict[str, list[str]]:
    """{split: its files (relative posix paths, duplicates kept)} of a Hub-style directory, in
    `datasets`' split order and file order (see the module docstring). `files`: the tree's files
    as relative posix paths where `root` is not a local directory (an object-store prefix's listing).

    Raises:
        SampleError: a `data/{split}-00000-of-00001` file whose split name `datasets` refuses.
    """
    paths = all_files(root) if files is None else data_files(files)
    sharded: dict[str, list[str]] = {}
    for p in paths:
        m = _SHARDED.fullmatch(p)
        if m is not None:
            sharded.setdefault(m.group("split"), []).append(p)
    if sharded:
        bad = sorted(s for s in sharded if not _SPLIT_NAME.match(s))
        if bad:
            raise SampleError(
                f"{root}: data file split name(s) {bad} are not names datasets accepts "
                f"({_SPLIT_NAME.pattern}); rename the files data/NAME-00000-of-00001.parquet"
            )
        order = [s for s in SPLIT_KEYWORDS if s in sharded] + sorted(set(sharded) - set(SPLIT_KEYWORDS))
        return {s: sharded[s] for s in order}
    for bases in (_IN_DIR_NAME, _IN_FILE_NAME):
        found = _keyword_splits(paths, bases)
        if found:
            return found
    return {"train": paths} if paths else {}


def read_local(path: str) -> str:
    with open(path, encoding="utf-8") as f:
        return f.read()


def _join(root: str, name: str) -> str:
    return f"{root.rstrip('/')}/{name}" if "://" in root else os.path.join(root, name)


def saved_splits(root: str, files=None, read=read_local) -> dict[str, list[str]] | None:
    """{split: its Arrow files, relative to root} of a `DatasetDict.save_to_disk` directory, or None
    if `root` has no dataset_dict.json. For an object-store prefix, `files` are its relative paths
    and `read(url)` returns a small object's text.

    Raises:
        SampleError: naming the file, if dataset_dict.json or a split's state.json is malformed.
    """
    listing = _join(root, "dataset_dict.json")
    if not (os.path.isfile(listing) if files is None else "dataset_dict.json" in files):
        return None
    try:
        names = json.loads(read(listing))["splits"]
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise TypeError(f"splits is {names!r}, not a list of names")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise SampleError(f"{listing}: not a datasets dataset_dict.json with a list of splits: {exc}") from exc
    return {name: [f"{name}/{f}" for f in state_files(_join(root, name), read)] for name in names}


def state_files(directory: str, read=read_local) -> list[str]:
    """The Arrow files a `save_to_disk` directory's state.json lists, in its order (relative names).

    Raises:
        SampleError: naming state.json if it is missing or malformed.
    """
    state = _join(directory, "state.json")
    try:
        return [d["filename"] for d in json.loads(read(state))["_data_files"]]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise SampleError(f"{state}: not a datasets state.json with _data_files: {exc}") from exc


def pick_split(splits: dict[str, list[str]], split: str | None, where: str) -> str:
    """The split to ingest: `split` if given, else the only one.

    Raises:
        SampleError: `split` is not one of `splits`, or several are found and none is chosen.
    """
    found = ", ".join(splits) or "none"
    if split is not None:
        if split not in splits:
            raise SampleError(f"{where}: no split {split!r}; the splits found: {found} (choose one with --split NAME)")
        return split
    if len(splits) > 1:
        raise SampleError(
            f"{where}: holds the splits {found}; ingesting them as one set would mix held-out rows into "
            "training: choose one with --split NAME (split= in the library)"
        )
    return next(iter(splits))
