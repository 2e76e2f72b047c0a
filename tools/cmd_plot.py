"""`dstore plot RUN_DIR`: draw a training run's curves to a PNG."""

from __future__ import annotations

HELP = (
    "Draw a training run's curves (loss, accuracy, samples/s, data wait per epoch) into a PNG "
    "(needs matplotlib: the bench extra)."
)


def add_arguments(parser) -> None:
    parser.add_argument("run_dir", metavar="RUN_DIR", help="a dstore train run directory (an LTFB job's too)")
    parser.add_argument(
        "--out",
        default=None,
        metavar="PNG",
        help="where the PNG goes (a missing folder is created; default: RUN_DIR/curves.png)",
    )


def run(args) -> int:
    import sys

    from dstore.training.plot import plot_run

    notes: list[str] = []
    path = plot_run(args.run_dir, args.out, notes)
    for line in notes:  # on stderr: stdout holds the PNG's path alone
        print(f"dstore plot: {line}", file=sys.stderr, flush=True)
    print(path, flush=True)
    return 0
