"""Parquet files and Hugging Face `datasets` directories: an image-bytes column and a label column,
read with pyarrow (an optional dependency: `pip install dstore-mpi[parquet]`).

The source is a `.parquet` or `.arrow` file, or a directory holding splits, found as `datasets`
finds them (dstore.ingest.splits): a `DatasetDict.save_to_disk` directory (`dataset_dict.json`),
a `Dataset.save_to_disk` directory (its `state.json` lists the Arrow files), or a Hub-style
directory (`data/train-00000-of-00004.parquet`, `train/*.parquet`, `x_test.parquet`...), whose
`*.parquet` (or else `*.arrow`) files are read in `datasets`' order. A directory with several
splits needs `split=` (`--split`): they are never mixed. Columns other than the image and the
label are stored as extra fields per sample (`--fields` selects; docs/format.md, "Fields"): strings
as `text`, binary as `bytes`, numbers, booleans, lists and structs as `json`; a column of another
type (timestamps, decimals...) is not stored, and the ingest summary says which. The image column holds the file
bytes, either as binary or as a `datasets` Image struct (`{bytes, path}`); the label column
integers or class names (dstore.ingest.labels). Class names come, in this order, from `classes=`,
from the `datasets` ClassLabel feature (in `dataset_info.json` or the schema's `huggingface`
metadata), or from the labels.

Cost: listing reads only the label column. A sample is read by decoding its Parquet row group's
image column (cached per rank, `cache_row_groups` groups); ingest's seeded order scatters a rank's
samples over the row groups, so with row groups of R rows a rank may decode up to R samples per
sample it keeps: write Parquet with small row groups (`datasets` uses 100 rows for images), or pass
`keep_order=True` for one pass. Arrow files are memory-mapped and read without a copy. In object
storage (a URL, dstore.ingest.remote) a prefix is listed once and its splits found from the listing;
Parquet is read one column chunk per request, an Arrow file whole in one request.
"""

from __future__ import annotations

import bisect
import collections
import json
import os

from dstore.errors import ConfigError, SampleError
from dstore.ingest import splits
from dstore.ingest.folder import VALIDATE, validate_image
from dstore.ingest.labels import class_names_option, resolve_labels
from dstore.ingest.remote import Remote, failure, is_url
from dstore.ingest.source import Source

TABLE_SUFFIXES = (".parquet", ".arrow")


def _pyarrow():
    try:
        import pyarrow
        import pyarrow.ipc  # submodules: loaded here, used as attributes of pyarrow below
        import pyarrow.parquet
    except ImportError:
        raise ConfigError(
            "reading Parquet/Arrow needs pyarrow: pip install 'dstore-mpi[parquet]' (or pip install pyarrow)"
        ) from None
    return pyarrow


def _read_features(path: str, tree: _Tree | None = None) -> dict:
    """The `features` of a `datasets` dataset_info.json, or {} if there is none."""
    if not (os.path.isfile(path) if tree is None else tree.has(path)):
        return {}
    try:
        if tree is not None:
            return json.loads(tree.remote.read_text(path)).get("features") or {}
        with open(path, encoding="utf-8") as f:
            return json.load(f).get("features") or {}
    except SampleError:
        raise
    except (OSError, ValueError, AttributeError) as exc:
        raise SampleError(f"{path}: cannot read: {exc}") from exc


class _Tree:
    """An object-store prefix as table_files sees a directory: its listing (read once) and its store."""

    def __init__(self, remote: Remote, root: str):
        self.remote, self.root = remote, root.rstrip("/")
        self.files = list(remote.listing(root))
        if not self.files:
            raise SampleError(f"{root}: no objects below this prefix (check the bucket and the prefix)")

    def join(self, *parts: str) -> str:
        return "/".join((self.root, *parts))

    def has(self, url: str) -> bool:
        return url.startswith(self.root + "/") and url[len(self.root) + 1 :] in self.files


def table_files(
    spec: str, split: str | None = None, remote: Remote | None = None
) -> tuple[list[str], dict, list[str], list[str], str | None]:
    """(the data files of `spec`'s split, the `datasets` features found in a dataset_info.json or {},
    notes for the ingest summary, data files left out as in no split, the split's name or None).

    A directory's splits are found as `datasets` finds them (dstore.ingest.splits); `split` picks
    one, and is needed where there are several. With `remote`, `spec` is a URL: a table object or a
    prefix, listed once; the files are URLs.

    Raises:
        SampleError: naming `spec`, if it holds no table file, or several splits and `split` is None,
            or no split `split` (the message lists the splits found).
    """
    single = (
        os.path.isfile(spec)
        if remote is None
        else spec.lower().endswith(TABLE_SUFFIXES) and remote.size(spec) is not None
    )
    if single:
        if split not in (None, "train"):  # datasets calls a lone data file's rows the split train
            raise SampleError(f"{spec}: a single file is the one split 'train'; no split {split!r} (drop --split)")
        return [os.path.abspath(spec) if remote is None else spec], {}, [], [], split
    if remote is None and not os.path.isdir(spec):
        raise SampleError(f"{spec}: neither a .parquet/.arrow file nor a directory")
    if remote is not None and spec.lower().endswith(TABLE_SUFFIXES):
        raise SampleError(f"{spec}: cannot read: does not exist (no such bucket or key)")
    tree = None if remote is None else _Tree(remote, spec)
    listing = None if tree is None else tree.files
    read = splits.read_local if tree is None else tree.remote.read_text
    join = os.path.join if tree is None else (lambda _root, *parts: tree.join(*parts))
    notes: list[str] = []
    ignored: list[str] = []
    saved = splits.saved_splits(spec, listing, read)
    if saved is not None:  # a DatasetDict.save_to_disk directory
        name = splits.pick_split(saved, split, spec)
        files, features = saved[name], _read_features(join(spec, name, "dataset_info.json"), tree)
        notes.append(f"split {name!r} of the splits {', '.join(saved)} (dataset_dict.json)")
    elif os.path.isfile(os.path.join(spec, "state.json")) if tree is None else "state.json" in tree.files:
        # one Dataset.save_to_disk directory
        files = splits.state_files(spec, read)
        features = _read_features(join(spec, "dataset_info.json"), tree)
        try:
            name = saved_as = json.loads(read(join(spec, "state.json"))).get("_split")
        except (OSError, ValueError, AttributeError) as exc:
            raise SampleError(f"{join(spec, 'state.json')}: cannot read: {exc}") from exc
        if split is not None and split != saved_as:
            raise SampleError(f"{spec}: holds one Dataset saved as split {saved_as!r}, not {split!r} (drop --split)")
    else:
        found = splits.hub_splits(spec, listing)
        kept = {}
        for suffix in TABLE_SUFFIXES:  # as datasets, one reader for the directory: Parquet if any, else Arrow
            kept = {s: [p for p in paths if p.endswith(suffix)] for s, paths in found.items()}
            kept = {s: paths for s, paths in kept.items() if paths}
            if kept:
                break
        if not kept:
            raise SampleError(f"{spec}: no .parquet or .arrow files")
        name = splits.pick_split(kept, split, spec)
        files = list(dict.fromkeys(kept[name]))
        if len(files) < len(kept[name]):
            twice = sorted({p for p in kept[name] if kept[name].count(p) > 1})
            notes.append(
                f"split {name!r}: {len(twice)} file(s) match two of datasets' split patterns (e.g. "
                f"{twice[0]}); datasets reads their rows twice, dstore once"
            )
        chosen = set(files)
        in_splits = {p for paths in kept.values() for p in paths}
        ignored = [
            join(spec, p)
            for p in (splits.all_files(spec) if listing is None else splits.data_files(listing))
            if p.endswith(TABLE_SUFFIXES) and p not in in_splits
        ]
        notes.append(f"split {name!r} of the splits {', '.join(kept)} ({len(chosen)} file(s))")
        if ignored:
            notes.append(
                f"{len(ignored)} table file(s) in no split, not read (datasets leaves them out too), e.g. {ignored[0]}"
            )
        features = _read_features(join(spec, "dataset_info.json"), tree)
    if tree is not None:
        return [tree.join(p) for p in files], features, notes, ignored, name
    return [os.path.abspath(os.path.join(spec, p)) for p in files], features, notes, ignored, name


def _open_arrow(pa, path: str, remote: Remote | None = None):
    """An Arrow file (IPC file or stream format, as `datasets` writes) as a table over a memory map
    (an object in a store: read whole, in one request, into memory)."""
    if remote is not None:
        data = pa.py_buffer(remote.read(path))
        try:
            return pa.ipc.open_file(data).read_all()
        except pa.ArrowInvalid:
            return pa.ipc.open_stream(data).read_all()
    source = pa.memory_map(path)
    try:
        return pa.ipc.open_file(source).read_all()
    except pa.ArrowInvalid:
        return pa.ipc.open_stream(pa.memory_map(path)).read_all()


def _parquet(pa, path: str, remote: Remote | None):
    """A ParquetFile; in a store, over a file that fetches what pyarrow asks for (the footer, then
    whole column chunks) in one request per read, without read-ahead."""
    return pa.parquet.ParquetFile(path if remote is None else remote.open(path, cache=False))


def _column_kind(pa, t) -> str | None:
    """The field kind a column of Arrow type `t` is stored as, or None where it has no faithful
    text, bytes or JSON form."""
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return "text"
    if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t):
        return "bytes"
    if pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t):
        return "json"
    nested = pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)
    if nested:
        return "json" if _column_kind(pa, t.value_type) is not None else None
    if pa.types.is_struct(t):
        return "json" if all(_column_kind(pa, t.field(j).type) is not None for j in range(t.num_fields)) else None
    return None


class TableSource(Source):
    """Rows of Parquet/Arrow files (see the module docstring).

    Args:
        spec: a file or a directory.
        image_column: the column of image bytes (binary, or a struct with a `bytes` field).
        label_column: the column of labels.
        classes: class names in label order (a file, one per line, or a sequence), or None.
        validate: as for an image folder.
        cache_row_groups: Parquet row groups a process keeps decoded.
        split: the split of a directory to ingest (`train`, `test`...), needed where it holds several.
    """

    kind = "parquet"
    list_on_root = True

    def __init__(
        self,
        spec: str,
        *,
        image_column: str = "image",
        label_column: str = "label",
        classes=None,
        validate: str = "header",
        cache_row_groups: int = 4,
        split: str | None = None,
    ):
        super().__init__()
        pa = _pyarrow()
        if validate not in VALIDATE:
            raise ConfigError(f"validate={validate!r} is not one of {VALIDATE}")
        self.spec, self.validate = os.fspath(spec), validate
        self.image_column, self.label_column = image_column, label_column
        self.cache_row_groups = max(1, int(cache_row_groups))
        self.remote = Remote(self.spec) if is_url(self.spec) else None
        self.files, features, self.notes, self.ignored, self.split = table_files(self.spec, split, self.remote)
        self._parts: list[tuple[int, int, int]] = []  # (file, row group or -1 for Arrow, first row of it)
        self._starts: list[int] = []  # global index of each part's first row
        values: list = []
        for k, path in enumerate(self.files):
            features = self._list_file(pa, k, path, values) or features
        names = class_names_option(classes)
        label_feature = features.get(label_column) if isinstance(features, dict) else None
        if names is None and isinstance(label_feature, dict) and label_feature.get("names"):
            names = tuple(label_feature["names"])
        self._labels, self.class_names = resolve_labels(values, self.spec, names, notes=self.notes)
        self._n = len(values)
        if not self._n:
            raise SampleError(f"{self.spec}: no rows")
        self.encoding = "image"
        self.description = f"table {self.spec} (columns {image_column}, {label_column})"
        if self.split is not None:
            self.description = f"table {self.spec} split {self.split} (columns {image_column}, {label_column})"
        self._cache: collections.OrderedDict = collections.OrderedDict()
        self._opened: dict = {}  # file -> ParquetFile in a store: its footer read once per process

    def _check_columns(self, path: str, schema) -> None:
        for col in (self.image_column, self.label_column):
            if schema.get_field_index(col) < 0:
                raise SampleError(
                    f"{path}: no column {col!r}; its columns: {schema.names} (choose with "
                    "--image-column / --label-column)"
                )

    def _note_columns(self, schema) -> None:
        """Declares, once, the other columns as fields (by their Arrow type, `_column_kind`) and says
        which columns are what, and which cannot be stored."""
        if any(n.startswith("columns:") for n in self.notes):
            return
        pa = _pyarrow()
        specs, cannot = [], []
        for f in schema:
            if f.name in (self.image_column, self.label_column):
                continue
            kind = _column_kind(pa, f.type)
            if kind is None:
                cannot.append(f"{f.name} ({f.type})")
            else:
                specs.append((f.name, kind))
        self.field_specs = tuple(specs)
        if specs or cannot:
            self.notes.append(
                f"columns: {self.image_column} (image), {self.label_column} (label)"
                + (f"; fields to store: {', '.join(n for n, _ in specs)}" if specs else "")
                + (f"; not stored (no text, bytes or JSON form): {', '.join(cannot)}" if cannot else "")
            )

    def fields(self, i: int, names) -> dict[str, bytes]:
        """Sample i's values of the columns `names` (a null is left out: stored as missing)."""
        p, row = self._where(i)
        kinds = dict(self.field_specs)
        got = {}
        for name in names:
            try:
                value = self._column(p, name)[row].as_py()
            except Exception as exc:  # pyarrow raises several types for damaged files; name the row
                raise SampleError(
                    f"{self.locate(i)}: cannot read column {name!r}: {type(exc).__name__}: {exc}"
                ) from exc
            if value is None:
                continue
            if kinds[name] == "json":
                got[name] = json.dumps(value).encode("utf-8")
            else:
                got[name] = value.encode("utf-8") if isinstance(value, str) else bytes(value)
        return got

    def _list_file(self, pa, k: int, path: str, values: list) -> dict:
        """Appends file k's row parts and labels; returns the `datasets` features in its schema, if any."""
        first = len(values)
        try:
            if path.endswith(".arrow"):
                table = _open_arrow(pa, path, self.remote)
                self._check_columns(path, table.schema)
                self._note_columns(table.schema)
                self._starts.append(len(values))
                self._parts.append((k, -1, 0))
                values.extend(table.column(self.label_column).to_pylist())
                meta = table.schema.metadata or {}
            else:
                pf = _parquet(pa, path, self.remote)
                self._check_columns(path, pf.schema_arrow)
                self._note_columns(pf.schema_arrow)
                row = 0
                for g in range(pf.metadata.num_row_groups):
                    self._starts.append(len(values) + row)
                    self._parts.append((k, g, row))
                    row += pf.metadata.row_group(g).num_rows
                values.extend(pf.read(columns=[self.label_column]).column(0).to_pylist())
                meta = pf.schema_arrow.metadata or {}
        except SampleError:
            raise
        except (OSError, pa.ArrowException) as exc:
            raise SampleError(f"{path}: cannot read: {exc}") from exc
        except Exception as exc:  # a store's client raises many types mid-read; name the file
            if self.remote is None:
                raise
            raise failure(path, "read", exc) from exc
        if any(v is None for v in values[first:]):
            raise SampleError(f"{path}: the label column {self.label_column!r} has empty (null) values")
        try:
            return json.loads(meta.get(b"huggingface", b"{}")).get("info", {}).get("features", {}) or {}
        except ValueError:
            return {}

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_cache"] = collections.OrderedDict()  # decoded row groups stay with their process
        state["_opened"] = {}
        return state

    def __len__(self) -> int:
        return self._n

    def label(self, i: int) -> int:
        return self._labels[i]

    def _where(self, i: int) -> tuple[int, int]:
        """(part, row within it) of sample i."""
        p = bisect.bisect_right(self._starts, i) - 1
        return p, i - self._starts[p]

    def name(self, i: int) -> str:
        p, row = self._where(i)
        k, _, first = self._parts[p]
        return f"{os.path.basename(self.files[k])}#{first + row}"

    def locate(self, i: int) -> str:
        p, row = self._where(i)
        k, _, first = self._parts[p]
        return f"{self.files[k]}#{first + row}"

    def _column(self, p: int, column: str | None = None):
        """Column `column` (default: the image column) of part p (cached)."""
        column = column or self.image_column
        key = p if column == self.image_column else (p, column)
        if key in self._cache:
            self._cache.move_to_end(key)
            return self._cache[key]
        pa = _pyarrow()
        k, group, _ = self._parts[p]
        path = self.files[k]
        if group < 0:
            col = _open_arrow(pa, path, self.remote).column(column)
        else:
            col = self._parquet_file(pa, k).read_row_group(group, columns=[column]).column(0)
        col = col.combine_chunks()
        if column == self.image_column and pa.types.is_struct(col.type):
            if col.type.get_field_index("bytes") < 0:
                raise SampleError(f"{path}: image column {self.image_column!r} is a struct without a 'bytes' field")
        self._cache[key] = col
        while len(self._cache) > self.cache_row_groups * (1 + len(self.field_specs)):
            self._cache.popitem(last=False)
        return col

    def _parquet_file(self, pa, k: int):
        """File k's ParquetFile: opened per read where local (as before), kept where in a store (one
        footer request per file and process, not one per row group read)."""
        if self.remote is None:
            return _parquet(pa, self.files[k], None)
        if k not in self._opened:
            self._opened[k] = _parquet(pa, self.files[k], self.remote)
        return self._opened[k]

    def load(self, i: int) -> bytes:
        where = self.locate(i)
        p, row = self._where(i)
        try:
            value = self._column(p)[row].as_py()
        except SampleError:
            raise
        except Exception as exc:  # pyarrow raises several types for damaged files; name the row
            raise SampleError(f"{where}: cannot read: {type(exc).__name__}: {exc}") from exc
        stored_path = None
        if isinstance(value, dict):  # a datasets Image: {bytes, path}
            value, stored_path = value.get("bytes"), value.get("path")
        if value is None and stored_path:
            raise SampleError(
                f"{where}: no image bytes, only the path {stored_path!r} (datasets would open that "
                "file; dstore reads only bytes in the table): embed the images, e.g. with datasets' "
                "Dataset.to_parquet or push_to_hub, which store the bytes"
            )
        if value is None:
            raise SampleError(f"{where}: no image bytes (null)")
        if not isinstance(value, (bytes, bytearray)):
            raise SampleError(f"{where}: the image column holds {type(value).__name__}, not bytes")
        validate_image(bytes(value), where, self.validate)
        return bytes(value)
