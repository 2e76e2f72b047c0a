"""`dstore` entry point: subcommand dispatch, and ending the whole MPI job when any rank fails.

Each subcommand lives in its own module `dstore.tools.cmd_<name>` exposing HELP, `add_arguments(parser)`
and `run(args) -> int`. Those modules keep heavy imports (torch, h5py, zarr) inside `run`, so
`dstore --help` is fast.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from dstore import __version__, job
from dstore.errors import DStoreError
from dstore.job import launcher_mismatch
from dstore.tools import config_file

COMMANDS = {
    "ingest": "dstore.tools.cmd_ingest",
    "verify": "dstore.tools.cmd_verify",
    "info": "dstore.tools.cmd_info",
    "train": "dstore.tools.cmd_train",
    "bench": "dstore.tools.cmd_bench",
    "pfs": "dstore.tools.cmd_pfs",
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


def _every_default_shown(parser: argparse.ArgumentParser) -> None:
    """Gives every option that takes a value a help text that states its default (argparse prints
    nothing for an option without help, and _HelpFormatter skips a None default)."""
    for action in parser._actions:
        if not action.option_strings or action.nargs == 0 or action.default is argparse.SUPPRESS:
            continue  # positionals, on/off flags, --help
        text = action.help or ""
        if "default" in text:
            continue
        if action.default is None:
            action.help = (text + " " if text else "") + "(default: not set)"
        elif not text:
            action.help = "(default: %(default)s)"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dstore",
        description="Distributed in-memory data store for deep-learning training over MPI RMA.",
    )
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
        _every_default_shown(p)
        p.set_defaults(_run=mod.run, _parser=p)
    return parser


def _quiet_broken_pipe() -> None:
    """The reader of stdout went away (`dstore info --json | head -1`): point stdout at /dev/null so
    that the interpreter's final flush does not raise again (Python's documented recipe)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


def abort_on_error(fn, *args):
    """Runs fn(*args); if it raises on any rank, prints the message once and aborts the whole MPI
    job with a non-zero code, so that no other rank waits forever in a collective.

    Errors of our own types (DStoreError) print one clear line; anything else prints the traceback.
    dstore.job.report_and_abort prints it (once per job) and aborts; a closed stdout
    (BrokenPipeError) ends quietly.
    """
    try:
        return fn(*args)
    except SystemExit:
        raise
    except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM where a command unwinds on it (ingest)
        code = getattr(exc, "exit_code", 130)
        msg = str(exc) or "interrupted"
    except BrokenPipeError:
        _quiet_broken_pipe()
        code, msg = 141, None  # 128 + SIGPIPE, as a tool killed by the signal exits
    except BaseException as exc:  # noqa: BLE001 - every failure must end the job, whatever its type
        code = 1
        msg = job.describe(exc)
    if msg is None:  # stdout is gone: end quietly, but still end every rank
        if job.world()[1] > 1:
            from mpi4py import MPI

            MPI.COMM_WORLD.Abort(code)
        return code
    return job.report_and_abort(code, msg)


def _check_launcher() -> int:
    """2 (after one message, from the launcher's rank 0) if this process is one of N separate 1-rank
    MPI worlds (torchrun, srun without PMI), else 0."""
    if launcher_mismatch(os.environ, 1) is None:  # no launcher of several processes: MPI not needed here
        return 0
    problem = launcher_mismatch(os.environ, job.world()[1])
    if problem is None:
        return 0
    if job.launcher_rank(os.environ) == 0:  # one copy of the message, not one per process
        sys.stderr.write(f"dstore: error: {problem}\n")
        sys.stderr.flush()
    return 2


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "config", None):  # the file's values become defaults: the command line wins
        try:
            config_file.apply(args._parser, args.config)
        except DStoreError as exc:
            args._parser.error(str(exc))
        args = parser.parse_args(argv)
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    code = _check_launcher()
    if code:
        return code
    code = abort_on_error(args._run, args)
    return int(code or 0)


if __name__ == "__main__":
    sys.exit(main())
