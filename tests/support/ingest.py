"""Real input files for the ingest tests: a small image folder (PNGs rendered from the digits data
set, synthetic JPEGs), CIFAR-format batch pickles, and bad files of every kind ingest must handle."""

from __future__ import annotations

import io
import os
import pickle
import zlib

import numpy as np

from dstore.ingest.synthetic import generate_image_folder


def digit_png(index: int, side: int = 32) -> bytes:
    """Digit `index` of scikit-learn's digits, upscaled to side x side, as PNG bytes (mode L)."""
    from PIL import Image

    from dstore.ingest.digits import digits_arrays

    images, _ = digits_arrays()
    im = Image.fromarray(images[index, :, :, 0]).resize((side, side), Image.Resampling.NEAREST)
    buf = io.BytesIO()
    im.save(buf, format="PNG")
    return buf.getvalue()


def small_jpegs(root: str, count: int, *, seed: int = 0, num_classes: int = 3) -> list[str]:
    """`count` small synthetic JPEGs (sides 40..64, ~2 KB) as root/class<k>/<i>.jpg."""
    return generate_image_folder(
        root, count, seed=seed, num_classes=num_classes, mean_bytes=2000, min_side=40, max_side=64
    )


def make_mixed_folder(root: str, *, jpegs: int = 24, pngs: int = 12) -> None:
    """An ImageFolder with JPEGs in class000..class002 and digit PNGs in a class `digits`, plus a
    `.txt` file (ignored by extension)."""
    small_jpegs(root, jpegs)
    os.makedirs(os.path.join(root, "digits"), exist_ok=True)
    for i in range(pngs):
        with open(os.path.join(root, "digits", f"d{i:03d}.png"), "wb") as f:
            f.write(digit_png(i))
    with open(os.path.join(root, "class000", "README.txt"), "w") as f:
        f.write("not an image\n")


def listing(root: str) -> list[tuple[str, int]]:
    """(relative path, label) of every image in ImageFolder order, computed independently of ingest:
    torchvision 0.24's find_classes/make_dataset rules (hidden entries included)."""
    exts = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")
    classes = sorted(e.name for e in os.scandir(root) if e.is_dir())
    out = []
    for label, cls in enumerate(classes):
        for dirpath, _, filenames in sorted(os.walk(os.path.join(root, cls), followlinks=True)):
            for name in sorted(filenames):
                if name.lower().endswith(exts):
                    out.append((os.path.relpath(os.path.join(dirpath, name), root), label))
    return out


def check_container_against_folder(
    path: str, root: str, *, expect_encoding: str | None = None, exclude=(), check_index: bool = True
) -> None:
    """Every sample's bytes equal its source file's and its stored checksum is their CRC32 (ingest
    computes it on the rank that processed the sample, not the writer), labels match the class
    folder, every listed file (less `exclude`, full paths) is there once, and the source indices are
    the listing's positions. Raises AssertionError otherwise."""
    from dstore.formats import open_container

    files = listing(root)
    if exclude:
        skip = {os.path.relpath(p, root) for p in exclude}
        files = [f for f in files if f[0] not in skip]
    index = {name: (i, label) for i, (name, label) in enumerate(files)}
    with open_container(path) as c:
        assert c.num_samples == len(files), (c.num_samples, len(files))
        if expect_encoding is not None:
            assert c.info.encoding == expect_encoding, c.info.encoding
        seen = set()
        for j in range(c.num_samples):
            name = c.name(j)
            data, label = c.sample(j)
            i, want_label = index[name]
            with open(os.path.join(root, name), "rb") as f:
                want = f.read()
            assert bytes(data) == want, f"sample {j} ({name}) differs from its file"
            assert int(c.checksums[j]) == zlib.crc32(want), f"sample {j} ({name}): stored checksum is not its CRC32"
            assert label == want_label, (name, label, want_label)
            if check_index:
                assert int(c.source_index[j]) == i, (name, int(c.source_index[j]), i)
            seen.add(name)
        assert len(seen) == len(files)


def cifar_batch(n: int, *, seed: int = 0, num_classes: int = 10, cifar100: bool = False) -> dict:
    """A dict shaped like a CIFAR python batch (bytes keys, data uint8[n, 3072], labels list)."""
    rng = np.random.default_rng(seed)
    data = rng.integers(0, 256, size=(n, 3072), dtype=np.uint8)
    labels = [int(v) for v in rng.integers(0, num_classes, size=n)]
    batch = {
        b"batch_label": b"training batch",
        b"data": data,
        b"filenames": [f"img_{seed}_{i}.png".encode() for i in range(n)],
    }
    if cifar100:
        batch[b"fine_labels"] = labels
        batch[b"coarse_labels"] = [v // 5 for v in labels]
    else:
        batch[b"labels"] = labels
    return batch


def write_pickle(path: str, obj, protocol: int = 2) -> None:
    with open(path, "wb") as f:
        pickle.dump(obj, f, protocol=protocol)


def write_cifar10(root: str, *, per_batch: int = 20, batches: int = 2, protocol: int = 2) -> list[dict]:
    """data_batch_1..k + test_batch + batches.meta under root; returns the train batches."""
    os.makedirs(root, exist_ok=True)
    out = []
    for b in range(1, batches + 1):
        batch = cifar_batch(per_batch, seed=b)
        write_pickle(os.path.join(root, f"data_batch_{b}"), batch, protocol)
        out.append(batch)
    write_pickle(os.path.join(root, "test_batch"), cifar_batch(per_batch, seed=99), protocol)
    names = [
        n.encode() for n in ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")
    ]
    write_pickle(
        os.path.join(root, "batches.meta"), {b"label_names": names, b"num_cases_per_batch": per_batch}, protocol
    )
    return out


class Exploit:
    """Pickles as a call to os.system: what a malicious 'CIFAR batch' would hold."""

    def __init__(self, command: str):
        self.command = command

    def __reduce__(self):
        return (os.system, (self.command,))


def jpeg_bytes(side: int = 48, seed: int = 0) -> bytes:
    import simplejpeg

    img = np.random.default_rng(seed).integers(0, 256, size=(side, side, 3), dtype=np.uint8)
    return simplejpeg.encode_jpeg(img, quality=90)


def png_bytes(side: int = 48, seed: int = 0) -> bytes:
    from PIL import Image

    img = np.random.default_rng(seed).integers(0, 256, size=(side, side, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(img).save(buf, format="PNG")
    return buf.getvalue()


BAD_KINDS = (
    "undecodable",
    "truncated_jpeg",
    "truncated_png",
    "empty_file",
    "not_an_image",
    "broken_link",
    "empty_class",
)


def clip_shards(wds, folder, per_shard: int, *, long_captions: bool = False) -> list[str]:
    """Two image + caption (+ JSON on odd samples) WebDataset shards written by webdataset's own
    TarWriter (`wds`: the webdataset module) into `folder`, `per_shard` samples each; their paths.
    Sample k: key s{k:03d}, a PNG, class k % 3, a caption (k more 'x's with `long_captions`)."""
    shards = []
    for s in range(2):
        shards.append(os.path.join(str(folder), f"shard-{s}.tar"))
        with wds.TarWriter(shards[-1]) as sink:
            for k in range(s * per_shard, (s + 1) * per_shard):
                caption = f"a photo of thing {k} – ünïcode" + (f" {'x' * k}" if long_captions else "")
                sample = {
                    "__key__": f"s{k:03d}",
                    "png": png_bytes(4, k),
                    "cls": str(k % 3).encode(),
                    "txt": caption.encode(),
                }
                if k % 2:
                    sample["json"] = f'{{"k": {k}}}'.encode()
                sink.write(sample)
    return shards


def add_bad(root: str, kind: str) -> tuple[str, str]:
    """Adds one bad input of `kind` to the ImageFolder at root; returns (its path, a word the
    reason must contain)."""
    cls = os.path.join(root, "class001")
    if kind == "undecodable":
        path = os.path.join(cls, "garbage.jpg")
        data, word = b"\xff\xd8\xff\xe0" + os.urandom(500), "not a valid image"
    elif kind == "truncated_jpeg":
        path, full = os.path.join(cls, "cut.jpg"), jpeg_bytes()
        data, word = full[: len(full) // 2], "truncated"
    elif kind == "truncated_png":
        path, full = os.path.join(cls, "cut.png"), png_bytes()
        data, word = full[: len(full) // 2], "not a valid image"
    elif kind == "empty_file":
        path, data, word = os.path.join(cls, "empty.jpg"), b"", "empty file"
    elif kind == "not_an_image":
        path, data, word = os.path.join(cls, "text.png"), b"just some text, not a PNG\n", "not a valid image"
    elif kind == "broken_link":
        path = os.path.join(cls, "gone.jpg")
        os.symlink(os.path.join(root, "does-not-exist.jpg"), path)
        return path, "broken symbolic link"
    elif kind == "empty_class":
        path = os.path.join(root, "class999")
        os.makedirs(path)
        with open(os.path.join(path, "notes.txt"), "w") as f:
            f.write("no images here\n")
        return path, "empty class folder"
    else:
        raise ValueError(kind)
    with open(path, "wb") as f:
        f.write(data)
    return path, word


def leftovers(directory: str) -> list[str]:
    """Names in `directory` that look like a container or a writer's temporary."""
    return sorted(n for n in os.listdir(directory) if n.endswith((".h5", ".zarr", ".json")) or ".tmp" in n)


def py2_cifar_pickle(data: np.ndarray, labels: list[int]) -> bytes:
    """The bytes Python 2's cPickle (protocol 2) writes for a CIFAR batch: str keys and data as
    BINSTRING, numpy.core.multiarray._reconstruct, as in the files distributed at cs.toronto.edu."""
    import struct

    def s(text: bytes) -> bytes:  # a Python 2 str
        return (b"U" + bytes([len(text)]) + text) if len(text) < 256 else (b"T" + struct.pack("<i", len(text)) + text)

    def i(v: int) -> bytes:
        return b"K" + bytes([v]) if v < 256 else b"M" + struct.pack("<H", v)

    rows, cols = data.shape
    array = (
        b"cnumpy.core.multiarray\n_reconstruct\n"
        + b"cnumpy\nndarray\n"
        + i(0)
        + b"\x85"
        + s(b"b")
        + b"\x87R"  # _reconstruct(ndarray, (0,), 'b')
        + b"("
        + i(1)
        + b"("
        + i(rows)
        + i(cols)
        + b"t"  # state: version, shape
        + b"cnumpy\ndtype\n("
        + s(b"u1")
        + i(0)
        + i(1)
        + b"tR"  # dtype('u1', 0, 1)
        + b"("
        + i(3)
        + s(b"|")
        + b"NNNJ\xff\xff\xff\xffJ\xff\xff\xff\xff"
        + i(0)
        + b"tb"  # dtype state
        + b"\x89"
        + s(data.tobytes())
        + b"tb"
    )  # fortran=False, raw bytes; BUILD
    label_list = b"](" + b"".join(i(v) for v in labels) + b"e"
    return b"\x80\x02}(" + s(b"data") + array + s(b"labels") + label_list + s(b"batch_label") + s(b"py2") + b"u."


def ingest_here(source, output, **kw):
    """`dstore.ingest.ingest` of `source` into `output` in this process alone (COMM_SELF), without a
    progress line unless `progress` is given; returns what ingest returns."""
    from mpi4py import MPI

    from dstore.ingest import ingest

    kw.setdefault("progress", False)
    return ingest(str(source), None if output is None else str(output), comm=MPI.COMM_SELF, **kw)
