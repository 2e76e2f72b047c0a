"""Training metrics: per-epoch accumulators reduced over the trainer's ranks, a JSON-lines log, and
the same per-epoch records as CSV and (optionally) TensorBoard events.

Reductions use the MPI communicator (a few doubles per epoch), not the torch group, so they do
not interleave with DDP's gradient traffic.
"""

from __future__ import annotations

import json
import math
import os
import time

import numpy as np

from dstore.errors import ConfigError


class EpochMeter:
    """Sums one rank's loss, correct predictions, samples and times over an epoch (or part of it).

    `data_wait` is time spent waiting for the next batch; `step_time` is everything (wait +
    compute), so `data_wait / step_time` is the fraction of training time lost to input.
    """

    FIELDS = ("loss_sum", "correct", "samples", "data_wait", "step_time", "steps")

    def __init__(self):
        self.loss_sum = 0.0
        self.correct = 0
        self.samples = 0
        self.data_wait = 0.0
        self.step_time = 0.0
        self.steps = 0
        self._t0 = time.perf_counter()

    def update(
        self, loss_sum: float, correct: int, samples: int, data_wait: float = 0.0, step_time: float = 0.0
    ) -> None:
        """Adds one step: the summed (not mean) loss over its samples, correct count, sample count."""
        self.loss_sum += float(loss_sum)
        self.correct += int(correct)
        self.samples += int(samples)
        self.data_wait += float(data_wait)
        self.step_time += float(step_time)
        self.steps += 1

    def reduce(self, comm) -> dict:
        """Global figures over all ranks of `comm` (collective).

        Returns:
            loss (mean per sample), accuracy, samples, steps, wall_s (slowest rank), samples_per_s,
            data_wait_frac (summed wait over summed step time of all ranks).
        """
        wall = time.perf_counter() - self._t0
        local = np.array([self.loss_sum, self.correct, self.samples, self.data_wait, self.step_time], dtype=np.float64)
        total = np.zeros_like(local)
        from mpi4py import MPI

        comm.Allreduce(local, total, op=MPI.SUM)
        wall = comm.allreduce(wall, op=MPI.MAX)
        steps = comm.allreduce(self.steps, op=MPI.MAX)
        loss_sum, correct, samples, wait, step_time = total
        return {
            "loss": loss_sum / samples if samples else math.nan,
            "accuracy": correct / samples if samples else math.nan,
            "samples": int(samples),
            "steps": int(steps),
            "wall_s": wall,
            "samples_per_s": samples / wall if wall > 0 else math.nan,
            "data_wait_frac": wait / step_time if step_time > 0 else math.nan,
        }


def _plain(value):
    """A JSON-safe copy: numpy scalars to Python numbers, NaN/inf to None (JSON has neither)."""
    if isinstance(value, dict):
        return _plain_dict(value)
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _plain_dict(record: dict) -> dict:
    """_plain of a dict (str keys)."""
    return {str(k): _plain(v) for k, v in record.items()}


class JsonLog:
    """Appends one JSON object per line to a file; opened lazily, flushed after every record.

    Args:
        path: the file; None makes a log that writes nothing (on ranks other than the main one).
    """

    def __init__(self, path: str | os.PathLike | None):
        self.path = None if path is None else os.fspath(path)
        self._fh = None

    def write(self, record: dict) -> None:
        """Writes `record` as one line."""
        if self.path is None:
            return
        if self._fh is None:
            os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
            self._fh = open(self.path, "a", encoding="utf-8")
        self._fh.write(json.dumps(_plain(record), sort_keys=True) + "\n")
        self._fh.flush()

    def close(self) -> None:
        """Closes the file. Safe to call twice."""
        if self._fh is not None:
            self._fh.close()
            self._fh = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


def read_jsonl(path: str | os.PathLike) -> list[dict]:
    """Every record of a JSON-lines file (raises json.JSONDecodeError on a malformed line)."""
    with open(path, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


class CurveLogs:
    """The per-epoch records again, for the usual viewers: `metrics.csv` (one row per epoch, the
    numeric fields of the first record as columns) and, with `tensorboard`, TensorBoard event files
    in `<run dir>/tensorboard/` (each numeric field a scalar at the record's global step).

    Args:
        run_dir: where they go; None makes logs that write nothing (ranks other than the main one).
        tensorboard: also write TensorBoard events (needs the `tensorboard` package).

    Raises:
        ConfigError: `tensorboard` without the package installed.
    """

    def __init__(self, run_dir: str | None, tensorboard: bool = False):
        self.csv_path = None if run_dir is None else os.path.join(run_dir, "metrics.csv")
        self._columns: list[str] | None = None
        self._tb = None
        if tensorboard and run_dir is not None:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:
                raise ConfigError("--tensorboard needs the tensorboard package: pip install tensorboard") from None
            self._tb = SummaryWriter(os.path.join(run_dir, "tensorboard"))

    def write(self, record: dict) -> None:
        """Adds one epoch's record (the dict written to metrics.jsonl)."""
        if self.csv_path is None:
            return
        numbers = {
            k: v for k, v in _plain_dict(record).items() if isinstance(v, (int, float)) and not isinstance(v, bool)
        }
        self._write_csv(self.csv_path, numbers)
        if self._tb is not None:
            step = int(numbers.get("global_step", numbers.get("epoch", 0)))
            for key, value in numbers.items():
                if key not in ("epoch", "global_step"):
                    self._tb.add_scalar(key.replace("_", "/", 1), value, step)
            self._tb.flush()

    def _write_csv(self, csv_path: str, numbers: dict) -> None:
        import csv

        new = not os.path.exists(csv_path) or os.path.getsize(csv_path) == 0
        if self._columns is None:
            if new:
                self._columns = list(numbers)
            else:  # a resumed run appends under the header the first run wrote
                with open(csv_path, newline="", encoding="utf-8") as fh:
                    self._columns = next(csv.reader(fh), list(numbers))
        with open(csv_path, "a", newline="", encoding="utf-8") as fh:
            writer = csv.DictWriter(fh, self._columns, extrasaction="ignore")
            if new:
                writer.writeheader()
            writer.writerow(numbers)

    def close(self) -> None:
        """Closes the TensorBoard writer. Safe to call twice."""
        if self._tb is not None:
            self._tb.close()
            self._tb = None
