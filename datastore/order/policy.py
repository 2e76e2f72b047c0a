"""The shuffle policies, one object each in one table (`POLICIES`): the only place a policy's name is read.

Everything a store, its budget, its stream, its resume and the trainer ask of a policy is a method or
an attribute here, so no other module compares a policy's name (tests/test_store_coupling.py,
`test_no_shuffle_policy_name_is_compared_outside_its_table`):

* `order`: the epoch's order of all samples (dstore.order.shuffle's functions of (sizes, seed, epoch));
* `schedule`: a rank's deliveries cut from that order; `rank_schedule`: the same, building only the
  rank's part of the order where the policy allows (O(N/P));
* `first_use` / `block_first_use`: the step in which each sample is first delivered (the streaming
  preload reads in that order);
* `largest_block`: what bounds the samples a rank takes in one step (the memory budget's receive
  buffer): the batch's share, or a whole block dealt over the epoch's steps;
* `position` / `resume_step`: a state's place in the epoch and the step it resumes at; `one_order`
  says whether that place is the same on any number of ranks (the order does not depend on the
  ranks), which a mix of stores, the `direct`/`files` loaders and the dynamic population need.

A new policy is one subclass of `Policy` and one entry in `POLICIES` (docs/design.md, "The epoch order").
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from dstore.errors import ConfigError
from dstore.order import plan, shuffle


class Policy:
    """A shuffle policy: its name, its order and what follows from it (module docstring)."""

    name: ClassVar[str]
    one_order: ClassVar[bool] = False
    """True: one order of all samples whatever the number of ranks (a position in it resumes anywhere)."""
    state_keys: ClassVar[tuple[str, ...]] = ()
    """The state's keys beyond the common ones that a resume must match (`resume_point`)."""

    def order(self, num_samples: int, bounds: np.ndarray, seed: int, epoch: int, fraction: float) -> np.ndarray:
        """The epoch's order of all samples (int64[N])."""
        raise NotImplementedError

    def schedule(
        self, order: np.ndarray, bounds: np.ndarray, batch_size: int, nranks: int, rank: int, drop_last: bool
    ) -> plan.Schedule:
        """Rank's deliveries of an epoch whose order is `order`: its own block's part of the order
        dealt over the epoch's steps (dstore.order.plan's module docstring); nothing is dropped."""
        steps = plan.steps_per_epoch(order.size, batch_size, drop_last)
        seq = order[int(bounds[rank]) : int(bounds[rank + 1])]
        return plan.dealt_schedule(seq, steps, int(seq[0]) if seq.size else int(order[rank % order.size]))

    def rank_schedule(
        self,
        num_samples: int,
        bounds: np.ndarray,
        seed: int,
        epoch: int,
        fraction: float,
        batch_size: int,
        nranks: int,
        rank: int,
        drop_last: bool,
    ) -> plan.Schedule:
        """`schedule` of the epoch's order, building only what this rank needs where the policy can."""
        order = self.order(num_samples, bounds, seed, epoch, fraction)
        return self.schedule(order, bounds, batch_size, nranks, rank, drop_last)

    def first_use(self, order: np.ndarray, bounds: np.ndarray, batch_size: int, steps: int) -> np.ndarray:
        """int64[N]: the step of the epoch whose order is `order` in which each sample is delivered
        (the step its rank's dealt sequence puts it in, approximately)."""
        step = np.zeros(order.size, dtype=np.int64)
        for r in range(len(bounds) - 1):
            lo, hi = int(bounds[r]), int(bounds[r + 1])
            m = hi - lo
            step[order[lo:hi]] = (np.arange(m, dtype=np.int64) * steps) // max(m, 1)
        return step

    def block_first_use(
        self,
        num_samples: int,
        bounds: np.ndarray,
        rank: int,
        seed: int,
        epoch: int,
        batch_size: int,
        steps: int,
        fraction: float,
    ) -> np.ndarray:
        """``first_use(...)[lo:hi]`` for rank's block ``[lo, hi) = bounds[rank:rank+2]``; this base
        builds the whole order (O(N)); a policy whose order allows it computes the block alone."""
        order = self.order(num_samples, bounds, seed, epoch, fraction)
        lo, hi = int(bounds[rank]), int(bounds[rank + 1])
        return self.first_use(order, bounds, batch_size, steps)[lo:hi]

    def largest_block(self, bounds: np.ndarray) -> int | None:
        """The largest block a rank deals over an epoch's steps (it bounds a step's samples with the
        batch's share, dstore.memory.budget.step_bound), or None where only the batch's share does."""
        return int(np.diff(bounds).max())

    def position(self, step: int, batch_size: int) -> int:
        """A state's `position` at `step`: an index in the order where `one_order`, else the step."""
        return int(step) * int(batch_size) if self.one_order else int(step)

    def resume_step(self, state: dict) -> int:
        """The step a saved state resumes at (from its position where `one_order`: any rank count)."""
        return int(state["position"]) // int(state["batch_size"]) if self.one_order else int(state["step"])


class Global(Policy):
    """One permutation of all samples, rank-independent (dstore.order.shuffle.global_permutation)."""

    name = "global"
    one_order = True

    def order(self, num_samples, bounds, seed, epoch, fraction):
        return shuffle.global_order(num_samples, seed, epoch)

    def schedule(self, order, bounds, batch_size, nranks, rank, drop_last):
        return plan.global_schedule(order, batch_size, nranks, rank, drop_last)

    def rank_schedule(self, num_samples, bounds, seed, epoch, fraction, batch_size, nranks, rank, drop_last):
        perm = shuffle.global_permutation(num_samples, seed, epoch)  # only this rank's positions are looked up
        return plan.global_schedule(perm, batch_size, nranks, rank, drop_last)

    def first_use(self, order, bounds, batch_size, steps):
        step = np.zeros(order.size, dtype=np.int64)
        step[order] = np.arange(order.size, dtype=np.int64) // batch_size
        return step

    def block_first_use(self, num_samples, bounds, rank, seed, epoch, batch_size, steps, fraction):
        lo, hi = int(bounds[rank]), int(bounds[rank + 1])
        perm = shuffle.global_permutation(num_samples, seed, epoch)  # each sample's position, by the inverse
        return perm.position_of(np.arange(lo, hi, dtype=np.int64)) // batch_size

    def largest_block(self, bounds):
        return None


class Local(Policy):
    """Each rank's block permuted within itself: no traffic (dstore.order.shuffle.local_order)."""

    name = "local"

    def order(self, num_samples, bounds, seed, epoch, fraction):
        return shuffle.local_order(bounds, seed, epoch)

    def rank_schedule(self, num_samples, bounds, seed, epoch, fraction, batch_size, nranks, rank, drop_last):
        if bounds[rank + 1] <= bounds[rank]:  # an empty block: the base pads from the whole order
            return super().rank_schedule(
                num_samples, bounds, seed, epoch, fraction, batch_size, nranks, rank, drop_last
            )
        seq = shuffle.local_block(bounds, rank, seed, epoch)
        return plan.dealt_schedule(seq, plan.steps_per_epoch(num_samples, batch_size, drop_last), int(seq[0]))

    def block_first_use(self, num_samples, bounds, rank, seed, epoch, batch_size, steps, fraction):
        lo, hi = int(bounds[rank]), int(bounds[rank + 1])
        seq = shuffle.local_block(bounds, rank, seed, epoch)
        use = np.empty(hi - lo, dtype=np.int64)
        use[seq - lo] = (np.arange(hi - lo, dtype=np.int64) * steps) // max(hi - lo, 1)
        return use


class Partial(Policy):
    """The local order with a `fraction` of slots exchanging contents (dstore.order.shuffle.partial_order);
    its chosen slots span all ranks, so every rank builds the whole order."""

    name = "partial"
    state_keys = ("partial_fraction",)

    def order(self, num_samples, bounds, seed, epoch, fraction):
        return shuffle.partial_order(bounds, seed, epoch, fraction)


POLICIES: dict[str, Policy] = {p.name: p for p in (Global(), Local(), Partial())}
"""Every shuffle policy a store accepts, by name (`StoreConfig.shuffle`, `dstore train --shuffle`)."""

NAMES = tuple(POLICIES)
"""The policies' names, in the table's order (the choices of `--shuffle`)."""

GLOBAL = POLICIES["global"]
"""The default policy (`StoreConfig.shuffle`)."""


def policy(name: str) -> Policy:
    """The policy named `name`, or ConfigError naming the choices."""
    found = POLICIES.get(name) if isinstance(name, str) else None
    if found is None:
        raise ConfigError(f"shuffle={name!r} is not one of {NAMES}")
    return found


_STATE_MATCH = ("num_samples", "batch_size", "shuffle", "drop_last", "sample_start", "sample_stop")


def resume_point(sd, current: dict, steps_per_epoch: int) -> tuple[int, int]:
    """(epoch, step) a saved store state `sd` resumes at, checked against the `current` state.

    Where the policy has `one_order` the step comes from the position in the order (samples consumed),
    so it is the same whatever the number of ranks. A finished epoch resumes at the next one's start.

    Raises:
        ConfigError: `sd` is not a store state, or it was saved for another data set, batch size,
            policy, partial fraction, drop_last, or a step outside the epoch.
    """
    if not isinstance(sd, dict) or sd.get("version") != plan.STATE_VERSION:
        got = sd.get("version") if isinstance(sd, dict) else type(sd).__name__
        raise ConfigError(f"state_dict version {got!r} is not {plan.STATE_VERSION}, or not a DataStore state")
    pol = policy(current["shuffle"])
    for key in _STATE_MATCH + pol.state_keys:
        if sd.get(key) != current[key]:
            raise ConfigError(f"state_dict[{key!r}]={sd.get(key)!r} does not match this store's {current[key]!r}")
    epoch, step = int(sd["epoch"]), pol.resume_step(sd)
    if not 0 <= step <= steps_per_epoch or epoch < 0:
        raise ConfigError(f"state_dict epoch={epoch} step={step} is outside [0, {steps_per_epoch}]")
    return (epoch + 1, 0) if step == steps_per_epoch else (epoch, step)
