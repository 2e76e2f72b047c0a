"""LTFB (`dstore train --trainers K`): the pure parts (layout, data parts, pairing, decision rule,
state checksum) exhaustively; one side of a match in-process on COMM_SELF with a real store and
Trainer; and real tournaments under mpiexec, whose log must agree with the models the trainers hold."""

import json
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from mpirun import run_mpi

from datastore.errors import ConfigError
from training.ltfb import (duel, from_bytes, pair_trainers, partner_of, partner_wins, ranks_per_trainer,
                           state_crc, to_bytes, trainer_parts)
from training.metrics import read_jsonl

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
    (train_n, tour_n), = sizes
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
    state = {"model": {"w": torch.arange(6, dtype=torch.float32).reshape(2, 3), "b": torch.zeros(2)},
             "optimizer": {"state": {0: {"step": torch.tensor(3.0)}}, "param_groups": [{"lr": 0.1, "params": [0]}]},
             "scheduler": None}
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
    from tools.cli import build_parser
    from training.run import TrainConfig

    args = build_parser().parse_args(["train", "--trainers", "2", "--ltfb-round", "5", "--ltfb-metric", "loss",
                                      "--tournament-fraction", "0.2"])
    cfg = TrainConfig(**{k: v for k, v in vars(args).items() if k in TrainConfig.__dataclass_fields__})
    cfg.check()
    assert (cfg.trainers, cfg.ltfb_round, cfg.ltfb_metric, cfg.tournament_fraction) == (2, 5, "loss", 0.2)
    for bad, flag in (({"trainers": 0}, "--trainers 0"), ({"ltfb_round": -1}, "--ltfb-round -1"),
                      ({"ltfb_metric": "f1"}, "--ltfb-metric 'f1'"),
                      ({"tournament_fraction": 0.0}, "--tournament-fraction 0.0"),
                      ({"tournament_fraction": 1.0}, "--tournament-fraction 1.0")):
        with pytest.raises(ConfigError, match=flag):
            TrainConfig(**bad).check()
    TrainConfig(trainers=2, resume="auto").check()


def test_resume_of_a_job_names_what_is_missing(tmp_path):
    from training.checkpoint import CHECKPOINT_NAME, resolve_job_resume

    job = tmp_path / "runs" / "job"
    (job / "trainer0").mkdir(parents=True)
    (job / "trainer0" / CHECKPOINT_NAME).write_bytes(b"x")
    assert resolve_job_resume(None, None, str(tmp_path / "runs"), 2) is None
    assert resolve_job_resume("auto", None, str(tmp_path / "none"), 2) is None  # nothing to resume: fresh
    with pytest.raises(ConfigError, match=r"no checkpoint.pt for trainer\(s\) \[1\]"):
        resolve_job_resume("auto", None, str(tmp_path / "runs"), 2)
    (job / "trainer1").mkdir()
    (job / "trainer1" / CHECKPOINT_NAME).write_bytes(b"x")
    for given in ("auto", str(job), str(job / "trainer1" / CHECKPOINT_NAME)):
        assert resolve_job_resume(given, None, str(tmp_path / "runs"), 2) == str(job), given
    with pytest.raises(ConfigError, match="give the job's run directory"):
        resolve_job_resume(str(tmp_path / "nothing.pt"), None, str(tmp_path / "runs"), 2)


# --- one side of a match, in-process ----------------------------------------------------------


@pytest.fixture
def self_trainer(tmp_path):
    """A real Trainer (DDP over a 1-rank group on COMM_SELF) and a StoreLoader over an easy 2-class
    raw container (dark vs bright 4x4 images)."""
    from mpi4py import MPI

    from datastore.formats import create_writer
    from datastore.store import DataStore
    from datastore.torch import StoreLoader
    from training.augment import ImageTransform
    from training.dist import init_distributed
    from training.loop import Trainer
    from training.models import build_model
    from training.optim import Schedule, make_optimizer, make_scheduler

    path = str(tmp_path / "easy.h5")
    gen = np.random.default_rng(0)
    with create_writer(path, encoding="raw", class_names=["dark", "bright"], raw_dtype="uint8",
                       raw_shape=(4, 4, 1)) as w:
        for i in range(48):
            lo = 150 if i % 2 else 0
            w.append(gen.integers(lo, lo + 100, (4, 4, 1), dtype=np.uint8), i % 2, f"s{i}", i)
    tf = ImageTransform((4, 4), 1, (0.5,), (0.25,))
    with init_distributed(MPI.COMM_SELF) as ctx, DataStore(MPI.COMM_SELF, path, batch_size=16, seed=0) as store, \
            StoreLoader(store, transform=tf, num_threads=1, size=(4, 4)) as loader:
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


# --- real tournaments under mpiexec ------------------------------------------------------------

pytest_mpi = pytest.mark.mpi
SEED = 1
# digits: 1438 training samples; 2 trainers -> 719 each, 72 of them the tournament set, 647 to
# train on; global batch 32 -> 21 steps per epoch, 42 in 2 epochs; a round every 7 steps -> 6
# rounds, the last at the very last step (so each trainer's final checkpoint is the model it kept).
RUN = ["--epochs", "2", "--batch-size", "32", "--ltfb-round", "7", "--ltfb-metric", "loss", "--seed", str(SEED),
       "--deterministic", "--no-progress"]
STEPS, ROUND = 42, 7


@pytest.fixture(scope="module")
def two_by_two(tmp_path_factory, cache):
    """2 trainers x 2 ranks: local rank i of one trainer exchanges with local rank i of the other."""
    run_dir = tmp_path_factory.mktemp("ltfb")
    res = run_mpi(4, ["dstore", "train", "--trainers", "2", "--run-dir", str(run_dir)] + RUN, timeout=150,
                  env={"DSTORE_CACHE": str(cache)})
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
        assert all(isinstance(r[key], float) and math.isfinite(r[key]) for r in records
                   for key in ("own_score", "partner_score", "seconds"))
        _check_round(records, 2, SEED, "loss")
    first = {r["trainer"]: r["crc_own"] for r in rounds[0]}
    assert first[0] != first[1], "the trainers started from the same model (seed + trainer index)"
    assert any(r["winner"] == "partner" for r in log), "no trainer ever took its partner's model"

    configs = [json.loads((run_dir / f"trainer{k}" / "config.json").read_text()) for k in (0, 1)]
    assert [c["config"]["seed"] for c in configs] == [SEED, SEED + 1]
    assert [c["ltfb"]["train_range"] for c in configs] == [[0, 647], [719, 1366]]
    assert [c["ltfb"]["tournament_range"] for c in configs] == [[647, 719], [1366, 1438]]
    assert all(c["ranks"] == 2 and c["steps_per_epoch"] == STEPS // 2 and c["ltfb"]["round_steps"] == ROUND
               for c in configs)
    last = {r["trainer"]: r for r in rounds[STEPS // ROUND - 1]}
    for k in (0, 1):
        metrics = read_jsonl(run_dir / f"trainer{k}" / "metrics.jsonl")
        assert [m["epoch"] for m in metrics if "epoch" in m] == [0, 1]
        assert [m["train_samples"] for m in metrics if "epoch" in m] == [647, 647]
        test = [m for m in metrics if "test_accuracy" in m]
        assert len(test) == 1 and test[0]["test_samples"] == 359
        ck = torch.load(run_dir / f"trainer{k}" / "checkpoint.pt", weights_only=True)
        assert ck["global_step"] == STEPS
        assert state_crc({key: ck[key] for key in ("model", "optimizer", "scheduler")}) == last[k]["crc_kept"]
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
    keys = ("round", "global_step", "trainer", "partner", "own_score", "partner_score", "kept", "crc_own",
            "crc_partner", "crc_kept")
    want = [{k: r[k] for k in keys} for r in read_jsonl(ref_dir / "tournament.jsonl")]
    got = [{k: r[k] for k in keys} for r in read_jsonl(tmp_path / "tournament.jsonl")]
    assert got == want
    for k in (0, 1):
        a = torch.load(ref_dir / f"trainer{k}" / "checkpoint.pt", weights_only=True)
        b = torch.load(tmp_path / f"trainer{k}" / "checkpoint.pt", weights_only=True)
        assert state_crc({key: a[key] for key in ("model", "optimizer", "scheduler")}) == \
            state_crc({key: b[key] for key in ("model", "optimizer", "scheduler")})


@pytest_mpi
def test_three_trainers_one_sits_out_each_round(tmp_path, cache):
    run_mpi(3, ["dstore", "train", "--trainers", "3", "--epochs", "1", "--batch-size", "32", "--ltfb-round", "5",
                "--seed", "4", "--no-progress", "--run-dir", str(tmp_path)], timeout=120,
            env={"DSTORE_CACHE": str(cache)})
    log = read_jsonl(tmp_path / "tournament.jsonl")
    # 1438 samples / 3 = 479 each (2 dropped), 48 of them the tournament set: 431 -> 14 steps, rounds at 5, 10.
    assert [r["round"] for r in log] == [0, 0, 0, 1, 1, 1]
    for i in (0, 1):
        records = log[3 * i:3 * i + 3]
        assert sum(r["partner"] is None for r in records) == 1
        _check_round(records, 3, 4, "accuracy")


@pytest_mpi
def test_trainers_that_do_not_divide_the_ranks_end_the_job(tmp_path):
    res = run_mpi(2, ["dstore", "train", "--trainers", "3", "--run-dir", str(tmp_path / "run"), "--no-progress"],
                  timeout=60, check=False)
    assert res.returncode != 0
    assert "error on rank" in res.stderr and "--trainers 3 does not divide the job's 2 MPI rank(s)" in res.stderr, \
        res.stderr
    assert not (tmp_path / "run").exists()
