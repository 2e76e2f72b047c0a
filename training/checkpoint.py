"""Checkpoints: written atomically by the main rank, read back with torch.load(weights_only=True).

A checkpoint holds only tensors and plain containers (dict, list, tuple, str, int, float, bool,
None): model, optimizer and scheduler state, every rank's RNG states, the data store's position
in its global order, and the loop's counters. Numpy values are converted on the way in.
"""

from __future__ import annotations

import errno
import glob
import os
import random
from typing import Any

import numpy as np

from dstore.errors import ConfigError, OutputError

CHECKPOINT_NAME = "checkpoint.pt"


def _map_leaves(value: Any, leaf) -> Any:
    """A copy of nested dicts/lists/tuples with `leaf` applied to every other value (Any: the
    structure is `value`'s, whatever it is)."""
    if isinstance(value, dict):
        return {k: _map_leaves(v, leaf) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_map_leaves(v, leaf) for v in value)
    return leaf(value)


def _safe_leaf(value):
    import torch

    if isinstance(value, np.ndarray):
        return torch.from_numpy(np.ascontiguousarray(value).copy())
    if isinstance(value, np.generic):
        return value.item()
    return value


def _numpy_leaf(value):
    import torch

    return value.numpy() if isinstance(value, torch.Tensor) else value


def to_safe(value: Any) -> Any:
    """A copy of `value` that torch.load(weights_only=True) accepts: numpy scalars become Python
    numbers, numpy arrays become tensors; containers are copied recursively."""
    return _map_leaves(value, _safe_leaf)


def from_safe(value: Any) -> Any:
    """Inverse of to_safe for state that wants numpy back (tensors become numpy arrays)."""
    return _map_leaves(value, _numpy_leaf)


def rng_state() -> dict:
    """This process's RNG states (torch CPU, the current CUDA device's when CUDA is in use, numpy
    legacy global, Python `random`)."""
    import torch

    np_state = np.random.get_state(legacy=False)
    # The current device's (a rank drives one GPU): resumable whatever GPUs another node shows.
    cuda = torch.cuda.get_rng_state() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
    return {
        "cuda": cuda,
        "torch": torch.get_rng_state(),
        "numpy": {
            "key": torch.from_numpy(np_state["state"]["key"].astype(np.int64)),
            "pos": int(np_state["state"]["pos"]),
            "has_gauss": int(np_state["has_gauss"]),
            "gauss": float(np_state["gauss"]),
        },
        "python": random.getstate(),
    }


def set_rng_state(state: dict) -> None:
    """Restores what rng_state() returned."""
    import torch

    torch.set_rng_state(state["torch"])
    cuda = state.get("cuda")  # absent in checkpoints made before it was recorded
    if cuda is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state(cuda)
    npst = state["numpy"]
    np.random.set_state(
        {
            "bit_generator": "MT19937",
            "state": {"key": npst["key"].numpy().astype(np.uint32), "pos": npst["pos"]},
            "has_gauss": npst["has_gauss"],
            "gauss": npst["gauss"],
        }
    )
    py = state["python"]
    random.setstate((py[0], tuple(py[1]), py[2]))


def save_checkpoint(path: str | os.PathLike, payload: dict) -> str:
    """Writes `payload` to `path` atomically: a temporary in the same directory, fsync, os.replace.

    A reader (or a job killed mid-write) never sees a partial file under `path`.
    """
    import torch

    path = os.fspath(path)
    tmp = f"{path}.tmp.{os.getpid()}"
    try:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(tmp, "wb") as fh:
            torch.save(to_safe(payload), fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except (OSError, RuntimeError) as exc:  # torch reports a failed write (a full disk) as RuntimeError
        raise OutputError(
            f"checkpoint {path}: cannot write it: {_write_failure(exc, path)}; "
            + ("the checkpoint there before is kept" if os.path.exists(path) else "no checkpoint written")
        ) from None
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


def _write_failure(exc: BaseException, path: str) -> str:
    """Why a checkpoint could not be written, in one line."""
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    try:
        st = os.statvfs(os.path.dirname(os.path.abspath(path)))
        if st.f_bavail * st.f_frsize < (1 << 20):
            return f"{os.strerror(errno.ENOSPC)} ({st.f_bavail * st.f_frsize} bytes free)"
    except OSError:
        pass
    text = str(exc).strip().splitlines()
    return text[-1][:300] if text else type(exc).__name__


def load_checkpoint(path: str | os.PathLike, required: tuple[str, ...] = ()) -> dict:
    """Loads a checkpoint written by save_checkpoint (weights_only=True: no code is unpickled).

    Args:
        required: keys the checkpoint must have (a file of another program lacks them).

    Raises:
        ConfigError: if `path` does not exist, is empty, truncated, not a checkpoint, holds anything
            but tensors and plain data (refused, never unpickled), or lacks a required key.
    """
    import torch

    path = os.fspath(path)
    if not os.path.isfile(path):
        raise ConfigError(f"resume checkpoint {path!r} does not exist")
    try:
        ck = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - torch raises many types (EOFError, RuntimeError, UnpicklingError...)
        # Not torch's own text: for a refused object it advises weights_only=False, which would run
        # whatever code the file names.
        if os.path.getsize(path) == 0:
            why = "the file is empty"
        elif "weights_only" in str(exc) or "Unsupported global" in str(exc):
            why = "it holds objects other than tensors and plain data, which are refused (not unpickled)"
        else:
            why = f"truncated or not a PyTorch checkpoint ({type(exc).__name__})"
        raise ConfigError(f"resume checkpoint {path}: cannot be loaded: {why}") from None
    if not isinstance(ck, dict):
        raise ConfigError(f"resume checkpoint {path}: holds a {type(ck).__name__}, not a dstore checkpoint")
    missing = [k for k in required if k not in ck]
    if missing:
        raise ConfigError(f"resume checkpoint {path}: not a dstore training checkpoint (no {missing})")
    return ck


def resolve_job_resume(resume: str | None, run_dir: str | None, runs_root: str, trainers: int) -> str | None:
    """The run directory of the LTFB job `--resume` means (K trainers), or None to start from scratch.

    Args:
        resume: None (no resume); a job's run directory, or one of its trainers' checkpoints
            (`<job>/trainer<k>/checkpoint.pt`); or "auto": with `run_dir`, that job if it holds
            trainer 0's checkpoint, else None; without, the newest `<runs_root>/*` that does, else None.
        run_dir: this run's directory, if one was given.
        runs_root: where run directories with default names are created.
        trainers: K; the job must hold a checkpoint for each trainer.

    Raises:
        ConfigError: the path is none of these, or a trainer's checkpoint is missing.
    """
    if resume is None:
        return None
    first = os.path.join("trainer0", CHECKPOINT_NAME)
    if resume == "auto":
        if run_dir:  # this run's own directory only: never another run's checkpoint
            if not os.path.isfile(os.path.join(run_dir, first)):
                return None
            job = run_dir
        else:
            found = glob.glob(os.path.join(runs_root, "*", first))
            if not found:
                return None
            job = os.path.dirname(os.path.dirname(max(found, key=os.path.getmtime)))
    elif os.path.isdir(resume):
        job = resume
    elif os.path.isfile(resume) and os.path.basename(os.path.dirname(os.path.abspath(resume))).startswith("trainer"):
        job = os.path.dirname(os.path.dirname(os.path.abspath(resume)))
    else:
        raise ConfigError(
            f"--resume {resume!r}: with --trainers {trainers}, give the job's run directory "
            f"(holding trainer0/ ... trainer{trainers - 1}/) or one of its trainers' {CHECKPOINT_NAME}"
        )
    missing = [k for k in range(trainers) if not os.path.isfile(os.path.join(job, f"trainer{k}", CHECKPOINT_NAME))]
    if missing:
        raise ConfigError(
            f"--resume: {job} has no {CHECKPOINT_NAME} for trainer(s) {missing}; a tournament of "
            f"{trainers} trainers resumes only with every trainer's checkpoint"
        )
    return job


def resolve_resume(resume: str | None, run_dir: str | None, runs_root: str) -> str | None:
    """The checkpoint path `--resume` means, or None to start from scratch.

    Args:
        resume: None (no resume), a path, or "auto": with `run_dir`, `<run_dir>/checkpoint.pt` if
            it exists, else None (a run never continues another run's checkpoint); without, the
            newest `<runs_root>/*/checkpoint.pt`, else None.
        run_dir: this run's directory, if one was given.
        runs_root: where run directories with default names are created.
    """
    if resume is None:
        return None
    if resume != "auto":
        if not os.path.isfile(resume):
            raise ConfigError(f"--resume {resume!r}: no such checkpoint file")
        return resume
    if run_dir:
        own = os.path.join(run_dir, CHECKPOINT_NAME)
        return own if os.path.isfile(own) else None
    found = glob.glob(os.path.join(runs_root, "*", CHECKPOINT_NAME))
    return max(found, key=os.path.getmtime) if found else None


def container_identity(reader) -> dict:
    """What a checkpoint records of the container it trained on: its path, sample count, total bytes
    and a digest of its per-sample checksums (two containers of the same size differ there)."""
    import hashlib

    crcs = np.ascontiguousarray(np.asarray(reader.checksums, dtype="<u4"))
    path = os.fspath(reader.path)
    from dstore.formats.objects import is_url

    return {
        "path": path if is_url(path) else os.path.abspath(path),
        "num_samples": int(reader.num_samples),
        "total_bytes": int(reader.total_bytes),
        "checksums_sha256": hashlib.sha256(crcs.tobytes()).hexdigest(),
    }


def _check_same_mix(saved: dict, current: dict, checkpoint_path: str) -> None:
    """check_same_container where either side is a mix ({"mix": [identity + "weight", ...]}): the
    same containers (by contents) with the same weights, in the same order."""

    def key(c):
        return [
            (m.get("num_samples"), m.get("total_bytes"), m.get("checksums_sha256"), m.get("weight"))
            for m in c.get("mix", [c])
        ]

    def describe(c):
        return " ".join(f"{m.get('path')}" + (f":{m['weight']:g}" if "weight" in m else "") for m in c.get("mix", [c]))

    if key(saved) != key(current):
        raise ConfigError(
            f"cannot resume: checkpoint {checkpoint_path} was made on {describe(saved)}, but this run "
            f"trains on {describe(current)} (other containers or weights). Resume with the data it "
            f"was made on, or start a new run (another --run-dir, no --resume)"
        )


def check_same_container(saved: dict | None, current: dict, checkpoint_path: str) -> None:
    """Refuses to resume a checkpoint made on another container (a moved or copied file with the same
    contents is the same container). Checkpoints made before identities were recorded pass.

    Raises:
        ConfigError: naming both containers and what differs.
    """
    if not saved:
        return
    if "mix" in saved or "mix" in current:
        return _check_same_mix(saved, current, checkpoint_path)
    differ = [k for k in ("num_samples", "total_bytes", "checksums_sha256") if saved.get(k) != current[k]]
    if not differ:
        return

    def describe(c):
        return (
            f"{c.get('path')} ({c.get('num_samples')} samples, {c.get('total_bytes')} bytes, checksums "
            f"sha256 {str(c.get('checksums_sha256'))[:12]}...)"
        )

    raise ConfigError(
        f"cannot resume: checkpoint {checkpoint_path} was made on container {describe(saved)}, but "
        f"this run trains on {describe(current)}; they differ in {', '.join(differ)}. Resume with "
        f"the container it was made on, or start a new run (another --run-dir, no --resume)"
    )
