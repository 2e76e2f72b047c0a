"""WebDataset tar shards: samples are groups of adjacent members sharing a key (the member's path up
to the first dot of its file name: `train/00042.jpg` and `train/00042.cls` are sample
`train/00042`), read as streams and never extracted.

The source is one `.tar`, a glob (`shards/*.tar`), a WebDataset brace pattern
(`shard-{000000..000099}.tar`), or a directory: its `*.tar` files of one split, found as `datasets`
finds them (`train-000.tar` and `validation-000.tar` side by side are two splits, never mixed:
`split=`/`--split` picks one). Listing (rank 0) walks each tar's headers once with `tarfile`
(uncompressed tars only: a sample is then read with one seek at its member's data offset, by
whichever rank processes it; in object storage, dstore.ingest.remote, the shard is read as a stream
of 16 MiB requests while listing and a sample is one ranged GET); the label members are read while
listing. Of each sample, the image is the member whose extension is one of `image_key`
(`jpg;png;jpeg` by default, the first found), the label the member with extension `label_key`
(`cls`: an integer or a class name; see dstore.ingest.labels). A sample with no image or no label
member is a listing problem (`on_error`); members of other extensions (`json`, `txt`...) are
stored as extra fields named by their extension (`--fields` selects; docs/format.md, "Fields"),
read on the writing rank, and the ingest summary says which (`fields stored: ...`).

As `webdataset` 1.0.2 (`tariterators.group_by_keys`), whose behaviour is the reference:
- a sample with two members of one extension (`a.jpg` twice) is refused (webdataset raises
  `ValueError: duplicate file name in tar file`), naming the tar and the key; never last-wins;
- a member whose file name has no dot, or starts with a dot (macOS `._a.jpg` resource forks,
  which `tar` on a Mac adds), is not part of any sample: skipped and listed as ignored. (For
  `dir/._a.jpg` webdataset makes a junk sample keyed `dir/`; dstore skips that member too.)
- a tar cut short (a partial copy or download) is an error naming the tar, the last whole member
  and the byte offset where the data stops; webdataset raises `tarfile.ReadError` where a member's
  data is cut, but ends the shard without a word where a header is cut or damaged (as `tarfile`
  does): dstore refuses that too, since the rest of the shard would be lost in silence.
"""

from __future__ import annotations

import contextlib
import glob
import os
import re
import tarfile

from dstore.errors import ConfigError, SampleError
from dstore.ingest import splits
from dstore.ingest.folder import VALIDATE, validate_image
from dstore.ingest.labels import class_names_option, resolve_labels
from dstore.ingest.remote import Prefetched, Remote, failure, is_url
from dstore.ingest.source import Source

_BRACES = re.compile(r"\{(\d+)\.\.(\d+)\}")


def expand_shards(spec: str, split: str | None = None, remote: Remote | None = None) -> tuple[list[str], list[str]]:
    """(the tar files `spec` names, notes for the ingest summary). `spec` is a file, a glob or a
    `{a..b}` pattern (its files, sorted), or a directory: the `*.tar` files below it of one split,
    found and ordered as `datasets` does (dstore.ingest.splits: `train-000.tar`, `val/000.tar`...;
    a directory of shards without split names is the one split `train`). With `remote`, `spec` is
    a URL and a directory is a prefix (listed once); the files are URLs.

    Raises:
        SampleError: naming `spec` if it names no tar file, or a directory holds several splits and
            `split` is None, or no split `split`.
    """
    notes: list[str] = []
    braces = _BRACES.search(spec)
    globbed = braces is None and any(c in spec for c in "*?[")
    single = (
        remote is not None
        and not braces
        and not globbed
        and spec.lower().endswith(".tar")
        and remote.size(spec) is not None
    )
    listing = None
    if remote is not None and braces is None and not globbed and not single and spec.lower().endswith(".tar"):
        raise SampleError(
            f"{spec}: does not exist (no such bucket or object; a prefix of shards is given without .tar)"
        )
    if remote is not None and braces is None and not globbed and not single:
        listing = remote.listing(spec)
        if not listing:
            raise SampleError(f"{spec}: no objects below this prefix (check the bucket and the prefix)")
    if listing is not None or (remote is None and os.path.isdir(spec)):
        tree = splits.hub_splits(spec, files=None if listing is None else list(listing))
        found = {s: [p for p in paths if p.endswith(".tar")] for s, paths in tree.items()}
        found = {s: paths for s, paths in found.items() if paths}
        if not found:
            raise SampleError(f"{spec}: no .tar shards found")
        name = splits.pick_split(found, split, spec)
        paths = [_join(spec, p) for p in dict.fromkeys(found[name])]
        if len(found) > 1 or split is not None:
            notes.append(f"split {name!r} of the splits {', '.join(found)} ({len(paths)} shard(s))")
    elif split is not None:
        raise SampleError(
            f"{spec}: split={split!r} picks a split of a directory; this names its shards itself "
            "(drop --split, or give the directory)"
        )
    elif braces is not None:
        lo, hi, width = int(braces.group(1)), int(braces.group(2)), len(braces.group(1))
        paths = [spec[: braces.start()] + f"{k:0{width}d}" + spec[braces.end() :] for k in range(lo, hi + 1)]
        if remote is None:
            missing = [p for p in paths if not os.path.isfile(p)]
        else:  # one listing of the pattern's folder, not one request per shard
            parent = spec[: braces.start()].rsplit("/", 1)[0]
            there = {_join(parent, p) for p in remote.listing(parent)}
            missing = [p for p in paths if p not in there]
        if missing:
            raise SampleError(f"{spec}: {len(missing)} of its {len(paths)} shards do not exist (first: {missing[0]})")
    elif globbed:
        paths = sorted(glob.glob(spec)) if remote is None else remote.glob(spec)
    else:
        paths = [spec] if single or os.path.isfile(spec) else []
    if not paths:
        raise SampleError(f"{spec}: no .tar shards found")
    return (paths if remote is not None else [os.path.abspath(p) for p in paths]), notes


def _join(root: str, rel: str) -> str:
    """A relative posix path below a directory or a URL prefix."""
    return f"{root.rstrip('/')}/{rel}" if is_url(root) else os.path.join(root, rel)


def split_key(member: str) -> tuple[str, str]:
    """(sample key, extension) of a member name, as WebDataset splits them."""
    directory, base = os.path.split(member)
    stem, _, ext = base.partition(".")
    return (f"{directory}/{stem}" if directory else stem), ext


def _in_a_sample(member: str) -> bool:
    """Whether webdataset puts `member` in a sample: its file name has a dot, and not first."""
    base = member.rsplit("/", 1)[-1]
    return "." in base and not base.startswith(".")


_COMPRESSED = {b"\x1f\x8b": "gzip", b"BZh": "bzip2", b"\xfd7zXZ\x00": "xz", b"\x28\xb5\x2f\xfd": "zstd"}


def _head_and_size(path: str, remote: Remote | None) -> tuple[bytes, int]:
    """(the first 6 bytes, the size) of a shard, or (b"", -1) where it cannot be read."""
    try:
        if remote is not None:
            return remote.read(path, 0, 6), remote.size(path) or -1
        with open(path, "rb") as f:
            return f.read(6), os.path.getsize(path)
    except (OSError, SampleError):
        return b"", -1


def _unreadable(path: str, last, exc: Exception, remote: Remote | None = None) -> str:
    """The message for a tar that `tarfile` cannot read to its end: compressed, cut short or damaged."""
    head, size = _head_and_size(path, remote)
    kind = next((name for magic, name in _COMPRESSED.items() if head.startswith(magic)), None)
    if kind is not None:
        return (
            f"{path}: a {kind}-compressed tar; shards are read by seeking to each member, which needs an "
            f"uncompressed tar: decompress it first"
        )
    if last is None:
        return f"{path}: not a tar file ({exc}); its first header is not a tar header"
    end = last.offset_data + (last.size if last.isfile() else 0)
    if end > size:
        return (
            f"{path}: truncated: member {last.name!r} needs bytes up to {end} but the file ends at byte {size} "
            f"({exc}); copy or download the shard again"
        )
    return (
        f"{path}: truncated or damaged after member {last.name!r}: no valid tar header at byte offset "
        f"{-(-end // 512) * 512} of {size} ({exc}); copy or download the shard again"
    )


def _check_end(path: str, tf: tarfile.TarFile, last, remote: Remote | None = None) -> None:
    """SampleError unless the tar ends with its end-of-archive block where `tf` stopped reading.

    `tarfile` (and so webdataset) ends its listing without a word at a header cut short or one that
    is not a header, after the first member: a shard cut at or inside a header would lose its
    remaining samples in silence. Here it is an error naming the tar and the byte."""
    fileobj = tf.fileobj
    if fileobj is None:
        return
    fileobj.seek(tf.offset)
    block = fileobj.read(tarfile.BLOCKSIZE)
    if len(block) == tarfile.BLOCKSIZE and not block.strip(b"\0"):
        return
    after = f"after member {last.name!r}" if last is not None else "at its start"
    size = _head_and_size(path, remote)[1]
    if len(block) < tarfile.BLOCKSIZE:
        raise SampleError(
            f"{path}: truncated {after}: the file ends at byte {size} without the tar's end-of-archive "
            f"block (a header cut short or missing); copy or download the shard again"
        )
    raise SampleError(
        f"{path}: damaged {after}: no valid tar header at byte offset {tf.offset} of {size}; "
        "copy or download the shard again"
    )


def _keys(value: str, what: str) -> tuple[str, ...]:
    keys = tuple(k.strip().lower().lstrip(".") for k in str(value).split(";") if k.strip())
    if not keys:
        raise ConfigError(f"{what}={value!r} names no extension")
    return keys


_FIELD_KIND = {"txt": "text", "text": "text", "caption": "text", "json": "json"}
"""The kind of a WebDataset member stored as a field, by extension (any other: bytes)."""


class TarSource(Source):
    """Samples of WebDataset tar shards (see the module docstring).

    Args:
        spec: the shards.
        image_key: the image member's extension(s), `;`-separated, first match wins.
        label_key: the label member's extension.
        classes: class names in label order (a file, one per line, or a sequence), or None.
        on_error: `raise` or `skip` for samples without an image or a label.
        validate: as for an image folder.
        split: the split of a directory to ingest (`train`, `validation`...), needed where it holds several.
    """

    kind = "tar"
    list_on_root = True

    def __init__(
        self,
        spec: str,
        *,
        image_key: str = "jpg;png;jpeg",
        label_key: str = "cls",
        classes=None,
        on_error: str = "raise",
        validate: str = "header",
        split: str | None = None,
    ):
        super().__init__()
        if validate not in VALIDATE:
            raise ConfigError(f"validate={validate!r} is not one of {VALIDATE}")
        self.validate = validate
        self.image_keys = _keys(image_key, "image_key")
        self.label_key = _keys(label_key, "label_key")[0]
        self.remote = Remote(os.fspath(spec)) if is_url(os.fspath(spec)) else None
        self._prefetched = Prefetched()
        self.shards, self.notes = expand_shards(os.fspath(spec), split, self.remote)
        self.description = f"webdataset {os.fspath(spec)} ({len(self.shards)} shard(s))"
        self._members: list[tuple[int, str, int, int]] = []  # (shard, member name, data offset, size)
        self._fields: dict[str, int] = {}  # extension -> samples with a member of it (an extra field)
        # per sample: {extension: (data offset, size)} of its other members, read when written
        self._field_members: list[dict[str, tuple[int, int]]] = []
        values: list[str] = []
        for s, path in enumerate(self.shards):
            self._list_shard(s, path, values, on_error)
        if not self._members:
            raise SampleError(
                f"{spec}: no samples with an image ({';'.join(self.image_keys)}) and a label ({self.label_key}) member"
            )
        self._labels, self.class_names = resolve_labels(
            values, os.fspath(spec), class_names_option(classes), notes=self.notes
        )
        self._note_fields()
        exts = {os.path.splitext(m[1])[1].lower() for m in self._members}
        self.encoding = "jpeg" if exts <= {".jpg", ".jpeg"} else "png" if exts == {".png"} else "image"

    def _list_shard(self, s: int, path: str, values: list, on_error: str) -> None:
        last = None  # the last member whose header was read whole
        try:
            # A shard in object storage is read start to end in large blocks (a stream of requests
            # of READ_BLOCK bytes), never one request per header; a local one through the OS.
            with self._open(path) as f, tarfile.open(path if f is None else None, "r:", fileobj=f) as tf:
                group: dict[str, tarfile.TarInfo] = {}
                key, duplicate = None, None
                for info in tf:
                    last = info
                    if not info.isfile():
                        continue
                    if not _in_a_sample(info.name):
                        self.ignored.append(f"{path}:{info.name}")
                        continue
                    k, ext = split_key(info.name)
                    if k != key:
                        self._take(s, path, key, group, values, tf, on_error, duplicate)
                        key, group, duplicate = k, {}, None
                    if ext.lower() in group and duplicate is None:
                        duplicate = (group[ext.lower()].name, info.name)
                    group.setdefault(ext.lower(), info)
                _check_end(path, tf, last, self.remote)
                self._take(s, path, key, group, values, tf, on_error, duplicate)
        except tarfile.ReadError as exc:
            raise SampleError(_unreadable(path, last, exc, self.remote)) from exc
        except SampleError:
            raise
        except OSError as exc:
            if self.remote is not None:
                raise failure(path, "read", exc) from exc
            raise SampleError(f"{path}: cannot read: {exc.strerror or exc}") from exc
        except Exception as exc:  # a store's client raises many types mid-read; name the shard
            if self.remote is None:
                raise
            raise failure(path, "read", exc) from exc

    def prefetch(self, indices) -> None:
        if self.remote is not None:
            self._prefetched.fill(self.remote, indices, self._range)

    def _range(self, i: int) -> tuple[str, int, int]:
        s, _, offset, size = self._members[i]
        return self.shards[s], offset, offset + size

    def _open(self, path: str):
        """A shard opened for reading start to end: a store's file object, or a null context for a local path."""
        return contextlib.nullcontext() if self.remote is None else self.remote.open(path)

    def _take(self, s, path, key, group, values, tf, on_error, duplicate=None) -> None:
        """Records sample `key` of shard `s` from its members `group` (ext -> TarInfo); `duplicate`:
        (first, second) names of two members of one extension, which refuse the sample."""
        if key is None:
            return
        if duplicate is not None:
            reason = (
                f"sample {key!r} has two members {duplicate[0]!r} and {duplicate[1]!r} of one extension; "
                "webdataset refuses it too (duplicate file name): rewrite the shard with one of them"
            )
            if on_error == "raise":
                raise SampleError(f"{path}: {reason}")
            self.skipped.append((f"{path}:{key}", reason))
            return
        image = next((group[k] for k in self.image_keys if k in group), None)
        label = group.get(self.label_key)
        if image is None or label is None:
            missing = (
                f"image member ({';'.join(self.image_keys)})" if image is None else f"label member ({self.label_key})"
            )
            reason = f"sample has no {missing}; its members' extensions: {sorted(group)}"
            if on_error == "raise":
                raise SampleError(f"{path}:{key}: {reason}")
            self.skipped.append((f"{path}:{key}", reason))
            return
        text = tf.extractfile(label).read().decode("utf-8", "replace").strip()
        self._members.append((s, image.name, image.offset_data, image.size))
        values.append(text)
        extra = {}
        for ext in group:  # the members of this sample other than its image and label: extra fields
            if group[ext] is not image and ext != self.label_key:
                self._fields[ext] = self._fields.get(ext, 0) + 1
                extra[ext] = (group[ext].offset_data, group[ext].size)
        self._field_members.append(extra)

    def _note_fields(self) -> None:
        """Declares the other member extensions as fields (`txt`/`text`/`caption`: text, `json`:
        json, else bytes) and says which members are what, with how many samples have each field
        (a sample without one stores it empty)."""
        image = sorted({split_key(m[1])[1].lower() for m in self._members})
        self.field_specs = tuple((ext, _FIELD_KIND.get(ext, "bytes")) for ext in sorted(self._fields))
        found = [f"{ext} ({n} of {len(self._members)} samples)" for ext, n in sorted(self._fields.items())]
        if found:
            self.notes.append(
                f"members: {';'.join(image)} (image), {self.label_key} (label); "
                f"other members, fields to store: {', '.join(found)}"
            )

    def fields(self, i: int, names) -> dict[str, bytes]:
        """Sample i's members of the extensions `names` (those it has), read from its shard."""
        s = self._members[i][0]
        got = {}
        for ext in names:
            where = self._field_members[i].get(ext)
            if where is None:
                continue
            offset, size = where
            what = f"{self.locate(i)} (field {ext!r})"
            if self.remote is not None:
                data = self.remote.read(self.shards[s], offset, offset + size)
            else:
                try:
                    with open(self.shards[s], "rb") as f:
                        data = os.pread(f.fileno(), size, offset)
                except OSError as exc:
                    raise SampleError(f"{what}: cannot read: {exc.strerror or exc}") from exc
            if len(data) != size:
                raise SampleError(f"{what}: the shard ends {size - len(data)} bytes before the member's end")
            got[ext] = data
        return got

    def __len__(self) -> int:
        return len(self._members)

    def label(self, i: int) -> int:
        return self._labels[i]

    def name(self, i: int) -> str:
        s, member, _, _ = self._members[i]
        return f"{os.path.basename(self.shards[s])}/{member}"

    def locate(self, i: int) -> str:
        s, member, _, _ = self._members[i]
        return f"{self.shards[s]}:{member}"

    def load(self, i: int) -> bytes:
        s, _, offset, size = self._members[i]
        where = self.locate(i)
        if self.remote is not None:  # one ranged request for exactly the member's bytes
            data = self._prefetched.take(i)
            if data is None:
                data = self.remote.read(self.shards[s], offset, offset + size)
            if len(data) != size:
                raise SampleError(f"{where}: the shard ends {size - len(data)} bytes before the member's end")
            validate_image(data, where, self.validate)
            return data
        try:
            with open(self.shards[s], "rb") as f:  # one open and one read per sample (~10 us more than a kept handle)
                data = os.pread(f.fileno(), size, offset)
        except OSError as exc:
            raise SampleError(f"{where}: cannot read: {exc.strerror or exc}") from exc
        if len(data) != size:
            raise SampleError(f"{where}: the shard ends {size - len(data)} bytes before the member's end")
        validate_image(data, where, self.validate)
        return data
