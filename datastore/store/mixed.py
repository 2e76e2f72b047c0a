"""`MixedStore`: several containers mixed by weight, one `DataStore` per source, served as one
sequence of global batches.

Rules (the arithmetic is in dstore.order.mix; docs/training.md, "Mixing data sets"):

* The epoch's global order is `dstore.order.mix.mix_plan` of (sizes, weights, seed, epoch, epoch size):
  E (source, sample) pairs, each source's count the largest-remainder rounding of its share of E.
* Global batch s is positions ``[s*B, (s+1)*B)`` of that order and rank r takes its contiguous part,
  exactly as a single DataStore under ``shuffle="global"`` (dstore.order.plan.global_schedule: the same
  steps, drop_last and padding rules, with E in place of N). Each source's store serves the
  entries of the rank's part that are its own; the batch keeps the order's positions.
* Resumption: ``state_dict()`` holds (seed, epoch, position); a resumed epoch continues the same
  order on any number of ranks.
* Each source keeps its own container, encoding, labels and population; ``Batch.sources`` tells
  which source each entry came from, and ``stats`` gives every source's figures.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from dstore.errors import ConfigError
from dstore.order import mix, plan
from dstore.order import policy as policy_mod
from dstore.order.shuffle import check_seed, epoch_rng
from dstore.runtime.collective import is_agreed
from dstore.store.config import StoreConfig
from dstore.store.data_store import DataStore
from dstore.store.epoch import Batch

STATE_KIND = "mixed"


@dataclasses.dataclass
class MixedBatch(Batch):
    """A `Batch` of a mix; `ids` are sample indices in each entry's own container.

    Attributes:
        sources: int64[b], each entry's source index (its position in the store's `sources`).
    """

    sources: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0, dtype=np.int64))


def _parse_sources(sources) -> list[tuple[object, float, object]]:
    """[(container, weight, sample_range or None)] from (container, weight[, sample_range]) items."""
    out = []
    for item in sources:
        if not isinstance(item, (tuple, list)) or len(item) not in (2, 3):
            raise ConfigError(f"source {item!r} must be (container, weight) or (container, weight, (start, stop))")
        out.append((item[0], item[1], item[2] if len(item) == 3 else None))
    if not out:
        raise ConfigError("a MixedStore needs at least one source")
    return out


class MixedStore:
    """Containers mixed by weight, held in the memory of all ranks of `comm` (collective, as DataStore).

    Args:
        comm: an mpi4py communicator.
        sources: (container, weight) or (container, weight, (start, stop)) items; a container is a
            path or an open ContainerReader, as for DataStore; weights are ratios (>= 0).
        config: a StoreConfig for every source's store (its `drop_last` applies to the mix; each
            source's own store never drops), or None to build one from `options`.
        epoch_size: samples per mixed epoch; None: the sum of the sources' sizes.
        **options: StoreConfig's fields, as for DataStore; `shuffle` must be "global" and
            `sample_range` is given per source instead.

    Attributes:
        stores: the DataStore of each source; weights: float64[K]; sizes: int64[K];
        counts: int64[K], each source's samples per epoch; infos: each source's ContainerInfo (info:
        the first's); epoch_size, steps_per_epoch, batch_size,
        seed, drop_last, rank, size; stats: {"epoch", "sources": [each source's EpochStats dict]}.
    """

    def __init__(
        self, comm, sources, config: StoreConfig | None = None, /, *, epoch_size: int | None = None, **options
    ):
        items = _parse_sources(sources)
        if config is None:
            if "sample_range" in options:
                raise ConfigError("sample_range is given per source in a mix: (container, weight, (start, stop))")
            config = StoreConfig.from_options(options)
        elif options:
            raise ConfigError(f"MixedStore takes a StoreConfig or keywords, not both ({', '.join(options)})")
        if not policy_mod.policy(config.shuffle).one_order:
            raise ConfigError(f"shuffle={config.shuffle!r}: a mix is served in one global order (shuffle='global')")
        if config.fields:
            raise ConfigError(
                f"fields={list(config.fields)}: a MixedStore does not serve extra fields; serve one "
                "container with DataStore(..., fields=[...])"
            )
        self.comm, self.rank, self.size = comm, comm.Get_rank(), comm.Get_size()
        self.batch_size, self.seed, self.drop_last = config.batch_size, config.seed, bool(config.drop_last)
        self.weights = mix.check_weights([w for _, w, _ in items], len(items), [_name(c) for c, _, _ in items])
        self.stores: list[DataStore] = []
        try:
            for container, _, rng in items:  # each constructor is collective and agreed: all ranks fail alike
                cfg = dataclasses.replace(config, drop_last=False, sample_range=rng)
                self.stores.append(DataStore(comm, container, cfg))
        except BaseException as exc:
            self._end(exc)
            raise
        self.sizes = np.array([s.num_samples for s in self.stores], dtype=np.int64)
        self.epoch_size = int(self.sizes.sum()) if epoch_size is None else epoch_size
        self.counts = mix.mix_counts(self.epoch_size, self.weights)  # validates epoch_size
        self.steps_per_epoch = plan.steps_per_epoch(self.epoch_size, self.batch_size, self.drop_last)
        if self.steps_per_epoch == 0:
            self._end(None)
            raise ConfigError(
                f"batch_size={self.batch_size} with drop_last=True leaves no step: the mixed epoch "
                f"holds {self.epoch_size} samples"
            )
        self.infos = [s.info for s in self.stores]
        self.info = self.infos[0]  # what a loader reads the channels off; each entry decodes by its own source's
        self.stats: dict | None = None
        self._next = (0, 0)
        self._resume: tuple[int, int] | None = None
        self._active = None

    # ----------------------------------------------------------------- plan
    def plan(self, epoch: int) -> tuple[np.ndarray, np.ndarray]:
        """The epoch's global order: (source index, sample id) per position (dstore.order.mix.mix_plan)."""
        return mix.mix_plan(self.sizes, self.weights, self.seed, epoch, self.epoch_size)

    def schedule(self, epoch: int) -> tuple[plan.Schedule, np.ndarray, np.ndarray]:
        """This rank's deliveries in `epoch`: (its Schedule over the order's positions, the source
        and sample id of each of its entries)."""
        e = self.epoch_size
        sched = plan.global_schedule(
            plan.Derived(e, lambda j: j), self.batch_size, self.size, self.rank, self.drop_last
        )  # over positions: the rank's own, no arange(E)
        pos = np.asarray(sched.ids, dtype=np.int64)
        sched = plan.Schedule(pos, sched.ptr, np.asarray(sched.pad, dtype=bool))
        src, ids = mix.mix_at(self.sizes, self.weights, self.seed, epoch, pos, self.epoch_size)
        return sched, src, ids

    def _source_schedules(self, sched: plan.Schedule, src: np.ndarray, ids: np.ndarray) -> list[plan.Schedule]:
        """Each source's part of this rank's schedule, over the same steps (steps may be empty)."""
        step_of = np.repeat(np.arange(sched.steps), np.diff(sched.ptr))
        out = []
        for k in range(len(self.stores)):
            sel = src == k
            ptr = np.zeros(sched.steps + 1, dtype=np.int64)
            np.cumsum(np.bincount(step_of[sel], minlength=sched.steps), out=ptr[1:])
            out.append(plan.Schedule(ids[sel], ptr, sched.pad[sel]))
        return out

    # ----------------------------------------------------------------- epochs
    def populate(self) -> None:
        """Collective: populates every source's store in turn (no stream reads a source's own first
        step ahead: its steps are the mix's)."""
        for s in self.stores:
            s.populate(first_reads=False)

    def epoch(self, epoch: int):
        """Iterates this rank's mixed batches of `epoch` (collective: every rank iterates it);
        starts at a loaded state's step if `epoch` is its epoch.

        Yields:
            MixedBatch, one per step.
        """
        epoch_rng(self.seed, epoch)  # validates epoch
        if self._active is not None:
            self._active.close()
        self._active = gen = self._run(int(epoch))
        return gen

    def __iter__(self):
        return self.epoch(self._next[0])

    def __len__(self) -> int:
        return self.steps_per_epoch

    def _run(self, e: int):
        first = 0
        if self._resume is not None and self._resume[0] == e:
            first = self._resume[1]
        self._resume = None
        sched, src, ids = self.schedule(e)
        parts = self._source_schedules(sched, src, ids)
        gens = []
        for store, part in zip(self.stores, parts):  # each source serves its part, from the mix's step
            gens.append(store.epoch(e, schedule=part, start=first))
        try:
            for s in range(first, sched.steps):
                got = [next(g) for g in gens]  # every rank steps every source in the same order
                self._next = (e, s + 1) if s + 1 < sched.steps else (e + 1, 0)
                yield self._merge(e, s, sched, src[sched.step(s)], got)
            for g in gens:  # each source's epoch end (collective: agrees on failures, logs)
                for _ in g:
                    raise RuntimeError("a source's store served more steps than the mix planned")
            self.stats = {
                "epoch": e,
                "sources": [s.stats.as_dict() if s.stats is not None else {} for s in self.stores],
            }
        finally:
            for g in gens:
                g.close()
            self._active = None

    def _merge(self, e: int, s: int, sched: plan.Schedule, src: np.ndarray, got: list[Batch]) -> MixedBatch:
        """The rank's step `s` from each source's batch, entries in the order's positions."""
        n = src.size
        samples: list = [None] * n
        labels = np.empty(n, dtype=np.int64)
        cids = np.empty(n, dtype=np.int64)
        for k, b in enumerate(got):
            where = np.nonzero(src == k)[0]
            if where.size != len(b):
                raise RuntimeError(f"source {k} served {len(b)} samples in step {s}, the mix planned {where.size}")
            for j, x in zip(where.tolist(), b.samples):
                samples[j] = x
            labels[where] = b.labels
            cids[where] = b.ids
        return MixedBatch(samples, labels, cids, e, s, sched.pad[sched.step(s)], sources=src.copy())

    def gather_stats(self) -> list:
        """Collective: every rank's `stats` ({} before the first epoch), in rank order."""
        return self.comm.allgather(self.stats or {})

    # ----------------------------------------------------------------- state
    def state_dict(self) -> dict:
        """Where the mix is: plain ints/strs/floats/lists (torch.save-able with weights_only=True)."""
        e, s = self._next
        return {
            "version": plan.STATE_VERSION,
            "kind": STATE_KIND,
            "seed": self.seed,
            "epoch": e,
            "step": s,
            "position": s * self.batch_size,
            "batch_size": self.batch_size,
            "epoch_size": self.epoch_size,
            "drop_last": int(self.drop_last),
            "nranks": self.size,
            "sizes": self.sizes.tolist(),
            "weights": self.weights.tolist(),
            "sample_ranges": [[st.start, st.stop] for st in self.stores],
        }

    def load_state_dict(self, sd: dict) -> None:
        """Resumes at `sd`'s position (on any number of ranks).

        Raises:
            ConfigError: `sd` is not a mix's state, or was saved for other sources, weights, epoch
                size, batch size or drop_last.
        """
        cur = self.state_dict()
        if not isinstance(sd, dict) or sd.get("version") != plan.STATE_VERSION or sd.get("kind") != STATE_KIND:
            raise ConfigError("the state_dict is not a MixedStore state")
        for key in ("batch_size", "epoch_size", "drop_last", "sizes", "weights", "sample_ranges"):
            if sd.get(key) != cur[key]:
                raise ConfigError(f"state_dict[{key!r}]={sd.get(key)!r} does not match this mix's {cur[key]!r}")
        epoch, step = int(sd["epoch"]), int(sd["position"]) // self.batch_size
        if epoch < 0 or not 0 <= step <= self.steps_per_epoch:
            raise ConfigError(f"state_dict epoch={epoch} step={step} is outside [0, {self.steps_per_epoch}]")
        self.seed = check_seed(sd["seed"])
        for store in self.stores:
            store.seed = self.seed
        self._next = self._resume = (epoch + 1, 0) if step == self.steps_per_epoch else (epoch, step)

    # ----------------------------------------------------------------- lifetime
    def before_free(self, end) -> None:
        """DataStore.before_free on every source: `end` is called before the first of them frees its windows."""
        for store in self.stores:
            store.before_free(end)

    def close(self) -> None:
        """Collective: ends an open epoch and closes every source's store. Safe twice."""
        if self._active is not None:
            self._active.close()
        self._end(None)

    def _end(self, exc) -> None:
        """Closes the stores (collectively after a clean run or an agreed error, else locally only)."""
        for store in self.stores:
            if exc is None or is_agreed(exc):
                store.close()
            else:
                store.abandon()

    def __enter__(self):
        try:
            self.populate()
        except BaseException as exc:
            self._end(exc)
            raise
        return self

    def __exit__(self, exc_type, exc, tb):
        if self._active is not None:
            self._active.close()
        self._end(exc)
        return False


def _name(container) -> str:
    """A source's container for messages: its path, or an open reader's."""
    return str(getattr(container, "path", container))
