"""An image folder in torchvision ImageFolder layout (root/<class>/<...>/<file>.jpg), stored as the
original file bytes.

Listing rules: those of torchvision.datasets.ImageFolder (0.24: `find_classes`, `make_dataset`), so
that sample i of the listing (the container's `source_index` i) is torchvision's `dataset[i]` and
the labels are its `class_to_idx`:
- classes are the sub-directories of root (links to directories too), sorted by name; label i is the
  i-th. Hidden ones (a leading `.`, e.g. `.ipynb_checkpoints`) are classes too, as in torchvision;
  ingest says so in a note, and an empty one is an error like any empty class;
- below each class, directories in the order of their whole path text (the class folder's own files
  first; `a-b/` before `a/x/`, as `sorted(os.walk(...))` gives), each one's files sorted by name;
  symbolic links are followed, except a link loop and a directory link back into the source tree
  (to the root, above it, or below it: its images would be listed twice, maybe under another
  class), which are bad entries (torchvision would list them; ingest says the indices differ);
- a file is a sample if its name ends with one of IMAGE_EXTENSIONS, case-insensitive (hidden files
  too: `._a.jpg` from macOS is a sample, and a bad one); other files (`.txt`, files directly in
  root) are ignored and listed in the report's `ignored`; `.gif` and other image files torchvision
  leaves out are left out and said in a note (`extensions=` takes them);
- a sample path that is not a regular file (a broken symlink, a FIFO, a link loop) is a bad
  sample: with on_error="raise" an error while listing; with "skip" it keeps its index and is
  skipped when loaded, so that the later samples keep theirs;
- an empty class (no image file) is an error with on_error="raise"; with "skip" the class keeps its
  label (class indices stay those of the sorted directory names, torchvision's `allow_empty=True`)
  and is listed as skipped.

In object storage (`s3://bucket/prefix`, dstore.ingest.remote) the prefix is listed once and the
same order follows from the keys (`folder_order`): a store has no links, special files or empty
directories; each file is read with one request.

Validation (`validate`), what each costs per file on top of reading it (measured here, 2 shared cores):
- `header` (default): JPEG: simplejpeg parses the header and the file must end its last scan with an
  EOI marker (catches truncation; ~3 us); PNG: Pillow `verify()` checks every chunk's CRC through
  IEND (~70 us per 100 KB); other formats: full Pillow decode.
- `full`: a full decode of every file (~1.1-2.3 ms for a 110 KB, ~420x420 JPEG: 400-900 files/s per core).
- `none`: only that the file is non-empty and starts with a known image signature (~1 us).
"""

from __future__ import annotations

import errno
import io
import os
import posixpath
import stat

from dstore.codec.decode import sniff
from dstore.errors import ConfigError, SampleError
from dstore.ingest.remote import Prefetched, Remote, is_url
from dstore.ingest.source import Source

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")
"""Extensions taken as images: torchvision's IMG_EXTENSIONS (0.24), so that the samples are its."""

OTHER_IMAGE_EXTENSIONS = (".gif", ".jfif", ".jpe", ".heic", ".heif", ".avif", ".jp2", ".ico", ".svg", ".dng")
"""Image files torchvision's ImageFolder leaves out: left out here too, and said at ingest."""

VALIDATE = ("header", "full", "none")

_JPEG_EXT = (".jpg", ".jpeg")
_PNG_EXT = (".png",)


def encoding_from_extensions(paths) -> str:
    """`jpeg` if every path ends in .jpg/.jpeg, `png` if every one ends in .png, else `image`."""
    exts = {os.path.splitext(p)[1].lower() for p in paths}
    if exts and exts <= set(_JPEG_EXT):
        return "jpeg"
    if exts and exts <= set(_PNG_EXT):
        return "png"
    return "image"


def validate_image(data: bytes, where: str, validate: str = "header") -> str:
    """Checks that `data` is a whole, decodable image; returns its kind (`jpeg`, `png`, `other`).

    Raises:
        SampleError: `where: reason` if it is empty, not an image, truncated or undecodable.
    """
    if not data:
        raise SampleError(f"{where}: empty file")
    kind = sniff(data)
    if validate == "none":
        if kind == "other" and not _pil_identifies(data):
            raise SampleError(f"{where}: not an image file (unknown signature {bytes(data[:8])!r})")
        return kind
    try:
        if kind == "jpeg":
            import simplejpeg

            if validate == "full":
                simplejpeg.decode_jpeg(data)
            else:
                simplejpeg.decode_jpeg_header(data)
                # The entropy-coded data cannot contain FF D9 (0xFF is always stuffed), so a file
                # whose last start-of-scan is not followed by an end-of-image marker was cut short.
                if not data.endswith(b"\xff\xd9") and data.rfind(b"\xff\xd9") < data.rfind(b"\xff\xda"):
                    raise ValueError("truncated: no end-of-image marker after the last scan")
            return kind
        from PIL import Image

        with Image.open(io.BytesIO(data)) as im:
            if kind == "png" and validate == "header":
                im.verify()
            else:
                im.load()
        return kind
    except SampleError:
        raise
    except Exception as exc:  # decoders raise many types (ValueError, OSError, SyntaxError...)
        raise SampleError(f"{where}: not a valid image: {type(exc).__name__}: {exc}") from exc


def _pil_identifies(data: bytes) -> bool:
    from PIL import Image

    try:
        with Image.open(io.BytesIO(data)):
            return True
    except Exception:  # noqa: BLE001 - any failure means "not an image Pillow knows"
        return False


def _not_regular(mode: int) -> str:
    """What a file of `mode` is if it is not a regular file (`a directory`, `a FIFO`...), else ``""``."""
    if stat.S_ISREG(mode):
        return ""
    for test, what in (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return what
    return "an unknown kind"


def folder_order(paths, exts, ignored: list[str], root: str) -> tuple[list[str], list[str], list[int]]:
    """(classes, files, labels) of an image folder given as relative posix paths (an object-store
    listing), in torchvision's order: classes the sorted first components, below each the
    directories by their path text and each one's files by name; files of other extensions and files
    directly in root are appended to `ignored` (as `root/path`)."""
    by_class: dict[str, dict[str, list[str]]] = {}
    for rel in paths:
        parts = rel.split("/")
        if len(parts) >= 2:
            by_class.setdefault(parts[0], {})  # a class even if it holds no image (an empty class)
        if len(parts) < 2 or not parts[-1].lower().endswith(exts):
            ignored.append(f"{root}/{rel}")
            continue
        by_class[parts[0]].setdefault("/".join(parts[:-1]), []).append(rel)
    classes = sorted(by_class)
    files, labels = [], []
    for label, cls in enumerate(classes):
        for directory in sorted(by_class[cls]):
            found = sorted(by_class[cls][directory], key=lambda rel: rel.rsplit("/", 1)[1])
            files.extend(found)
            labels.extend([label] * len(found))
    return classes, files, labels


class FileSamples(Source):
    """Image files below `self.root`: sample i is the file `self._files[i]` (relative) with label
    `self._labels[i]`, checked by `validate_image` at `self.validate` when loaded."""

    root: str
    validate: str
    remote: Remote | None = None  # set where root is an object-store URL
    _prefetched: Prefetched = Prefetched()  # replaced per instance where root is a URL
    _files: list[str]
    _labels: list[int]

    def __len__(self) -> int:
        return len(self._files)

    def label(self, i: int) -> int:
        return self._labels[i]

    def name(self, i: int) -> str:
        return self._files[i].replace(os.sep, "/")

    def prefetch(self, indices) -> None:
        if self.remote is not None:
            self._prefetched.fill(self.remote, indices, lambda i: (self.locate(i), None, None))

    def locate(self, i: int) -> str:
        if self.remote is not None:  # a key is literal: `./a.jpg` in a labels CSV is the object `a.jpg`
            return f"{self.root}/{posixpath.normpath(self._files[i])}"
        return os.path.join(self.root, self._files[i])

    def load(self, i: int) -> bytes:
        where = self.locate(i)
        if self.remote is not None:  # an object: one request for the whole file
            data = self._prefetched.take(i)
            if data is None:
                data = self.remote.read(where)
            validate_image(data, where, self.validate)
            return data
        try:
            # Checked before open: opening a FIFO waits for a writer forever and reading a device
            # (/dev/zero) never ends.
            kind = _not_regular(os.stat(where).st_mode)
            if kind:
                raise SampleError(f"{where}: not a regular file ({kind}); list image files only")
            with open(where, "rb") as f:
                data = f.read()
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise SampleError(f"{where}: symbolic link loop") from exc
            if exc.errno == errno.ENOENT and os.path.islink(where):
                raise SampleError(f"{where}: broken symbolic link") from exc
            raise SampleError(f"{where}: cannot read: {exc.strerror or exc}") from exc
        validate_image(data, where, self.validate)
        return data


class FolderSource(FileSamples):
    """Image files under root/<class>/, labels from the sorted class names.

    Args:
        root: the directory.
        on_error: `raise` or `skip` for problems found while listing (empty class, a sample path
            that is not a regular file).
        validate: one of VALIDATE (see the module docstring for what each checks and costs).
        extensions: file extensions taken as images.
    """

    kind = "folder"
    list_on_root = True

    def __init__(
        self,
        root: str,
        *,
        on_error: str = "raise",
        validate: str = "header",
        extensions: tuple[str, ...] = IMAGE_EXTENSIONS,
    ):
        super().__init__()
        if validate not in VALIDATE:
            raise ConfigError(f"validate={validate!r} is not one of {VALIDATE}")
        if on_error not in ("raise", "skip"):
            raise ConfigError(f"on_error={on_error!r} is not one of ('raise', 'skip')")
        self.remote = Remote(os.fspath(root)) if is_url(os.fspath(root)) else None
        self._prefetched = Prefetched()
        self.root = os.path.abspath(os.fspath(root)) if self.remote is None else os.fspath(root).rstrip("/")
        self.validate = validate
        self.description = self.root
        exts = tuple(e.lower() if e.startswith(".") else "." + e.lower() for e in extensions)
        if self.remote is None and not os.path.isdir(self.root):
            raise SampleError(f"{self.root}: not a directory (an image folder source is root/<class>/<file>)")
        if self.remote is not None:
            classes, files, labels = self._scan_listing(self.remote, exts, on_error)
        else:
            classes, files, labels = self._scan(exts, on_error)
        if not classes:
            raise SampleError(f"{self.root}: no class directories (expected root/<class>/<image file>)")
        if not files:
            raise SampleError(
                f"{self.root}: no image files ({', '.join(exts)}) in any of the {len(classes)} class directories"
            )
        self.class_names = tuple(classes)
        for name in classes:
            try:
                name.encode("utf-8")
            except UnicodeEncodeError:
                escaped = name.encode("utf-8", "backslashreplace").decode("utf-8")
                self.notes.append(
                    f"class directory '{escaped}' is not valid UTF-8; its class name is stored "
                    "backslash-escaped as shown"
                )
        self._files = files
        self._labels = labels
        self.encoding = encoding_from_extensions(files)

    def _scan(self, exts, on_error):
        """(classes, files, labels) in torchvision's order (see the module docstring); fills the
        notes on where the listing and torchvision's ImageFolder differ or may surprise."""
        try:
            top = sorted(os.scandir(self.root), key=lambda e: e.name)
        except OSError as exc:
            raise SampleError(f"{self.root}: cannot list: {exc.strerror or exc}") from exc
        self._real_root = os.path.realpath(self.root)
        classes, files, labels = [], [], []
        for entry in top:
            is_dir, problem = self._examine(entry)
            if problem is not None:
                self._bad(entry.path, problem, on_error)
            elif is_dir:
                classes.append(entry.name)
            else:
                self.ignored.append(entry.path)  # files directly in root belong to no class
        for label, cls in enumerate(classes):
            directories: list[tuple[str, list[str]]] = []
            self._walk(os.path.join(self.root, cls), exts, on_error, directories, set())
            # torchvision: `for root, _, fnames in sorted(os.walk(class_dir, followlinks=True))`:
            # directories in the order of their whole path text (the class folder's own files first,
            # `a-b/` before `a/x/`), each one's files sorted by name.
            found = [rel for _, names in sorted(directories) for rel in names]
            if not found:
                reason = "empty class folder: no image files"
                if cls.startswith("."):
                    reason += " (a hidden directory is a class, as in torchvision's ImageFolder: remove it)"
                if on_error == "raise":
                    raise SampleError(
                        f"{os.path.join(self.root, cls)}: {reason} (use on_error='skip' / "
                        "--on-error skip to keep the class without samples)"
                    )
                self.skipped.append((os.path.join(self.root, cls), reason))
            files.extend(found)
            labels.extend([label] * len(found))
        self._note_differences(classes, files, exts)
        return classes, files, labels

    def _scan_listing(self, remote: Remote, exts, on_error):
        """(classes, files, labels) of an object-store prefix, from one listing, in the order `_scan`
        gives for the same tree: a store has no links, no special files and no empty directories."""
        listing = remote.listing(self.root)
        if not listing:
            raise SampleError(f"{self.root}: no objects below this prefix (check the bucket and the prefix)")
        classes, files, labels = folder_order(listing, exts, self.ignored, self.root)
        present = set(labels)
        for label, cls in enumerate(classes):
            if label not in present:
                reason = "empty class folder: no image files"
                if on_error == "raise":
                    raise SampleError(
                        f"{self.root}/{cls}: {reason} (use on_error='skip' / --on-error skip to keep "
                        "the class without samples)"
                    )
                self.skipped.append((f"{self.root}/{cls}", reason))
        self._note_differences(classes, files, exts)
        return classes, files, labels

    def _note_differences(self, classes, files, exts) -> None:
        """Notes on hidden entries taken, image files of other extensions left out, and entries
        torchvision's ImageFolder would list that were skipped (its indices then differ from ours)."""
        hidden_classes = [c for c in classes if c.startswith(".")]
        hidden_files = [f for f in files if (os.sep + f).find(os.sep + ".") >= 0]  # a hidden file or folder on its path
        if hidden_classes or hidden_files:
            self.notes.append(
                f"hidden entries (a leading '.') are taken, as torchvision's ImageFolder takes them: "
                f"{len(hidden_classes)} class folder(s) {hidden_classes[:3]}, {len(hidden_files)} "
                f"file(s) {hidden_files[:3]}; remove them if they are not data"
            )
        other = [p for p in self.ignored if p.lower().endswith(OTHER_IMAGE_EXTENSIONS) and not p.lower().endswith(exts)]
        if other:
            kinds = sorted({os.path.splitext(p)[1].lower() for p in other})
            self.notes.append(
                f"{len(other)} image file(s) with extension {', '.join(kinds)} are not taken (as "
                f"torchvision's ImageFolder, which lists {', '.join(IMAGE_EXTENSIONS)}), e.g. "
                f"{other[0]}; extensions=... takes them"
            )
        # An empty class keeps its label and torchvision's os.walk passes over a directory it cannot
        # list: neither moves an index. A link refused (loop, back into the tree) does.
        listing_skips = [w for w, r in self.skipped if not r.startswith(("empty class folder", "cannot list"))]
        if listing_skips:
            self.notes.append(
                f"{len(listing_skips)} entries that torchvision's ImageFolder would list were "
                f"skipped while listing (first {listing_skips[0]}): past it a sample's source index is "
                "not its torchvision index"
            )

    def _bad(self, where: str, reason: str, on_error: str) -> None:
        """A listing problem: an error with on_error="raise", else listed as skipped."""
        if on_error == "raise":
            raise SampleError(f"{where}: {reason}")
        self.skipped.append((where, reason))

    def _examine(self, entry) -> tuple[bool, str | None]:
        """(is a directory to walk, why not to take it): a link loop (ELOOP) or a directory link back
        into the source tree (root, one of its ancestors, or a directory below root, which would list
        images twice, perhaps under another class) is a problem; a link elsewhere is followed."""
        try:
            is_dir = entry.is_dir()
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                return False, "symbolic link loop"
            return False, f"cannot examine: {exc.strerror or exc}"
        if not is_dir or not entry.is_symlink():
            return is_dir, None
        real = os.path.realpath(entry.path)
        root, here = self._real_root, os.path.realpath(os.path.dirname(entry.path))
        if os.path.join(here, "").startswith(os.path.join(real, "")):
            return True, f"symbolic link loop: points to {real}, a directory above it"
        if os.path.join(root, "").startswith(os.path.join(real, "")) or real.startswith(os.path.join(root, "")):
            return True, (f"symbolic link to {real}, inside the source (or above it): its images would be listed twice")
        return True, None

    def _walk(self, directory, exts, on_error, directories, seen):
        """Appends (directory, its image files relative to root, sorted) for `directory` and every
        directory below it (links followed, as os.walk(followlinks=True) does, loops refused)."""
        try:
            st = os.stat(directory)
            if (st.st_dev, st.st_ino) in seen:  # reached again through a link outside the source tree
                self._bad(directory, "symbolic link loop (a directory reached twice through links)", on_error)
                return
            seen.add((st.st_dev, st.st_ino))
            entries = sorted(os.scandir(directory), key=lambda e: e.name)
        except OSError as exc:
            reason = f"cannot list directory: {exc.strerror or exc}"
            if on_error == "raise":
                raise SampleError(f"{directory}: {reason}") from exc
            self.skipped.append((directory, reason))
            return
        names, below = [], []
        for entry in entries:
            is_dir, problem = self._examine(entry)
            if is_dir and problem is not None:
                self._bad(entry.path, problem, on_error)
            elif is_dir:
                below.append(entry.path)
            elif not entry.name.lower().endswith(exts):
                self.ignored.append(entry.path)
            else:
                # torchvision lists every non-directory with an image extension (a broken link, a
                # FIFO, a link loop) and fails when it opens it. Here "raise" stops now; "skip" keeps
                # the entry, so that later source indices stay torchvision's, and `load` refuses it.
                if problem is None and not entry.is_file():
                    problem = (
                        "broken symbolic link"
                        if entry.is_symlink() and not os.path.exists(entry.path)
                        else "not a regular file"
                    )
                if problem is not None and on_error == "raise":
                    raise SampleError(f"{entry.path}: {problem}")
                names.append(entry.path[len(os.path.join(self.root, "")) :])  # scandir builds it from root
        directories.append((directory, names))
        for path in below:
            self._walk(path, exts, on_error, directories, seen)
