"""LTFB, a tournament of trainers: K data-parallel trainers in one MPI job that every few steps swap
models in pairs, and each keeps whichever of the two does better on its own tournament set.

Pure parts (no MPI, tested without mpiexec): the trainer layout, each trainer's share of the data,
the pairing of a round, the truncation plan, the decision rule, a checksum of a trainer's state.
`duel` plays one side of a match on the ranks of one trainer; `Tournament` is one rank's part in the
whole thing (a round of either strategy, the exchange over the world communicator through
dstore.training.exchange, exploration through dstore.training.hparams, the log). A job of K trainers
is run by dstore.training.run.train_trainers (what `train` calls when `cfg.trainers > 1`).
"""

from __future__ import annotations

import dataclasses
import math
import time
import zlib

import numpy as np

from dstore.errors import ConfigError
from dstore.runtime.collective import topology
from dstore.training import exchange, hparams
from dstore.training.metrics import JsonLog

METRICS = ("accuracy", "loss")
"""Tournament metrics: accuracy is better higher, loss lower."""
STRATEGIES = ("pairwise", "truncation")
"""How a round picks who takes whose model (Tournament._pairwise / Tournament._truncation)."""
LOG_NAME = "tournament.jsonl"
_TAG = 7301  # the model exchange's message tag (nothing else in a run sends point-to-point)


# --- pure arithmetic --------------------------------------------------------------------------


def ranks_per_trainer(world_size: int, trainers: int) -> int:
    """M = N / K, the ranks of each trainer; raises ConfigError unless K divides N."""
    if trainers < 1 or world_size % trainers != 0:
        divisors = [k for k in range(1, world_size + 1) if world_size % k == 0]
        raise ConfigError(
            f"--trainers {trainers} does not divide the job's {world_size} MPI rank(s): every trainer "
            f"needs the same number of ranks; with {world_size} ranks use one of {divisors}"
        )
    return world_size // trainers


def trainer_parts(train_range: tuple[int, int], trainers: int, fraction: float):
    """Cuts the training range into `trainers` equal contiguous parts, each a (train, tournament) pair.

    Equal parts give every trainer the same steps per epoch, so all of them reach every round. The
    remainder (< trainers samples, the range's tail) is dropped. The last `fraction` of a part (at
    least one sample) is its trainer's tournament set. The container was shuffled at ingest, so a
    contiguous part is a random subset.

    Returns:
        ([((train_start, train_stop), (tour_start, tour_stop)) per trainer], samples dropped).
    """
    if not 0.0 < fraction < 1.0:
        raise ConfigError(f"--tournament-fraction {fraction} must be in (0, 1)")
    start, stop = train_range
    n = stop - start
    part = n // trainers
    tour = max(1, int(round(part * fraction)))
    if part - tour < 1:
        raise ConfigError(
            f"--trainers {trainers}: each trainer's part of the {n} training samples has {part} "
            f"sample(s), none left to train on after the tournament set of {tour}"
        )
    parts = []
    for k in range(trainers):
        lo = start + k * part
        cut = lo + part - tour
        parts.append(((lo, cut), (cut, lo + part)))
    return parts, n - part * trainers


def pair_trainers(trainers: int, seed: int, round_index: int) -> list[tuple[int, int]]:
    """The matches of a round: a seeded permutation of the trainers taken two by two.

    Every rank computes the same pairs from (seed, round) with no communication; with an odd
    number of trainers the last one of the permutation sits the round out.
    """
    order = np.random.default_rng((seed, round_index)).permutation(trainers)
    return [(int(order[i]), int(order[i + 1])) for i in range(0, trainers - 1, 2)]


def partner_of(pairs: list[tuple[int, int]], trainer: int) -> int | None:
    """`trainer`'s opponent in `pairs`, or None if it sits out."""
    for a, b in pairs:
        if trainer == a:
            return b
        if trainer == b:
            return a
    return None


def truncation_count(trainers: int, fraction: float) -> int:
    """How many trainers form the top and the bottom of a truncation round: floor(K x fraction),
    at least 1 and at most K // 2 (so the two never overlap)."""
    if not 0.0 < fraction < 1.0:
        raise ConfigError(f"--truncation-fraction {fraction} must be in (0, 1)")
    return min(trainers // 2, max(1, int(trainers * fraction)))


def rank_trainers(scores: list[float], metric: str) -> list[int]:
    """Trainers from best to worst score (NaN last; equal scores in trainer order)."""
    if metric not in METRICS:
        raise ConfigError(f"--ltfb-metric {metric!r} is not one of {METRICS}")
    sign = -1.0 if metric == "accuracy" else 1.0

    def key(k):
        bad = math.isnan(scores[k])
        return (bad, 0.0 if bad else sign * scores[k], k)

    return sorted(range(len(scores)), key=key)


def truncation_plan(scores: list[float], metric: str, fraction: float, seed: int, round_index: int) -> dict[int, int]:
    """Truncation selection: {bottom trainer: the top trainer whose model it takes}.

    All trainers' scores (each its own model on its own tournament set) are ranked; the bottom
    truncation_count trainers are matched with the top as many by a seeded permutation of the
    top, so every rank computes the same plan from the gathered scores with no further messages,
    and each top model is copied at most once. A bottom trainer whose score does not lose to its
    donor's (a tie, or both NaN: partner_wins) keeps its own model and is left out of the plan.
    """
    order = rank_trainers(scores, metric)
    q = truncation_count(len(scores), fraction) if len(scores) > 1 else 0
    if q == 0:
        return {}
    top, bottom = order[:q], order[len(order) - q :]
    donors = np.random.default_rng((seed, round_index, 0x7C)).permutation(top)
    return {int(b): int(d) for b, d in zip(bottom, donors) if partner_wins(scores[b], scores[int(d)], metric)}


def partner_wins(own: float, theirs: float, metric: str) -> bool:
    """The decision rule: True if the partner's model beats the trainer's own.

    Accuracy is better higher, loss lower; a tie keeps the own model; NaN always loses (two NaNs
    keep the own model).
    """
    if metric not in METRICS:
        raise ConfigError(f"--ltfb-metric {metric!r} is not one of {METRICS}")
    if math.isnan(theirs):
        return False
    if math.isnan(own):
        return True
    return theirs > own if metric == "accuracy" else theirs < own


def state_crc(state) -> int:
    """CRC32 of a (nested) state dict: every tensor's dtype, shape and bytes, every other value's repr.

    Dict keys are visited in sorted order, so two states with equal contents have equal checksums
    however they were built (live, or loaded from bytes). Used to show in the log which model each
    trainer holds.
    """
    import torch

    crc = 0

    def visit(value):
        nonlocal crc
        if isinstance(value, dict):
            for key in sorted(value, key=str):
                crc = zlib.crc32(repr(key).encode(), crc)
                visit(value[key])
        elif isinstance(value, (list, tuple)):
            crc = zlib.crc32(f"[{len(value)}".encode(), crc)
            for item in value:
                visit(item)
        elif isinstance(value, torch.Tensor):
            t = value.detach().cpu().contiguous()
            crc = zlib.crc32(f"{t.dtype}{tuple(t.shape)}".encode(), crc)
            crc = zlib.crc32(t.reshape(-1).view(torch.uint8).numpy().tobytes(), crc)
        else:
            crc = zlib.crc32(repr(value).encode(), crc)

    visit(state)
    return crc


def to_bytes(state: dict) -> bytes:
    """A state dict as torch.save bytes (a deep copy: nothing shares storage with live tensors)."""
    return exchange.pack(state).tobytes()


def from_bytes(data) -> dict:
    """Inverse of to_bytes, with torch.load(weights_only=True): a received model runs no code."""
    return exchange.unpack(np.frombuffer(data, dtype=np.uint8))


def check_config(cfg) -> None:
    """The LTFB extensions' fields of a TrainConfig: raises ConfigError naming the flag."""
    if cfg.ltfb_strategy not in STRATEGIES:
        raise ConfigError(f"--ltfb-strategy {cfg.ltfb_strategy!r} is not one of {STRATEGIES}")
    truncation_count(2, cfg.truncation_fraction)
    names = hparams.parse(cfg.explore)
    if names and cfg.trainers < 2:
        raise ConfigError(f"--explore {cfg.explore} needs --trainers K > 1 (hyperparameters travel between trainers)")
    hparams.check(names, {"lr": cfg.lr, "weight_decay": cfg.weight_decay, "momentum": cfg.momentum})


# --- one match, on the ranks of one trainer ---------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Match:
    """One trainer's side of a match: both models' scores on its tournament set, and the verdict."""

    own_score: float
    partner_score: float
    partner_won: bool


def duel(trainer, loader, partner_state: dict, own_state: dict, metric: str) -> Match:
    """Scores the trainer's own model and the partner's on `loader`, and keeps the better one.

    Collective over the trainer's communicator (evaluate reduces over it). The own model is scored
    first; then the partner's state (model, optimizer, scheduler) is loaded in place, so DDP keeps
    its references to the parameters, and scored; if the own model wins, `own_state` is loaded back.

    Args:
        trainer: a dstore.training.loop.Trainer.
        loader: the trainer's tournament loader (a StoreLoader).
        partner_state: the partner's Trainer.state_dict().
        own_state: a copy of this trainer's state_dict() that shares no storage with the live
            model (from_bytes(to_bytes(...))): loading the partner overwrites the live tensors.
        metric: "accuracy" or "loss".
    """
    own = trainer.evaluate(loader)[metric]
    trainer.load_state_dict(partner_state)
    theirs = trainer.evaluate(loader)[metric]
    # The scores are reduced over the trainer's ranks, so they agree; rank 0's verdict is broadcast
    # anyway so that no floating-point detail can leave ranks of one trainer with different models.
    won = trainer.ctx.comm.bcast(partner_wins(own, theirs, metric), root=0)
    if not won:
        trainer.load_state_dict(own_state)
    return Match(float(own), float(theirs), bool(won))


# --- one rank's part in the tournament --------------------------------------------------------


class Tournament:
    """Who this rank is among K trainers x M ranks, when rounds happen, the exchange, the log.

    World rank r is local rank r % M of trainer r // M. Local rank i of trainer a exchanges with
    local rank i of trainer b directly (all ranks of a trainer hold the same model), so no rank
    sends more than one model per round. A model crosses as torch.save bytes in blocks
    (dstore.training.exchange), so its size is not limited by one MPI message.

    Args:
        world: the communicator of the whole job (not owned).
        trainers: K.
        seed: the pairing seed, the same on every rank (the run's --seed).
        metric: "accuracy" or "loss".
        every: steps between rounds; 0 = once per epoch (set by start()).
        fraction: share of each trainer's part kept for its tournament set.
        log_path: where world rank 0 writes the tournament log.
        say: how world rank 0 reports a round (one line).
        strategy: "pairwise" (the paper: seeded pairs, each judges both models on its own set) or
            "truncation" (all scores gathered, the bottom fraction takes the top's models).
        truncation: the truncation strategy's fraction (dstore.training.ltfb.truncation_count).
        explore: hyperparameter names explored (dstore.training.hparams); a trainer that takes another's
            model perturbs the hyperparameters that came with it.
        block: bytes per message of the exchange (0: dstore.training.exchange.BLOCK).
    """

    def __init__(
        self,
        world,
        trainers: int,
        *,
        seed: int,
        metric: str,
        every: int,
        fraction: float,
        log_path: str | None,
        say=None,
        strategy: str = "pairwise",
        truncation: float = 0.25,
        explore: tuple[str, ...] = (),
        block: int = 0,
    ):
        if metric not in METRICS:
            raise ConfigError(f"--ltfb-metric {metric!r} is not one of {METRICS}")
        if strategy not in STRATEGIES:
            raise ConfigError(f"--ltfb-strategy {strategy!r} is not one of {STRATEGIES}")
        truncation_count(max(2, int(trainers)), truncation)  # checks the fraction
        self.world = world
        self.trainers = int(trainers)
        self.ranks = ranks_per_trainer(world.Get_size(), self.trainers)
        self.trainer, self.local_rank = divmod(world.Get_rank(), self.ranks)
        self.seed, self.metric, self.every, self.fraction = int(seed), metric, int(every), float(fraction)
        self.strategy, self.truncation = strategy, float(truncation)
        self.explore, self.block = hparams.parse(explore), int(block)
        self.rounds = 0
        # The ranks of all trainers on a node share its cores and its GPUs: numbered over the world.
        here = topology(world)  # the machine's real nodes, never $DSTORE_RANKS_PER_NODE's
        self.node_rank, self.node_ranks = here.local_rank, here.local_size
        main = world.Get_rank() == 0
        self._say = say if (main and say is not None) else (lambda line: None)
        self._log = JsonLog(log_path if main else None)

    def split(self):
        """This rank's trainer communicator (collective over world; the caller frees it)."""
        return self.world.Split(self.trainer, self.world.Get_rank())

    def data(self, train_range: tuple[int, int]) -> tuple[tuple[int, int], tuple[int, int], int]:
        """(this trainer's training range, its tournament range, samples dropped from the whole)."""
        parts, dropped = trainer_parts(train_range, self.trainers, self.fraction)
        train, tour = parts[self.trainer]
        return train, tour, dropped

    def start(self, steps_per_epoch: int) -> int:
        """Fixes the round length (once per epoch unless given); returns it."""
        self.every = self.every or max(1, int(steps_per_epoch))
        return self.every

    def after_step(self, trainer, loader, global_step: int) -> None:
        """The training loop's hook: plays a round every `every` steps (round r at step (r+1) x every,
        counted from the job's first step, so a resumed job pairs as an uninterrupted one)."""
        if global_step % self.every == 0:
            self.rounds = global_step // self.every - 1
            self.play(trainer, loader, global_step)

    def play(self, trainer, loader, global_step: int) -> list[dict] | None:
        """One round (collective over world): choose, exchange, judge, explore, log.

        Returns:
            On world rank 0, the round's log records (one per trainer); None elsewhere.
        """
        t0 = time.perf_counter()
        own_state = trainer.state_dict()
        record = {
            "round": self.rounds,
            "global_step": int(global_step),
            "trainer": self.trainer,
            "strategy": self.strategy,
            "partner": None,
            "pair": None,
            "metric": self.metric,
            "crc_own": state_crc(own_state),
            "own_score": None,
            "partner_score": None,
            "winner": None,
            "kept": self.trainer,
            "crc_partner": None,
        }
        if self.strategy == "pairwise":
            self._pairwise(trainer, loader, own_state, record)
        else:
            self._truncation(trainer, loader, own_state, record)
        record["crc_kept"] = state_crc(trainer.state_dict())  # what the trainer took, as it was sent
        if self.explore:
            record["hparams_own"] = hparams.get(own_state)
            if record["kept"] != self.trainer:  # took another's model: explore around its values
                values = hparams.perturb(
                    hparams.get(trainer.state_dict()), self.explore, self.seed, self.rounds, self.trainer
                )
                trainer.load_state_dict(hparams.put(trainer.state_dict(), values))
            record["hparams"] = hparams.get(trainer.state_dict())
        held = state_crc(trainer.state_dict())
        record.update(
            crc_held=held, ranks_agree=len(set(trainer.ctx.comm.allgather(held))) == 1, seconds=time.perf_counter() - t0
        )
        records = self.world.gather(record if self.local_rank == 0 else None, root=0)
        self.rounds += 1
        if records is None:
            return None
        records = sorted((r for r in records if r is not None), key=lambda r: r["trainer"])
        for r in records:
            self._log.write(r)
        self._say(describe_round(records, self.explore))
        return records

    def _peer(self, trainer: int) -> int:
        """The world rank of `trainer`'s rank with this rank's local rank."""
        return trainer * self.ranks + self.local_rank

    def _pairwise(self, trainer, loader, own_state: dict, record: dict) -> None:
        """The paper's round: seeded pairs swap models, each keeps the better on its own set."""
        pairs = pair_trainers(self.trainers, self.seed, self.rounds)
        partner = partner_of(pairs, self.trainer)
        if partner is None:
            return
        record.update(partner=partner, pair=next(list(p) for p in pairs if self.trainer in p))
        blob = exchange.pack(own_state)
        theirs = exchange.unpack(exchange.sendrecv(self.world, blob, self._peer(partner), _TAG, block=self.block))
        own_copy = exchange.unpack(blob)  # shares nothing with the live tensors the partner's state overwrites
        del blob  # at most four copies of a state at once: live, own bytes, the partner's bytes and state
        match = duel(trainer, loader, theirs, own_copy, self.metric)
        record.update(
            crc_partner=state_crc(theirs),
            own_score=match.own_score,
            partner_score=match.partner_score,
            winner="partner" if match.partner_won else "own",
            kept=partner if match.partner_won else self.trainer,
        )

    def _truncation(self, trainer, loader, own_state: dict, record: dict) -> None:
        """Truncation selection: every trainer scores its own model on its own set, the scores are
        gathered, and each bottom trainer loads the model of the top trainer the seeded plan gives it
        (truncation_plan: computed alike on every rank from the scores, no further messages)."""
        own = float(trainer.evaluate(loader)[self.metric])
        gathered = self.world.allgather(own)
        scores = [float(gathered[k * self.ranks]) for k in range(self.trainers)]  # each trainer's rank 0
        plan = truncation_plan(scores, self.metric, self.truncation, self.seed, self.rounds)
        record.update(
            own_score=scores[self.trainer],
            winner="own",
            position=rank_trainers(scores, self.metric).index(self.trainer),
            sent_to=sorted(b for b, d in plan.items() if d == self.trainer),
        )
        for b in record["sent_to"]:
            exchange.send(self.world, exchange.pack(own_state), self._peer(b), _TAG, block=self.block)
        donor = plan.get(self.trainer)
        if donor is not None:
            theirs = exchange.unpack(exchange.recv(self.world, self._peer(donor), _TAG, block=self.block))
            trainer.load_state_dict(theirs)
            record.update(
                partner=donor, partner_score=scores[donor], crc_partner=state_crc(theirs), winner="partner", kept=donor
            )

    def close(self) -> None:
        """Closes the log. Safe to call twice."""
        self._log.close()


def describe_round(records: list[dict], explore: tuple[str, ...] = ()) -> str:
    """One line for a round's records (what each trainer kept, and the scores it saw)."""
    head = f"tournament round {records[0]['round']} at step {records[0]['global_step']}:"
    parts = []
    for r in records:
        if r["partner"] is None:
            part = (
                f"trainer {r['trainer']} sat out"
                if r["own_score"] is None
                else f"trainer {r['trainer']} kept its model ({r['metric']} {_num(r['own_score'])})"
            )
        else:
            part = (
                f"trainer {r['trainer']} kept {r['kept']}'s model ({r['metric']} "
                f"{_num(r['own_score'])} own vs {_num(r['partner_score'])} from {r['partner']})"
            )
        if explore and r.get("hparams"):
            part += f" [{hparams.describe(r['hparams'], explore)}]"
        parts.append(part)
    return head + " " + "; ".join(parts)


def _num(x) -> str:
    return "nan" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.4f}"
