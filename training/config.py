"""TrainConfig: everything a training run depends on, and, field by field, the flag of `dstore train`.

Each field's `metadata` describes its flag (read by dstore.tools.flags, which builds the parser):
`help`, `group` (the help section), `choices`, `parse` (text -> value where the annotation does not
say how to read it), `metavar`, `flags` (option strings where they differ from --the-field-name),
`deprecated` (old option string -> new one), and `flag: False` for a field that is not a flag. So
a field's default, choices and help live here once, for the library and the command alike. This
module stays light (no torch, no MPI): `dstore --help` imports it.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import math

from dstore.errors import ConfigError
from dstore.loader.config import check_workers
from dstore.memory.limits import parse_bytes
from dstore.order.policy import NAMES as SHUFFLES
from dstore.order.policy import policy
from dstore.order.tiers import OVERFLOWS, POPULATIONS
from dstore.runtime import values
from dstore.runtime.preemption import parse_signals
from dstore.training import ltfb
from dstore.training.dist import DEVICES
from dstore.training.models import get_model, model_names
from dstore.training.optim import OPTIMIZERS, SCHEDULES

LOADERS = ("store", "direct", "files", "webdataset", "litdata")
"""What feeds the trainer: the distributed store, or a per-sample baseline (training.data.DirectSource reading
the container, FilesSource reading the image files it was ingested from), or one of the store's peers over
copies of the container beside it (training.peers.PeerSource; the peer's own shuffle)."""
AUGMENTS = ("auto", "on", "off", "imagenet")
"""Training augmentation: by input size (training.augment.default_augmentation), always, never, or the
ImageNet recipe (random resized crop + flip; evaluation: resize to size*256/224, centre crop)."""
RESIZES = ("fast", "torchvision")
"""The ImageNet recipe's resize filter (dstore.training.augment.ImageTransform(resize=))."""
RESIZE_ON = ("auto", "device", "worker")
"""Where decode workers leave the training images' resize and crop (dstore.loader.store_loader.StoreLoader(resize_on=))."""
AMPS = ("off", "bf16", "fp16")
"""Mixed precision: none, torch.autocast to bfloat16, or to float16 with a GradScaler."""
CHANNELS = (1, 3)
"""Channels the input may be forced to: grey or RGB."""
MODELS = ("auto", *model_names())
"""The registered models, and `auto` (chosen by input size)."""

MAX_SEED = 2**31
"""Seeds are below this (numpy takes < 2**32; trainer k and the held-out set add small numbers)."""
MAX_THREADS = 1024
"""The most --decode-threads, --read-threads or --prefetch batches a rank may be given."""

# The help sections of `dstore train`, in this order.
DATA = "data"
MODEL = "model and optimisation"
LTFB = "tournament (LTFB)"
RUN = "run directory, checkpoints, resumption"


def _floats(text: str) -> tuple[float, ...]:
    try:
        return tuple(float(v) for v in text.split(","))
    except ValueError:
        raise ConfigError(f"{text!r} is not a comma-separated list of numbers") from None


def _bytes(text: str) -> int:
    return parse_bytes(text, "--memory-budget")


def _size(text: str) -> tuple[int, int]:
    try:
        parts = [int(v) for v in text.lower().split("x")]
    except ValueError:
        parts = []
    if len(parts) not in (1, 2):
        raise ConfigError(f"{text!r} is not N or HxW")
    return (parts[0], parts[-1])


def _signals(text: str) -> str:
    return ",".join(parse_signals(text)) or "none"


def _flag(default, help=None, **meta):
    """A field with a flag: its default and the flag's description (see the module docstring)."""
    return dataclasses.field(default=default, metadata={"help": help, **meta})


@dataclasses.dataclass
class TrainConfig:
    """Everything a run depends on (the CLI flags of `dstore train`, one field each, but runs_root)."""

    # --- data ---
    data: str | tuple[str, ...] | None = _flag(
        None,
        "container to train on; none: the built-in `digits` set, ingested once into $DSTORE_CACHE or "
        "~/.cache/dstore; several, each CONTAINER:WEIGHT (a.h5:0.7 b.zarr:0.3), train on their mix "
        "(needs --val; see docs/training.md, Mixing data sets)",
        group=DATA,
        flags=("data",),
        nargs="*",
        parse=str,
        metavar="CONTAINER[:WEIGHT]",
    )
    val: str | None = _flag(
        None, "separate held-out container (then --holdout is ignored; default: none, the --holdout tail)", group=DATA
    )
    holdout: float = _flag(
        0.2, "fraction of the container (its tail; ingest already shuffled it) held out for evaluation", group=DATA
    )
    loader: str = _flag(
        "store",
        "store: the distributed in-memory store; direct: baseline reading every sample "
        "from the container file when its batch is due (same order, same decode); "
        "files: baseline reading every sample from its own image file, as a "
        "DataLoader over an image folder does (the files the container was ingested "
        "from, --files-root; same order, same decode); webdataset / litdata: the "
        "store's peers over copies of the container in peers/ beside it (as train_e2e "
        "and dstore bench --peers write them; their own shuffle; same decode)",
        group=DATA,
        choices=LOADERS,
    )
    files_root: str | None = _flag(
        None,
        "with --loader files: the folder the samples' names are relative to "
        "(default: the container's source folder, as ingest recorded it)",
        group=DATA,
        metavar="FOLDER",
    )
    read_threads: int = _flag(
        4, "with --loader files: files read at once per rank (as a DataLoader's workers)", group=DATA
    )
    direct_cold: bool = _flag(
        False,
        "with --loader direct: drop the container from each node's page cache before "
        "every epoch, so per-sample reads come from storage (as for data larger than "
        "memory)",
        group=DATA,
    )
    shuffle: str = _flag("global", "store shuffle policy", group=DATA, choices=SHUFFLES)
    population: str = _flag("preload", "store population", group=DATA, choices=POPULATIONS)
    prefetch: int = _flag(2, "batches fetched ahead", group=DATA)
    decode_threads: int = _flag(
        2,
        "decode/augment threads per rank (StoreLoader's decode_threads; --threads: deprecated)",
        group=DATA,
        flags=("--decode-threads", "--threads"),
        deprecated={"--threads": "--decode-threads"},
    )
    decode_workers: int | None = _flag(
        None,
        "decode/augment worker processes of the training loader per rank (0: "
        "decode in the rank's --decode-threads threads instead; default: the "
        "cores this rank may use, by its CPU affinity and cgroup quota, over "
        "the node's ranks)",
        group=DATA,
        metavar="N",
    )
    resize_on: str = _flag(
        "auto",
        "with decode workers: where the resize and crop of the training images run: "
        "device (one batch op on the model's device; the workers only decode and cut "
        "out), worker (per sample in the workers), auto (device on a GPU, else "
        "worker); the same pixels either way",
        group=DATA,
        choices=RESIZE_ON,
    )
    memory_budget: int | None = _flag(
        None,
        "what a rank may hold in memory for its data: the stores of the "
        "training, held-out and tournament sets and the loaders' decoded "
        "batches share it: bytes or e.g. 8G, 512MiB (default: "
        "$DSTORE_MEMORY_BUDGET, else 70% of the node's available memory, or "
        "of its cgroup limit if lower, over its ranks)",
        group=DATA,
        parse=_bytes,
        metavar="BYTES",
    )
    overflow: str = _flag(
        "serve",
        "data over the memory budget: serve the rest from storage (default) or refuse",
        group=DATA,
        choices=OVERFLOWS,
    )
    storage_threads: int = _flag(
        4,
        "with data over the memory budget served from storage: the reads in flight "
        "per rank (a container in object storage wants more: a rank's storage tier "
        "serves about threads / round-trip time samples per second)",
        group=DATA,
    )
    storage_lookahead: int = _flag(
        4,
        "with data over the memory budget served from storage: the steps whose "
        "storage reads are issued ahead (their buffers count in the budget)",
        group=DATA,
    )
    drop_last: bool = _flag(False, "drop each epoch's last partial global batch", group=DATA)
    augment: str = _flag(
        "auto",
        "auto: random crop with padding + flip for images of 32x32 and up, none below; "
        "imagenet: random resized crop (0.08-1, 3/4-4/3) + flip, evaluation resize "
        "size*256/224 and centre crop, JPEGs decoded only as far as the crop needs",
        group=DATA,
        choices=AUGMENTS,
    )
    resize: str = _flag(
        "fast",
        "with --augment imagenet: fast (a fixed-point bilinear, the same pixels on every "
        "device, JPEGs decoded at a reduced DCT scale where that covers the crop) or "
        "torchvision (torchvision v2's antialiased bilinear and box placement on full-scale "
        "decodes, as torchvision's RandomResizedCrop and Resize + CenterCrop give them: "
        "for weights validated on those; slower, resized in the workers)",
        group=DATA,
        choices=RESIZES,
    )
    channels: int | None = _flag(
        None,
        "force grey (1) or RGB (3) (default: 1 if every probed training image is grey, else 3)",
        group=DATA,
        choices=CHANNELS,
    )
    mean: tuple[float, ...] | None = _flag(
        None, "per-channel mean in [0,1] (default: measured)", group=DATA, parse=_floats
    )
    std: tuple[float, ...] | None = _flag(
        None, "per-channel std in [0,1] (default: measured)", group=DATA, parse=_floats
    )
    cache_dir: str | None = _flag(
        None, "where built-in data sets are ingested (default: $DSTORE_CACHE, else ~/.cache/dstore)", group=DATA
    )

    # --- model and optimisation ---
    model: str = _flag(
        "auto",
        "one of " + ", ".join(MODELS) + ", or your own as package.module:factory (see "
        "docs/guide.md, 'Your own model'); auto: small_cnn below 32x32, resnet_small (32x32 "
        "input) otherwise",
        group=MODEL,
        metavar="NAME|pkg.mod:factory",
    )
    image_size: tuple[int, int] | None = _flag(
        None,
        "size images are resized to for the model (default: the "
        "model's own: the data's size for small_cnn, 32x32 for the "
        "ResNets)",
        group=MODEL,
        parse=_size,
        metavar="N|HxW",
    )
    epochs: int = _flag(15, group=MODEL)
    batch_size: int = _flag(64, "GLOBAL batch size (split over the ranks)", group=MODEL)
    optimizer: str = _flag("adam", group=MODEL, choices=OPTIMIZERS)
    lr: float = _flag(3e-3, "base learning rate", group=MODEL)
    momentum: float = _flag(0.9, "SGD momentum / Adam beta1", group=MODEL)
    weight_decay: float = _flag(0.0, group=MODEL)
    nesterov: bool = _flag(False, "Nesterov momentum (sgd)", group=MODEL)
    schedule: str = _flag("cosine", group=MODEL, choices=SCHEDULES)
    warmup_epochs: float = _flag(0.0, "linear LR warm-up", group=MODEL)
    step_epochs: int = _flag(10, "step schedule: epochs between decays", group=MODEL)
    gamma: float = _flag(0.1, "step schedule: decay factor", group=MODEL)
    seed: int = _flag(0, group=MODEL)
    deterministic: bool = _flag(
        False, "deterministic torch kernels, one intra-op thread: identical results run to run", group=MODEL
    )
    device: str = _flag("cpu", "cuda: nccl, one GPU per rank by node-local rank", group=MODEL, choices=DEVICES)
    amp: str = _flag(
        "off",
        "mixed precision (torch.autocast): bf16 (CPU or GPU), fp16 (with a gradient scaler; meant for GPUs), or off",
        group=MODEL,
        choices=AMPS,
    )
    channels_last: bool = _flag(
        False,
        "model and input batches in channels-last memory format (faster convolutions on tensor-core GPUs)",
        group=MODEL,
    )

    # --- tournament (LTFB) ---
    trainers: int = _flag(
        1,
        "split the job into K trainers of N/K ranks each (K must divide N), each training "
        "on its own part of the training set and playing a tournament every --ltfb-round "
        "steps",
        group=LTFB,
        metavar="K",
    )
    ltfb_round: int = _flag(
        0, "optimizer steps between tournament rounds (default: 0 = once per epoch)", group=LTFB, metavar="STEPS"
    )
    ltfb_metric: str = _flag(
        "accuracy",
        "what a trainer compares on its tournament set: accuracy (higher wins) "
        "or loss (lower wins); ties keep the trainer's own model, NaN always "
        "loses",
        group=LTFB,
        choices=ltfb.METRICS,
    )
    tournament_fraction: float = _flag(
        0.1, "share of each trainer's part of the training set held out as its tournament set", group=LTFB, metavar="F"
    )
    ltfb_strategy: str = _flag(
        "pairwise",
        "pairwise: seeded pairs swap models, each keeps the better on its own "
        "tournament set; truncation: all scores gathered, the bottom "
        "--truncation-fraction of the trainers take the models of the top as "
        "many (default: pairwise)",
        group=LTFB,
        choices=ltfb.STRATEGIES,
    )
    truncation_fraction: float = _flag(
        0.25,
        "truncation: share of the trainers in the top and in the bottom (at least 1, at most K/2; default: 0.25)",
        group=LTFB,
        metavar="F",
    )
    explore: str = _flag(
        "",
        "hyperparameters to explore, comma-separated, of lr, weight_decay, momentum: "
        "trainers start from seeded perturbations of the given values, and a trainer that "
        "takes another's model perturbs its values by a seeded factor (0.8 or 1.25) "
        "(default: none)",
        group=LTFB,
        metavar="NAMES",
    )

    # --- run directory, checkpoints, resumption ---
    run_dir: str | None = _flag(
        None,
        "where metrics.jsonl, config.json and checkpoint.pt go: a new or empty "
        "directory, or one of an earlier run (a folder not made by dstore is "
        "refused; one job at a time) (default: runs/<YYYYmmdd-HHMMSS>-<pid of "
        "rank 0>)",
        group=RUN,
    )
    runs_root: str = dataclasses.field(default="runs", metadata={"flag": False})
    """Where a run directory is made when run_dir is None (not a flag: tests point it elsewhere)."""
    resume: str | None = _flag(
        None,
        "continue from a checkpoint (exact sample, also mid-epoch); auto: "
        "--run-dir's checkpoint if it has one, else start fresh (without --run-dir: "
        "the newest runs/*/checkpoint.pt); flags not given are the run's own (its "
        "config.json); a checkpoint made on another container, or with another "
        "schedule, model or input, is refused; --epochs may change (see "
        "docs/training.md, Resuming) (default: start fresh)",
        group=RUN,
        metavar="PATH|auto",
    )
    overwrite: bool = _flag(
        False,
        "start a new run in a --run-dir that holds one (finished or partial): its "
        "checkpoint, metrics and config are removed first (and named); without it such "
        "a directory is refused (--resume auto continues the run there)",
        group=RUN,
    )
    checkpoint_every: int = _flag(
        0, "also checkpoint every STEPS optimizer steps (always at each epoch end)", group=RUN, metavar="STEPS"
    )
    stop_after_steps: int = _flag(
        0,
        "stop (with a checkpoint) after N steps of this invocation: simulates an interruption",
        group=RUN,
        metavar="N",
    )
    preempt_signal: str = _flag(
        "TERM,USR1",
        "signals that stop the run after its current step (agreed by every "
        "rank), with a checkpoint, exit code 75: --resume auto continues "
        "exactly; Slurm sends TERM before a kill, or USR1 with "
        "--signal=USR1@120 (comma-separated, of TERM, USR1, USR2, INT; none: "
        "a signal ends the run as before)",
        group=RUN,
        metavar="SIGNALS",
        parse=_signals,
    )
    tensorboard: bool = _flag(
        False,
        "also write each epoch's figures as TensorBoard events in <run-dir>/tensorboard "
        "(needs the tensorboard package; metrics.csv is always written beside "
        "metrics.jsonl)",
        group=RUN,
    )
    log_batches: bool = _flag(False, "write every trained batch's sample ids to batches.rank<r>.jsonl", group=RUN)
    heartbeat: float = _flag(
        30.0,
        "when stdout is not a terminal (a batch log): after every SECONDS without a line, "
        "rank 0 writes one plain line saying what the run does and how far (start-up, "
        "population, the epoch's step); 0: none",
        group=RUN,
        metavar="SECONDS",
    )
    progress: bool | None = _flag(
        None,
        "a progress bar per epoch on rank 0, on stderr (default: only when stderr "
        "is a terminal, so batch logs get plain lines; under mpiexec stderr is a "
        "pipe: pass --progress)",
        group=RUN,
    )

    def __post_init__(self):
        # The positionals come as a list: none is the built-in set, one a container as before mixes,
        # several a mix (dstore.training.data.parse_sources reads them).
        if isinstance(self.data, (list, tuple)):
            self.data = None if not self.data else str(self.data[0]) if len(self.data) == 1 else tuple(self.data)

    def check(self) -> None:
        """Raises ConfigError naming the first field with a value that is not allowed (every bool and
        number first normalised by dstore.runtime.values' one rule)."""
        for name, value in values.typed(
            self, [f.name for f in dataclasses.fields(self) if f.name != "memory_budget"]
        ).items():
            setattr(self, name, value)
        if self.model != "auto":
            get_model(self.model)  # an import path is imported here: its errors before any data is read
        if self.epochs < 1:
            raise ConfigError(f"epochs={self.epochs} must be >= 1")
        if self.batch_size < 1:
            raise ConfigError(f"batch_size={self.batch_size} must be >= 1")
        if self.loader not in LOADERS:
            raise ConfigError(f"loader={self.loader!r} is not one of {LOADERS}")
        if self.amp not in AMPS:
            raise ConfigError(f"amp={self.amp!r} is not one of {AMPS}")
        if self.augment not in AUGMENTS:
            raise ConfigError(f"augment={self.augment!r} is not one of {AUGMENTS}")
        if self.loader in ("direct", "files") and not policy(self.shuffle).one_order:
            raise ConfigError(f"loader={self.loader!r} supports only shuffle='global', not {self.shuffle!r}")
        if self.files_root is not None and self.loader != "files":
            raise ConfigError(f"--files-root (files_root) needs --loader files, not --loader {self.loader}")
        if self.read_threads < 1:
            raise ConfigError(f"--read-threads (read_threads={self.read_threads}) must be >= 1")
        if self.direct_cold and self.loader != "direct":
            raise ConfigError(f"--direct-cold (direct_cold=True) needs --loader direct, not --loader {self.loader}")
        if self.decode_threads < 1 or self.prefetch < 0:
            raise ConfigError(f"decode_threads={self.decode_threads} must be >= 1 and prefetch={self.prefetch} >= 0")
        if self.decode_workers is not None:
            check_workers("decode_workers", self.decode_workers)
        if self.resize not in RESIZES:
            raise ConfigError(f"resize={self.resize!r} is not one of {RESIZES}")
        if self.resize == "torchvision" and self.augment != "imagenet":
            raise ConfigError(
                f"--resize torchvision is torchvision's ImageNet transforms: it needs --augment "
                f"imagenet, not --augment {self.augment}"
            )
        if self.resize == "torchvision" and self.resize_on == "device":
            raise ConfigError(
                "--resize torchvision runs in the decode workers, not as a batch op: give --resize-on worker or auto"
            )
        if self.resize_on == "device" and self.decode_workers == 0:
            raise ConfigError(
                "--resize-on device needs decode workers (--decode-workers N > 0): decode threads resize each sample"
            )
        if self.overwrite and self.resume is not None:
            raise ConfigError(
                f"--overwrite starts the run again, --resume {self.resume} continues it: give one of them"
            )
        if not (math.isfinite(self.heartbeat) and self.heartbeat >= 0):
            raise ConfigError(f"--heartbeat {self.heartbeat} must be a number of seconds >= 0 (0: none)")
        if self.checkpoint_every < 0 or self.stop_after_steps < 0:
            raise ConfigError("checkpoint_every and stop_after_steps must be >= 0")
        if self.image_size is not None and (len(self.image_size) != 2 or min(self.image_size) < 1):
            raise ConfigError(f"image_size={self.image_size} must be (height, width), both >= 1")
        if self.warmup_epochs < 0:
            raise ConfigError(f"warmup_epochs={self.warmup_epochs} must be >= 0")
        if self.trainers < 1:
            raise ConfigError(f"--trainers {self.trainers} must be >= 1")
        if self.ltfb_round < 0:
            raise ConfigError(f"--ltfb-round {self.ltfb_round} must be >= 0 (0: once per epoch)")
        if self.ltfb_metric not in ltfb.METRICS:
            raise ConfigError(f"--ltfb-metric {self.ltfb_metric!r} is not one of {ltfb.METRICS}")
        if not 0.0 < self.tournament_fraction < 1.0:
            raise ConfigError(f"--tournament-fraction {self.tournament_fraction} must be in (0, 1)")
        parse_signals(self.preempt_signal)
        if self.tensorboard and importlib.util.find_spec("tensorboard") is None:  # before the run dir is written
            raise ConfigError(
                "--tensorboard needs the tensorboard package: pip install tensorboard (or drop "
                "--tensorboard: metrics.csv and metrics.jsonl are written anyway)"
            )
        self._check_values()
        ltfb.check_config(self)

    def _check_values(self) -> None:
        """Numbers a user types: finite, in range, and bounded (issue 19); ConfigError naming the flag."""
        for name in ("lr", "momentum", "weight_decay", "gamma", "warmup_epochs", "holdout"):
            if not math.isfinite(getattr(self, name)):
                raise ConfigError(f"--{name.replace('_', '-')} {getattr(self, name)} must be a finite number")
        if not self.lr > 0:
            raise ConfigError(f"--lr {self.lr} must be > 0")
        if not 0 <= self.seed < MAX_SEED:
            raise ConfigError(f"--seed {self.seed} must be in [0, {MAX_SEED}) (numpy's seeds; trainer k uses seed + k)")
        if not 0.0 <= self.holdout < 1.0:
            raise ConfigError(f"--holdout {self.holdout} must be in [0, 1)")
        for name, lo in (("mean", 0.0), ("std", 0.0)):
            given = getattr(self, name) or ()
            if any(not (lo <= v <= 1.0 and (name == "mean" or v > 0)) for v in given):
                raise ConfigError(
                    f"--{name} {','.join(f'{v:g}' for v in given)}: every value must be in "
                    + ("[0, 1]" if name == "mean" else "(0, 1]")
                    + " (pixels scaled to [0, 1])"
                )
        for name in ("decode_threads", "read_threads", "prefetch"):
            if getattr(self, name) > MAX_THREADS:
                raise ConfigError(f"--{name.replace('_', '-')} {getattr(self, name)} is more than {MAX_THREADS}")
