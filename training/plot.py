"""`dstore plot RUN_DIR`: a run's curves (loss, accuracy, samples/s, data wait) in one PNG.

Reads the per-epoch records of `<run dir>/metrics.jsonl` (or, for an LTFB job, of every
`<run dir>/trainer<k>/metrics.jsonl`, one line per trainer). Needs matplotlib (the `bench` extra).
"""

from __future__ import annotations

import glob
import json
import os

from dstore.errors import ConfigError

PANELS = (
    ("loss", ("train_loss", "val_loss"), None),
    ("accuracy", ("train_accuracy", "val_accuracy"), None),
    ("samples/s (training)", ("train_samples_per_s",), None),
    ("data wait (share of step time)", ("train_data_wait_frac",), (0.0, 1.0)),
)
"""(title, the record fields drawn, y range or None) of each panel."""


def read_records(path: str, notes: list[str] | None = None) -> list[dict]:
    """The records of a metrics.jsonl; a last line cut short (a run killed while writing it) is
    skipped, with a line about it appended to `notes`.

    Raises:
        ConfigError: a line before the last that is not JSON (the file was edited or damaged).
    """
    with open(path, encoding="utf-8") as fh:
        lines = fh.read().split("\n")
    records = []
    for k, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except ValueError:
            if any(rest.strip() for rest in lines[k + 1 :]):
                raise ConfigError(f"{path}: line {k + 1} is not JSON ({line[:60]!r}); the file is damaged") from None
            if notes is not None:
                notes.append(
                    f"{path}: skipped its last line, cut short ({len(line)} characters, not JSON: the run "
                    f"was killed while writing it)"
                )
    return records


def run_curves(run_dir: str, notes: list[str] | None = None) -> dict[str, list[dict]]:
    """{label: per-epoch records} of the run (label "" for one trainer, "trainer k" under LTFB);
    what was skipped (read_records) is appended to `notes`.

    Raises:
        ConfigError: no metrics.jsonl there, or one with no epoch record yet.
    """
    own = os.path.join(run_dir, "metrics.jsonl")
    paths = (
        {"": own}
        if os.path.isfile(own)
        else {
            f"trainer {os.path.basename(os.path.dirname(p))[len('trainer') :]}": p
            for p in sorted(glob.glob(os.path.join(run_dir, "trainer*", "metrics.jsonl")))
        }
    )
    if not paths:
        raise ConfigError(f"{run_dir}: no metrics.jsonl (nor trainer*/metrics.jsonl): not a dstore run directory")
    curves = {
        label: [r for r in read_records(p, notes) if isinstance(r, dict) and "epoch" in r and not r.get("final")]
        for label, p in paths.items()
    }
    if not any(curves.values()):
        raise ConfigError(f"{run_dir}: the run has finished no epoch yet (metrics.jsonl holds no epoch record)")
    return curves


def plot_run(run_dir: str, out: str | None = None, notes: list[str] | None = None) -> str:
    """Draws the run's curves into `out` (default: `<run dir>/curves.png`; a missing folder of it is
    created); returns its path. What was skipped or created is appended to `notes`.

    Raises:
        ConfigError: not a run directory, no epoch yet, `out`'s folder cannot be made, or matplotlib missing.
    """
    curves = run_curves(run_dir, notes)
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import MaxNLocator
    except ImportError:
        raise ConfigError("dstore plot needs matplotlib: pip install 'dstore-mpi[bench]'") from None
    out = out or os.path.join(run_dir, "curves.png")
    folder = os.path.dirname(os.path.abspath(out))
    if not os.path.isdir(folder):
        try:
            os.makedirs(folder)
        except OSError as exc:
            raise ConfigError(f"--out {out}: cannot create its folder {folder}: {exc.strerror or exc}") from None
        if notes is not None:
            notes.append(f"created the folder {folder} for --out")
    fig, axes = plt.subplots(2, 2, figsize=(10, 7), constrained_layout=True)
    for ax, (title, fields, ylim) in zip(axes.flat, PANELS):
        for label, records in curves.items():
            for field in fields:
                points = [(r["epoch"], r[field]) for r in records if isinstance(r.get(field), (int, float))]
                if points:
                    name = " ".join(x for x in (label, field.split("_")[0]) if x)
                    ax.plot(*zip(*points), marker="o", label=name)
        ax.set_title(title)
        ax.set_xlabel("epoch")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        if ylim is not None:
            ax.set_ylim(*ylim)
        if ax.lines:
            ax.legend(fontsize="small")
    fig.suptitle(os.path.basename(os.path.normpath(run_dir)))
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out
