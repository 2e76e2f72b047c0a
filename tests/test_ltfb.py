"""LTFB (`dstore train --trainers K`): the pure parts (layout, data parts, pairing, decision rule,
truncation plan, state checksum, block plan, hyperparameter exploration) exhaustively; one side of a
match and the blocked exchange in-process on COMM_SELF with a real store and Trainer; and real
tournaments (pairwise, truncation, with exploration) under mpiexec, whose log must agree with the
models the trainers hold."""

import json
import math
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from support.mpirun import run_mpi

from dstore.errors import ConfigError
from dstore.runtime import rc
from dstore.training import exchange, hparams
from dstore.training.ltfb import (
    duel,
    from_bytes,
    pair_trainers,
    partner_of,
    partner_wins,
    rank_trainers,
    ranks_per_trainer,
    state_crc,
    to_bytes,
    trainer_parts,
    truncation_count,
    truncation_plan,
)
from dstore.training.metrics import read_jsonl

# --- pure parts -----------------------------------------------------------------------------


def test_ranks_per_trainer_needs_a_divisor():
    assert ranks_per_trainer(4, 2) == 2 and ranks_per_trainer(4, 4) == 1 and ranks_per_trainer(3, 1) == 3
    for n, k in ((3, 2), (2, 3), (4, 0)):
        with pytest.raises(ConfigError, match=f"--trainers {k} does not divide"):
            ranks_per_trainer(n, k)


@settings(deadline=None)
@given(n=st.integers(2, 5000), k=st.integers(1, 16), fraction=st.floats(0.01, 0.5), start=st.integers(0, 100))
def test_trainer_parts_are_equal_disjoint_and_in_range(n, k, fraction, start):
    try:
        parts, dropped = trainer_parts((start, start + n), k, fraction)
    except ConfigError as exc:
        assert f"--trainers {k}" in str(exc) and n // k - max(1, round(n // k * fraction)) < 1
        return
    assert len(parts) == k and 0 <= dropped < k
    sizes = {(t[1] - t[0], q[1] - q[0]) for t, q in parts}
    assert len(sizes) == 1  # every trainer: the same training and tournament sizes (same steps per epoch)
    ((train_n, tour_n),) = sizes
    assert train_n >= 1 and tour_n >= 1 and (train_n + tour_n) * k + dropped == n
    covered = [i for t, q in parts for i in list(range(*t)) + list(range(*q))]
    assert covered == list(range(start, start + n - dropped))  # contiguous, disjoint, in order
    assert all(t[1] == q[0] for t, q in parts)  # the tournament set is the part's tail


def test_trainer_parts_examples_and_errors():
    parts, dropped = trainer_parts((0, 1438), 2, 0.1)
    assert parts == [((0, 647), (647, 719)), ((719, 1366), (1366, 1438))] and dropped == 0
    parts, dropped = trainer_parts((0, 11), 3, 0.1)  # a tournament set has at least one sample
    assert parts == [((0, 2), (2, 3)), ((3, 5), (5, 6)), ((6, 8), (8, 9))] and dropped == 2
    with pytest.raises(ConfigError, match="none left to train on"):
        trainer_parts((0, 3), 2, 0.5)
    with pytest.raises(ConfigError, match="--tournament-fraction 1.0"):
        trainer_parts((0, 100), 2, 1.0)


@settings(max_examples=200, deadline=None)
@given(k=st.integers(1, 40), seed=st.integers(0, 2**32 - 1), round_index=st.integers(0, 10**6))
def test_pairing_is_a_seeded_matching(k, seed, round_index):
    pairs = pair_trainers(k, seed, round_index)
    assert pairs == pair_trainers(k, seed, round_index)  # what every rank computes, with no messages
    members = [t for p in pairs for t in p]
    assert len(members) == len(set(members)) and set(members) <= set(range(k))  # each in at most one pair
    assert len(pairs) == k // 2  # all but one (odd k) play
    out = [t for t in range(k) if partner_of(pairs, t) is None]
    assert len(out) == k % 2
    for a, b in pairs:
        assert partner_of(pairs, a) == b and partner_of(pairs, b) == a


def test_pairing_changes_with_the_round_and_the_seed():
    rounds = {tuple(map(tuple, map(sorted, pair_trainers(6, 0, r)))) for r in range(20)}
    assert len(rounds) > 5  # not the same matches every round
    assert [pair_trainers(8, s, 3) for s in range(5)] != [pair_trainers(8, 0, 3)] * 5
    assert pair_trainers(1, 0, 0) == [] and partner_of([], 0) is None


def test_decision_rule():
    nan = math.nan
    assert partner_wins(0.5, 0.6, "accuracy") and not partner_wins(0.6, 0.5, "accuracy")
    assert partner_wins(0.6, 0.5, "loss") and not partner_wins(0.5, 0.6, "loss")
    assert not partner_wins(0.5, 0.5, "accuracy") and not partner_wins(0.5, 0.5, "loss")  # ties: own
    assert not partner_wins(0.1, nan, "accuracy") and not partner_wins(9.0, nan, "loss")  # NaN loses
    assert partner_wins(nan, 0.1, "accuracy") and partner_wins(nan, 9.0, "loss")
    assert not partner_wins(nan, nan, "loss")
    with pytest.raises(ConfigError, match="--ltfb-metric 'f1'"):
        partner_wins(0.1, 0.2, "f1")


def test_state_crc_sees_every_value_and_survives_a_round_trip():
    state = {
        "model": {"w": torch.arange(6, dtype=torch.float32).reshape(2, 3), "b": torch.zeros(2)},
        "optimizer": {"state": {0: {"step": torch.tensor(3.0)}}, "param_groups": [{"lr": 0.1, "params": [0]}]},
        "scheduler": None,
    }
    crc = state_crc(state)
    assert state_crc(from_bytes(to_bytes(state))) == crc
    assert state_crc({"scheduler": None, "optimizer": state["optimizer"], "model": state["model"]}) == crc
    changed = from_bytes(to_bytes(state))
    changed["model"]["w"][1, 2] = 5.5
    assert state_crc(changed) != crc
    changed = from_bytes(to_bytes(state))
    changed["optimizer"]["param_groups"][0]["lr"] = 0.2
    assert state_crc(changed) != crc
    assert state_crc({**state, "model": {**state["model"], "b": torch.zeros(2, dtype=torch.float64)}}) != crc


def test_config_checks_name_the_flag():
    from dstore.tools.cli import build_parser
    from dstore.training.run import TrainConfig

    args = build_parser().parse_args(
        ["train", "--trainers", "2", "--ltfb-round", "5", "--ltfb-metric", "loss", "--tournament-fraction", "0.2"]
    )
    cfg = TrainConfig(**{k: v for k, v in vars(args).items() if k in TrainConfig.__dataclass_fields__})
    cfg.check()
    assert (cfg.trainers, cfg.ltfb_round, cfg.ltfb_metric, cfg.tournament_fraction) == (2, 5, "loss", 0.2)
    bad: dict[str, Any]
    for bad, flag in (
        ({"trainers": 0}, "--trainers 0"),
        ({"ltfb_round": -1}, "--ltfb-round -1"),
        ({"ltfb_metric": "f1"}, "--ltfb-metric 'f1'"),
        ({"tournament_fraction": 0.0}, "--tournament-fraction 0.0"),
        ({"tournament_fraction": 1.0}, "--tournament-fraction 1.0"),
    ):
        with pytest.raises(ConfigError, match=flag):
            TrainConfig(**bad).check()
    TrainConfig(trainers=2, resume="auto").check()


def test_resume_of_a_job_names_what_is_missing(tmp_path):
    from dstore.training.checkpoint import CHECKPOINT_NAME, resolve_job_resume

    job = tmp_path / "runs" / "job"
    (job / "trainer0").mkdir(parents=True)
    (job / "trainer0" / CHECKPOINT_NAME).write_bytes(b"x")
    assert resolve_job_resume(None, None, str(tmp_path / "runs"), 2) is None
    assert resolve_job_resume("auto", None, str(tmp_path / "none"), 2) is None  # nothing to resume: fresh
    with pytest.raises(ConfigError, match=r"no checkpoint.pt for trainer\(s\) \[1\]"):
        resolve_job_resume("auto", None, str(tmp_path / "runs"), 2)
    (job / "trainer1").mkdir()
    (job / "trainer1" / CHECKPOINT_NAME).write_bytes(b"x")
    for spec in ("auto", str(job), str(job / "trainer1" / CHECKPOINT_NAME)):
        assert resolve_job_resume(spec, None, str(tmp_path / "runs"), 2) == str(job), spec
    # issue 19: auto with --run-dir continues only that directory's job, never another's
    assert resolve_job_resume("auto", str(tmp_path / "runs" / "other"), str(tmp_path / "runs"), 2) is None
    with pytest.raises(ConfigError, match="give the job's run directory"):
        resolve_job_resume(str(tmp_path / "nothing.pt"), None, str(tmp_path / "runs"), 2)


# --- truncation selection, the exchange's blocks, exploration (pure) --------------------------


def test_truncation_count_is_at_least_one_and_at_most_half():
    assert [truncation_count(k, 0.25) for k in (2, 3, 4, 8, 9, 16)] == [1, 1, 1, 2, 2, 4]
    assert truncation_count(4, 0.5) == 2 and truncation_count(5, 0.9) == 2 and truncation_count(10, 0.01) == 1
    for bad in (0.0, 1.0, -0.1):
        with pytest.raises(ConfigError, match=f"--truncation-fraction {bad}"):
            truncation_count(4, bad)


def test_ranking_puts_nan_last_and_breaks_ties_by_trainer():
    nan = math.nan
    assert rank_trainers([0.5, 0.9, nan, 0.5, 0.1], "accuracy") == [1, 0, 3, 4, 2]
    assert rank_trainers([0.5, 0.9, nan, 0.5, 0.1], "loss") == [4, 0, 3, 1, 2]


@settings(max_examples=300, deadline=None)
@given(
    scores=st.lists(
        st.one_of(st.floats(0, 1), st.just(math.nan), st.sampled_from([0.25, 0.5])), min_size=1, max_size=12
    ),
    metric=st.sampled_from(["accuracy", "loss"]),
    fraction=st.floats(0.01, 0.99),
    seed=st.integers(0, 2**31),
    round_index=st.integers(0, 10**5),
)
def test_truncation_plan_moves_top_models_to_the_bottom(scores, metric, fraction, seed, round_index):
    plan = truncation_plan(scores, metric, fraction, seed, round_index)
    assert plan == truncation_plan(list(scores), metric, fraction, seed, round_index)  # same on every rank
    k = len(scores)
    order = rank_trainers(scores, metric)
    q = truncation_count(k, fraction) if k > 1 else 0
    top, bottom = set(order[:q]), set(order[k - q :])
    assert set(plan) <= bottom and set(plan.values()) <= top and not top & bottom
    assert len(set(plan.values())) == len(plan)  # each top model copied at most once
    for b, d in plan.items():
        assert partner_wins(scores[b], scores[d], metric)  # only a strictly better (non-NaN) model is taken
    if k > 1 and all(not math.isnan(x) for x in scores) and len(set(scores)) == k:
        assert len(plan) == q  # distinct scores: every bottom trainer takes a top model


def test_truncation_plan_is_seeded():
    scores = [0.9, 0.8, 0.1, 0.2, 0.7, 0.3]  # top (0.5): 0, 1, 4; bottom: 5, 3, 2
    plans = {tuple(sorted(truncation_plan(scores, "accuracy", 0.5, 0, r).items())) for r in range(30)}
    assert len(plans) > 1 and all(dict(p).keys() == {2, 3, 5} and set(dict(p).values()) == {0, 1, 4} for p in plans)
    assert truncation_plan([0.5, 0.5], "accuracy", 0.5, 0, 0) == {}  # a tie keeps the own model
    assert truncation_plan([0.5], "accuracy", 0.5, 0, 0) == {}


@settings(max_examples=150, deadline=None)
@given(length=st.integers(0, 2**42), block=st.integers(1, exchange.MAX_BLOCK))
def test_blocks_cover_any_length_in_messages_one_count_can_name(length, block):
    if length // block > 2000:  # keep the list small; the arithmetic is the same
        block = max(block, length // 2000 + 1)
        assume(block <= exchange.MAX_BLOCK)
    parts = exchange.blocks(length, block)
    assert parts[0][0] == 0 and parts[-1][1] == length
    assert all(a[1] == b[0] for a, b in zip(parts, parts[1:]))
    assert all(0 < hi - lo <= block for lo, hi in parts) or parts == [(0, 0)]


def test_blocks_of_a_state_over_2_gib_stay_under_the_count_limit():
    # The default block for a 5 GiB + 3 state: every message is a legal MPI count of bytes.
    parts = exchange.blocks(5 * 2**30 + 3)
    assert len(parts) == 6 and max(hi - lo for lo, hi in parts) == exchange.BLOCK < 2**31 - 1
    assert parts[-1] == (5 * 2**30, 5 * 2**30 + 3)
    for bad in (0, 2**31):
        with pytest.raises(ValueError, match="block="):
            exchange.blocks(10, bad)


def test_unpack_runs_no_code_and_a_damaged_state_is_named():
    class Payload:
        def __reduce__(self):
            return (print, ("this must never run",))

    import io
    import pickle

    buf = io.BytesIO()
    torch.save({"model": Payload()}, buf)  # what a hostile peer could send
    with pytest.raises(pickle.UnpicklingError):
        exchange.unpack(np.frombuffer(buf.getvalue(), dtype=np.uint8))
    data = exchange.pack({"w": torch.arange(10)})
    header = exchange._header(data)
    damaged = data.copy()
    damaged[-5] ^= 1
    with pytest.raises(exchange.ExchangeError, match="received from rank 3 is damaged"):
        exchange._check(damaged, header, 3)


def test_explore_names_and_values_are_checked():
    assert hparams.parse("lr, momentum") == ("lr", "momentum") and hparams.parse("") == ()
    for bad in ("lr,lr", "beta", "lr,,momentum"):
        with pytest.raises(ConfigError, match="--explore"):
            hparams.parse(bad)
    with pytest.raises(ConfigError, match="--weight-decay > 0"):
        hparams.check(("weight_decay",), {"lr": 0.1, "weight_decay": 0.0, "momentum": 0.9})
    with pytest.raises(ConfigError, match="--momentum in"):
        hparams.check(("momentum",), {"lr": 0.1, "weight_decay": 0.0, "momentum": 1.0})


@settings(max_examples=200, deadline=None)
@given(
    seed=st.integers(0, 2**31),
    trainer=st.integers(0, 64),
    round_index=st.integers(0, 10**4),
    lr=st.floats(1e-5, 1.0),
    wd=st.floats(1e-6, 0.1),
    momentum=st.floats(0.0, 0.99),
)
def test_exploration_is_seeded_and_bounded(seed, trainer, round_index, lr, wd, momentum):
    given_values = {"lr": lr, "weight_decay": wd, "momentum": momentum}
    names = hparams.EXPLORABLE
    start = hparams.initial(given_values, names, seed, trainer)
    assert start == hparams.initial(given_values, names, seed, trainer)
    assert 1 / 3.0001 <= start["lr"] / lr <= 3.0001 and 1 / 3.0001 <= start["weight_decay"] / wd <= 3.0001
    assert 0.0 <= start["momentum"] < 1.0
    assert hparams.initial(given_values, ("momentum",), seed, trainer)["lr"] == lr  # only the named ones move
    # Exploring one more name does not move the others' draws.
    assert hparams.initial(given_values, ("lr",), seed, trainer)["lr"] == start["lr"]
    after = hparams.perturb(start, names, seed, round_index, trainer)
    assert after == hparams.perturb(start, names, seed, round_index, trainer)
    assert after["lr"] / start["lr"] == pytest.approx(0.8) or after["lr"] / start["lr"] == pytest.approx(1.25)
    assert 0.0 <= after["momentum"] < 1.0
    assert hparams.perturb(start, (), seed, round_index, trainer) == start


def test_trainers_start_from_different_values():
    given_values = {"lr": 0.01, "weight_decay": 0.0, "momentum": 0.9}
    lrs = {hparams.initial(given_values, ("lr",), 0, k)["lr"] for k in range(8)}
    assert len(lrs) == 8 and min(lrs) < 0.01 < max(lrs)


def test_experiment_variants_and_summary():
    import argparse

    from dstore.tools.measure.ltfb_experiment import VARIANTS, markdown, summarize, variant_args

    opts = argparse.Namespace(
        trainers=4,
        round=5,
        truncation_fraction=0.25,
        explore="lr",
        epochs=6,
        batch_size=32,
        lr=0.003,
        metric="loss",
        seeds=[0, 1],
    )
    args = {v: variant_args(v, opts) for v in VARIANTS}
    assert args["dp"] == ["--trainers", "1"] and "--ltfb-round" not in args["dp"]
    assert args["independent"][-1] == str(10**9)  # the trainers never meet
    assert "--ltfb-strategy" not in args["pairwise"] and args["explore"][-2:] == ["--explore", "lr"]
    assert args["explore"][:-2] == args["truncation"]  # exploration is the only difference
    runs = [
        {"variant": "independent", "seed": s, "best": b, "mean": m, "wall_s": w, "models_taken": None}
        for s, b, m, w in ((0, 0.6, 0.4, 10.0), (1, 0.8, 0.6, 12.0))
    ]
    runs.append({"variant": "pairwise", "seed": 0, "best": 0.7, "mean": 0.7, "wall_s": 11.0, "models_taken": 3})
    rows = summarize(runs)
    assert [r["variant"] for r in rows] == ["independent", "pairwise"]
    assert rows[0]["best"] == pytest.approx(0.7) and rows[0]["best_sd"] == pytest.approx(math.sqrt(0.02))
    assert rows[0]["mean"] == pytest.approx(0.5) and rows[1]["best_sd"] == 0.0 and rows[1]["models_taken"] == 3
    table = markdown(rows, opts)
    assert "| (b) K independent trainers, 1/K each | 0.7000 ± 0.1414 | 0.5000 ± 0.1414 | – | 11.0 ± 1.4 |" in table


# --- one side of a match, in-process ----------------------------------------------------------


@pytest.fixture
def self_trainer(tmp_path):
    """A real Trainer (DDP over a 1-rank group on COMM_SELF) and a StoreLoader over an easy 2-class
    raw container (dark vs bright 4x4 images)."""
    from mpi4py import MPI

    from dstore.formats import create_writer
    from dstore.loader.store_loader import StoreLoader
    from dstore.store.data_store import DataStore
    from dstore.training.augment import ImageTransform
    from dstore.training.dist import init_distributed
    from dstore.training.loop import Trainer
    from dstore.training.models import build_model
    from dstore.training.optim import Schedule, make_optimizer, make_scheduler

    path = str(tmp_path / "easy.h5")
    gen = np.random.default_rng(0)
    with create_writer(
        path, encoding="raw", class_names=["dark", "bright"], raw_dtype="uint8", raw_shape=(4, 4, 1)
    ) as w:
        for i in range(48):
            lo = 150 if i % 2 else 0
            w.append(gen.integers(lo, lo + 100, (4, 4, 1), dtype=np.uint8), i % 2, f"s{i}", i)
    tf = ImageTransform((4, 4), 1, (0.5,), (0.25,))
    with (
        init_distributed(MPI.COMM_SELF) as ctx,
        DataStore(MPI.COMM_SELF, path, batch_size=16, seed=0) as store,
        StoreLoader(store, transform=tf, decode_threads=1, size=(4, 4)) as loader,
    ):
        torch.manual_seed(0)
        model = build_model("small_cnn", 1, 2, (4, 4))
        opt = make_optimizer("adam", model.parameters(), lr=0.01)
        yield Trainer(ctx, model, opt, make_scheduler(opt, Schedule("constant", total=100))), loader


def _copy(state):
    return from_bytes(to_bytes(state))


def _crc(trainer):
    return state_crc(trainer.state_dict())


def test_duel_keeps_the_better_model_with_its_optimizer_state(self_trainer):
    trainer, loader = self_trainer
    params = [id(p) for p in trainer.model.parameters()]
    fresh = _copy(trainer.state_dict())
    for epoch in range(4):
        for images, labels in loader.epoch(epoch):
            trainer.train_step(images, labels, 16)
    trained = _copy(trainer.state_dict())
    assert trained["optimizer"]["state"] and not fresh["optimizer"]["state"]  # Adam moments travel too

    trainer.load_state_dict(fresh)  # the partner is better: the trainer ends up holding it
    match = duel(trainer, loader, trained, _copy(fresh), "loss")
    assert match.partner_won and match.partner_score < match.own_score, match
    assert _crc(trainer) == state_crc(trained)

    trainer.load_state_dict(trained)  # its own is better: put back after scoring the partner
    match = duel(trainer, loader, fresh, _copy(trained), "loss")
    assert not match.partner_won and _crc(trainer) == state_crc(trained)
    match = duel(trainer, loader, fresh, _copy(trained), "accuracy")
    assert not match.partner_won and match.own_score >= match.partner_score

    broken = _copy(trained)  # NaN loses, even against an untrained model
    next(iter(broken["model"].values())).fill_(math.nan)
    trainer.load_state_dict(fresh)
    match = duel(trainer, loader, broken, _copy(fresh), "loss")
    assert math.isnan(match.partner_score) and not match.partner_won and _crc(trainer) == state_crc(fresh)

    tie = {**_copy(fresh), "optimizer": trained["optimizer"]}  # the same model: the same scores
    match = duel(trainer, loader, tie, _copy(fresh), "accuracy")
    assert match.own_score == match.partner_score and not match.partner_won
    assert _crc(trainer) == state_crc(fresh) != state_crc(tie)

    # Loaded in place: DDP and the optimizer still hold the very parameter tensors they were built on.
    assert [id(p) for p in trainer.model.parameters()] == params
    assert [id(p) for p in trainer.optimizer.param_groups[0]["params"]] == params
    assert trainer.ddp.module is trainer.model


@pytest.mark.parametrize("name", ["adam", "sgd"])
def test_hyperparameters_travel_in_the_state_and_take_effect(self_trainer, name):
    from dstore.training.optim import Schedule, make_optimizer, make_scheduler

    trainer, loader = self_trainer
    opt = make_optimizer(name, trainer.model.parameters(), lr=0.02, momentum=0.9, weight_decay=1e-4)
    trainer.optimizer, trainer.scheduler = opt, make_scheduler(opt, Schedule("cosine", total=40))
    for images, labels in loader.epoch(0):
        trainer.train_step(images, labels, 16)
    state = _copy(trainer.state_dict())
    before = hparams.get(state)
    assert before == pytest.approx({"lr": 0.02, "weight_decay": 1e-4, "momentum": 0.9})
    assert state_crc(hparams.put(state, before)) == state_crc(state)  # putting the same values changes nothing
    values = {"lr": 0.005, "weight_decay": 2e-4, "momentum": 0.8}
    moved = _copy(hparams.put(state, values))
    assert hparams.get(moved) == values and hparams.get(state) == before  # a copy; the original is untouched
    trainer.load_state_dict(moved)  # what a trainer does after taking a model: the new values are in force
    in_force = trainer.optimizer.param_groups[0]["lr"]
    assert in_force == pytest.approx(state["optimizer"]["param_groups"][0]["lr"] * 0.25)
    for images, labels in loader.epoch(1):
        trainer.train_step(images, labels, 16)
    group = trainer.optimizer.param_groups[0]
    assert trainer.scheduler.base_lrs[0] == 0.005 and group["weight_decay"] == 2e-4
    assert (group["betas"][0] if name == "adam" else group["momentum"]) == 0.8
    # The schedule continues from where it was, on the new base.
    assert group["lr"] == pytest.approx(0.005 * trainer.scheduler.lr_lambdas[0](trainer.scheduler.last_epoch))


def test_exchange_in_blocks_on_comm_self(self_trainer):
    # sendrecv to itself on COMM_SELF: the trainer's real state in 512-byte blocks, read back intact.
    from mpi4py import MPI

    trainer, _ = self_trainer
    state = trainer.state_dict()
    data = exchange.pack(state)
    assert data.size > 20 * 512
    got = exchange.sendrecv(MPI.COMM_SELF, data, 0, 5, block=512)
    assert np.array_equal(got, data) and state_crc(exchange.unpack(got)) == state_crc(state)
    empty = exchange.sendrecv(MPI.COMM_SELF, data[:0], 0, 5, block=512)
    assert empty.size == 0


def _available_bytes() -> int:
    with open("/proc/meminfo") as fh:
        for line in fh:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0


@pytest.mark.slow
@pytest.mark.skipif(
    not rc.LARGE_TESTS.get() or _available_bytes() < 12 * 2**30,
    reason="set DSTORE_LARGE_TESTS=1, with 12 GiB of memory available: two copies of a 2 GiB "
    "payload took 127-142 s on the shared 2-core machine; the 512- and 1000-byte block tests "
    "run the same loop over many blocks",
)
def test_a_payload_over_2_gib_crosses_in_blocks_on_comm_self():
    # More bytes than one MPI count can name: 3 messages of <= 1 GiB each way, CRC32 checked on arrival.
    # The pattern's period (1 MiB + 1) does not divide the block, so a block lost or misplaced changes the CRC.
    from mpi4py import MPI

    n = 2**31 + 2**20 + 7
    data = np.resize(np.frombuffer(np.random.default_rng(0).bytes(2**20 + 1), dtype=np.uint8), n)
    assert len(exchange.blocks(n)) == 3
    got = exchange.sendrecv(MPI.COMM_SELF, data, 0, 9)
    assert got.size == n and np.array_equal(got[-4096:], data[-4096:]) and np.array_equal(got[:4096], data[:4096])
    del got


# --- real tournaments under mpiexec ------------------------------------------------------------

pytest_mpi = pytest.mark.mpi
SEED = 1
# digits: 1438 training samples; 2 trainers -> 719 each, 72 of them the tournament set, 647 to
# train on; global batch 32 -> 21 steps per epoch, 42 in 2 epochs; a round every 7 steps -> 6
# rounds, the last at the very last step (so each trainer's final checkpoint is the model it kept).
# Exploring the learning rate: a trainer that takes its partner's model perturbs the rate that came with it.
RUN = [
    "--epochs",
    "2",
    "--batch-size",
    "32",
    "--ltfb-round",
    "7",
    "--ltfb-metric",
    "loss",
    "--seed",
    str(SEED),
    "--explore",
    "lr",
    "--deterministic",
    "--no-progress",
]
STEPS, ROUND = 42, 7


@pytest.fixture(scope="module")
def two_by_two(tmp_path_factory, cache):
    """2 trainers x 2 ranks: local rank i of one trainer exchanges with local rank i of the other."""
    run_dir = tmp_path_factory.mktemp("ltfb")
    res = run_mpi(
        4,
        ["dstore", "train", "--trainers", "2", "--run-dir", str(run_dir)] + RUN,
        timeout=150,
        env={"DSTORE_CACHE": str(cache)},
    )
    return run_dir, res


def _check_round(records, trainers, seed, metric):
    """The records of one round agree with the pairing, the decision rule and each other's checksums."""
    by = {r["trainer"]: r for r in records}
    assert sorted(by) == list(range(trainers))
    pairs = pair_trainers(trainers, seed, records[0]["round"])
    for k, r in by.items():
        assert r["ranks_agree"] is True, r  # every rank of the trainer holds the same model
        partner = partner_of(pairs, k)
        assert r["partner"] == partner and r["metric"] == metric, r
        if partner is None:
            assert r["kept"] == k and r["crc_kept"] == r["crc_own"] and r["pair"] is None, r
            continue
        assert sorted(r["pair"]) == sorted((k, partner)), r
        assert r["crc_partner"] == by[partner]["crc_own"], "the model received is not the one the partner had"
        won = partner_wins(r["own_score"], r["partner_score"], metric)
        assert r["winner"] == ("partner" if won else "own") and r["kept"] == (partner if won else k), r
        # What the trainer holds after the round is exactly the model it says it kept, as it was before.
        assert r["crc_kept"] == by[r["kept"]]["crc_own"], r


@pytest_mpi
def test_two_trainers_of_two_ranks_play_a_logged_tournament(two_by_two):
    run_dir, res = two_by_two
    log = read_jsonl(run_dir / "tournament.jsonl")
    assert len(log) == 2 * (STEPS // ROUND), log
    rounds = {}
    for r in log:
        rounds.setdefault(r["round"], []).append(r)
    assert sorted(rounds) == list(range(STEPS // ROUND))
    for i, records in rounds.items():
        assert {r["global_step"] for r in records} == {(i + 1) * ROUND}
        assert all(
            isinstance(r[key], float) and math.isfinite(r[key])
            for r in records
            for key in ("own_score", "partner_score", "seconds")
        )
        _check_round(records, 2, SEED, "loss")
        _check_explore(records, SEED, ("lr",))
    first = {r["trainer"]: r["crc_own"] for r in rounds[0]}
    assert first[0] != first[1], "the trainers started from the same model (seed + trainer index)"
    assert any(r["winner"] == "partner" for r in log), "no trainer ever took its partner's model"

    configs = [json.loads((run_dir / f"trainer{k}" / "config.json").read_text()) for k in (0, 1)]
    assert [c["config"]["seed"] for c in configs] == [SEED, SEED + 1]
    assert [c["ltfb"]["train_range"] for c in configs] == [[0, 647], [719, 1366]]
    assert [c["ltfb"]["tournament_range"] for c in configs] == [[647, 719], [1366, 1438]]
    assert all(
        c["ranks"] == 2 and c["steps_per_epoch"] == STEPS // 2 and c["ltfb"]["round_steps"] == ROUND for c in configs
    )
    last = {r["trainer"]: r for r in rounds[STEPS // ROUND - 1]}
    for k in (0, 1):
        metrics = read_jsonl(run_dir / f"trainer{k}" / "metrics.jsonl")
        assert [m["epoch"] for m in metrics if "epoch" in m] == [0, 1]
        assert [m["train_samples"] for m in metrics if "epoch" in m] == [647, 647]
        test = [m for m in metrics if "test_accuracy" in m]
        assert len(test) == 1 and test[0]["test_samples"] == 359
        ck = torch.load(run_dir / f"trainer{k}" / "checkpoint.pt", weights_only=True)
        assert ck["global_step"] == STEPS
        assert state_crc({key: ck[key] for key in ("model", "optimizer", "scheduler")}) == last[k]["crc_held"]
        assert f"trainer {k}: test accuracy" in res.stdout, res.stdout
    assert "best: trainer" in res.stdout and "tournament round 5 at step 42" in res.stdout, res.stdout


@pytest_mpi
def test_an_interrupted_tournament_resumes_exactly(two_by_two, tmp_path, cache):
    # The same deterministic job stopped after 10 steps (round 0 played at step 7), then resumed with
    # --resume auto: every later round pairs, scores and keeps exactly what the uninterrupted job did.
    ref_dir, _ = two_by_two
    base = ["dstore", "train", "--trainers", "2", "--run-dir", str(tmp_path)] + RUN
    env = {"DSTORE_CACHE": str(cache)}
    run_mpi(4, base + ["--stop-after-steps", "10"], timeout=150, env=env)
    assert [r["round"] for r in read_jsonl(tmp_path / "tournament.jsonl")] == [0, 0]
    res = run_mpi(4, base + ["--resume", "auto"], timeout=150, env=env)
    assert "resumed from" in res.stdout and "at epoch 0, step 10" in res.stdout, res.stdout
    keys = (
        "round",
        "global_step",
        "trainer",
        "partner",
        "own_score",
        "partner_score",
        "kept",
        "crc_own",
        "crc_partner",
        "crc_kept",
        "crc_held",
        "hparams",
    )
    want = [{k: r[k] for k in keys} for r in read_jsonl(ref_dir / "tournament.jsonl")]
    got = [{k: r[k] for k in keys} for r in read_jsonl(tmp_path / "tournament.jsonl")]
    assert got == want
    for k in (0, 1):
        a = torch.load(ref_dir / f"trainer{k}" / "checkpoint.pt", weights_only=True)
        b = torch.load(tmp_path / f"trainer{k}" / "checkpoint.pt", weights_only=True)
        assert state_crc({key: a[key] for key in ("model", "optimizer", "scheduler")}) == state_crc(
            {key: b[key] for key in ("model", "optimizer", "scheduler")}
        )


@pytest_mpi
def test_three_trainers_one_sits_out_each_round(tmp_path, cache):
    run_mpi(
        3,
        [
            "dstore",
            "train",
            "--trainers",
            "3",
            "--epochs",
            "1",
            "--batch-size",
            "32",
            "--ltfb-round",
            "5",
            "--seed",
            "4",
            "--no-progress",
            "--run-dir",
            str(tmp_path),
        ],
        timeout=120,
        env={"DSTORE_CACHE": str(cache)},
    )
    log = read_jsonl(tmp_path / "tournament.jsonl")
    # 1438 samples / 3 = 479 each (2 dropped), 48 of them the tournament set: 431 -> 14 steps, rounds at 5, 10.
    assert [r["round"] for r in log] == [0, 0, 0, 1, 1, 1]
    for i in (0, 1):
        records = log[3 * i : 3 * i + 3]
        assert sum(r["partner"] is None for r in records) == 1
        _check_round(records, 3, 4, "accuracy")


@pytest_mpi
def test_trainers_that_do_not_divide_the_ranks_end_the_job(tmp_path):
    res = run_mpi(
        2,
        ["dstore", "train", "--trainers", "3", "--run-dir", str(tmp_path / "run"), "--no-progress"],
        timeout=60,
        check=False,
    )
    assert res.returncode != 0
    assert "error on rank" in res.stderr and "--trainers 3 does not divide the job's 2 MPI rank(s)" in res.stderr, (
        res.stderr
    )
    assert not (tmp_path / "run").exists()


# --- the blocked exchange, truncation and exploration under mpiexec ---------------------------


@pytest_mpi
def test_states_cross_in_many_small_blocks_between_ranks():
    # Both directions at once (sizes differ, so one side runs out of blocks first) and one way, in
    # 1000-byte messages: the same loop that cuts a > 2 GiB state into 1 GiB messages.
    from pathlib import Path

    script = Path(__file__).resolve().parent / "ltfb_scenarios" / "exchange.py"
    res = run_mpi(2, ["python", str(script), "1000"], timeout=90)
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert [r["rank"] for r in out] == [0, 1]
    assert out[0]["blocks"] > 30 and out[1]["blocks"] > 2 * out[0]["blocks"], out
    assert all(r["swapped_intact"] for r in out) and out[0]["one_way_intact"] is True, out


# 4 trainers x 1 rank: 1438 / 4 = 359 each, 36 of them the tournament set, 323 to train on; global
# batch 16 -> 21 steps in one epoch; a round every 3 steps -> 7 rounds, the last at the last step.
TRUNC = [
    "--epochs",
    "1",
    "--batch-size",
    "16",
    "--ltfb-round",
    "3",
    "--ltfb-strategy",
    "truncation",
    "--truncation-fraction",
    "0.5",
    "--explore",
    "lr,momentum",
    "--lr",
    "0.01",
    "--seed",
    "3",
    "--deterministic",
    "--no-progress",
]
TRUNC_STEPS, TRUNC_ROUND, EXPLORE = 21, 3, ("lr", "momentum")


@pytest.fixture(scope="module")
def four_truncating(tmp_path_factory, cache):
    run_dir = tmp_path_factory.mktemp("ltfb_trunc")
    res = run_mpi(
        4,
        ["dstore", "train", "--trainers", "4", "--run-dir", str(run_dir)] + TRUNC,
        timeout=150,
        env={"DSTORE_CACHE": str(cache)},
    )
    return run_dir, res


def _check_explore(records, seed, names=EXPLORE):
    """A trainer that took a model carries the donor's values times its seeded factor; the others
    keep theirs; what it holds differs from what it took only by those values."""
    by = {r["trainer"]: r for r in records}
    for k, r in by.items():
        if r["kept"] == k:
            assert r["hparams"] == r["hparams_own"] and r["crc_held"] == r["crc_kept"], r
        else:
            want = hparams.perturb(by[r["kept"]]["hparams_own"], names, seed, r["round"], k)
            assert r["hparams"] == pytest.approx(want, rel=1e-12) and r["crc_held"] != r["crc_kept"], r
            assert r["hparams"]["weight_decay"] == by[r["kept"]]["hparams_own"]["weight_decay"]  # not explored


@pytest_mpi
def test_truncation_with_exploration_logs_what_each_trainer_took(four_truncating):
    run_dir, res = four_truncating
    log = read_jsonl(run_dir / "tournament.jsonl")
    rounds = {}
    for r in log:
        rounds.setdefault(r["round"], []).append(r)
    assert sorted(rounds) == list(range(TRUNC_STEPS // TRUNC_ROUND)), log
    took = 0
    for i, records in rounds.items():
        by = {r["trainer"]: r for r in records}
        assert sorted(by) == [0, 1, 2, 3] and {r["global_step"] for r in records} == {(i + 1) * TRUNC_ROUND}
        scores = [by[k]["own_score"] for k in range(4)]
        plan = truncation_plan(scores, "accuracy", 0.5, 3, i)  # recomputed from the logged scores alone
        for k, r in by.items():
            assert r["strategy"] == "truncation" and r["ranks_agree"] is True
            assert r["position"] == rank_trainers(scores, "accuracy").index(k)
            assert r["sent_to"] == sorted(b for b, d in plan.items() if d == k), (plan, r)
            if k in plan:
                assert r["kept"] == r["partner"] == plan[k] and r["winner"] == "partner"
                assert r["crc_partner"] == by[plan[k]]["crc_own"]  # received what the donor had
                assert r["crc_kept"] == by[plan[k]]["crc_own"]  # and holds exactly that (before exploring)
                took += 1
            else:
                assert r["kept"] == k and r["crc_kept"] == r["crc_own"] and r["crc_partner"] is None, r
        _check_explore(records, 3)
    assert took >= 3, "the bottom trainers hardly ever took a model"
    configs = [json.loads((run_dir / f"trainer{k}" / "config.json").read_text())["config"] for k in range(4)]
    starts = [hparams.initial({"lr": 0.01, "weight_decay": 0.0, "momentum": 0.9}, EXPLORE, 3, k) for k in range(4)]
    assert [(c["lr"], c["momentum"]) for c in configs] == [(s["lr"], s["momentum"]) for s in starts]
    assert [r["hparams_own"]["lr"] for r in rounds[0]] == pytest.approx([s["lr"] for s in starts], rel=1e-12)
    last = {r["trainer"]: r for r in rounds[TRUNC_STEPS // TRUNC_ROUND - 1]}
    for k in range(4):  # each final checkpoint: the state the last round says the trainer holds
        ck = torch.load(run_dir / f"trainer{k}" / "checkpoint.pt", weights_only=True)
        state = {key: ck[key] for key in ("model", "optimizer", "scheduler")}
        assert ck["global_step"] == TRUNC_STEPS and state_crc(state) == last[k]["crc_held"]
        assert hparams.get(state) == pytest.approx(last[k]["hparams"], rel=1e-12)
    assert "exploring lr, momentum: trainers start from" in res.stdout, res.stdout


@pytest_mpi
def test_truncation_with_exploration_resumes_exactly(four_truncating, tmp_path, cache):
    ref_dir, _ = four_truncating
    base = ["dstore", "train", "--trainers", "4", "--run-dir", str(tmp_path)] + TRUNC
    env = {"DSTORE_CACHE": str(cache)}
    run_mpi(4, base + ["--stop-after-steps", "8"], timeout=150, env=env)  # rounds 0 and 1 played
    res = run_mpi(4, base + ["--resume", "auto"], timeout=150, env=env)
    assert "at epoch 0, step 8" in res.stdout, res.stdout
    keys = ("round", "trainer", "partner", "own_score", "kept", "crc_own", "crc_kept", "crc_held", "hparams")
    want = [{k: r[k] for k in keys} for r in read_jsonl(ref_dir / "tournament.jsonl")]
    assert [{k: r[k] for k in keys} for r in read_jsonl(tmp_path / "tournament.jsonl")] == want
    for k in range(4):
        a = torch.load(ref_dir / f"trainer{k}" / "checkpoint.pt", weights_only=True)
        b = torch.load(tmp_path / f"trainer{k}" / "checkpoint.pt", weights_only=True)
        assert state_crc({key: a[key] for key in ("model", "optimizer", "scheduler")}) == state_crc(
            {key: b[key] for key in ("model", "optimizer", "scheduler")}
        )
