"""`dstore ingest --dry-run`: what an ingest would write, found without writing anything (no MPI).

The source is listed as the ingest would list it; the samples are counted per class and sized
(an image folder's files by a stat each, a WebDataset's members from their tar headers, a raw
target exactly; otherwise an estimate, said to be one); the plan says the stored encoding, the
fields, the shards and their sample counts, and whether an interrupted ingest of the output would be
resumed or what an append would add. No sample is read and no file is created.
"""

from __future__ import annotations

import dataclasses
import os

import numpy as np

from dstore.ingest.config import IngestConfig, field_names, format_for
from dstore.runtime.units import fmt_size


@dataclasses.dataclass
class DryRun:
    """What an ingest would do (see the module docstring); `summary()` in words, `as_dict()` for JSON."""

    source: str
    output: str
    samples: int
    classes: list  # (class name, samples) in label order
    encoding: str
    fields: list  # (name, kind)
    bytes: int
    bytes_exact: bool
    shards: list  # (path, samples)
    split: str | None
    listed: list  # (name, class, bytes or None) of the first samples
    skipped: list
    ignored: int
    notes: list
    resume: str | None = None
    append: str | None = None

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)

    def summary(self, listed: int = 5) -> str:
        mean = self.bytes / self.samples if self.samples else 0
        size = f"{fmt_size(self.bytes)}" + ("" if self.bytes_exact else " (estimated)")
        lines = [
            f"dry run: nothing written. {self.source} -> {self.output}",
            f"{self.samples} samples, {size}, {fmt_size(mean)} per sample on average, stored as {self.encoding}",
        ]
        if self.split is not None:
            lines.append(f"split: {self.split}")
        shown = ", ".join(f"{c} ({n})" for c, n in self.classes[:20])
        lines.append(f"{len(self.classes)} classes: {shown}" + (" ..." if len(self.classes) > 20 else ""))
        lines.append("fields: " + (", ".join(f"{n} ({k})" for n, k in self.fields) or "none"))
        if len(self.shards) == 1:
            lines.append(f"one file: {self.shards[0][0]}")
        else:
            lines.append(
                f"{len(self.shards)} shards of {min(n for _, n in self.shards)}-"
                f"{max(n for _, n in self.shards)} samples: {self.shards[0][0]} ..."
            )
        for name, cls, nbytes in self.listed[:listed]:
            lines.append(f"  {name}  class {cls}" + ("" if nbytes is None else f"  {fmt_size(nbytes)}"))
        if self.samples > listed:
            lines.append(f"  ... and {self.samples - min(listed, self.samples)} more")
        if self.skipped:
            lines.append(
                f"would skip {len(self.skipped)} while listing, e.g. {self.skipped[0][0]}: {self.skipped[0][1]}"
            )
        if self.ignored:
            lines.append(f"ignored {self.ignored} non-image or hidden file(s)")
        lines += [f"note: {n}" for n in self.notes]
        for extra in (self.resume, self.append):
            if extra:
                lines.append(extra)
        return "\n".join(lines)


def _sizes(src, n: int) -> np.ndarray | None:
    """Each sample's stored size where the listing gives it without reading the sample, else None."""
    from dstore.ingest.journal import input_files, stat_files

    files, per_sample = input_files(src, n)
    if per_sample:
        return stat_files(files)[:, 0]
    members = getattr(src, "_members", None)  # a WebDataset's (shard, name, offset, size) per sample
    if isinstance(members, list) and len(members) >= n:
        return np.array([m[3] for m in members[:n]], dtype=np.int64)
    return None


def dry_run(source: str, output: str | None, **kwargs) -> DryRun:
    """What `ingest(source, output, **kwargs)` would write (its IngestConfig keywords; the rest are
    the source's options), found without writing anything."""
    from dstore.ingest import plan
    from dstore.ingest.journal import Journal, journal_dir
    from dstore.ingest.process import resolve_target
    from dstore.ingest.registry import open_source
    from dstore.ingest.run import output_paths
    from dstore.ingest.source import select_fields

    names = set(field_names())
    cfg = IngestConfig(**{k: v for k, v in kwargs.items() if k in names}).checked()
    options = {k: v for k, v in kwargs.items() if k not in names}
    if source == "synthetic" or options.get("source_type") == "synthetic":
        options["seed"] = cfg.seed
    src = open_source(source, on_error=cfg.on_error, count=cfg.count, **options)
    try:
        n = len(src) if cfg.count is None else min(len(src), int(cfg.count))
        target = resolve_target(src, cfg.encoding, cfg.resize, cfg.reencode_max_side, cfg.reencode_quality)
        fields = list(select_fields(src, cfg.fields))
        labels = np.array([src.label(i) for i in range(n)], dtype=np.int64)
        counts = np.bincount(labels, minlength=len(src.class_names)) if n else np.zeros(0, np.int64)
        classes = [
            (src.class_names[c] if c < len(src.class_names) else str(c), int(counts[c])) for c in range(counts.size)
        ]
        if target.encoding == "raw" and target.raw_shape is not None:
            per = int(np.prod(target.raw_shape)) * np.dtype(target.raw_dtype).itemsize
            sizes, total, exact = None, per * n, True
        else:
            sizes = None if target.max_side is not None else _sizes(src, n)
            exact = sizes is not None
            total = int(sizes.sum()) if sizes is not None else src.estimated_sample_bytes * n
        listed = [
            (
                src.name(i),
                classes[labels[i]][0] if labels[i] < len(classes) else int(labels[i]),
                None if sizes is None else int(sizes[i]),
            )
            for i in range(min(n, 5))
        ]
        append = resume = None
        if cfg.append_to is not None:
            append, output = _append_plan(cfg, src, n), cfg.append_to
            shards = [(os.fspath(output), n)]
        else:
            if output is None:
                from dstore.errors import ConfigError

                raise ConfigError("dry run: give OUTPUT or --append-to")
            bounds = plan.shard_bounds(n, cfg.shards)
            shards = [
                (p, int(bounds[s + 1] - bounds[s]))
                for s, p in enumerate(output_paths(output, format_for(cfg.fmt, output), cfg.shards)[1])
            ]
            journal = Journal.load(journal_dir(output))
            if journal is not None and cfg.resume is not False:
                resume = (
                    f"an interrupted ingest of {output} is journaled in {journal.path} "
                    f"({journal.positions_done(cfg.shards)} positions durable in unfinished shards): this "
                    "command would resume it, if its source and options are unchanged"
                )
            elif os.path.lexists(output) and not cfg.overwrite:
                resume = f"{output} exists: the ingest would be refused without --overwrite"
        return DryRun(
            source=str(getattr(src, "description", source)),
            output=str(output),
            samples=n,
            classes=classes,
            encoding=target.encoding,
            fields=fields,
            bytes=int(total),
            bytes_exact=exact,
            shards=shards,
            split=getattr(src, "split", None),
            listed=listed,
            skipped=list(src.skipped),
            ignored=len(src.ignored),
            notes=list(src.notes),
            resume=resume,
            append=append,
        )
    finally:
        close = getattr(src, "close", None)
        if close is not None:
            close()


def _append_plan(cfg: IngestConfig, src, n: int) -> str:
    """What an append would add, in words: samples, classes added, duplicates by name."""
    from dstore.ingest import append

    old = append.OldContainer.open(str(cfg.append_to))
    merged, _ = append.merge_classes(old.class_names, src.class_names)
    keep, dup = append.name_duplicates(old.path, src, n)
    added = list(merged[len(old.class_names) :])
    text = (
        f"append to {old.path} ({old.kind}, {old.num_samples} samples, {len(old.class_names)} classes): "
        f"{keep.size} new samples after the old ones; classes added: {', '.join(added) or 'none'}"
    )
    if dup:
        text += f"; {len(dup)} sample(s) have the name of a stored one (e.g. {src.name(dup[0][0])}): " + (
            "refused (--duplicates raise)" if cfg.duplicates == "raise" else "left out (--duplicates skip)"
        )
    return text + "; samples with a stored sample's bytes are found while writing"
