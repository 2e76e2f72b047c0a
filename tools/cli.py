"""`dstore` entry point: subcommand dispatch, and ending the whole MPI job when any rank fails.

Each subcommand lives in its own module `tools.cmd_<name>` exposing HELP, `add_arguments(parser)`
and `run(args) -> int`. Those modules keep heavy imports (torch, h5py, zarr) inside `run`, so
`dstore --help` is fast.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import traceback

COMMANDS = {
    "ingest": "tools.cmd_ingest",
    "verify": "tools.cmd_verify",
    "info": "tools.cmd_info",
    "train": "tools.cmd_train",
    "bench": "tools.cmd_bench",
    "pfs": "tools.cmd_pfs",
}


class _HelpFormatter(argparse.HelpFormatter):
    """Shows an option's default unless its help already says it or there is none to show."""

    def _get_help_string(self, action):
        text = action.help or ""
        default = action.default
        if ("default" in text or default is None or default is False or default is argparse.SUPPRESS
                or not action.option_strings):
            return text
        return text + " (default: %(default)s)"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dstore",
        description="Distributed in-memory data store for deep-learning training over MPI RMA.",
    )
    from datastore import __version__

    parser.add_argument("--version", action="version", version=f"dstore {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name, modname in COMMANDS.items():
        try:
            mod = importlib.import_module(modname)
        except ModuleNotFoundError as exc:
            if exc.name != modname:
                raise
            continue  # a subcommand not built yet
        p = sub.add_parser(name, help=mod.HELP, description=mod.HELP,
                           formatter_class=_HelpFormatter)
        mod.add_arguments(p)
        p.set_defaults(_run=mod.run)
    return parser


def _world():
    """(rank, size) without forcing MPI initialisation on a plain single-process run."""
    from mpi4py import MPI

    return MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()


def abort_on_error(fn, *args):
    """Runs fn(*args); if it raises on any rank, prints that rank's message and aborts the whole
    MPI job with a non-zero code, so that no other rank waits forever in a collective.

    Errors of our own types (DStoreError) print one clear line; anything else prints the traceback.
    """
    from datastore.errors import DStoreError

    try:
        return fn(*args)
    except SystemExit:
        raise
    except KeyboardInterrupt:
        code = 130
        msg = "interrupted"
    except BaseException as exc:  # noqa: BLE001 - every failure must end the job, whatever its type
        code = 1
        if isinstance(exc, DStoreError):
            msg = f"{type(exc).__name__}: {exc}"
        else:
            msg = traceback.format_exc().rstrip()
    rank, size = _world()
    prefix = f"dstore: error on rank {rank}/{size}: " if size > 1 else "dstore: error: "
    sys.stderr.write(prefix + msg + "\n")
    sys.stderr.flush()
    sys.stdout.flush()
    if size > 1:
        from mpi4py import MPI

        MPI.COMM_WORLD.Abort(code)
    return code


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    code = abort_on_error(args._run, args)
    return int(code or 0)


if __name__ == "__main__":
    sys.exit(main())
