"""`dstore train`: data-parallel training fed by the distributed store (start with mpiexec -n N)."""

from __future__ import annotations

import argparse
import dataclasses
import sys

from dstore.errors import ConfigError
from dstore.runtime.preemption import PREEMPTED_EXIT, Preemption, parse_signals
from dstore.tools import flags
from dstore.training.config import RUN, TrainConfig
from dstore.training.metrics import _plain

HELP = (
    "Train a model data-parallel (torch DDP bootstrapped from MPI) on batches served by the "
    "distributed store; with no container, ingests and trains on the built-in `digits` set."
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """A flag per field of TrainConfig (its default, choices and help are the field's), and --json."""
    groups = flags.add_fields(p, TrainConfig)
    groups[RUN].add_argument(
        "--config",
        metavar="FILE",
        help="read flags from a YAML or JSON file (keys: flag names, e.g. batch_size: 256; a "
        "run's config.json works as it is); flags on the command line override it "
        "(default: none)",
    )
    groups[RUN].add_argument(
        "--print-config",
        action="store_true",
        help="print the resolved configuration (file, then command line) as JSON, valid "
        "input for --config, and exit without training",
    )
    groups[RUN].add_argument(
        "--json",
        action="store_true",
        help="rank 0's progress lines go to stderr and the run's summary (run dir, per-epoch "
        "metrics, test metrics) is printed on stdout as one JSON object",
    )


def run(args) -> int:
    cfg = flags.from_args(TrainConfig, args)
    # First thing, before MPI starts and torch loads (seconds): a preemption signal during start-up
    # is held and the run stops before its first step with exit 75, instead of dying by the signal.
    with Preemption(parse_signals(cfg.preempt_signal)) as watch:
        return _run(args, cfg, watch)


def _run(args, cfg: TrainConfig, watch: Preemption) -> int:
    from mpi4py import MPI

    # here, not at the top (as in every cmd module): it loads torch and MPI, which `dstore --help` must not
    from dstore.training.run import train

    say = _to_stderr if args.json else None  # with --json, stdout holds the JSON summary alone
    if cfg.resume is not None:  # the flags not given: the run's own (--print-config shows them)
        cfg = resume_defaults(args, cfg, MPI.COMM_WORLD, say if not args.print_config else _to_stderr)
    if args.print_config:
        cfg.check()
        if MPI.COMM_WORLD.Get_rank() == 0:
            import json

            print(json.dumps({"config": _plain(dataclasses.asdict(cfg))}, indent=1), flush=True)
        return 0
    result = train(cfg, MPI.COMM_WORLD, say=say, preemption=watch)
    code = PREEMPTED_EXIT if result.get("preempted") else 0  # every rank agreed on it
    if MPI.COMM_WORLD.Get_rank() != 0:
        return code
    if args.json:
        import json

        summary = {
            k: result.get(k) for k in ("run_dir", "test", "epochs", "stopped_early", "preempted", "ltfb") if k in result
        }
        print(json.dumps(_plain(summary)), flush=True)
    elif result["test"] is None and not result["stopped_early"]:
        print("no held-out set (--holdout 0 and no --val): no test accuracy", flush=True)
    return code


def resume_defaults(args, cfg: TrainConfig, comm, say=None) -> TrainConfig:
    """`cfg` with every flag the user did not give (args.given_flags: command line or --config file) set
    to the value in the config.json of the run --resume continues, so that `dstore train --resume
    auto --run-dir D` needs no other flag. The flags of this invocation only (--run-dir, --resume,
    --progress, --stop-after-steps, --overwrite) are never taken from it. A flag given with another
    value than the run's is refused when the checkpoint is checked (dstore.training.resume.
    check_compatible: all of them in one line), unless a resume may change it (CHANGEABLE)."""
    from dstore.runtime.collective import on_root
    from dstore.tools import config_file
    from dstore.training import console
    from dstore.training.resume import NOT_COMPARED, missing_run_config, run_config_path

    given = getattr(args, "given_flags", None)  # set by dstore.tools.cli.main
    path = None if given is None else on_root(comm, run_config_path, cfg.resume, cfg.run_dir, cfg.runs_root)
    if path is None and given is not None and "data" not in given:
        missing = on_root(comm, missing_run_config, cfg.resume, cfg.run_dir, cfg.runs_root)
        if missing is not None:
            raise ConfigError(
                f"--resume {cfg.resume}: the run's {missing} is missing, so its flags (the data set "
                f"first) are not known: put it back, or give them again on the command line"
            )
    if path is None:  # no run to take from, or args not parsed by dstore's main: every flag as given
        return cfg
    saved = on_root(comm, config_file.read_values, args.command_parser, path)
    taken = {
        k: v
        for k, v in saved.items()
        if k not in given and (k == "data" or k not in NOT_COMPARED) and k in TrainConfig.__dataclass_fields__
    }
    if comm.Get_rank() == 0 and taken:
        (say or console.say)(f"--resume: the flags not given are the run's own, from {path}")
    return dataclasses.replace(cfg, **taken)


def _to_stderr(line: str) -> None:
    sys.stderr.write(line + "\n")
    sys.stderr.flush()
