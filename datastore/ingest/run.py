"""The parallel ingest driver: every rank processes its share of the (permuted) samples; each shard's
writer rank receives its group's chunks round by round and writes them in order.

Per round, a group exchanges one small header (an allgather of 4 int64 per rank: error flag, bytes,
samples, skipped) and, where all is well, two gathervs of plain buffers to the writer: (size, CRC32)
per sample, computed by the rank that processed it, and the bytes. No pickles for sample data; the
writer holds at most two rounds (one being written by its BackgroundWriter thread). Waiting ranks
poll with short sleeps rather than spin, leaving the core to the writer thread when ranks share
cores. An error on any rank sets its flag; the group then exchanges the messages and every member
raises the same error, so no rank is left waiting. Groups then agree once more over the whole
communicator before rank 0 writes a sharded container's manifest; on any failure every rank
removes what it wrote.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time
import uuid
from typing import Any

import numpy as np

from dstore.errors import ConfigError, OutputError, SampleError
from dstore.formats import (
    MANIFEST_NAME,
    ContainerExistsError,
    ContainerNotFoundError,
    create_writer,
    write_manifest,
)
from dstore.formats.layout import DATA_CHUNK_BYTES
from dstore.formats.lock import OutputLock
from dstore.formats.replace import check_replaceable, is_leftover, private_like, remove_path
from dstore.ingest import plan
from dstore.ingest.bounds import check_ingest_memory
from dstore.ingest.config import IngestConfig, format_for
from dstore.ingest.journal import Checkpointer, Journal, journal_dir, options_fingerprint
from dstore.ingest.meter import Meter
from dstore.ingest.process import Block, Target, process_block, resolve_target
from dstore.ingest.reencode import reencode_attrs
from dstore.ingest.registry import open_source
from dstore.ingest.report import IngestError, IngestReport
from dstore.ingest.source import Source, select_fields
from dstore.ingest.writer import BackgroundWriter
from dstore.runtime import collective, rc
from dstore.runtime.collective import message, remote_error, wait_asleep


def output_paths(output: str, fmt: str, shards: int) -> tuple[str | None, list[str]]:
    """(manifest path or None, shard paths). One shard is `output` itself; several go into the
    directory `output` (`manifest.json` + `shard-00000-of-00004.h5`...) or, if `output` ends in
    `.json`, beside it (`<stem>-00000-of-00004.h5`...)."""
    suffix = ".h5" if fmt == "hdf5" else ".zarr"
    output = os.path.abspath(os.fspath(output))
    if shards == 1:
        return None, [output]
    if output.endswith(".json"):
        stem = output[: -len(".json")]
        return output, [f"{stem}-{s:05d}-of-{shards:05d}{suffix}" for s in range(shards)]
    return (
        os.path.join(output, MANIFEST_NAME),
        [os.path.join(output, f"shard-{s:05d}-of-{shards:05d}{suffix}") for s in range(shards)],
    )


_TYPES = {"ContainerExistsError": ContainerExistsError, "ContainerNotFoundError": ContainerNotFoundError}


def _remote(name: str, text: str, rank: int) -> BaseException:
    """The error to raise for a failure that happened on another rank (same type where it is ours,
    else IngestError)."""
    return remote_error(name, text, rank, types=_TYPES, fallback=IngestError)


def _raise_agreed(comm, exc: BaseException | None) -> None:
    """Collective after a flag said some rank failed: every rank raises (its own error, or the
    first failing rank's)."""
    collective.raise_agreed(comm, exc, types=_TYPES, fallback=IngestError)


def agree(comm, exc: BaseException | None) -> None:
    """Collective: returns if no rank passes an error, else raises on every rank (dstore.runtime.collective.agree
    with ingest's error types)."""
    collective.agree(comm, exc, types=_TYPES, fallback=IngestError)


def open_source_collective(comm, spec: str, **options) -> Source:
    """The source on every rank: listed on rank 0 and broadcast if listing is costly (a folder
    walk), else opened by every rank after rank 0 has succeeded. Errors reach every rank."""
    opened = []

    def open_on_root():
        opened.append(open_source(spec, **options))
        return opened[0] if opened[0].list_on_root else None

    shared = collective.on_root(comm, open_on_root, types=_TYPES, fallback=IngestError)
    if shared is not None:
        return shared
    src, exc = (opened or [None])[0], None
    if comm.Get_rank() != 0:
        try:
            src = open_source(spec, **options)
        except Exception as e:  # noqa: BLE001 - every rank must learn of it, or they would wait forever
            exc = e
    agree(comm, exc)
    return src


@dataclasses.dataclass
class _Shard:
    index: int
    path: str
    samples: int
    bytes: int
    skipped: list
    duplicates: list = dataclasses.field(default_factory=list)


def _write_shard(
    gcomm,
    src: Source,
    target,
    order: np.ndarray,
    lo: int,
    hi: int,
    *,
    index: int,
    path: str,
    fmt: str,
    chunk: int,
    on_error: str,
    overwrite: bool,
    extra_attrs: dict,
    bar,
    fields=(),
    journal: Journal | None = None,
    chunk_bytes: int = DATA_CHUNK_BYTES,
    kept=None,
    prologue=None,
    dedupe=None,
    meter: Meter | None = None,
) -> _Shard | None:
    """Collective over the group: writes positions [lo, hi) of `order` to `path` (on the group's
    first rank, which returns the shard's record; the others return None). With a `journal`, the
    positions its best attempt made durable are restored first and only the rest are written, with
    checkpoints logged (dstore.ingest.journal); `kept` (a list) gets True if an abort kept the
    temporary for a resume. `prologue(writer)` writes samples before position lo (an append's
    old samples); `dedupe` filters each round (dstore.ingest.append)."""
    m, k = gcomm.Get_size(), gcomm.Get_rank()
    out, pending = None, None
    skipped: list = []
    start = lo
    attempt = None
    if k == 0:
        try:
            state = journal.state(index) if journal is not None else None
            attempt = journal.new_attempt(index) if journal is not None else None
            writer = create_writer(
                path,
                fmt,
                encoding=target.encoding,
                class_names=src.class_names,
                raw_dtype=target.raw_dtype,
                raw_shape=target.raw_shape,
                source=src.description,
                extra_attrs=extra_attrs,
                overwrite=overwrite,
                fields=fields,
                chunk_bytes=chunk_bytes,
                tmp=None if attempt is None else attempt.tmp,
            )
            names = [n for n, _ in fields]
            ckpt = None
            try:
                if prologue is not None:
                    prologue(writer)
                restored = None
                if journal is not None and attempt is not None:
                    if state is not None:
                        restored = journal.restore(state, writer, src, order, lo, names)
                        start = lo + restored.positions
                        if meter is not None:
                            meter.already(restored.positions)
                        skipped.extend(tuple(x) for x in restored.skipped)
                    ckpt = Checkpointer(
                        journal, attempt, writer, float(rc.INGEST_CHECKPOINT.get()), superseded=state, prefix=restored
                    )
            except BaseException:
                writer.abort()
                raise
            out = BackgroundWriter(writer, src, order, on_written=bar, fields=names, checkpointer=ckpt, filter=dedupe)
        except Exception as e:  # noqa: BLE001 - reported to the group below, raised on every member
            pending = e
    if m > 1:
        start = gcomm.bcast(start, root=0)
    header = np.zeros(4, dtype=np.int64)
    headers = np.zeros((m, 4), dtype=np.int64)
    # Reused byte buffers (not new ones each round, page-faulted in anew): [t % 2] what the writer
    # receives in round t, [2] what this rank sends. Two suffice: round t's buffer is next refilled
    # in round t + 2, and submit(t + 1) has by then waited for round t to be written.
    bufs = [np.empty(0, np.uint8)] * 3
    try:
        for t, rnd in enumerate(plan.rounds(plan.chunk_bounds(start, hi, chunk), m)):
            a, b = rnd[k]
            err, block = pending or (out.error if out is not None else None), None
            if err is None:
                try:
                    # Alone (m == 1), the writer thread checksums while this thread loads the
                    # next round (measured: faster than checksumming here); in a group, every
                    # member checksums its own samples and the writer rank needs to compute none.
                    block = process_block(src, order[a:b], target, on_error, checksums=m > 1, fields=fields)
                except Exception as e:  # noqa: BLE001 - any failure must reach the whole group
                    err = e
            if block is None:
                block = Block.empty()
            header[:] = (err is not None, block.nbytes, block.sizes.size, len(block.skipped))
            _wait(gcomm.Iallgather(header, headers))
            if headers[:, 0].any():
                _raise_agreed(gcomm, err)
            if m > 1:
                skipped_parts, sizes, data, crcs = _gather_round(gcomm, block, headers, bufs, t % 2)
            else:
                skipped_parts, sizes, data, crcs = [block.skipped], block.sizes, block.parts, None
            if out is not None:  # the group's writer (its rank 0: an error there was raised above)
                round_skipped = [s for part in skipped_parts for s in part]
                skipped.extend(round_skipped)
                assert sizes is not None and data is not None  # the writer's gather holds them
                out.submit(rnd[0][0], sizes, data, checksums=crcs, skipped=round_skipped)
        agree(gcomm, out.finish() if out is not None else pending)
    finally:
        if out is not None:
            out.abort()  # after a commit this only stops the thread
            if out.kept and kept is not None:
                kept.append(True)
            elif journal is not None and attempt is not None and not out.kept:
                journal.discard(attempt)  # its log: the temporary went with the abort or the commit
        elif attempt is not None and journal is not None:
            journal.discard(attempt)
    if out is None:  # not the writer (on the writer a failed creation was raised above)
        return None
    dropped = list(getattr(dedupe, "dropped", []))
    return _Shard(
        index, path, out.writer.num_samples, out.writer.buffer.total_bytes, skipped + dropped, duplicates=dropped
    )


def _gather_round(gcomm, block: Block, headers: np.ndarray, bufs: list[np.ndarray], slot: int):
    """Collective over a group of several ranks: one round's samples gathered on its writer (rank 0)
    as (skipped parts, sizes (-1: skipped), packed bytes, CRC32 of the kept samples); the other
    ranks get (their own skipped, None, None, None). `headers` is the round's allgathered
    (error, bytes, samples, skipped) per rank; the writer receives into bufs[slot]."""
    k = gcomm.Get_rank()
    meta = np.zeros((block.sizes.size, 2), np.int64)  # per position: size (-1: skipped), CRC32
    meta[:, 0] = block.sizes
    assert block.checksums is not None  # a group's members checksum their own samples (process_block)
    meta[block.sizes >= 0, 1] = block.checksums
    metas = np.empty((int(headers[:, 2].sum()), 2), np.int64) if k == 0 else None
    _wait(gcomm.Igatherv(meta, None if k else [metas, headers[:, 2] * 2], root=0))
    data = _room(bufs, slot, int(headers[:, 1].sum())) if k == 0 else None
    _wait(gcomm.Igatherv(block.packed(out=_room(bufs, 2, block.nbytes)), None if k else [data, headers[:, 1]], root=0))
    skipped_parts = gcomm.gather(block.skipped, root=0) if headers[:, 3].any() else [block.skipped]
    if metas is None:  # not the writer
        return skipped_parts, None, None, None
    return skipped_parts, metas[:, 0], data, metas[metas[:, 0] >= 0, 1]


def _room(bufs: list[np.ndarray], slot: int, n: int) -> np.ndarray:
    """The first n bytes of bufs[slot], which is grown (with a margin) when too small."""
    if bufs[slot].size < n:
        bufs[slot] = np.empty(n + n // 4, np.uint8)
    return bufs[slot][:n]


def _wait(request) -> None:
    """Completes an MPI request asleep, not spinning: a rank waiting for the others leaves its core to
    them and to its own writer thread (ranks often share cores); 1 ms at most between tests."""
    wait_asleep(request, most=1e-3)


def _check_output(fmt: str, shards: int, output) -> None:
    """ConfigError if a one-file `output` has the other format's suffix."""
    lower = os.fspath(output).rstrip("/").lower()
    if shards == 1 and (
        (fmt == "hdf5" and lower.endswith(".zarr")) or (fmt == "zarr" and lower.endswith((".h5", ".hdf5")))
    ):
        raise ConfigError(f"output {output!r} has the suffix of the other format but fmt={fmt!r}")


def _check_overlap(source: str, output: str, paths: list[str]) -> None:
    """Refuses an output inside the source (its files would be read while written, and an
    overwrite could destroy them) and a source inside the output (an overwrite would remove it)."""
    if source in ("digits", "synthetic") or not os.path.exists(source):
        return
    src = os.path.realpath(source)
    for path in [output] + paths:
        real = os.path.realpath(path)
        if real == src or real.startswith(os.path.join(src, "")):
            raise ConfigError(
                f"output {output!r} is inside the source {source!r} (or is it); write the container elsewhere"
            )
        if src.startswith(os.path.join(real, "")):
            raise ConfigError(f"the source {source!r} is inside the output {output!r}; write the container elsewhere")


def _prepare_output(
    source: str,
    output: str,
    manifest: str | None,
    shard_paths: list[str],
    overwrite: bool,
    locked: bool = False,
    done=frozenset(),
) -> bool:
    """On rank 0 before writing: checks the target (it may hold only our own containers, and only
    with `overwrite`); for a sharded container creates its directory and removes an old manifest
    (so a failed rewrite never leaves a manifest over mixed shards), and, if `locked` (this job
    holds the output's lock, so nobody else writes in it), the temporaries and lock files killed
    writers left in its directory. The shards in `done` (finished by the interrupted ingest being
    resumed) are kept. Returns True if it created the directory."""
    _check_overlap(source, os.fspath(output), ([] if manifest is None else [manifest]) + shard_paths)
    kept = {shard_paths[s] for s in done}
    for path in ([] if manifest is None else [manifest]) + shard_paths:
        if os.path.lexists(path) and path not in kept:
            if not overwrite:
                raise ContainerExistsError(f"{path} already exists (pass overwrite=True / --overwrite)")
            check_replaceable(path)
    if manifest is None:
        return False
    directory = os.path.dirname(shard_paths[0])
    try:
        if os.path.lexists(manifest):
            os.remove(manifest)
        if os.path.isdir(directory):
            if locked and manifest == os.path.join(directory, MANIFEST_NAME):  # the directory is the output's own
                for entry in filter(is_leftover, os.listdir(directory)):
                    remove_path(os.path.join(directory, entry))
            return False
        os.makedirs(directory)
    except OSError as exc:
        raise OutputError(
            f"{output}: cannot prepare the sharded container: {exc.strerror or exc} ({exc.filename or directory})"
        ) from exc
    return True


def ingest(
    source: str | Source,
    output: str | None,
    *,
    comm=None,
    fmt: str | None = None,
    shards: int = 1,
    seed: int = 0,
    keep_order: bool = False,
    encoding: str | None = None,
    resize=None,
    on_error: str = "raise",
    count: int | None = None,
    progress: bool = True,
    overwrite: bool = False,
    reencode_max_side: int | None = None,
    reencode_quality: int | None = None,
    stratify: bool = False,
    heartbeat: float | None = None,
    fields=None,
    resume: bool | None = None,
    append_to: str | None = None,
    duplicates: str = "raise",
    config: IngestConfig | None = None,
    **source_options,
) -> IngestReport:
    """Ingests `source` into a container at `output`, split over the ranks of `comm`. Collective.

    Args:
        source: an image folder, a CIFAR batch directory or file, a .npy/.npz file, `digits`,
            `synthetic`, a folder with `labels=FILE.csv`, WebDataset tar shards, Parquet/Arrow
            files (see dstore.ingest.registry), or a Source object (the same on every rank).
        output: the container path (`x.h5`, `x.zarr`); with shards > 1 a directory (or `x.json`).
        comm: an mpi4py communicator (default MPI.COMM_WORLD).
        fmt: `hdf5` or `zarr`; None: `zarr` where `output` ends in .zarr, else `hdf5`.
        shards: number of shard files (see dstore.ingest.plan for which ranks write which).
        seed: seed of the write order (for `synthetic`, also of the generated images).
        keep_order: write in source order instead of a seeded random order.
        stratify: a seeded order with every class spread evenly (plan.stratified_order; `--stratify`).
        encoding: stored encoding; None keeps the source's (see process.resolve_target).
        resize: `HxW` (or (H, W)) to store decoded, resized pixels (implies encoding `raw`).
        on_error: `raise` (stop at the first bad sample, nothing left behind) or `skip`.
        count: use only the first `count` source samples (for `synthetic`: how many to make).
        progress: show a progress bar on rank 0; False: plain heartbeat lines instead (`heartbeat`).
        overwrite: replace an existing container.
        reencode_max_side, reencode_quality: re-encode images whose longer side is over this many px
            as JPEG of that side and quality (default 90) (`--max-side`, `--quality`; ingest.reencode).
        heartbeat: without a bar, seconds between the plain progress lines rank 0 writes on stderr
            (samples, bytes, rate, elapsed, time left; dstore.runtime.heartbeat), so a batch log shows a long
            ingest alive; None: $DSTORE_HEARTBEAT (dstore.runtime.rc, 30 s by default); 0: none.
        fields: the extra fields per sample to store (`--fields`; dstore.ingest.source.select_fields):
            None: every field the source has (WebDataset members other than the image and label,
            other Parquet columns, ingest_items' field dicts); "none": none.
        resume: None: continue an interrupted ingest of `output` where its journal (dstore.ingest.journal)
            is there, else start; True: continue one (ConfigError if there is none); False: discard
            any and start over. A changed source or option is refused, naming what changed.
        append_to: add the source's samples to this existing container instead (dstore.ingest.append);
            `output` must then be None or the same path.
        duplicates: with append_to, a sample already stored (same name, or same bytes): `raise` or `skip`.
        config: a dstore.ingest.config.IngestConfig instead of the keywords fmt .. duplicates (not both).
        **source_options: passed to the source (e.g. validate="full", split="test", seed options).

    Returns:
        The IngestReport, on every rank.

    Raises:
        ConfigError: a bad parameter. SampleError: a bad sample (with on_error="raise") or an
        unreadable/empty source. ContainerExistsError: `output` exists. Every rank raises.
    """
    from dstore.formats.objects import is_url

    if output is None and append_to is None and (config is None or config.append_to is None):
        raise ConfigError("ingest: output=None needs append_to (the container to add to)")
    if output is not None and is_url(os.fspath(output)):  # before any collective step: every rank refuses alike
        raise ConfigError(
            f"output {output!r} is a URL; ingest writes a local container (under a temporary name, "
            "renamed when complete: object stores have no rename). Ingest to a local path, upload it "
            "(aws s3 cp --recursive, or fsspec's put), then train on the URL"
        )
    if comm is None:
        from mpi4py import MPI

        comm = MPI.COMM_WORLD
    given = {
        "fmt": fmt,
        "shards": shards,
        "seed": seed,
        "keep_order": keep_order,
        "encoding": encoding,
        "resize": resize,
        "on_error": on_error,
        "count": count,
        "progress": progress,
        "overwrite": overwrite,
        "reencode_max_side": reencode_max_side,
        "reencode_quality": reencode_quality,
        "stratify": stratify,
        "heartbeat": heartbeat,
        "fields": fields,
        "resume": resume,
        "append_to": append_to,
        "duplicates": duplicates,
    }
    if config is None:
        config = IngestConfig(**given)
    else:
        defaults = IngestConfig()
        passed = [k for k, v in given.items() if not _is_default(v, getattr(defaults, k))]
        if passed:  # before any collective step: every rank refuses alike
            raise ConfigError(f"ingest takes an IngestConfig or keywords, not both ({', '.join(passed)})")
    with private_like(source):  # a private source gives a private container
        return _ingest(source, output, comm, config, **source_options)


def _is_default(value, default) -> bool:
    """Whether a keyword's value is its default (compared by value only for ints, bools and strings:
    a resize may be an array, whose == is not a truth value)."""
    return value is default or (type(value) is type(default) and isinstance(value, (int, str)) and value == default)


def _ingest(source, output: str | None, comm, config: IngestConfig, **source_options) -> IngestReport:
    """ingest()'s work, inside its private_like block."""
    cfg = config.checked()
    if cfg.append_to is not None:
        if output is not None and os.path.abspath(os.fspath(output)) != os.path.abspath(os.fspath(cfg.append_to)):
            raise ConfigError(
                f"append_to={cfg.append_to!r} writes into that container; output={output!r} must be it or None"
            )
        output = os.fspath(cfg.append_to)
    fmt = format_for(cfg.fmt, output)
    if cfg.append_to is None:
        cfg = dataclasses.replace(cfg, fmt=fmt)  # resolved: the journal's options name the format written
        _check_output(fmt, cfg.shards, output)
    shards, seed, on_error, count = cfg.shards, cfg.seed, cfg.on_error, cfg.count
    comm.Barrier()
    t0 = time.perf_counter()
    if isinstance(source, Source):  # built by the caller (every rank has it), e.g. ingest_items' spool
        src, source = source, source.description
    else:
        if source == "synthetic" or source_options.get("source_type") == "synthetic":
            source_options["seed"] = seed  # one seed: the generated images and their order
        src = open_source_collective(comm, source, on_error=on_error, count=count, **source_options)
    if cfg.append_to is not None:
        job = _append_job(comm, source, src, cfg)
    else:
        job = _Job.for_source(
            source,
            output,
            src,
            fmt=fmt,
            shards=shards,
            seed=seed,
            keep_order=cfg.keep_order,
            encoding=cfg.encoding,
            resize=cfg.resize,
            on_error=on_error,
            count=count,
            overwrite=cfg.overwrite,
            reencode=(cfg.reencode_max_side, cfg.reencode_quality),
            stratify=cfg.stratify,
            fields=cfg.fields,
        )
    _check_memory(comm, job)
    job_lock = _lock_output(comm, job)
    resume = None
    try:
        resume = collective.on_root(
            comm, _open_journal, job, cfg, source, source_options, types=_TYPES, fallback=IngestError
        )
        created = collective.on_root(
            comm,
            _prepare_output,
            source,
            job.output,
            job.manifest,
            job.shard_paths,
            job.overwrite,
            job_lock is not None and job_lock.held,
            types=_TYPES,
            fallback=IngestError,
            done=set(resume.done),
        )
        written, exc, kept = _write_shards(comm, job, cfg.progress, cfg.heartbeat, resume)
        recs = _finish(comm, job, written, exc, created, resume, kept)
    except BaseException:
        # A failure before the shards (the output refused), or an interruption outside the collective
        # clean-up (SIGTERM, Ctrl-C): a journal that records nothing durable is rank 0's to remove.
        if (
            comm.Get_rank() == 0
            and resume is not None
            and resume.journal is not None
            and not _worth_keeping(job, resume)
        ):
            Journal(resume.journal, {}).remove()
        raise
    finally:
        if job_lock is not None:
            job_lock.release()
        close = getattr(src, "close", None)
        if close is not None:  # a source holding a file open (a container being re-ingested)
            close()
    seconds = comm.bcast(time.perf_counter() - t0, root=0)
    report = job.report(recs, seconds, comm.Get_size())
    if job.old is not None:
        _append_notes(report, job)
    if resume.positions:
        report.notes.append(
            f"resumed an interrupted ingest: {resume.positions} of {job.n} positions were already written and were kept"
        )
    return report


def _append_job(comm, source, src: Source, cfg: IngestConfig) -> _Job:
    """The job of an append (dstore.ingest.append) on every rank: the source without the samples the
    container already names, labelled in the merged class map, written after the old samples (one
    file: the old ones copied first, then renamed over it; sharded: new shards and a new manifest)."""
    from dstore.ingest import append

    old = collective.on_root(comm, append.OldContainer.open, cfg.append_to, types=_TYPES, fallback=IngestError)
    n = len(src) if cfg.count is None else min(len(src), int(cfg.count))
    merged, mapping = append.merge_classes(old.class_names, src.class_names)
    keep, dup = collective.on_root(comm, append.name_duplicates, old.path, src, n, types=_TYPES, fallback=IngestError)
    if dup and cfg.duplicates == "raise":  # the same on every rank: every rank raises alike
        i, j = dup[0]
        raise SampleError(
            f"{src.locate(i)}: a duplicate: stored sample {j} of {old.path} has its name "
            f"{src.name(i)!r} ({len(dup)} such sample(s)); pass duplicates='skip' (--duplicates skip) "
            "to leave them out"
        )
    description = f"{old.source} + {src.description}" if old.source else src.description
    asrc = append.AppendSource(src, keep, merged, mapping if src.class_names else None, description)
    asrc.skipped += [(src.locate(i), f"duplicate: the name of stored sample {j} of {old.path}") for i, j in dup]
    if not len(asrc):
        raise SampleError(
            f"{src.description}: nothing to append to {old.path}: all {n} samples are stored there already"
        )
    single = old.kind != "sharded"
    if single and cfg.shards != 1:
        raise ConfigError(
            f"shards={cfg.shards}: an append to the one-file container {old.path} writes one file; "
            "append to a sharded container to add shards"
        )
    job = _Job.for_source(
        source,
        old.path,
        asrc,
        fmt=old.shard_fmt,
        shards=cfg.shards,
        seed=cfg.seed,
        keep_order=cfg.keep_order,
        encoding=_append_encoding(cfg, old.encoding),
        resize=cfg.resize,
        on_error=cfg.on_error,
        count=None,
        overwrite=single,
        reencode=(cfg.reencode_max_side, cfg.reencode_quality),
        stratify=cfg.stratify,
        fields=cfg.fields,
    )
    append.check_compatible(old, src, job.target, job.fields)
    added = [c for c in merged[len(old.class_names) :]]
    extra = append.history(old, src.description, cfg.seed, len(asrc), added)
    job.journaled, job.old = False, old
    job.dedupe = lambda: append.Duplicates(old.path, asrc, cfg.duplicates)
    if single:
        job.prologue = append.CopyOld(old.path, [f for f, _ in job.fields])
        job.extra_attrs = extra
    else:
        job.manifest, job.shard_paths = None, append.new_shard_paths(old, cfg.shards)
        job.lock_path = old.path
        job.finish = lambda paths: append.write_appended_manifest(old, paths, extra)
    return job


def _append_encoding(cfg: IngestConfig, stored: str) -> str | None:
    """The encoding an append asks for: the container's unless --encoding or --resize says (then
    dstore.ingest.append.check_compatible refuses what would not match)."""
    if cfg.encoding is not None or cfg.resize is not None or stored == "raw":
        return cfg.encoding
    return stored


def _append_notes(report: IngestReport, job: _Job) -> None:
    """An append's report: the samples and bytes added (not the container's), what it holds now,
    the classes added and the duplicates left out, by name and by content."""
    old = job.old
    if old.kind != "sharded":
        report.samples -= old.num_samples
        report.bytes -= old.total_bytes
    report.output = old.path
    added = list(job.src.class_names[len(old.class_names) :])
    report.notes.append(
        f"appended {report.samples} samples to {old.path}, which now holds "
        f"{old.num_samples + report.samples} samples of {len(job.src.class_names)} classes"
        + (f"; classes added: {', '.join(added)}" if added else "; no class added")
    )
    by_name = sum(1 for _, why in report.skipped if why.startswith("duplicate: the name"))
    by_bytes = sum(1 for _, why in report.skipped if why.startswith("duplicate: the same bytes"))
    if by_name or by_bytes:
        report.notes.append(f"left out as already stored: {by_name} by name, {by_bytes} by content (the same bytes)")


@dataclasses.dataclass
class _Resume:
    """What rank 0 found in the output's journal (dstore.ingest.journal), the same on every rank."""

    journal: str | None  # the journal directory (None: the ingest keeps none)
    ingest_id: str
    chunk_bytes: int
    done: dict  # shard -> (samples, bytes) of the shards an interrupted run finished
    positions: int = 0  # positions found written (finished shards and durable prefixes)

    def open(self) -> Journal | None:
        return None if self.journal is None else Journal.load(self.journal)


def _finished_by(path: str, ingest_id: str) -> tuple[int, int] | None:
    """(samples, bytes) of the complete container at `path` if ingest `ingest_id` wrote it, else None."""
    from dstore.formats import open_container

    if not os.path.exists(path):
        return None
    try:
        with open_container(path, check_labels=False) as r:
            ok = r.info.extra.get("ingest_id") == ingest_id
            return (r.num_samples, r.total_bytes) if ok else None
    except Exception:  # noqa: BLE001 - not a finished container of this ingest: written again
        return None


def _worth_keeping(job: _Job, resume: _Resume) -> bool:
    """Whether the journal records durable work: a checkpoint logged, or a finished shard."""
    if resume.journal is None:
        return False
    try:
        logs = [e for e in os.listdir(resume.journal) if e.endswith(".log")]
    except OSError:
        return False
    if any(_logged(os.path.join(resume.journal, e)) for e in logs):
        return True
    return job.manifest is not None and any(_finished_by(p, resume.ingest_id) for p in job.shard_paths)


def _logged(path: str) -> bool:
    """Whether the checkpoint log `path` records anything; a log gone meanwhile does not (an interrupted
    rank removes its own empty log while rank 0 looks: seen in CI under SIGTERM)."""
    try:
        return os.path.getsize(path) > 0
    except FileNotFoundError:
        return False


def _open_journal(job: _Job, cfg: IngestConfig, source, source_options: dict) -> _Resume:
    """On rank 0: the journal of this ingest, created, or found and checked against this run's
    options and source (ConfigError in one line naming what changed); what it says is finished."""
    jdir = journal_dir(job.output)
    journal = Journal.load(jdir)
    if journal is not None and cfg.resume is False:
        journal.remove()
        journal = None
    if journal is not None and _finished_by(job.manifest or job.shard_paths[0], journal.ingest_id):
        journal.remove()  # that ingest finished; its journal outlived it (a kill just after the rename)
        journal = None
    options = options_fingerprint(str(source), cfg, source_options)
    if not job.journaled:  # an append (dstore.ingest.append): run again whole if interrupted
        if cfg.resume:
            raise ConfigError(
                "resume=True (--resume) does not apply to an append (append_to / --append-to): an "
                "interrupted append leaves the container as it was; run it again"
            )
        return _Resume(None, uuid.uuid4().hex, int(rc.INGEST_CHUNK_BYTES.get()), {})
    if journal is None:
        if cfg.resume:
            raise ConfigError(
                f"resume=True (--resume): there is no interrupted ingest of {job.output} to resume (no journal {jdir})"
            )
        chunk = int(rc.INGEST_CHUNK_BYTES.get())
        journal = Journal.create(jdir, options=options, src=job.src, n=job.n, fmt=job.fmt, chunk_bytes=chunk)
        return _Resume(jdir, journal.ingest_id, journal.chunk_bytes, {})
    done_positions = np.zeros(job.n, dtype=bool)
    done, positions = {}, 0
    for s in range(job.shards):
        lo, hi = int(job.bounds[s]), int(job.bounds[s + 1])
        finished = _finished_by(job.shard_paths[s], journal.ingest_id) if job.manifest is not None else None
        state = None if finished else journal.state(s)
        count = (hi - lo) if finished else (state.positions if state is not None else 0)
        if finished:
            done[s] = finished
        done_positions[job.order[lo : lo + count]] = True
        positions += count
    journal.check(options, job.src, job.n, done_positions)
    return _Resume(jdir, journal.ingest_id, journal.chunk_bytes, done, positions)


@dataclasses.dataclass
class _Job:
    """What every rank knows of an ingest once its source is open: the samples, their order, the
    target encoding and where each shard goes."""

    source: str
    output: str
    src: Source
    fmt: str
    shards: int
    seed: int
    keep_order: bool
    on_error: str
    overwrite: bool
    n: int
    target: Target
    order: np.ndarray
    bounds: np.ndarray
    manifest: str | None
    shard_paths: list[str]
    order_kind: str = "seeded"  # the `ingest_order` attribute: source, seeded or stratified
    fields: tuple[tuple[str, str], ...] = ()  # the extra fields stored, (name, kind)
    journaled: bool = True  # keeps a journal for a resume (dstore.ingest.journal); not an append
    extra_attrs: dict = dataclasses.field(default_factory=dict)  # more attributes (an append's history)
    prologue: Any = None  # writes samples before shard 0's first position (an append's old samples)
    finish: Any = None  # on rank 0 after every shard is written, with their paths (an append's manifest)
    dedupe: Any = None  # makes a round filter for a group's writer (an append's duplicates), or None
    lock_path: str | None = None  # an output rank 0 locks for the whole job (an append's manifest)
    old: Any = None  # the container appended to (dstore.ingest.append.OldContainer), or None

    def dedupe_for(self, gcomm):
        """The duplicate filter of this group's writer (None on the other ranks, or not an append)."""
        return self.dedupe() if self.dedupe is not None and gcomm.Get_rank() == 0 else None

    @classmethod
    def for_source(
        cls,
        source,
        output,
        src: Source,
        *,
        fmt,
        shards,
        seed,
        keep_order,
        encoding,
        resize,
        on_error,
        count,
        overwrite,
        reencode=(None, None),
        stratify=False,
        fields=None,
    ) -> _Job:
        """The job on every rank (no collective): the same source, seed and arguments give the same plan."""
        n = len(src) if count is None else min(len(src), int(count))
        target = resolve_target(src, encoding, resize, *reencode)
        order, kind = plan.write_order(n, seed, keep_order=keep_order, label=src.label if stratify else None)
        bounds = plan.shard_bounds(n, shards)
        manifest, shard_paths = output_paths(output, fmt, shards)
        return cls(
            source,
            output,
            src,
            fmt,
            shards,
            seed,
            keep_order,
            on_error,
            overwrite,
            n,
            target,
            order,
            bounds,
            manifest,
            shard_paths,
            kind,
            select_fields(src, fields),
        )

    def sample_bytes(self) -> int:
        """The expected bytes of a stored sample (sizes the chunks a group exchanges)."""
        t = self.target
        if t.encoding == "raw":
            assert t.raw_shape is not None  # a raw target has one (resolve_target)
            return int(np.prod(t.raw_shape)) * np.dtype(t.raw_dtype).itemsize
        return self.src.estimated_sample_bytes

    def _field_notes(self) -> list[str]:
        """What the summary says of the extra fields: which are stored, which found but not."""
        stored = dict(self.fields)
        left = [n for n, _ in self.src.field_specs if n not in stored]
        notes = [f"fields stored: {', '.join(f'{n} ({k})' for n, k in self.fields)}"] if stored else []
        if left:
            notes.append(f"fields found but not stored (--fields): {', '.join(left)}")
        return notes

    def report(self, recs: list[_Shard], seconds: float, ranks: int) -> IngestReport:
        skipped = list(self.src.skipped) + [s for r in recs for s in r.skipped]
        return IngestReport(
            output=os.path.abspath(os.fspath(self.output)),
            samples=sum(r.samples for r in recs),
            bytes=sum(r.bytes for r in recs),
            seconds=seconds,
            skipped=skipped,
            ignored=list(self.src.ignored),
            notes=list(self.src.notes) + self._field_notes(),
            shards=[r.path for r in recs],
            encoding=self.target.encoding,
            num_classes=len(self.src.class_names),
            ranks=ranks,
            fmt=self.fmt,
        )


def _check_memory(comm, job: _Job) -> None:
    """Collective: every rank raises MemoryBudgetError if the ingest would hold more than a node
    has available (dstore.ingest.bounds), before anything is read or written."""
    t = job.target
    what = (
        f"--resize {t.resize[0]}x{t.resize[1]} (a decoded {'x'.join(map(str, t.raw_shape or ()))} {t.raw_dtype} image)"
        if t.resize
        else "the stored sample"
    )
    exc = check_ingest_memory(
        sample_bytes=job.sample_bytes(),
        positions=int(np.diff(job.bounds).max(initial=0)),
        ranks=comm.Get_size(),
        shards=job.shards,
        ranks_on_node=collective.topology(comm).local_size,
        what=what,
    )
    agree(comm, exc)


def _lock_output(comm, job: _Job) -> OutputLock | None:
    """Collective: rank 0 locks a sharded output for the whole job, from its checks to its manifest
    (each shard's writer locks only its shard; a single file is locked by its writer). Every rank
    raises ContainerExistsError if another job holds the lock. Returns rank 0's lock, else None."""
    held = []

    def take() -> None:
        if job.manifest is not None:
            held.append(OutputLock(job.output))
        elif job.lock_path is not None:
            held.append(OutputLock(job.lock_path))
        elif job.journaled:  # a single file: its writer locks the file; its journal is this job's
            held.append(OutputLock(journal_dir(job.output)))

    collective.on_root(comm, take, types=_TYPES, fallback=IngestError)
    return held[0] if held else None


def _write_shards(
    comm, job: _Job, progress: bool, heartbeat: float | None, resume: _Resume
) -> tuple[list[_Shard], BaseException | None, bool]:
    """Collective: this rank's group writes the group's shards (those a resumed ingest has not
    finished). Returns the records of the shards this rank wrote (as its group's first rank), this
    rank's error, not raised: the other groups must learn of it first (`_finish`), and whether this
    rank kept something for a resume."""
    rank, size = comm.Get_rank(), comm.Get_size()
    group = plan.group_of(rank, size, job.shards)
    gcomm = comm.Split(group, rank)
    # One id for every shard of this ingest (a manifest records it per shard: a shard of another
    # ingest, even of the same source, is then refused by name); a resumed ingest keeps its journal's.
    extra = {"ingest_seed": int(job.seed), "ingest_order": job.order_kind, "ingest_id": resume.ingest_id}
    if job.target.max_side is not None:
        extra.update(reencode_attrs(job.target.max_side, job.target.quality))
    extra.update(job.extra_attrs)
    mine = plan.shards_of_group(group, size, job.shards)
    sample_bytes = job.sample_bytes()
    meter = Meter(
        job.bounds,
        [s for s in mine if s not in resume.done],
        job.shards,
        plan.num_groups(size, job.shards),
        bar=progress,
        period=heartbeat,
        enabled=gcomm.Get_rank() == 0,
        rank=rank,
        bar_rank=rank == 0,
    )
    written, exc, kept = [], None, []
    try:
        journal = resume.open() if gcomm.Get_rank() == 0 else None
        with meter:
            for s in mine:
                lo, hi = int(job.bounds[s]), int(job.bounds[s + 1])
                if s in resume.done:  # finished by the interrupted run: kept as it is
                    if gcomm.Get_rank() == 0:
                        samples, nbytes = resume.done[s]
                        written.append(_Shard(s, job.shard_paths[s], samples, nbytes, []))
                        kept.append(True)
                    continue
                chunk = plan.group_chunk(hi - lo, gcomm.Get_size(), sample_bytes)
                rec = _write_shard(
                    gcomm,
                    job.src,
                    job.target,
                    job.order,
                    lo,
                    hi,
                    index=s,
                    path=job.shard_paths[s],
                    fmt=job.fmt,
                    chunk=chunk,
                    on_error=job.on_error,
                    overwrite=job.overwrite,
                    extra_attrs=extra,
                    bar=meter.update if meter.enabled else None,
                    fields=job.fields,
                    journal=journal,
                    chunk_bytes=resume.chunk_bytes,
                    kept=kept,
                    prologue=job.prologue if s == 0 else None,
                    dedupe=job.dedupe_for(gcomm),
                    meter=meter if meter.enabled else None,
                )
                if rec is not None:
                    written.append(rec)
    except Exception as e:  # noqa: BLE001 - must reach the other groups before anyone raises
        exc = e
    finally:
        gcomm.Free()
    return written, exc, bool(kept)


def _finish(
    comm, job: _Job, written: list[_Shard], exc: BaseException | None, created: bool, resume: _Resume, kept: bool
) -> list[_Shard]:
    """Collective: gathers every group's shard records and, where all went well, has rank 0 write a
    sharded container's manifest (or an append's new one) and remove the journal. On any failure
    every rank removes what it wrote, unless some rank kept durable work for a resume (then all of
    it stays, and rank 0 says how to resume), and raises (its own error, or the first failing
    rank's). Returns the records of all shards, in shard order."""
    rank = comm.Get_rank()
    results = comm.allgather((None if exc is None else message(exc), written))
    recs = sorted((r for _, part in results for r in part), key=lambda r: r.index)
    if exc is None and not any(m for m, _ in results):
        if sum(r.samples for r in recs) == 0:
            exc = SampleError(f"{job.source}: no samples left to write: all {job.n} were skipped")
        elif rank == 0 and (job.manifest is not None or job.finish is not None):
            try:
                if job.finish is not None:
                    job.finish([r.path for r in recs])
                else:
                    write_manifest(
                        os.path.abspath(os.fspath(job.output)), [r.path for r in recs], overwrite=job.overwrite
                    )
            except Exception as e:  # noqa: BLE001 - every rank must learn of it, or they would wait forever
                exc = e
    failed = comm.allgather(None if exc is None else message(exc))
    if not any(failed):
        if rank == 0 and resume.journal is not None:
            Journal(resume.journal, {}).remove()  # after the completion marker: the container is whole
        return recs
    if resume.journal is not None and any(comm.allgather(kept)):
        if rank == 0:
            print(
                f"ingest: what was written durably is kept in {resume.journal}; run the same command again "
                "to resume, or pass --restart to start over",
                file=sys.stderr,
                flush=True,
            )
    else:
        _remove_written(comm, job, written, recs, created)
        if rank == 0 and resume.journal is not None:
            Journal(resume.journal, {}).remove()
    if exc is not None:
        raise exc
    r, (name, text) = next((r, m) for r, m in enumerate(failed) if m is not None)
    raise _remote(name, text, r)


def _remove_written(comm, job: _Job, written: list[_Shard], recs: list[_Shard], created: bool) -> None:
    """Collective after a failure: every rank removes the shards it wrote; then rank 0 removes a
    sharded container's other shards and the directory it created."""
    for rec in written:
        _remove(rec.path)
    comm.Barrier()
    if comm.Get_rank() == 0 and job.manifest is not None:
        for path in (r.path for r in recs):
            _remove(path)
        if created:
            try:
                os.rmdir(os.path.dirname(job.shard_paths[0]))
            except OSError:
                pass


def _remove(path: str) -> None:
    remove_path(path)
