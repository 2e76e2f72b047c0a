"""The Mosaic Streaming baseline: runs `mosaic_peer.py` with the interpreter of the separate Mosaic venv
(tools/setup_mosaic.sh), on rank 0 only, in one process, and turns its output into measurements."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from dstore.runtime import rc
from dstore.tools.bench.common import Measurement, quiet_barrier

REPO = Path(__file__).resolve().parents[2]
DEFAULT_VENV = REPO / ".cache" / "venv-mosaic"
"""Where tools/setup_mosaic.sh puts the venv by default (git-ignored)."""


def find_python(venv: str | os.PathLike | None = None) -> str | None:
    """The Mosaic venv's interpreter, or None if there is no such venv.

    Looks at `venv`, then $DSTORE_MOSAIC_VENV, then DEFAULT_VENV.
    """
    for cand in (venv, rc.MOSAIC_VENV.get(), DEFAULT_VENV):
        if cand:
            py = Path(cand) / "bin" / "python"
            if py.exists():
                return str(py)
    return None


def run_peer(
    comm, samples: list[tuple[str, int]], work_dir: str, *, seed: int, batch_size: int, venv=None, timeout: float = 1200
) -> tuple[list[Measurement], str]:
    """Runs the Mosaic baseline on rank 0; every rank gets the same result.

    Args:
        comm: the ranks (only rank 0 runs the peer; the others wait).
        samples: (file path, label) per sample, in the container's order.
        work_dir: where the MDS shards and the sample list go (MDS is reused if already there).
        seed, batch_size: Mosaic's shuffle seed and batch size.
        venv: the Mosaic venv (see `find_python`).
        timeout: seconds before the peer is given up on.

    Returns:
        (measurements, note): the cold and warm passes (possibly none) and a line saying what
        happened (version, conversion time, or why it was skipped).
    """
    result = None
    if comm.Get_rank() == 0:
        result = _run_on_root(samples, work_dir, seed=seed, batch_size=batch_size, venv=venv, timeout=timeout)
    quiet_barrier(comm)  # the other ranks sleep meanwhile instead of spinning in the bcast
    ms, note = comm.bcast(result, root=0)
    return [Measurement.from_dict(d) for d in ms], note


def _run_on_root(samples, work_dir, *, seed, batch_size, venv, timeout):
    py = find_python(venv)
    if py is None:
        where = os.path.relpath(DEFAULT_VENV, REPO)
        return [], (
            f"skipped: no Mosaic venv (run `bash tools/setup_mosaic.sh` to create {where}, or set DSTORE_MOSAIC_VENV)"
        )
    os.makedirs(work_dir, exist_ok=True)
    listing = os.path.join(work_dir, "samples.json")
    with open(listing, "w") as fh:
        json.dump([[os.path.abspath(p), int(label)] for p, label in samples], fh)
    mds = os.path.join(work_dir, f"mds-{len(samples)}")
    cmd = [
        py,
        str(Path(__file__).with_name("mosaic_peer.py")),
        "--samples",
        listing,
        "--mds",
        mds,
        "--seed",
        str(seed),
        "--batch-size",
        str(batch_size),
    ]
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PMI_", "PMIX_", "MPI", "HYDRA_", "OMPI_")) and k != "PYTHONPATH"
    }
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return [], f"skipped: the Mosaic peer did not finish within {timeout:.0f}s"
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        return [], f"skipped: the Mosaic peer failed (exit {proc.returncode}): {' | '.join(tail)}"
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    ms = []
    for p in out["passes"]:
        m = Measurement(
            "Mosaic Streaming (MDS, 1 process)",
            "baseline",
            p["cache"],
            [p["samples"]],
            [p["bytes"]],
            [p["seconds"]],
            {"streaming_version": out["streaming_version"]},
        )
        ms.append(m.to_dict())
    conv = out.get("convert_seconds")
    note = f"mosaicml-streaming {out['streaming_version']}, 1 process, local MDS ({out['mds_bytes'] / 1e6:.0f} MB" + (
        f", converted in {conv:.1f}s)" if conv else ", reused)"
    )
    return ms, note
