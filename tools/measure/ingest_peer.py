"""The peers' writers for `python -m dstore.tools.measure.ingest`, run in the peers' own venv.

It imports nothing from this project (the peers' venv does not have it): it reads a JSON job (the
input: image files with their labels, or WebDataset tar shards; the class names), writes it with one
peer's writer in WORKERS processes as that peer's documentation shows, and prints one JSON line
(samples written, as the output's index counts them; bytes written; the peer's version). Every
writer stores the JPEG's bytes as they are (no decode, no re-encode) and the label, in ~64 MB
shards, uncompressed.

    python ingest_peer.py litdata|mosaic|webdataset|hf --job JOB.json --out DIR --workers W
    python ingest_peer.py --check        # one JSON line: each peer's version or why it cannot run

Peers: LitData `optimize`, Mosaic Streaming `MDSWriter` (one writer per worker into a partition,
then `merge_index`, as Mosaic's docs do for parallel conversion), webdataset `ShardWriter` (one per
worker), Hugging Face `datasets` (`Dataset.from_generator(..., num_proc=W)` then
`save_to_disk(num_proc=W)`: what a user runs to get a saved dataset from files, cache included).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import multiprocessing
import os
import sys
import tarfile
import types

SHARD_BYTES = 64 << 20
"""Every peer's shard size limit: 64 MiB."""
IMAGE_EXTS = (".jpg", ".jpeg", ".png")


def samples(kind: str, items: list):
    """(key, image bytes, label) of each item: files [path, label] (read whole, as a user's
    `open(p, "rb").read()`), or tar shards read in stream mode (what webdataset's tar reader does)."""
    if kind == "folder":
        for path, label in items:
            with open(path, "rb") as fh:
                yield os.path.splitext(os.path.basename(path))[0], fh.read(), int(label)
        return
    for shard in items:
        key, image, label = "", None, None
        with tarfile.open(shard, "r|") as tar:
            for m in tar:
                if not m.isfile():
                    continue
                stem, ext = os.path.splitext(m.name)
                if stem != key:
                    if image is not None and label is not None:
                        yield key, image, label
                    key, image, label = stem, None, None
                f = tar.extractfile(m)
                payload = f.read() if f is not None else b""
                if ext.lower() in IMAGE_EXTS:
                    image = payload
                elif ext == ".cls":
                    label = int(payload)
        if image is not None and label is not None:
            yield key, image, label


def parts(items: list, workers: int) -> list[list]:
    """`items` cut into `workers` contiguous parts of about the same length."""
    if workers <= 1:
        return [items]
    n = len(items)
    return [items[k * n // workers : (k + 1) * n // workers] for k in range(workers)]


def import_streaming():
    """Mosaic's `streaming` package; where its top-level import fails only because torchvision cannot
    load (a CPU torch beside a CUDA torchvision), the writer's own modules, which do not use it."""
    try:
        return importlib.import_module("streaming"), ""
    except (ImportError, RuntimeError) as exc:
        if "torchvision" not in repr(exc) and "torchvision" not in str(getattr(exc, "__cause__", "")):
            raise
        for name in [m for m in sys.modules if m == "streaming" or m.startswith("streaming.")]:
            del sys.modules[name]
        spec = importlib.util.find_spec("streaming")
        if spec is None or not spec.submodule_search_locations:
            raise
        root = list(spec.submodule_search_locations)[0]
        for name, sub in (("streaming", ""), ("streaming.base", "base")):
            mod = types.ModuleType(name)
            mod.__path__ = [os.path.join(root, sub)]
            sys.modules[name] = mod
        pkg = sys.modules["streaming"]
        setattr(pkg, "__version__", importlib.import_module("streaming._version").__version__)  # noqa: B010
        setattr(pkg, "MDSWriter", importlib.import_module("streaming.base.format.mds.writer").MDSWriter)  # noqa: B010
        return pkg, " (writer modules imported alone: torchvision does not load beside this CPU torch)"


# --- LitData ---------------------------------------------------------------------------------------


def _lit_file(item):
    path, label = item
    with open(path, "rb") as fh:
        return {"image": fh.read(), "label": int(label)}


def _lit_shard(shard):
    for _key, image, label in samples("tars", [shard]):
        yield {"image": image, "label": label}


def write_litdata(job: dict, out: str, workers: int) -> tuple[str, int]:
    litdata = importlib.import_module("litdata")
    fn = _lit_file if job["kind"] == "folder" else _lit_shard
    litdata.optimize(
        fn=fn,
        inputs=job["items"],
        output_dir=out,
        chunk_bytes="64MB",
        num_workers=workers,
        mode="overwrite",
        verbose=False,
    )
    with open(os.path.join(out, "index.json")) as fh:
        n = sum(c["chunk_size"] for c in json.load(fh)["chunks"])
    return f"litdata {litdata.__version__}", n


# --- Mosaic Streaming ------------------------------------------------------------------------------


def _mds_part(arg) -> int:
    kind, items, out = arg
    streaming, _ = import_streaming()
    n = 0
    with streaming.MDSWriter(
        out=out,
        columns={"image": "bytes", "label": "int"},
        compression=None,
        size_limit=SHARD_BYTES,
        progress_bar=False,
    ) as w:
        for _key, image, label in samples(kind, items):
            w.write({"image": image, "label": label})
            n += 1
    return n


def write_mosaic(job: dict, out: str, workers: int) -> tuple[str, int]:
    streaming, how = import_streaming()
    if workers == 1:
        _mds_part((job["kind"], job["items"], out))
    else:
        outs = [os.path.join(out, str(k)) for k in range(workers)]
        with multiprocessing.Pool(workers) as pool:
            pool.map(_mds_part, [(job["kind"], p, o) for p, o in zip(parts(job["items"], workers), outs)])
        merge_index = importlib.import_module("streaming.base.util").merge_index
        merge_index([os.path.join(o, "index.json") for o in outs], out, keep_local=True)
    with open(os.path.join(out, "index.json")) as fh:
        n = sum(s["samples"] for s in json.load(fh)["shards"])
    return f"mosaicml-streaming {streaming.__version__}{how}", n


# --- webdataset ------------------------------------------------------------------------------------


def _wds_part(arg) -> int:
    kind, items, pattern = arg
    wds = importlib.import_module("webdataset")
    n = 0
    with wds.ShardWriter(pattern, maxsize=SHARD_BYTES, verbose=0) as sink:
        for key, image, label in samples(kind, items):
            sink.write({"__key__": key, "jpg": image, "cls": label})
            n += 1
    return n


def write_webdataset(job: dict, out: str, workers: int) -> tuple[str, int]:
    wds = importlib.import_module("webdataset")
    os.makedirs(out, exist_ok=True)
    args = [
        (job["kind"], p, os.path.join(out, f"part{k}-%06d.tar")) for k, p in enumerate(parts(job["items"], workers))
    ]
    if workers == 1:
        counts = [_wds_part(args[0])]
    else:
        with multiprocessing.Pool(workers) as pool:
            counts = pool.map(_wds_part, args)
    return f"webdataset {wds.__version__}", sum(counts)


# --- Hugging Face datasets -------------------------------------------------------------------------


def _hf_gen(items, kind):
    for key, image, label in samples(kind, items):
        yield {"image": {"bytes": image, "path": key + ".jpg"}, "label": label}


def write_hf(job: dict, out: str, workers: int) -> tuple[str, int]:
    datasets = importlib.import_module("datasets")
    features = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(names=job["classes"])})
    cache = out + ".hf-cache"  # the generator's Arrow cache: written too, then removed by the caller
    ds = datasets.Dataset.from_generator(
        _hf_gen,
        features=features,
        cache_dir=cache,
        gen_kwargs={"items": job["items"], "kind": job["kind"]},
        num_proc=workers if workers > 1 else None,
    )
    ds.save_to_disk(out, max_shard_size=SHARD_BYTES, num_proc=workers if workers > 1 else None)
    return f"datasets {datasets.__version__}", len(ds)


WRITERS = {"litdata": write_litdata, "mosaic": write_mosaic, "webdataset": write_webdataset, "hf": write_hf}
MODULES = {"litdata": "litdata", "mosaic": "streaming", "webdataset": "webdataset", "hf": "datasets"}


def check() -> dict:
    """Each peer: its version, or why it cannot run here."""
    out = {}
    for name, mod in MODULES.items():
        try:
            if name == "mosaic":
                m, how = import_streaming()
                out[name] = {"version": m.__version__ + how}
            else:
                out[name] = {"version": importlib.import_module(mod).__version__}
        except Exception as exc:  # noqa: BLE001 (any import failure is a reason to skip that peer, reported whole)
            out[name] = {"missing": f"{type(exc).__name__}: {exc}"[:300]}
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").partition("\n")[0])
    p.add_argument("writer", nargs="?", choices=sorted(WRITERS))
    p.add_argument("--job", help="JSON: {kind: folder|tars, items: [[path, label]...] or [shard...], classes}")
    p.add_argument("--out", help="output directory (must not exist)")
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--check", action="store_true")
    args = p.parse_args(argv)
    if args.check:
        print(json.dumps(check()))
        return 0
    if not (args.writer and args.job and args.out):
        p.error("WRITER, --job and --out are needed (or --check)")
    with open(args.job) as fh:
        job = json.load(fh)
    version, n = WRITERS[args.writer](job, args.out, args.workers)
    written = sum(os.path.getsize(os.path.join(d, n)) for d, _, ns in os.walk(args.out) for n in ns)
    print(json.dumps({"version": version, "samples": n, "bytes_written": written}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
