"""NVIDIA DALI's CPU pipeline beside dstore's loader: the same JPEGs, the same cores, the same recipe.

DALI runs in a venv of its own (tools/setup_dali.sh: about 1.1 GB, never the project's), found by
`python=` (a flag), $DSTORE_DALI_PYTHON (dstore.runtime.rc) or DEFAULT_PYTHON; `dali_peer.py` runs there in
a subprocess, pinned to the same cores as dstore's rows (`cores`). The container's JPEGs are handed
over once as two .npy files (the bytes back to back, the offsets) and DALI's process loads them into
memory before it is timed: see dali_peer.py for why memory and not DALI's file reader.

A missing venv or a failed run is a row's skip reason, never an error of the bench.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np

from dstore.runtime import rc

REPO = Path(__file__).resolve().parents[2]
DEFAULT_PYTHON = REPO / ".cache" / "venv-dali" / "bin" / "python"
"""Where tools/setup_dali.sh puts DALI's venv by default (git-ignored)."""
RECIPES = ("plain", "imagenet")


def find_python(python: str | os.PathLike | None = None) -> str | None:
    """DALI's interpreter: `python`, else $DSTORE_DALI_PYTHON, else DEFAULT_PYTHON; None where none exists."""
    for cand in (python, rc.DALI_PYTHON.get(), DEFAULT_PYTHON):
        if cand and Path(cand).is_file():
            return str(cand)
    return None


def missing(python: str | os.PathLike | None = None) -> str | None:
    """Why DALI cannot run here (None: it can): no venv, or DALI does not import in it."""
    py = find_python(python)
    if py is None:
        return (
            f"DALI: no DALI venv (run `bash tools/setup_dali.sh` to create {os.path.relpath(DEFAULT_PYTHON, REPO)}, "
            f"or pass its python with --dali / $DSTORE_DALI_PYTHON)"
        )
    proc = subprocess.run([py, "-c", "import nvidia.dali"], capture_output=True, text=True, env=dali_env(), timeout=120)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:]
        return f"DALI: {py} cannot import nvidia.dali: {' '.join(tail)}"
    return None


def dali_env() -> dict:
    """The environment without MPI launcher variables or this project's PYTHONPATH."""
    return {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PMI_", "PMIX_", "MPI", "HYDRA_", "OMPI_")) and k != "PYTHONPATH"
    }


def export(samples: list, work_dir: str) -> tuple[str, str]:
    """The samples' bytes as BLOB.npy (uint8, back to back) and OFFSETS.npy (int64[N+1]) under work_dir."""
    os.makedirs(work_dir, exist_ok=True)
    lens = np.fromiter((len(s) for s in samples), np.int64, len(samples))
    offsets = np.zeros(lens.size + 1, np.int64)
    np.cumsum(lens, out=offsets[1:])
    blob = np.empty(int(offsets[-1]), np.uint8)
    for s, a, b in zip(samples, offsets[:-1], offsets[1:]):
        blob[a:b] = np.frombuffer(s, np.uint8)
    paths = os.path.join(work_dir, "dali-blob.npy"), os.path.join(work_dir, "dali-offsets.npy")
    np.save(paths[0], blob)
    np.save(paths[1], offsets)
    return paths


def run(
    python: str,
    blob: tuple[str, str],
    *,
    recipe: str,
    threads: int,
    batch_size: int,
    size: int,
    epochs: int,
    dtype: str = "uint8",
    cores: list[int] | None = None,
    seed: int = 0,
    timeout: float = 1200,
) -> dict:
    """One DALI row: {"samples_per_s", "cpu_us_per_sample", ...} over the timed epochs, or {"error": why}."""
    if recipe not in RECIPES:
        raise ValueError(f"recipe={recipe!r} is not one of {RECIPES}")
    cmd = [
        python,
        str(Path(__file__).with_name("dali_peer.py")),
        "--blob",
        blob[0],
        "--offsets",
        blob[1],
        "--recipe",
        recipe,
        "--threads",
        str(threads),
        "--batch-size",
        str(batch_size),
        "--size",
        str(size),
        "--dtype",
        dtype,
        "--epochs",
        str(epochs),
        "--seed",
        str(seed),
    ]
    if cores:  # the same cores as dstore's rows: DALI's threads and its feeding thread stay on them
        cmd = ["taskset", "-c", ",".join(map(str, cores)), *cmd]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=dali_env())
    except subprocess.TimeoutExpired:
        return {"error": f"DALI did not finish within {timeout:.0f} s"}
    except OSError as exc:
        return {"error": f"DALI could not start: {exc}"}
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        return {"error": f"DALI failed (exit {proc.returncode}): {' | '.join(tail)}"}
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    n = sum(e["samples"] for e in out["epochs"])
    secs = sum(e["seconds"] for e in out["epochs"])
    cpu = sum(e["cpu_seconds"] for e in out["epochs"])
    return {
        "dali": out["dali"],
        "samples": n,
        "samples_per_s": n / secs,
        "cpu_us_per_sample": 1e6 * cpu / n,
        "sample_shape": out["sample_shape"],
    }
