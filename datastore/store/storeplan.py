"""`StorePlan`: what a DataStore is, as one frozen value built once (its rank, the served samples'
sizes and offsets, who owns what, the steps, its arguments), that the modules serving it take as
an argument (dstore.memory.budget, dstore.store.populate, dstore.store.stream, dstore.store.epoch) instead of the store.

NOTE [ The store as values ]: those modules read a store's plan and the few live objects they need
(the communicator, the container, the windows), never the store itself, and return what they
produce (the windows, the residency, the epoch's batches) for the store to keep: the store is the
one place its state is written, and no module it calls imports it (no import cycle, for the type
checker either). What changes during a store's life (its seed from a loaded state, its memory
budget before the population, its layout once over budget) replaces the plan with another value.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from dstore.errors import ConfigError
from dstore.order import plan, shuffle
from dstore.order import policy as policy_mod
from dstore.store.config import StoreConfig


@dataclasses.dataclass(frozen=True, eq=False)
class StorePlan:
    """One rank's view of a store, fixed at construction (see NOTE [ The store as values ]).

    Attributes:
        rank, size: this rank and the number of ranks of the store's communicator.
        config: the validated arguments (dstore.store.config.StoreConfig; its fields are also properties here).
        start, stop: the served samples' range in the container.
        offsets: int64[N+1] of the served samples, from 0 (the node's shared index); labels: int64[N];
            checksums: uint32[N]; base_byte: the container's data byte of served sample 0.
        sizes: each served sample's bytes (a dstore.order.plan.Derived of `offsets`).
        steps_per_epoch: the steps of every epoch.
        bounds: int64[P+1], each rank's block of samples (the preload's reads).
        layout: where each sample lives (dstore.order.plan.Layout): the plan's, or over budget its resident samples'.
        tier: {resident_fraction, resident_bytes, storage_bytes} (all resident until the budget says otherwise).
        reader_index: bytes of the index arrays each storage or population thread's reader holds.
        budget_source: what set the memory budget (named in a MemoryBudgetError).
        field_bytes: what the served fields (`fields=`, dstore.store.fieldstore) cost this rank: its
            window of its block's values and a step's receive buffer (0 without fields).
    """

    rank: int
    size: int
    config: StoreConfig
    start: int
    stop: int
    offsets: np.ndarray
    labels: np.ndarray
    checksums: np.ndarray
    base_byte: int
    sizes: plan.Derived
    steps_per_epoch: int
    bounds: np.ndarray
    layout: plan.Layout
    tier: dict
    reader_index: int
    budget_source: str = "memory_budget argument"
    field_bytes: int = 0

    @property
    def num_samples(self) -> int:
        return self.stop - self.start

    # the arguments (dstore.store.config.StoreConfig), as the modules serving the store read them
    @property
    def batch_size(self) -> int:
        return self.config.batch_size

    @property
    def seed(self) -> int:
        return self.config.seed

    @property
    def policy(self) -> str:
        return self.config.shuffle

    @property
    def order_policy(self) -> policy_mod.Policy:
        """The shuffle policy's object (dstore.order.policy): everything that differs by policy."""
        return policy_mod.policy(self.config.shuffle)

    @property
    def partial_fraction(self) -> float:
        return self.config.partial_fraction

    @property
    def population(self) -> str:
        return self.config.population

    @property
    def replicate(self) -> bool:
        return self.config.replicate

    @property
    def prefetch(self) -> int:
        return self.config.prefetch

    @property
    def drop_last(self) -> bool:
        return self.config.drop_last

    @property
    def node_views(self) -> bool:
        return bool(self.config.node_views)  # resolved by StoreConfig.checked

    @property
    def overflow(self) -> str:
        return self.config.overflow

    @property
    def storage_lookahead(self) -> int:
        return self.config.storage_lookahead

    @property
    def storage_threads(self) -> int:
        return self.config.storage_threads

    @property
    def population_threads(self) -> int:
        return self.config.population_threads

    def schedule(self, epoch: int) -> plan.Schedule:
        """This rank's deliveries in `epoch` (pure). Under ``global`` and ``local`` only this rank's
        part of the order is built (O(N/P) memory)."""
        return self.order_policy.rank_schedule(
            self.num_samples,
            self.bounds,
            self.seed,
            epoch,
            self.partial_fraction,
            self.batch_size,
            self.size,
            self.rank,
            self.drop_last,
        )


def build(
    rank: int,
    size: int,
    config: StoreConfig,
    start: int,
    stop: int,
    offsets: np.ndarray,
    labels: np.ndarray,
    checksums: np.ndarray,
    base_byte: int,
    reader_index: int,
    budget_source: str = "memory_budget argument",
) -> StorePlan:
    """The plan of a store of `size` ranks serving samples [start, stop) (`offsets` etc. of those).

    Raises:
        ConfigError: drop_last leaves no step.
    """
    num_samples = stop - start
    cfg = config
    steps = plan.steps_per_epoch(num_samples, cfg.batch_size, cfg.drop_last)
    if steps == 0:
        raise ConfigError(f"batch_size={cfg.batch_size} with drop_last=True leaves no step: only {num_samples} samples")
    bounds = plan.block_bounds(offsets, size)
    if cfg.population == "dynamic" and policy_mod.policy(cfg.shuffle).one_order and not cfg.replicate:
        # Owners from epoch 0's bijection on lookup; only the displacements are held (int64[N])
        perm0 = shuffle.global_permutation(num_samples, cfg.seed, 0)
        owner = plan.dynamic_owner_of(num_samples, cfg.batch_size, size, cfg.drop_last, perm0)
        layout = plan.owner_layout(offsets, owner, size)
    else:
        layout = plan.block_layout(offsets, bounds)
    tier = {"resident_fraction": 1.0, "resident_bytes": int(offsets[-1]), "storage_bytes": 0}
    return StorePlan(
        rank,
        size,
        config,
        start,
        stop,
        offsets,
        labels,
        checksums,
        base_byte,
        plan.sizes_of(offsets),
        steps,
        bounds,
        layout,
        tier,
        int(reader_index),
        budget_source,
    )
