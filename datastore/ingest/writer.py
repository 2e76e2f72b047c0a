"""A container writer fed from a background thread, so that the writing rank keeps processing and
exchanging the next round while the last one is checksummed and written (no MPI here).

At most one round is being written while the caller prepares the next: memory stays bounded at two
rounds. A failure in the thread is kept and reported by `error`, so the caller can tell its group at
the next exchange; nothing is raised from the thread itself.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np

from dstore.ingest.source import Source


class BackgroundWriter:
    """Appends rounds of samples to a ContainerWriter on one worker thread.

    Args:
        writer: an open ContainerWriter (from dstore.formats.create_writer).
        source: where labels and names come from.
        order: the write order (source index at each position).
        fields: the names of the extra fields to store (`Source.fields`), () for none.
        on_written: called with the number of positions done and the bytes written after each round
            (progress).
    """

    def __init__(
        self, writer, source: Source, order: np.ndarray, on_written=None, fields=(), checkpointer=None, filter=None
    ):
        self.writer = writer
        self._checkpointer = checkpointer  # dstore.ingest.journal.Checkpointer, or None (not journaled)
        self._filter = filter  # dstore.ingest.append.Duplicates.filter, or None
        self._fields = tuple(fields)  # names of the fields stored (read from the source here, in write order)
        self._source = source
        self._order = order
        self._on_written = on_written
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ingest-writer")
        self._inflight: Future | None = None
        self._error: BaseException | None = None
        self.bytes = 0
        self._state = "open"

    @property
    def error(self) -> BaseException | None:
        """The first failure of a finished write, if any (does not wait for one in flight)."""
        if self._error is None and self._inflight is not None and self._inflight.done():
            self._collect()
        return self._error

    def _collect(self) -> None:
        fut, self._inflight = self._inflight, None
        if fut is None:
            return
        try:
            self.bytes += fut.result()
        except Exception as exc:  # noqa: BLE001 - kept for the caller to report to its group
            if self._error is None:
                self._error = exc

    def submit(self, start: int, sizes: np.ndarray, data, checksums=None, skipped=()) -> None:
        """Queues positions start, start+1, ... (size -1 = skipped); waits for the previous round
        first. `data` is one buffer of the kept samples back to back (or a list of per-sample
        arrays); `checksums` their CRC32s if the ranks that processed them computed them (None:
        the writer computes them); `skipped` the round's (where, reason) of the skipped positions, in order."""
        self._collect()
        if self._error is None:
            self._inflight = self._pool.submit(self._append, start, sizes, data, checksums, list(skipped))

    def _append(self, start: int, sizes: np.ndarray, data, checksums, skipped) -> int:
        """The whole round in one `extend`: the per-sample work left here is a label and a name."""
        src = self._source
        sizes = np.asarray(sizes, dtype=np.int64)
        keep = sizes >= 0
        if isinstance(data, list):
            data = np.concatenate(data) if data else np.zeros(0, np.uint8)
        if self._filter is not None:  # an append: samples already in the container are left out
            sizes, data, checksums, dropped = self._filter(
                self._order[start : start + sizes.size], sizes, data, checksums
            )
            keep = sizes >= 0
            skipped = skipped + dropped
        indices = self._order[start : start + sizes.size][keep].tolist()
        values = [src.fields(i, self._fields) for i in indices] if self._fields else None
        self.writer.extend(
            data,
            sizes[keep],
            [src.label(i) for i in indices],
            [src.name(i) for i in indices],
            indices,
            checksums=checksums,
            fields=values,
        )
        if self._checkpointer is not None:
            self._checkpointer.add(sizes.tolist(), skipped)
            self._checkpointer.maybe()
        if self._on_written is not None:
            self._on_written(int(sizes.size), int(data.size))
        return int(data.size)

    def finish(self) -> BaseException | None:
        """Waits for the last round and commits; returns the failure (None if committed)."""
        self._collect()
        self._pool.shutdown(wait=True)
        if self._error is None:
            try:
                self.writer.commit()
                self._state = "committed"
            except Exception as exc:  # noqa: BLE001 - reported to the group by the caller
                self._error = exc
        return self._error

    @property
    def kept(self) -> bool:
        """Whether an abort keeps the temporary: its journal logged durable positions to resume from."""
        return self._checkpointer is not None and self._checkpointer.progress

    def abort(self) -> None:
        """Stops the thread (after its current round) and removes the temporary, unless its journal
        logged durable positions (`kept`): then the temporary stays for a resume. Safe twice."""
        self._pool.shutdown(wait=True)
        if self._state != "committed":
            self._state = "aborted"
            if self.kept:
                self.writer.release()
            else:
                self.writer.abort()
