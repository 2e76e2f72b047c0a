"""The journal of a resumable ingest: what an interrupted ingest finished, so that the same command
run again writes only what is missing (no MPI here; dstore.ingest.run drives it).

Beside the output `out.h5` (or the sharded directory `out/`) an ingest keeps the directory
`.out.h5.ingest/` until its container is complete:

- `journal.json`: the ingest's id, the data chunk size, and the fingerprint of its options and its
  source (sample count, class names, a CRC32 of the names and labels, and the size and
  modification time of each input file: `source-inputs.npz`, with the names in `source-names.txt`).
- per shard s and attempt a, the temporary being written (`shard-00000.a0.h5`, a Zarr directory
  `shard-00000.a0.zarr`) and its log (`shard-00000.a0.log`): JSON lines, each written after the
  writer made its data chunks durable (`StreamingWriter.durable`), recording the positions now
  durable: per position the stored size (-1: skipped), per kept sample its CRC32, the skipped
  samples' reasons, and where each durable chunk lies in the temporary.

A resume takes, per shard, the attempt with the most durable positions, reads its durable bytes
back (each sample checked against its logged CRC32; the first that fails ends the prefix), writes
them into a new attempt and continues at the next position. Labels, names, source indices and
fields come from the source again. The completion marker is still written last, by the commit of
the container; the journal goes after it.
"""

from __future__ import annotations

import array
import dataclasses
import hashlib
import json
import os
import re
import shutil
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from dstore.errors import ConfigError, OutputError
from dstore.formats.base import crc32
from dstore.formats.layout import read_durable
from dstore.ingest.source import Source

JOURNAL_VERSION = 1
SUFFIX = ".ingest"
OPTION_KEYS = (
    "fmt",
    "shards",
    "seed",
    "keep_order",
    "encoding",
    "resize",
    "count",
    "reencode_max_side",
    "reencode_quality",
    "stratify",
    "fields",
)
"""The IngestConfig fields that decide what a container holds (a resume refuses a change in them).
`on_error`, `progress`, `heartbeat` and `overwrite` may change between runs: the samples already
written are the same either way (a rerun after a bad sample stopped the ingest may pass
`--on-error skip`)."""


def journal_dir(output) -> str:
    """The journal directory of output `output`: `.<name>.ingest` beside it."""
    head, tail = os.path.split(os.path.abspath(os.fspath(output)).rstrip("/"))
    return os.path.join(head, f".{tail}{SUFFIX}")


def options_fingerprint(source_spec: str, cfg, source_options: dict) -> dict:
    """The options a resume must find unchanged, as JSON-able values."""
    opts = {k: getattr(cfg, k) for k in OPTION_KEYS}
    opts["resize"] = None if opts["resize"] is None else list(opts["resize"])
    opts["fields"] = (
        opts["fields"] if opts["fields"] is None or isinstance(opts["fields"], str) else list(opts["fields"])
    )
    opts["source"] = os.path.abspath(source_spec) if os.path.exists(str(source_spec)) else str(source_spec)
    opts.update(
        {
            f"source option {k}": v
            for k, v in sorted(source_options.items())
            if k != "on_error" and not (k == "source_type" and v == "auto")
        }
    )  # auto: the default
    return json.loads(json.dumps(opts, default=str))


def _names_blob(src: Source, n: int) -> bytes:
    return "\n".join(src.name(i).replace("\n", "\\n") for i in range(n)).encode("utf-8", "backslashreplace")


def listing_fingerprint(src: Source, n: int, names: bytes) -> dict:
    """The source's listing: count, class names, encoding and a CRC32 of names and labels."""
    labels = np.array([src.label(i) for i in range(n)], dtype="<i8")
    return {
        "samples": int(n),
        "class_names": list(src.class_names),
        "encoding": src.encoding,
        "names_crc32": crc32(names) & 0xFFFFFFFF,
        "labels_crc32": crc32(labels.tobytes()) & 0xFFFFFFFF,
    }


def input_files(src: Source, n: int) -> tuple[list[str], bool]:
    """(the local files the source reads, whether file i is sample i's alone): an image folder's
    files, a WebDataset's shards, Parquet files, a container's file. Objects in a bucket and
    generated sources have none (their listing is compared, not their files)."""
    if getattr(src, "remote", None) is not None:
        return [], False
    if hasattr(src, "_files") and hasattr(src, "root"):  # FileSamples: a file per sample
        return [src.locate(i) for i in range(n)], True
    for attr in ("shards", "files"):  # TarSource, TableSource
        paths = getattr(src, attr, None)
        if isinstance(paths, list) and all(isinstance(p, str) for p in paths):
            return list(paths), False
    path = getattr(src, "path", None)  # ContainerSource, ArraySource, CifarSource
    if isinstance(path, str) and os.path.exists(path):
        if os.path.isdir(path):
            return sorted(os.path.join(r, f) for r, _, fs in os.walk(path) for f in fs), False
        return [path], False
    return [], False


def stat_files(paths: list[str], *, probe: int = 256, slow: float = 200e-6) -> np.ndarray:
    """int64[len(paths), 2]: each file's size and modification time in ns ((-1, -1): gone). The
    first `probe` are stat'ed in turn; where one took more than `slow` seconds on average (a parallel
    file system answers in milliseconds) the rest run in a pool of 16 threads (measured: on a local
    disk the pool cost 0.3-0.7 s for 3,000 files under load, the loop a few ms)."""

    def one(p):
        try:
            st = os.stat(p)
            return st.st_size, st.st_mtime_ns
        except OSError:
            return -1, -1

    t0 = time.perf_counter()
    out = [one(p) for p in paths[:probe]]
    rest = paths[probe:]
    if rest and (time.perf_counter() - t0) / max(1, len(out)) > slow:
        with ThreadPoolExecutor(16) as pool:
            out += pool.map(one, rest, chunksize=64)
    else:
        out += [one(p) for p in rest]
    return np.array(out, dtype=np.int64).reshape(-1, 2)


def _atomic_write(path: str, data: bytes) -> None:
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


@dataclasses.dataclass
class ShardState:
    """What one attempt at a shard made durable: `positions` done (relative to the shard's first),
    per position its stored size (-1: skipped), the kept samples' CRC32s, the skipped samples'
    (where, reason), and the locators of the temporary's durable data chunks."""

    attempt: int
    tmp: str
    log: str
    positions: int = 0
    sizes: list = dataclasses.field(default_factory=list)
    crcs: list = dataclasses.field(default_factory=list)
    skipped: list = dataclasses.field(default_factory=list)
    locators: list = dataclasses.field(default_factory=list)

    @property
    def kept_sizes(self) -> np.ndarray:
        s = np.asarray(self.sizes, dtype=np.int64)
        return s[s >= 0]

    def truncated(self, positions: int) -> ShardState:
        """This state cut to its first `positions` positions."""
        kept = sum(1 for x in self.sizes[:positions] if x >= 0)
        nskip = positions - kept
        return dataclasses.replace(
            self, positions=positions, sizes=self.sizes[:positions], crcs=self.crcs[:kept], skipped=self.skipped[:nskip]
        )


def _read_log(path: str) -> dict:
    """The cumulative content of a shard log (a torn last line, from a kill mid-write, is ignored)."""
    out = {"positions": 0, "sizes": [], "crcs": [], "skipped": [], "locators": []}
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().split("\n")
    except OSError:
        return out
    for line in lines:
        try:
            rec = json.loads(line)
        except ValueError:
            break
        out["positions"] = int(rec["positions"])
        for key in ("sizes", "crcs", "skipped", "locators"):
            out[key].extend(rec[key])
    return out


class Journal:
    """An ingest's journal directory (see the module docstring). Built by `create` or `load`."""

    def __init__(self, path: str, meta: dict):
        self.path = path
        self.meta = meta

    @property
    def ingest_id(self) -> str:
        return self.meta["ingest_id"]

    @property
    def chunk_bytes(self) -> int:
        return int(self.meta["chunk_bytes"])

    @classmethod
    def create(cls, path: str, *, options: dict, src: Source, n: int, fmt: str, chunk_bytes: int) -> Journal:
        """A new journal (replacing any at `path`) for an ingest of `src` with `options`."""
        try:
            return cls._create(path, options=options, src=src, n=n, fmt=fmt, chunk_bytes=chunk_bytes)
        except OSError as exc:
            shutil.rmtree(path, ignore_errors=True)
            raise OutputError(
                f"{os.path.dirname(path)}: cannot create the ingest's journal {path} beside the "
                f"output: {exc.strerror or exc}"
            ) from exc

    @classmethod
    def _create(cls, path: str, *, options: dict, src: Source, n: int, fmt: str, chunk_bytes: int) -> Journal:
        shutil.rmtree(path, ignore_errors=True)
        os.makedirs(path)
        names = _names_blob(src, n)
        files, per_sample = input_files(src, n)
        stats = stat_files(files)
        listing = listing_fingerprint(src, n, names)
        # The ingest's id is its fingerprint's digest (not a random one): an uninterrupted ingest and a
        # resumed one of the same files with the same options write the same attributes, and an
        # ingest of another source, seed or file version gets another id.
        h = hashlib.sha256(json.dumps([options, listing], sort_keys=True).encode("utf-8"))
        h.update("\n".join(files).encode("utf-8", "backslashreplace"))
        h.update(np.ascontiguousarray(stats, dtype="<i8").tobytes())
        digest = h.hexdigest()[:32]
        meta = {
            "version": JOURNAL_VERSION,
            "ingest_id": digest,
            "fmt": fmt,
            "chunk_bytes": int(chunk_bytes),
            "options": options,
            "listing": listing,
            "per_sample_files": per_sample,
        }
        _atomic_write(os.path.join(path, "source-names.txt"), names)
        with open(os.path.join(path, "source-inputs.npz"), "wb") as f:
            np.savez(f, stats=stats, paths=np.array(files if not per_sample else [], dtype=str))
        _atomic_write(os.path.join(path, "journal.json"), json.dumps(meta, indent=1).encode("utf-8"))
        return cls(path, meta)

    @classmethod
    def load(cls, path: str) -> Journal | None:
        """The journal at `path`, or None where there is none (or only a torn one, from a kill
        before its journal.json was written: nothing was written before that)."""
        try:
            with open(os.path.join(path, "journal.json"), encoding="utf-8") as f:
                meta = json.load(f)
        except (OSError, ValueError):
            return None
        if not isinstance(meta, dict) or meta.get("version") != JOURNAL_VERSION:
            return None
        return cls(path, meta)

    def remove(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)

    # ------------------------------------------------------------------ the fingerprint
    def check(self, options: dict, src: Source, n: int, done_positions: np.ndarray | None = None) -> None:
        """ConfigError in one line naming what changed since the interrupted ingest: an option, the
        source's listing (samples added, removed, renamed or relabelled), or an input file's size or
        modification time. An image folder's file that changed but is not written yet (e.g. a bad
        sample replaced) is allowed: `done_positions` (bool per source index) says which are."""
        old = self.meta["options"]
        diff = [
            f"{k} {old.get(k)!r} -> {options.get(k)!r}"
            for k in sorted(set(old) | set(options))
            if old.get(k) != options.get(k)
        ]
        if diff:
            raise ConfigError(self._refusal("options changed: " + ", ".join(diff)))
        names = _names_blob(src, n)
        now, then = listing_fingerprint(src, n, names), self.meta["listing"]
        if now != then:
            raise ConfigError(self._refusal("the source changed: " + self._listing_change(then, now, names)))
        files, per_sample = input_files(src, n)
        with np.load(os.path.join(self.path, "source-inputs.npz")) as z:
            stats = z["stats"]
        if len(files) != len(stats):
            raise ConfigError(self._refusal(f"the source changed: it reads {len(files)} file(s), it read {len(stats)}"))
        check = np.arange(len(files))
        if per_sample and done_positions is not None:
            check = np.flatnonzero(done_positions[: len(files)])
        now_stats = stat_files([files[i] for i in check])
        bad = np.flatnonzero((now_stats != stats[check]).any(axis=1))
        if bad.size:
            i = int(check[bad[0]])
            was, now_s = stats[i], now_stats[bad[0]]
            what = (
                "is gone"
                if now_s[0] < 0
                else (f"size {was[0]} -> {now_s[0]} bytes" if was[0] != now_s[0] else "modification time changed")
            )
            raise ConfigError(
                self._refusal(
                    f"the source changed: {files[i]} {what}"
                    + (f" (and {bad.size - 1} more file(s))" if bad.size > 1 else "")
                )
            )

    def _listing_change(self, then: dict, now: dict, names: bytes) -> str:
        if then["samples"] != now["samples"] or then["names_crc32"] != now["names_crc32"]:
            try:
                with open(os.path.join(self.path, "source-names.txt"), "rb") as f:
                    old = set(f.read().split(b"\n"))
            except OSError:
                old = set()
            new = set(names.split(b"\n"))
            added, removed = sorted(new - old), sorted(old - new)
            parts = [f"{len(added)} sample(s) added (e.g. {added[0].decode('utf-8', 'replace')})"] if added else []
            parts += (
                [f"{len(removed)} sample(s) removed (e.g. {removed[0].decode('utf-8', 'replace')})"] if removed else []
            )
            return ", ".join(parts) or f"{then['samples']} -> {now['samples']} samples (names reordered)"
        if then["class_names"] != now["class_names"]:
            return f"class names {then['class_names'][:5]} -> {now['class_names'][:5]}"
        if then["labels_crc32"] != now["labels_crc32"]:
            return "labels differ"
        return f"encoding {then['encoding']!r} -> {now['encoding']!r}"

    def _refusal(self, what: str) -> str:
        return (
            f"cannot resume the interrupted ingest journaled in {self.path}: {what}; run the same command as "
            "before, or pass --restart (resume=False) to discard what it wrote and start over"
        )

    # ------------------------------------------------------------------ shards
    def _attempts(self, shard: int) -> list[int]:
        pat = re.compile(rf"shard-{shard:05d}\.a(\d+)\.log")
        found = []
        for entry in os.listdir(self.path):
            m = pat.fullmatch(entry)
            if m:
                found.append(int(m.group(1)))
        return sorted(found)

    def _files(self, shard: int, attempt: int) -> tuple[str, str]:
        suffix = ".h5" if self.meta["fmt"] == "hdf5" else ".zarr"
        stem = os.path.join(self.path, f"shard-{shard:05d}.a{attempt}")
        return stem + suffix, stem + ".log"

    def state(self, shard: int) -> ShardState | None:
        """Shard `shard`'s best durable attempt (the most positions), or None; attempts with fewer
        positions are removed."""
        best = None
        for a in self._attempts(shard):
            tmp, log = self._files(shard, a)
            st = ShardState(a, tmp, log, **_read_log(log)) if os.path.exists(tmp) else None
            if st is not None and st.positions > 0 and (best is None or st.positions > best.positions):
                if best is not None:
                    self.discard(best)
                best = st
            elif st is None or best is not None:
                self.discard(ShardState(a, tmp, log))
        return best

    def discard(self, state: ShardState) -> None:
        """Removes an attempt's temporary and log."""
        shutil.rmtree(state.tmp, ignore_errors=True) if os.path.isdir(state.tmp) else _unlink(state.tmp)
        _unlink(state.log)

    def new_attempt(self, shard: int) -> ShardState:
        """A fresh attempt at `shard` (its temporary's path and an empty log)."""
        attempts = self._attempts(shard)
        a = attempts[-1] + 1 if attempts else 0
        tmp, log = self._files(shard, a)
        with open(log, "w", encoding="utf-8"):
            pass
        return ShardState(a, tmp, log)

    def positions_done(self, shards: int) -> int:
        """Durable positions over all shards' best attempts (for messages)."""
        return sum(st.positions for st in map(self.state, range(shards)) if st is not None)

    def restore(
        self,
        state: ShardState,
        writer,
        src: Source,
        order: np.ndarray,
        lo: int,
        field_names,
        batch_bytes: int = 64 << 20,
    ) -> ShardState:
        """Writes `state`'s durable samples (positions lo.. of `order`) into `writer`, each checked
        against its logged CRC32; returns the state as restored (cut before the first sample whose
        bytes do not read back as logged: the rest is written again)."""
        from dstore.formats.base import checksum

        sizes = np.asarray(state.sizes, dtype=np.int64)
        kept_pos = np.flatnonzero(sizes >= 0)
        ends = np.cumsum(sizes[kept_pos])
        starts = ends - sizes[kept_pos]
        k, good = 0, state.positions
        while k < kept_pos.size:
            j = int(np.searchsorted(ends, starts[k] + batch_bytes, side="right"))
            j = max(j, k + 1)
            data = read_durable(
                self.meta["fmt"], state.tmp, self.chunk_bytes, state.locators, int(starts[k]), int(ends[j - 1])
            )
            crcs = [checksum(data[int(starts[x] - starts[k]) : int(ends[x] - starts[k])]) for x in range(k, j)]
            bad = [x for x, c in zip(range(k, j), crcs) if c != int(state.crcs[x])]
            if bad:
                j, good = bad[0], int(kept_pos[bad[0]])
                data = data[: int(starts[j] - starts[k])] if j > k else data[:0]
            if j > k:
                idx = order[lo + kept_pos[k:j]].tolist()
                writer.extend(
                    data,
                    sizes[kept_pos[k:j]],
                    [src.label(i) for i in idx],
                    [src.name(i) for i in idx],
                    idx,
                    checksums=[int(c) for c in state.crcs[k:j]],
                    fields=[src.fields(i, field_names) for i in idx] if field_names else None,
                )
            if bad:
                break
            k = j
        return state.truncated(good)


def _unlink(path: str) -> None:
    try:
        os.remove(path)
    except OSError:
        pass


def _kill_at(positions: int) -> None:
    """The resume tests' interruption ($DSTORE_INGEST_KILL_AT=SIGNAL:N, dstore.runtime.rc): this process
    sends itself SIGNAL once a shard's journal has logged N positions."""
    from dstore.runtime import rc

    spec = rc.INGEST_KILL_AT.raw()
    if spec is None:
        return
    import signal

    name, _, count = spec.partition(":")
    if positions >= int(count):
        os.kill(os.getpid(), getattr(signal, name))


class Checkpointer:
    """Records an attempt's durable positions in its log, from the writer's thread: `add` after each
    round written into the writer, `maybe` then checkpoints if `period` seconds have passed (0:
    after every round) and the writer has made new chunks durable. `superseded` (an older attempt
    this one copied) is removed once this one's log covers as many positions."""

    def __init__(
        self,
        journal: Journal,
        state: ShardState,
        writer,
        period: float,
        superseded: ShardState | None = None,
        prefix: ShardState | None = None,
    ):
        import time

        self._time = time.monotonic
        self.journal, self.state, self.writer, self.period = journal, state, writer, float(period)
        self.superseded = superseded
        self._sizes = array.array("q")  # per position of this attempt: stored size, -1 skipped (8 bytes each)
        self._kept_pos = array.array("q")  # the positions of the kept samples
        self._skipped: list = []
        self.logged = 0  # positions logged
        self._logged_kept = 0
        self._logged_skipped = 0
        self._last = self._time()
        if prefix is not None and prefix.positions:
            self.add([int(s) for s in prefix.sizes], list(prefix.skipped))

    @property
    def progress(self) -> bool:
        """Whether this attempt has durable positions worth keeping."""
        return self.logged > 0

    def add(self, sizes, skipped) -> None:
        """Counts a round written into the writer: its positions' sizes (-1: skipped) and the skipped
        samples' (where, reason)."""
        sizes = np.asarray(sizes, dtype=np.int64)
        base = len(self._sizes)
        self._sizes.extend(sizes.tolist())
        self._kept_pos.extend((np.flatnonzero(sizes >= 0) + base).tolist())
        self._skipped.extend(skipped)

    def maybe(self, force: bool = False) -> None:
        if not force and self._time() - self._last < self.period:
            return
        self._last = self._time()
        written, locators = self.writer.durable()
        offsets = self.writer.buffer.offsets
        ends = np.frombuffer(offsets, dtype=np.int64)[1:] if len(offsets) > 1 else np.zeros(0, np.int64)
        kept = int(np.searchsorted(ends, written, side="right"))  # kept samples wholly durable
        positions = self._kept_pos[kept] if kept < len(self._kept_pos) else len(self._sizes)
        if positions <= self.logged and not locators:
            return
        positions = max(positions, self.logged)
        nskip = positions - kept
        crcs = self.writer.buffer.checksums
        rec = {
            "positions": positions,
            "sizes": self._sizes[self.logged : positions].tolist(),
            "crcs": [int(c) for c in crcs[self._logged_kept : kept]],
            "skipped": [list(x) for x in self._skipped[self._logged_skipped : nskip]],
            "locators": locators,
        }
        try:
            with open(self.state.log, "a", encoding="utf-8") as f:
                f.write(json.dumps(rec) + "\n")
                f.flush()
                os.fsync(f.fileno())
        except OSError as exc:
            raise OutputError(f"{self.state.log}: cannot write the ingest's journal: {exc.strerror or exc}") from exc
        self.logged, self._logged_kept, self._logged_skipped = positions, kept, nskip
        _kill_at(positions)
        if self.superseded is not None and positions >= self.superseded.positions:
            self.journal.discard(self.superseded)
            self.superseded = None
