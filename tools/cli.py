"""`dstore` entry point: subcommand dispatch, and ending the whole MPI job when any rank fails.

Each subcommand lives in its own module `dstore.tools.cmd_<name>` exposing HELP, `add_arguments(parser)`
and `run(args) -> int`. Those modules keep heavy imports (torch, h5py, zarr) inside `run`, so
`dstore --help` is fast.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import os
import sys
import warnings

from dstore import __version__
from dstore.errors import DStoreError
from dstore.runtime import job, rc
from dstore.runtime.job import launcher_mismatch
from dstore.tools import config_file, flags

COMMANDS = {
    "ingest": "dstore.tools.cmd_ingest",
    "verify": "dstore.tools.cmd_verify",
    "info": "dstore.tools.cmd_info",
    "train": "dstore.tools.cmd_train",
    "bench": "dstore.tools.cmd_bench",
    "pfs": "dstore.tools.cmd_pfs",
    "plot": "dstore.tools.cmd_plot",
    "plan": "dstore.tools.cmd_plan",
    "cluster": "dstore.tools.cmd_cluster",
}


class _HelpFormatter(argparse.HelpFormatter):
    """Shows an option's default unless its help already says it or there is none to show."""

    def _get_help_string(self, action):
        text = action.help or ""
        default = action.default
        if (
            "default" in text
            or default is None
            or default is False
            or default is argparse.SUPPRESS
            or not action.option_strings
        ):
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


class _Parser(argparse.ArgumentParser):
    """No abbreviations (`--epoch 3` is not taken for `--epochs`: a prefix that one day matches two
    flags would change meaning), and an unknown flag gets the closest known one suggested."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def _known_options(self) -> list[str]:
        """This parser's option strings, and those of the subcommand the command line names."""
        known = [o for a in self._actions for o in a.option_strings]
        argv = sys.argv[1:] if self.argv is None else self.argv
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    if name in argv:
                        known += [o for a in sub._actions for o in a.option_strings]
        return known

    argv: list[str] | None = None  # what main() parses (None: sys.argv)

    def error(self, message: str):
        if message.startswith("unrecognized arguments: "):
            known = self._known_options()
            hints = []
            for word in message.removeprefix("unrecognized arguments: ").split():
                close = difflib.get_close_matches(word.split("=")[0], known, n=1, cutoff=0.6)
                if word.startswith("-") and close:
                    hints.append(f"{word.split('=')[0]}: did you mean {close[0]}?")
            if hints:
                message += " (" + "; ".join(hints) + ")"
        super().error(message)


def build_parser() -> _Parser:
    parser = _Parser(
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
        p = sub.add_parser(name, help=mod.HELP, description=mod.HELP, formatter_class=_HelpFormatter)
        mod.add_arguments(p)
        _every_default_shown(p)
        p.set_defaults(command_run=mod.run, command_parser=p)
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
    dstore.runtime.job.report_and_abort prints it (once per job) and aborts; a closed stdout
    (BrokenPipeError) ends quietly.
    """
    settle = 0.0
    try:
        return fn(*args)
    except SystemExit:
        raise
    except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM where a command unwinds on it (ingest)
        code = getattr(exc, "exit_code", 130)
        msg = str(exc) or "interrupted"
        settle = job.INTERRUPT_GRACE_S  # the other ranks got the signal too: let them clean up
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
    return job.report_and_abort(code, msg, settle=settle)


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


def _warnings_once_per_job() -> None:
    """Python warnings (a deprecated flag, pin_memory without CUDA, ...) from rank 0 only: every
    rank meets the same ones, and 64 copies of a line hide the rest of a log. The launcher's rank
    variables say which rank this is before MPI starts (flags are parsed first).
    $DSTORE_ALL_RANK_WARNINGS=1 shows every rank's."""
    if job.launcher_rank(os.environ) != 0 and not rc.ALL_RANK_WARNINGS.get():
        warnings.simplefilter("ignore")


def main(argv: list[str] | None = None) -> int:
    _warnings_once_per_job()
    parser = build_parser()
    parser.argv = argv
    args = parser.parse_args(argv)
    from_file: dict = {}
    if getattr(args, "config", None):  # the file's values become defaults: the command line wins
        try:
            from_file = config_file.apply(args.command_parser, args.config)
        except DStoreError as exc:
            args.command_parser.error(str(exc))
        args = parser.parse_args(argv)
    if hasattr(args, "resume"):  # what the user gave (command line or --config file), not a default
        args.given_flags = flags.given(parser, args.command_parser, argv) | set(from_file)
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    code = _check_launcher()
    if code:
        return code
    code = abort_on_error(args.command_run, args)
    return int(code or 0)


if __name__ == "__main__":
    sys.exit(main())
