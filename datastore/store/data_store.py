"""`DataStore`: a container spread over the memory of the ranks of a communicator, served as
shuffled mini-batches with MPI one-sided gets.

Rules a user can rely on (the arithmetic is in dstore.order.plan and dstore.order.shuffle):

* Order: the epoch's global order is a pure function of (seed, epoch); global batch s is its
  positions ``[s*B, (s+1)*B)`` and rank r takes the contiguous part ``[n*r//P, n*(r+1)//P)`` of it
  (per-rank batch sizes differ by at most one when P does not divide B). The global order and the
  batches do not depend on the number of ranks P.
* Steps: every rank takes ``steps_per_epoch`` steps: ``N // B`` with drop_last (the order's last
  ``N % B`` samples are not served that epoch; a new order next epoch), else ``ceil(N / B)`` with
  a short last batch.
* Padding: when a step holds fewer samples than ranks (only a short last batch), a rank whose part
  is empty gets one repeated sample flagged ``Batch.pad``; no rank ever gets an empty batch.
* ``local``: each rank serves only the samples it owns (no traffic), dealt over the same number of
  steps (its batch sizes are its sample count over the steps, so ranks' batch sizes follow their
  share of the data); ``partial``: the same after a fraction of slots exchange contents. Both
  deliver every sample exactly once per epoch, with or without drop_last.
* Resumption: ``state_dict()`` holds (seed, epoch, step, position in the global order). Under
  ``global`` a resumed epoch continues the same order on any number of ranks, nothing lost or
  repeated. Under ``local``/``partial`` the same holds on the same number of ranks; on another
  number the resumed epoch continues at the same step of the new ranks' orders (samples may be
  repeated or missed in that one epoch; a warning is logged), later epochs are exact.
* Data larger than the memory budget (``overflow="serve"``, the default): each rank keeps a
  seeded random subset of its samples in its window and the rest are read from the container by
  the rank that delivers them, ahead of need (dstore.order.tiers, dstore.store.storage). None of the
  rules above depends on residency.
* Fields: with ``fields=[...]`` each batch also carries those fields' values of its samples
  (``Batch.fields``), held in the ranks' memory beside the samples and served from the same owners
  (dstore.store.fieldstore); order, exactly-once and resumption are the samples'.
* Failure: every collective step first agrees that no rank failed (dstore.runtime.collective); a read
  error on one rank is raised on every rank, naming the container and the samples.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import time
import warnings
import weakref

from dstore.errors import ConfigError
from dstore.formats import open_container
from dstore.formats.base import ContainerReader
from dstore.memory.budget import index_bytes
from dstore.memory.limits import parse_bytes
from dstore.order import plan, tiers
from dstore.order import policy as policy_mod
from dstore.order import shuffle as shuffle_mod
from dstore.runtime import job, rc
from dstore.runtime.collective import AGREED, agree, gather_ints, is_agreed
from dstore.runtime.progress import ProgressThread
from dstore.runtime.watchdog import guarded
from dstore.store import budget as budget_mod
from dstore.store import fieldstore, storeplan
from dstore.store import populate as populate_mod
from dstore.store import stream as stream_mod
from dstore.store.config import StoreConfig
from dstore.store.epoch import Batch as Batch  # re-exported: dstore.store.data_store.Batch
from dstore.store.epoch import EpochRun, EpochStats
from dstore.store.index import NodeIndex, served_range
from dstore.store.populate import Windows
from dstore.store.storeplan import StorePlan

log = logging.getLogger("dstore.store")

POPULATIONS = tiers.POPULATIONS

_AUTO_PROGRESS = 0.002
"""The progress thread's period where one is needed: bounds a get's wait at about 2 ms for a few
microseconds of CPU per call (docs/reliability.md)."""


class DataStore:
    """A data set held in the memory of all ranks of `comm`, served as shuffled batches.

    Construction and population are collective over `comm`; so are `close()`, `gather_stats()`
    and iterating an epoch (every rank iterates the same epochs). Use as a context manager: a
    clean exit frees the windows collectively; an exception leaves them to MPI_Finalize, because
    another rank may never reach the collective free (the job is expected to end; see
    `python -m mpi4py` and the CLI's abort_on_error).

    Attributes:
        plan: what the store is, one frozen value (a dstore.store.storeplan.StorePlan: rank, sizes,
            offsets, layout, steps, config) that the modules serving it take as an argument (NOTE
            [ The store as values ]); these attributes read it:
        steps_per_epoch, num_samples, info (ContainerInfo), rank, size, seed, layout (plan.Layout).
        tier: {resident_fraction, resident_bytes, storage_bytes}: the bytes kept in the windows and
            the bytes read from storage per epoch (all samples resident unless over budget).
        stats: this rank's figures for the current or last epoch (a dstore.store.epoch.EpochStats; None
            before the first; `as_dict()` for a plain dict): steps, samples (local: its own
            window; node: a node peer's window, mapped; remote: fetched with gets; pads), bytes
            (local/node/remote), gets (one per coalesced run), wait_seconds (time the
            consumer was blocked in the store), fetch_seconds (planning, issuing and completing
            gets), get_wait_seconds, epoch_seconds, delivered_GBps; with data over the budget,
            samples_storage / bytes_storage (served from the container), storage_reads (one per
            coalesced run) and storage_wait_seconds; and the store's population
            so far (population_seconds, population_bytes, population_MBps). Logged at INFO
            ("dstore.store") at the end of each epoch.
        windows: what the population built (a dstore.store.populate.Windows: the windows, the peers'
            views, the resident and loaded masks, the storage reader, the population's figures),
            None before the population and after close.
        budget_source: what set the memory budget (named in a MemoryBudgetError).
        fail_fast: False (default): a read failing mid-epoch is raised on every rank at the epoch's end;
            True: at once, on its rank only (for jobs that abort on any rank's error, as `dstore train`).

    Samples are served as read-only views: local ones straight from this rank's window, those of
    another rank on the same node straight from its window where the MPI library shares it
    (`node_views`; no copy either), remote ones from receive buffers (`prefetch + 1` of them,
    reused in turn).

    Args:
        comm: an mpi4py communicator (any, e.g. a trainer's sub-communicator or COMM_SELF).
        container: a path (opened with dstore.formats.open_container and closed by the store)
            or an open ContainerReader (left open).
        config: a dstore.store.config.StoreConfig, or None to build one from `options`.
        **options: StoreConfig's fields as keywords (`batch_size` is required), each documented
            there: batch_size, seed, shuffle, partial_fraction, population, replicate, prefetch,
            drop_last, sample_range, memory_budget, node_views, overflow, storage_lookahead,
            storage_threads, population_threads, progress_period, fields (the container's extra
            fields held and served with the samples: each batch's `fields`, dstore.store.fieldstore).
            The validated, normalised arguments are kept as `config`.
    """

    def __init__(self, comm, container, config: StoreConfig | None = None, /, **options):
        self._job = job.arm()  # torchrun refused; an uncaught exception aborts the job while open
        self.comm = comm
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        self._owns_container = False  # `container` is set by _setup, closed by close() if opened here
        exc = None
        try:  # an argument bad on one rank only must fail every rank, not leave them in populate()
            if config is None:
                config = StoreConfig.from_options(options)
            elif options:
                raise ConfigError(f"DataStore takes a StoreConfig or keywords, not both ({', '.join(options)})")
            self._setup(container, config)
        except Exception as e:  # noqa: BLE001 - every rank must learn of it, or they would wait forever
            exc = e
        try:
            agree(comm, exc)  # NOTE [ Store agreement protocol ], 1
            self._index = NodeIndex(comm, self.container, self.start, self.stop)  # collective, agreed
        except BaseException:
            self._close_container()
            raise
        try:
            if self._config.fields:  # collective, agreed; fields not asked for cost nothing
                self._fields = fieldstore.ServedFields(comm, self.container, self.start, self.stop, self._config.fields)
        except BaseException:
            self._index.free()  # agreed: every rank is here
            self._close_container()
            raise
        exc = None
        try:
            self._init_index()
        except Exception as e:  # noqa: BLE001 - as above
            exc = e
        try:
            agree(comm, exc)
        except BaseException:
            if self._fields is not None:
                self._fields.free()
            self._index.free()  # agreed: every rank is here
            self._close_container()
            raise

    def _setup(self, container, config: StoreConfig) -> None:
        cfg = config.checked(self.size)
        if isinstance(container, ContainerReader):
            reader, owns = container, False
        elif isinstance(container, (str, os.PathLike)):
            # Attributes only: one rank per node reads the index (dstore.store.index.NodeIndex)
            reader, owns = open_container(container, index=False), True
        elif isinstance(container, (list, tuple)):
            raise ConfigError(
                f"container={container!r}: containers mixed by weight are served by "
                f"dstore.MixedStore(comm, [(path, weight), ...], ...)"
            )
        else:
            raise ConfigError(f"container={container!r} must be a path or a ContainerReader")
        self.container, self._owns_container = reader, owns
        self._index = None
        self._fields: fieldstore.ServedFields | None = None
        try:
            self.start, self.stop = served_range(reader, cfg.sample_range)
            self._config = dataclasses.replace(cfg, sample_range=(self.start, self.stop))  # as ranks compare it
            fieldstore.check_names(reader, cfg.fields)
        except BaseException:
            self._close_container()
            raise
        self.info = reader.info
        self.windows: Windows | None = None  # set by populate(), the one place (dstore.store.populate)
        self.fail_fast = False
        self._resume: tuple[int, int] | None = None
        self._next = (0, 0)
        self._active = None
        self._readers: list[weakref.WeakMethod] = []  # before_free's: ended before the windows are freed
        self._closed = False
        self._failed = False  # an agreed failure was raised on every rank: skip further agreements
        self._progress = None  # its ProgressThread while it holds windows, where one is needed
        self.stats: EpochStats | None = None  # set by each epoch

    # ----------------------------------------------------------------- set-up
    def _init_index(self) -> None:
        """The served samples' arrays (from the node's shared index) and the plan built on them."""
        index = self._index  # opened by __init__ just before; closed only by close()
        assert (
            index is not None and index.offsets is not None and index.labels is not None and index.checksums is not None
        )
        c = self.container
        reader_index = index_bytes(int(c.num_samples), bool(getattr(c, "index_on_demand", False)))
        self.plan: StorePlan = storeplan.build(
            self.rank,
            self.size,
            self._config,
            self.start,
            self.stop,
            index.offsets,
            index.labels,
            index.checksums,
            index.base_byte,
            reader_index,
        )
        if self._fields is not None:  # its window and a step's buffer, counted in the budget
            self.plan = dataclasses.replace(self.plan, field_bytes=self._fields.budget_bytes(self.plan))

    # The plan's values, as the store's attributes (NOTE [ The store as values ] in dstore.store.storeplan)
    config = property(lambda self: self.plan.config, doc="The validated arguments (a StoreConfig).")
    batch_size = property(lambda self: self.plan.batch_size)
    policy = property(lambda self: self.plan.policy, doc="The shuffle policy (`shuffle=`).")
    partial_fraction = property(lambda self: self.plan.partial_fraction)
    population = property(lambda self: self.plan.population)
    replicate = property(lambda self: self.plan.replicate)
    prefetch = property(lambda self: self.plan.prefetch)
    drop_last = property(lambda self: self.plan.drop_last)
    node_views = property(lambda self: self.plan.node_views)
    overflow = property(lambda self: self.plan.overflow)
    storage_lookahead = property(lambda self: self.plan.storage_lookahead)
    storage_threads = property(lambda self: self.plan.storage_threads)
    population_threads = property(lambda self: self.plan.population_threads)
    progress_period = property(lambda self: self.plan.config.progress_period)
    offsets = property(lambda self: self.plan.offsets)
    labels = property(lambda self: self.plan.labels)
    checksums = property(lambda self: self.plan.checksums)
    base_byte = property(lambda self: self.plan.base_byte)
    sizes = property(lambda self: self.plan.sizes)
    num_samples = property(lambda self: self.plan.num_samples)
    steps_per_epoch = property(lambda self: self.plan.steps_per_epoch)
    bounds = property(lambda self: self.plan.bounds)
    layout = property(lambda self: self.plan.layout)
    tier = property(lambda self: self.plan.tier)
    budget_source = property(lambda self: self.plan.budget_source)
    fields = property(
        lambda self: self.plan.config.fields,
        doc="The extra fields the store holds and serves with its samples (`fields=`).",
    )

    @property
    def seed(self) -> int:
        return self.plan.seed

    @seed.setter
    def seed(self, seed: int) -> None:
        """Serves later epochs in `seed`'s orders (a loaded state's; a mix sets its sources')."""
        seed = shuffle_mod.check_seed(seed)
        self.plan = dataclasses.replace(self.plan, config=dataclasses.replace(self.plan.config, seed=seed))

    def tier_overhead(self) -> int:
        """Bytes of buffers a rank holds when the data exceed its budget (receive and storage
        buffers): a budget of this plus f times a rank's share keeps about a fraction f resident."""
        return budget_mod.tier_buffers(self.plan, budget_mod.receive_buffers(self.plan))

    def memory_needs(self) -> tuple[int, int]:
        """(bytes to hold all this rank's samples with its buffers, the least it can serve with: the
        buffers alone); before population, no communication (for `limit_memory`'s callers)."""
        return budget_mod.memory_needs(self.plan)

    def limit_memory(self, budget, source: str = "memory_budget argument") -> None:
        """Sets this rank's memory budget (as `memory_budget=`, `source` naming it), before population."""
        if self.windows is not None:
            raise ConfigError("limit_memory() after the population: the windows are sized already")
        cfg = dataclasses.replace(self.plan.config, memory_budget=parse_bytes(budget))
        self.plan = dataclasses.replace(self.plan, config=cfg, budget_source=source)

    def populate(self, *, first_reads: bool = True) -> None:
        """Collective: checks the budget, allocates the windows and (preload/replicate) fills them
        (dstore.store.populate). With population="stream", `first_reads` reads the first step of the
        store's own schedule ahead of the block (False: a MixedStore's source, whose steps are the
        mix's)."""
        if self.windows is not None:
            return
        if self._closed:
            raise ValueError("the DataStore is closed")
        w = self.windows = populate_mod.populate(self.plan, self.comm, self.container)
        if self._fields is not None:
            try:  # collective, agreed: a damaged value is raised on every rank before anything is served
                t0 = time.perf_counter()
                n = self._fields.populate(self.comm, self.container, self.plan.bounds, self.rank, self.node_views)
                w.add_population(time.perf_counter() - t0, n)
            except BaseException:
                self._free_windows()  # agreed: every rank is here
                raise
        self.plan = dataclasses.replace(self.plan, layout=w.layout, tier=w.tier)  # over budget: the resident samples'
        if self.population == "stream" and w.resident is None and not self.replicate:
            # the block read in the background (dstore.store.stream), in the order of the epoch served first
            epoch, step = self._resume if self._resume is not None else (0, 0)
            first = (step, self.plan.schedule(epoch)) if first_reads else None
            w.stream = stream_mod.start(self.plan, self.comm, self.container, w.arena, w.checks, epoch, first)
        self._start_progress()

    @property
    def resume_at(self) -> tuple[int, int] | None:
        """(epoch, step) where a loaded state_dict resumes, until that epoch starts; else None."""
        return self._resume

    def _begin(self, e: int, start: int | None = None) -> int:
        """Collective: the first step of epoch `e` (`start` if given, else a loaded state's if `e` is
        its epoch; the state is used up), the same on every rank or all raise (`_check_same_epoch`)."""
        first = 0
        if start is not None:
            first = int(start)
        elif self._resume is not None and self._resume[0] == e:
            first = self._resume[1]
        self._resume = None
        self._check_same_epoch(e, first)
        return first

    def _advance(self, e: int, s: int, steps: int) -> None:
        """Records step `s` of epoch `e` (of `steps`) as the next to serve (what state_dict saves)."""
        self._next = (e, s) if s < steps else (e + 1, 0)

    def _start_progress(self) -> None:
        """Starts the progress thread where other ranks' gets need this rank's progress engine."""
        period = self.progress_period
        if period is None:
            topo = self.windows.topology if self.windows is not None else None
            remote = (topo is not None and not topo.single_node) or rc.MPICH_NOLOCAL.get()
            period = _AUTO_PROGRESS if (remote and not self.replicate) else 0.0
        if period <= 0 or self.windows is None:
            return
        try:
            self._progress = ProgressThread(self.comm, period).start()
        except ConfigError as exc:  # not MPI_THREAD_MULTIPLE: gets complete at this rank's next MPI call
            if self.progress_period is not None:
                raise
            log.warning("rank %d: no progress thread (%s)", self.rank, exc)

    def _agree(self, exc) -> None:
        """Collective (dstore.runtime.collective.agree): raises on every rank if `exc` is set on any."""
        try:
            agree(self.comm, exc)
        except BaseException:
            self._failed = True
            raise

    # ----------------------------------------------------------------- epochs
    def schedule(self, epoch: int) -> plan.Schedule:
        """This rank's deliveries in `epoch` (pure; no communication; StorePlan.schedule). Under
        ``global`` and ``local`` only this rank's part of the order is built (O(N/P) memory)."""
        return self.plan.schedule(epoch)

    def epoch(self, epoch: int, *, schedule: plan.Schedule | None = None, start: int | None = None):
        """Iterates this rank's batches of `epoch` (collective: every rank iterates it).

        Starts at the step a loaded state_dict recorded if `epoch` is that state's epoch.

        Args:
            epoch: the epoch.
            schedule: this rank's deliveries instead of the store's own (a MixedStore's source: its
                part of the mixed epoch, any ids, steps may be empty; dstore.store.mixed).
            start: the first step instead of a loaded state's (a MixedStore's source, resumed with
                the mix, which checked the state).

        Yields:
            Batch, one per step.
        """
        shuffle_mod.epoch_rng(self.seed, epoch)  # validates epoch
        if self._active is not None:
            self._active.close()
        gen = self._serve(int(epoch), schedule, start)  # a generator: nothing runs before the first next()
        self._active = gen
        return gen

    def _serve(self, e: int, schedule: plan.Schedule | None, start: int | None):
        """Epoch `e`'s EpochRun (dstore.store.epoch) on the windows, recording where it is: the store is
        the one writer of its position, its stats and its failed state."""
        self.populate(first_reads=schedule is None)  # a given schedule (a mix's) is not the store's own
        if self.windows is None:  # populate() raises instead
            raise ValueError("the DataStore is closed")
        first = self._begin(e, start)
        run = EpochRun(self.plan, self.comm, self.container, self.windows, e, first, schedule, self.fail_fast)
        batches = None
        fields = self._fields
        try:
            steps = run.start().steps
            self.stats = run.stats
            self._advance(e, first, steps)
            batches = iter(run)
            with fields.reading() if fields is not None else contextlib.nullcontext():
                for batch in batches:
                    if fields is not None:  # the batch's values from their owners' windows (dstore.store.fieldstore)
                        batch.fields = fields.fetch(batch.ids - self.start, self.rank)
                    self._advance(e, batch.step + 1, steps)
                    yield batch
        finally:
            if batches is not None:
                batches.close()  # an abandoned epoch completes its gets before it unlocks the windows
            if run.agreement_failed:
                self._failed = True

    def __iter__(self):
        return self.epoch(self._next[0])

    def _check_same_epoch(self, e: int, first: int) -> None:
        """Collective: every rank iterates the same epoch from the same step, or all raise ConfigError
        (ranks in different epochs would serve wrong batches without any other error)."""
        # the ranks' epochs ended unevenly: the first ones here wait asleep, not spinning
        rows = gather_ints(self.comm, (e, first))  # NOTE [ Store agreement protocol ], 4
        if any(r != rows[0] for r in rows):
            odd = next(i for i, r in enumerate(rows) if r != rows[0])
            exc = ConfigError(
                f"ranks iterate different epochs: rank 0 epoch {rows[0][0]} from step {rows[0][1]}, "
                f"rank {odd} epoch {rows[odd][0]} from step {rows[odd][1]}; every rank must iterate "
                f"the same epochs (and load the same state_dict)"
            )
            setattr(exc, AGREED, True)  # every rank saw the same rows
            raise exc

    def gather_stats(self) -> list:
        """Collective: every rank's `stats` as a dict (`EpochStats.as_dict`; {} before the first
        epoch), in rank order."""
        with guarded("a gather of the store's stats"):  # NOTE [ Waits on another node ]
            return self.comm.allgather(self.stats.as_dict() if self.stats is not None else {})

    # ----------------------------------------------------------------- state
    def state_dict(self) -> dict:
        """Where the store is: plain ints/strs/floats (torch.save-able with weights_only=True)."""
        e, s = self._next
        return {
            "version": plan.STATE_VERSION,
            "seed": self.seed,
            "epoch": e,
            "step": s,
            "position": self.plan.order_policy.position(s, self.batch_size),
            "batch_size": self.batch_size,
            "num_samples": self.num_samples,
            "shuffle": self.policy,
            "partial_fraction": self.partial_fraction,
            "drop_last": int(self.drop_last),
            "nranks": self.size,
            "sample_start": self.start,
            "sample_stop": self.stop,
        }

    def load_state_dict(self, sd: dict) -> None:
        """Resumes at `sd`'s position: the next `epoch(sd["epoch"])` starts at its step.

        Raises:
            ConfigError: `sd` is not a store state, or it was saved for another data set, batch
                size, policy or drop_last.
        """
        epoch, step = policy_mod.resume_point(sd, self.state_dict(), self.steps_per_epoch)
        if not self.plan.order_policy.one_order and step and int(sd["nranks"]) != self.size:
            warnings.warn(
                f"resuming a {self.policy!r}-shuffled epoch saved on {sd['nranks']} ranks on "
                f"{self.size}: epoch {epoch} may repeat or miss samples; later epochs are exact",
                RuntimeWarning,
                stacklevel=2,
            )
        self.seed = sd["seed"]  # checked by the setter
        self._resume = (epoch, step)
        self._next = (epoch, step)

    # ----------------------------------------------------------------- lifetime
    def _stop_progress(self) -> None:
        progress, self._progress = self._progress, None
        if progress is not None:
            progress.stop()

    def _close_container(self) -> None:
        if self._owns_container:
            self.container.close()

    def close(self) -> None:
        """Collective: ends an open epoch (and the epochs of the readers registered with before_free),
        agrees that no rank failed (else raises that rank's error on every rank, after freeing), frees
        the windows, closes a container it opened. Safe twice."""
        self._close(release=True)

    def before_free(self, end) -> None:
        """Registers `end`, a bound method called (once) before this store frees its windows: a reader
        of the windows' memory outside this process's code (a StoreLoader's decode workers read samples
        in place, dstore.loader.vmread) ends its epoch there, so that nothing reads freed memory even
        when the store is closed first. Held weakly: a reader gone needs no call."""
        self._readers.append(weakref.WeakMethod(end))

    def _end_readers(self) -> None:
        readers, self._readers = self._readers, []
        for ref in readers:
            end = ref()
            if end is not None:
                end()

    def _close(self, *, release: bool) -> None:
        """close(); `release`: give the exception hook back (not while an agreed error is on its way
        up through `__exit__`, nor after one was raised here: the hook prints it once and ends the job)."""
        self._closed = True
        pending = None
        try:
            self._end_readers()  # before the epoch and the windows: they may still read them
        except BaseException as exc:  # noqa: BLE001 - raised below, once the windows are freed (a collective)
            pending = exc
        if self._active is not None:
            self._active.close()
            self._active = None
        try:
            if self.windows is not None and not self._failed:
                self._agree(self.windows.end_stream())  # a rank that failed mid-epoch waits here: meet it
        finally:
            self._free_windows()
            if self._fields is not None:
                self._fields.free()  # collective, like the windows
            if self._index is not None:
                self._index.free()  # collective over the node, like the windows
            self._close_container()
            self._owns_container = False
        if pending is not None:
            raise pending
        if release and not self._failed:
            self._job.release()  # only when no rank failed: an agreed error keeps the hook on its way up

    def _free_windows(self) -> None:
        """Collective: frees the windows (the fields' too) and the node communicator (safe twice)."""
        self._stop_progress()
        windows, self.windows = self.windows, None
        if windows is not None:
            windows.free()
        if self._fields is not None:
            self._fields.free_windows()

    def __enter__(self):
        try:
            self.populate()
        except BaseException:
            # An agreed failure has freed the windows on every rank already; any other leaves
            # them to MPI_Finalize, since another rank may never reach a collective free.
            self.abandon()
            raise
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None or (exc is not None and is_agreed(exc)):  # NOTE [ Store agreement protocol ], 6
            self._close(release=exc_type is None)  # every rank raised the same agreed error, so every rank is here
        else:
            # Another rank may never reach the collective free: release what is local only, so
            # the exception reaches the top (where `python -m mpi4py` or the CLI ends the job)
            # instead of hanging in Win.Free.
            self.abandon()
        return False

    def abandon(self) -> None:
        """Local-only teardown after an error (not collective; a MixedStore's sources after one):
        ends an open epoch, drops the windows unfreed."""
        self._closed = True
        if self._active is not None:
            self._active.close()
            self._active = None
        if self.windows is not None:
            log.debug("rank %d: leaving the store's windows to MPI_Finalize after an error", self.rank)
        self._stop_progress()
        windows, self.windows = self.windows, None
        if windows is not None:
            windows.abandon()  # local: nothing writes into the windows from here on
        if self._fields is not None:
            self._fields.abandon()
        if self._index is not None:
            self._index.abandon()
        self._close_container()
        self._owns_container = False

    def __len__(self) -> int:
        return self.steps_per_epoch
