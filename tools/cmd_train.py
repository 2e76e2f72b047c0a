"""`dstore train`: data-parallel training fed by the distributed store (start with mpiexec -n N)."""

from __future__ import annotations

import argparse
import sys

from dstore.errors import ConfigError
from dstore.memory import parse_bytes
from dstore.training.metrics import _plain
from dstore.training.models import model_names

HELP = ("Train a model data-parallel (torch DDP bootstrapped from MPI) on batches served by the "
        "distributed store; with no container, ingests and trains on the built-in `digits` set.")


def _floats(text: str) -> tuple[float, ...]:
    try:
        return tuple(float(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of numbers") from None


def _bytes(text: str) -> int:
    try:
        return parse_bytes(text, "--memory-budget")
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _size(text: str) -> tuple[int, int]:
    try:
        parts = [int(v) for v in text.lower().split("x")]
    except ValueError:
        parts = []
    if len(parts) not in (1, 2):
        raise argparse.ArgumentTypeError(f"{text!r} is not N or HxW")
    return (parts[0], parts[-1])


class _DeprecatedAlias(argparse.Action):
    """Stores the value; warns (on stderr, once per use) when given under an old option name."""

    def __init__(self, option_strings, dest, deprecated=None, **kwargs):
        self.deprecated = deprecated or {}
        super().__init__(option_strings, dest, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        if option_string in self.deprecated:
            import warnings

            warnings.warn(f"{option_string} is deprecated: use {self.deprecated[option_string]}",
                          FutureWarning, stacklevel=2)
        setattr(namespace, self.dest, values)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The flags; each maps onto one field of dstore.training.run.TrainConfig."""
    d = p.add_argument_group("data")
    d.add_argument("data", nargs="?", default=None,
                   help="container to train on; none: the built-in `digits` set, ingested once into "
                        "$DSTORE_CACHE or ~/.cache/dstore")
    d.add_argument("--val", default=None,
                   help="separate held-out container (then --holdout is ignored; default: none, the --holdout tail)")
    d.add_argument("--holdout", type=float, default=0.2,
                   help="fraction of the container (its tail; ingest already shuffled it) held out for evaluation")
    d.add_argument("--loader", choices=("store", "direct"), default="store",
                   help="store: the distributed in-memory store; direct: baseline reading every sample from "
                        "the container file when its batch is due (same order, same decode)")
    d.add_argument("--direct-cold", action="store_true",
                   help="with --loader direct: drop the container from each node's page cache before "
                        "every epoch, so per-sample reads come from storage (as for data larger than memory)")
    d.add_argument("--shuffle", choices=("global", "local", "partial"), default="global", help="store shuffle policy")
    d.add_argument("--population", choices=("preload", "dynamic"), default="preload", help="store population")
    d.add_argument("--prefetch", type=int, default=2, help="batches fetched ahead")
    d.add_argument("--decode-threads", "--threads", dest="decode_threads", type=int, default=2,
                   action=_DeprecatedAlias, deprecated={"--threads": "--decode-threads"},
                   help="decode/augment threads per rank (StoreLoader's decode_threads; --threads: deprecated)")
    d.add_argument("--memory-budget", type=_bytes, default=None, metavar="BYTES",
                   help="what a rank may hold in memory: bytes or e.g. 8G, 512MiB (default: $DSTORE_MEMORY_BUDGET, "
                        "else 70%% of the node's available memory, or of its cgroup limit if lower, over its ranks)")
    d.add_argument("--overflow", choices=("serve", "error"), default="serve",
                   help="data over the memory budget: serve the rest from storage (default) or refuse")
    d.add_argument("--drop-last", action="store_true", help="drop each epoch's last partial global batch")
    d.add_argument("--augment", choices=("auto", "on", "off"), default="auto",
                   help="auto: random crop with padding + flip for images of 32x32 and up, none below")
    d.add_argument("--channels", type=int, choices=(1, 3), default=None,
                   help="force grey (1) or RGB (3) (default: grey stays 1, the rest RGB)")
    d.add_argument("--mean", type=_floats, default=None, help="per-channel mean in [0,1] (default: measured)")
    d.add_argument("--std", type=_floats, default=None, help="per-channel std in [0,1] (default: measured)")
    d.add_argument("--cache-dir", default=None,
                   help="where built-in data sets are ingested (default: $DSTORE_CACHE, else ~/.cache/dstore)")

    m = p.add_argument_group("model and optimisation")
    m.add_argument("--model", default="auto", choices=("auto",) + model_names(),
                   help="auto: small_cnn below 32x32, resnet_small (32x32 input) otherwise")
    m.add_argument("--image-size", type=_size, default=None, metavar="N|HxW",
                   help="size images are resized to for the model (default: the model's own: the data's "
                        "size for small_cnn, 32x32 for the ResNets)")
    m.add_argument("--epochs", type=int, default=15)
    m.add_argument("--batch-size", type=int, default=64, help="GLOBAL batch size (split over the ranks)")
    m.add_argument("--optimizer", choices=("sgd", "adam", "adamw"), default="adam")
    m.add_argument("--lr", type=float, default=3e-3, help="base learning rate")
    m.add_argument("--momentum", type=float, default=0.9, help="SGD momentum / Adam beta1")
    m.add_argument("--weight-decay", type=float, default=0.0)
    m.add_argument("--nesterov", action="store_true", help="Nesterov momentum (sgd)")
    m.add_argument("--schedule", choices=("cosine", "step", "constant"), default="cosine")
    m.add_argument("--warmup-epochs", type=float, default=0.0, help="linear LR warm-up")
    m.add_argument("--step-epochs", type=int, default=10, help="step schedule: epochs between decays")
    m.add_argument("--gamma", type=float, default=0.1, help="step schedule: decay factor")
    m.add_argument("--seed", type=int, default=0)
    m.add_argument("--deterministic", action="store_true",
                   help="deterministic torch kernels, one intra-op thread: identical results run to run")
    m.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                   help="cuda: nccl, one GPU per rank by node-local rank")

    t = p.add_argument_group("tournament (LTFB)")
    t.add_argument("--trainers", type=int, default=1, metavar="K",
                   help="split the job into K trainers of N/K ranks each (K must divide N), each training on "
                        "its own part of the training set and playing a tournament every --ltfb-round steps")
    t.add_argument("--ltfb-round", type=int, default=0, metavar="STEPS",
                   help="optimizer steps between tournament rounds (default: 0 = once per epoch)")
    t.add_argument("--ltfb-metric", choices=("accuracy", "loss"), default="accuracy",
                   help="what a trainer compares on its tournament set: accuracy (higher wins) or loss "
                        "(lower wins); ties keep the trainer's own model, NaN always loses")
    t.add_argument("--tournament-fraction", type=float, default=0.1, metavar="F",
                   help="share of each trainer's part of the training set held out as its tournament set")
    t.add_argument("--ltfb-strategy", choices=("pairwise", "truncation"), default="pairwise",
                   help="pairwise: seeded pairs swap models, each keeps the better on its own tournament set; "
                        "truncation: all scores gathered, the bottom --truncation-fraction of the trainers "
                        "take the models of the top as many (default: pairwise)")
    t.add_argument("--truncation-fraction", type=float, default=0.25, metavar="F",
                   help="truncation: share of the trainers in the top and in the bottom (at least 1, at most "
                        "K/2; default: 0.25)")
    t.add_argument("--explore", default="", metavar="NAMES",
                   help="hyperparameters to explore, comma-separated, of lr, weight_decay, momentum: trainers "
                        "start from seeded perturbations of the given values, and a trainer that takes another's "
                        "model perturbs its values by a seeded factor (0.8 or 1.25) (default: none)")

    r = p.add_argument_group("run directory, checkpoints, resumption")
    r.add_argument("--run-dir", default=None, help="where metrics.jsonl, config.json and checkpoint.pt go "
                                                   "(default: runs/<YYYYmmdd-HHMMSS>-<pid of rank 0>)")
    r.add_argument("--resume", default=None, metavar="PATH|auto",
                   help="continue from a checkpoint (exact sample, also mid-epoch); auto: --run-dir's "
                        "checkpoint, else the newest runs/*/checkpoint.pt, else start fresh; a checkpoint "
                        "made on another container is refused (default: start fresh)")
    r.add_argument("--checkpoint-every", type=int, default=0, metavar="STEPS",
                   help="also checkpoint every STEPS optimizer steps (always at each epoch end)")
    r.add_argument("--stop-after-steps", type=int, default=0, metavar="N",
                   help="stop (with a checkpoint) after N steps of this invocation: simulates an interruption")
    r.add_argument("--log-batches", action="store_true",
                   help="write every trained batch's sample ids to batches.rank<r>.jsonl")
    r.add_argument("--json", action="store_true",
                   help="rank 0's progress lines go to stderr and the run's summary (run dir, per-epoch metrics, "
                        "test metrics) is printed on stdout as one JSON object")
    r.add_argument("--progress", dest="progress", action=argparse.BooleanOptionalAction, default=None,
                   help="a progress bar per epoch on rank 0, on stderr (default: only when stderr is a terminal, "
                        "so batch logs get plain lines; under mpiexec stderr is a pipe: pass --progress)")


def run(args) -> int:
    from mpi4py import MPI

    # here, not at the top (as in every cmd module): it loads torch and MPI, which `dstore --help` must not
    from dstore.training.run import TrainConfig, train

    fields = {f: getattr(args, f) for f in TrainConfig.__dataclass_fields__ if hasattr(args, f)}
    cfg = TrainConfig(**fields)
    say = None
    if args.json:  # stdout holds the JSON summary alone
        def say(line):
            sys.stderr.write(line + "\n")
            sys.stderr.flush()
    result = train(cfg, MPI.COMM_WORLD, say=say)
    if MPI.COMM_WORLD.Get_rank() != 0:
        return 0
    if args.json:
        import json

        summary = {k: result.get(k) for k in ("run_dir", "test", "epochs", "stopped_early", "ltfb")
                   if k in result}
        print(json.dumps(_plain(summary)), flush=True)
    elif result["test"] is None and not result["stopped_early"]:
        print("no held-out set (--holdout 0 and no --val): no test accuracy", flush=True)
    return 0
