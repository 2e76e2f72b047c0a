"""WebDataset tar shards: samples are groups of adjacent members sharing a key (the member's path up
to the first dot of its file name: `train/00042.jpg` and `train/00042.cls` are sample
`train/00042`), read as streams and never extracted.

The source is one `.tar`, a directory (its `*.tar` files, sorted), a glob (`shards/*.tar`) or a
WebDataset brace pattern (`shard-{000000..000099}.tar`). Listing (rank 0) walks each tar's headers
once with `tarfile` (uncompressed tars only: a sample is then read with one seek at its member's
data offset, by whichever rank processes it); the label members are read while listing. Of each
sample, the image is the member whose extension is one of `image_key` (`jpg;png;jpeg` by default,
the first found), the label the member with extension `label_key` (`cls`: an integer or a class
name; see dstore.ingest.labels). A sample with no image or no label member is a listing problem
(`on_error`); members of other extensions (`json`, `txt`...) are ignored.
"""

from __future__ import annotations

import glob
import os
import re
import tarfile

from dstore.errors import ConfigError, SampleError
from dstore.ingest.folder import VALIDATE, validate_image
from dstore.ingest.labels import class_names_option, resolve_labels
from dstore.ingest.source import Source

_BRACES = re.compile(r"\{(\d+)\.\.(\d+)\}")


def expand_shards(spec: str) -> list[str]:
    """The tar files `spec` names (a file, a directory, a glob or a `{a..b}` pattern), sorted.

    Raises:
        SampleError: naming `spec` if it names no tar file.
    """
    if os.path.isdir(spec):
        paths = sorted(glob.glob(os.path.join(spec, "*.tar")))
    elif (m := _BRACES.search(spec)) is not None:
        lo, hi, width = int(m.group(1)), int(m.group(2)), len(m.group(1))
        paths = [spec[:m.start()] + f"{k:0{width}d}" + spec[m.end():] for k in range(lo, hi + 1)]
        missing = [p for p in paths if not os.path.isfile(p)]
        if missing:
            raise SampleError(f"{spec}: {len(missing)} of its {len(paths)} shards do not exist (first: {missing[0]})")
    elif any(c in spec for c in "*?["):
        paths = sorted(glob.glob(spec))
    else:
        paths = [spec] if os.path.isfile(spec) else []
    if not paths:
        raise SampleError(f"{spec}: no .tar shards found")
    return [os.path.abspath(p) for p in paths]


def split_key(member: str) -> tuple[str, str]:
    """(sample key, extension) of a member name, as WebDataset splits them."""
    directory, base = os.path.split(member)
    stem, _, ext = base.partition(".")
    return (f"{directory}/{stem}" if directory else stem), ext


def _keys(value: str, what: str) -> tuple[str, ...]:
    keys = tuple(k.strip().lower().lstrip(".") for k in str(value).split(";") if k.strip())
    if not keys:
        raise ConfigError(f"{what}={value!r} names no extension")
    return keys


class TarSource(Source):
    """Samples of WebDataset tar shards (see the module docstring).

    Args:
        spec: the shards.
        image_key: the image member's extension(s), `;`-separated, first match wins.
        label_key: the label member's extension.
        classes: class names in label order (a file, one per line, or a sequence), or None.
        on_error: `raise` or `skip` for samples without an image or a label.
        validate: as for an image folder.
    """

    kind = "tar"
    list_on_root = True

    def __init__(self, spec: str, *, image_key: str = "jpg;png;jpeg", label_key: str = "cls", classes=None,
                 on_error: str = "raise", validate: str = "header"):
        super().__init__()
        if validate not in VALIDATE:
            raise ConfigError(f"validate={validate!r} is not one of {VALIDATE}")
        self.validate = validate
        self.image_keys = _keys(image_key, "image_key")
        self.label_key = _keys(label_key, "label_key")[0]
        self.shards = expand_shards(os.fspath(spec))
        self.description = f"webdataset {os.fspath(spec)} ({len(self.shards)} shard(s))"
        self._members: list[tuple[int, str, int, int]] = []  # (shard, member name, data offset, size)
        values: list[str] = []
        for s, path in enumerate(self.shards):
            self._list_shard(s, path, values, on_error)
        if not self._members:
            raise SampleError(f"{spec}: no samples with an image ({';'.join(self.image_keys)}) and a label "
                              f"({self.label_key}) member")
        self._labels, self.class_names = resolve_labels(values, os.fspath(spec), class_names_option(classes),
                                                        notes=self.notes)
        exts = {os.path.splitext(m[1])[1].lower() for m in self._members}
        self.encoding = "jpeg" if exts <= {".jpg", ".jpeg"} else "png" if exts == {".png"} else "image"

    def _list_shard(self, s: int, path: str, values: list, on_error: str) -> None:
        try:
            with tarfile.open(path, "r:") as tf:
                group: dict[str, tarfile.TarInfo] = {}
                key = None
                for info in tf:
                    if not info.isfile():
                        continue
                    k, ext = split_key(info.name)
                    if k != key:
                        self._take(s, path, key, group, values, tf, on_error)
                        key, group = k, {}
                    group[ext.lower()] = info
                self._take(s, path, key, group, values, tf, on_error)
        except tarfile.ReadError as exc:
            raise SampleError(f"{path}: not an uncompressed tar file ({exc}); compressed shards cannot be read "
                              "by seeking: decompress them first") from exc
        except OSError as exc:
            raise SampleError(f"{path}: cannot read: {exc.strerror or exc}") from exc

    def _take(self, s, path, key, group, values, tf, on_error) -> None:
        """Records sample `key` of shard `s` from its members `group` (ext -> TarInfo)."""
        if key is None:
            return
        image = next((group[k] for k in self.image_keys if k in group), None)
        label = group.get(self.label_key)
        if image is None or label is None:
            missing = f"image member ({';'.join(self.image_keys)})" if image is None else \
                f"label member ({self.label_key})"
            reason = f"sample has no {missing}; its members' extensions: {sorted(group)}"
            if on_error == "raise":
                raise SampleError(f"{path}:{key}: {reason}")
            self.skipped.append((f"{path}:{key}", reason))
            return
        text = tf.extractfile(label).read().decode("utf-8", "replace").strip()
        self._members.append((s, image.name, image.offset_data, image.size))
        values.append(text)

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
        try:
            with open(self.shards[s], "rb") as f:  # one open and one read per sample (~10 us more than a kept handle)
                data = os.pread(f.fileno(), size, offset)
        except OSError as exc:
            raise SampleError(f"{where}: cannot read: {exc.strerror or exc}") from exc
        if len(data) != size:
            raise SampleError(f"{where}: the shard ends {size - len(data)} bytes before the member's end")
        validate_image(data, where, self.validate)
        return data
