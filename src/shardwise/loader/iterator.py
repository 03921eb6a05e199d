"""One pass over a loader: tasks out to the workers, batches back in order, the count kept.

The bookkeeping follows torch's multi-process iterator: task ids in sampler order, at most
``prefetch_factor`` tasks per worker in flight, handed out round-robin, and a reorder buffer
(``in_order=True``) or first-come delivery (``in_order=False``). It draws from the random
generators in the same order as torch's, so the same seeds give the same batches.
"""

from __future__ import annotations

import itertools
import time
import warnings
import weakref
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch._utils import ExceptionWrapper
from torch.utils.data._utils.pin_memory import pin_memory as pin_batch
from torch.utils.data.dataloader import _BaseDataLoaderIter, _DatasetKind

from shardwise.loader.datapipes import draw_shared_seed, shard_for_rank, sharding_init_fn
from shardwise.loader.device import Background, ToDevice, detached
from shardwise.loader.pools import (
    ABORT_GRACE_SECONDS,
    GRACE_SECONDS,
    Event,
    ProcessPool,
    ThreadPool,
    TimedOut,
    Workers,
    WorkersLate,
    start_method_context,
)
from shardwise.loader.position import (
    PassRecord,
    Resume,
    StateMismatchError,
    dataset_states,
    keeps_states,
    new_record,
    next_pass_states,
    orders_by_epoch,
    placement,
    resumable_sampler,
)
from shardwise.loader.randomness import restore_randomness
from shardwise.loader.stats import Clock
from shardwise.loader.workers import WorkerSpec


@dataclass
class _Task:
    worker: int
    count: int  # indices behind the batch
    place: int  # the batch's place in the pass
    event: Event | None = None


@dataclass(frozen=True)
class _Failed:
    """A batch that its dataset failed to load. It keeps its place through the stages (pinning,
    the copy to the GPU) and raises when delivery reaches it; the pass goes on, as in torch."""

    error: BaseException | ExceptionWrapper  # raised here, or in a worker

    def exception(self) -> BaseException:
        """The error to raise: a worker's made as torch makes it, with no traceback yet (the
        frame that made it would hold it, a cycle that keeps a dropped pass alive)."""
        if not isinstance(self.error, ExceptionWrapper):
            return self.error
        try:
            self.error.reraise()
        except BaseException as error:  # noqa: BLE001 - every kind is the dataset's to raise
            return error.with_traceback(None)
        raise AssertionError("ExceptionWrapper.reraise returned")


class LoaderIterator(_BaseDataLoaderIter):
    """What ``iter(loader)`` returns: one pass, on the loader's persistent workers or its own.

    A torch ``_BaseDataLoaderIter`` by type only, for trainers that look for one (Lightning
    leaves such iterators out when it pickles a loader it combines); none of its machinery runs.
    """

    def __init__(self, loader: Any, workers: Workers | None = None) -> None:
        self._loader = loader
        self._num_workers = loader.num_workers
        self._auto = loader._auto_collation
        self._sampler = resumable_sampler(loader)
        self._pool_owner: Workers | None = workers
        self._pool = workers.pool if workers is not None else None
        # Stages run ahead, some in threads of their own: they stop when the pass is closed or
        # dropped (a `break` leaves no thread behind).
        self._stages: list[Any] = []
        self._stop_stages = weakref.finalize(self, _close_stages, self._stages)
        self._workers: list[Any] = []  # the worker processes (or threads), as torch lists them
        self._closed = False
        self._stopped_by: str | None = None  # what stopped the pass before its end
        self._in_stage = False  # a stage's thread takes the batches (see _wait)
        self._waiting_since: float | None = None
        self._taken: Resume | None = None  # the loaded state this pass resumes
        self._init_failed = False  # a worker_init_fn failed (reported, not a death)
        self._source: Iterator[tuple[Any, int]] | None = None
        # Ranks that disagree stop where the pass's order is read, before any worker starts: at
        # iter() for workers (or a pinning thread), at the first next() in this process (torch's
        # loader reads the sampler there, and a trainer may set the epoch between, as Lightning
        # does), and where a resumed pass that waits for it begins.
        self._unchecked = True
        # A resumed pass begins at the first next() where a trainer's epoch decides the
        # sampler's order: resuming a checkpoint, Lightning sets it after iter() (torch's loader
        # with no workers reads the order at the first next() too). For a state saved at an
        # epoch's unseen end, what it resumes is known then too.
        resume = loader._resume
        ordered_later = orders_by_epoch(loader)
        if resume is not None:  # (refused as iter() is called, wherever the pass begins)
            self._refuse_misfit(resume)
        waits = resume is not None and (resume.unseen_end_of or ordered_later)
        self._undecided = resume if waits else None
        if self._undecided is None:
            if self._num_workers or loader._pinning:
                self._check_ranks(None if resume is None else resume.applied(loader))
            self._start()

    def _refuse_misfit(self, resume: Resume) -> None:
        """Refuse a state this loader cannot resume on every rank that checks: the others would
        wait in the check for this one."""
        try:
            resume.check_fit(self._loader)
        except StateMismatchError as error:
            self._loader._check_ranks(resume.applied(self._loader), problem=error)
            raise

    def _check_ranks(self, resume: Resume | None) -> None:
        """Compare this pass with the other ranks' (one collective), as it takes ``resume``."""
        self._loader._check_ranks(resume)
        self._unchecked = False  # (refused, it is compared again if asked again)

    def _start(self) -> None:
        try:
            self._begin(first=self._pool_owner is None)
        except BaseException as error:
            self._failed_start(late=isinstance(error, WorkersLate))
            raise

    def _decide(self) -> None:
        """Begin a resumed pass, as the first ``next()`` asks. A state saved at an epoch's
        unseen end resumes as the sampler's epoch now says: the empty rest of the saved epoch
        (the pass ends here, and the next begins the epoch after it), or the next epoch whole
        (a trainer set it after ``iter()``, as Lightning does)."""
        resume, loader = self._undecided, self._loader
        self._check_ranks(resume.applied(loader) if loader._resume is resume else None)
        self._undecided = None
        if loader._resume is resume:  # (not taken by a pass made since)
            loader._resume = replace(resume, unseen_end_of=None)
            if resume.rest_is_empty(loader):
                loader._loaded = {key: value for key, value in (loader._loaded or {}).items()
                                  if key != "end_unseen"}
                self._closed = True
                return
        self._start()

    def _failed_start(self, late: bool) -> None:
        """A pass that could not start leaves the loader as it found it: the state it was to
        resume stays loaded, and workers stop, unless persistent ones only reported a failed
        ``worker_init_fn`` or were ``late`` to begin the pass (they go on, as torch's do, and
        carry their datasets' states to the next pass)."""
        loader, owner = self._loader, self._pool_owner
        if self._taken is not None and loader._resume is None:
            loader._resume = self._taken
        keep = (self._init_failed or late) and self._taken is None and loader._workers is owner
        if owner is not None and not keep:
            owner.close(ABORT_GRACE_SECONDS)
            if loader._workers is owner:
                loader._workers = None

    # -- a pass ----------------------------------------------------------------------------------

    def _begin(self, first: bool) -> None:
        loader = self._loader
        resume = self._taken = loader._take_resume()
        self.record: PassRecord = new_record(loader)
        # What len(loader) said of an IterableDataset before this pass, as torch keeps it.
        self._told_length = (loader._IterableDataset_len_called
                             if loader._dataset_kind == _DatasetKind.Iterable else None)
        # A Stateful dataset in this process is put back by its own state, which may hold the
        # random state it stood at: a state from within a pass is put back after the pass's own
        # draws are replayed (and before thread workers make its iterator), one from before a
        # pass began before them. Each worker process puts back its own copy's as it starts.
        self._processes = processes = self._num_workers > 0 and loader.worker_type == "process"
        restored = resume.dataset_states if resume is not None and not processes else {}
        # Saved workers' states fit as many workers (check_fit); with none of their own, they
        # are left for as many new ones as this loader has.
        kept = resume.worker_states if resume is not None and resume.streams is not None else None
        self.record.worker_states = (
            list(kept or next_pass_states(loader, None)) if resume is not None
            else next_pass_states(loader, loader._record if not first else None))
        self._dataset_state = restored.get("dataset")  # put back once, by _put_dataset_back
        if resume is None or not resume.within:
            self._put_dataset_back()
        self._open_indices(first, resume, restored)
        self._put_dataset_back()
        self.clock = Clock(self._num_workers)
        weakref.finalize(self, self.clock.stop)  # a pass dropped (`break`) is over too
        self._fetcher = None if self._num_workers else _DatasetKind.create_fetcher(
            loader._dataset_kind, loader.dataset, self._auto, loader.collate_fn, loader.drop_last)
        iterator = self._iterator = getattr(self._fetcher, "dataset_iter", None)
        if self._fetcher is not None:  # (threads restored theirs)
            if "dataset_iter" in restored:
                iterator.load_state_dict(restored["dataset_iter"])
            if restored.get("ended"):  # its stream ended with its last batch
                self._fetcher.ended = True
        # The dataset in this process: its states as the pass begins, then after each batch
        # fetched here or by a thread, kept when the batch is delivered.
        begun = {} if processes else dataset_states(
            loader.dataset, iterator if self._fetcher else getattr(self._pool, "iterator", None))
        self.record.dataset_states = begun or None
        self._keeps_states = bool(begun)
        # Each fetched batch's worker (None: this process), dataset states and place, with the
        # ends of worker streams passed over in order before it, until the batch is delivered.
        self._fetched: deque[tuple[int | None, Any, int, Sequence[Event]]] = deque()
        self._passed_ends: list[Event] = []
        self._sent = self._received = 0
        self._tasks: dict[int, _Task] = {}
        self._active = [w not in self.record.ended for w in range(self._num_workers)]
        self._in_flight = [0] * self._num_workers
        # Workers take turns; a resumed pass goes on with the worker whose turn it was.
        self._cycle = itertools.islice(itertools.cycle(range(self._num_workers)),
                                       self.record.next_worker, None)
        for _ in range((loader.prefetch_factor or 0) * self._num_workers):
            self._dispatch()
        # Stages take the pass's batches through a weak reference: nothing here refers back to
        # the pass, so dropping it stops its workers at once, with no garbage collection.
        if loader._pinning:  # pinned off the main thread, a few batches ahead
            self._source = self._stage(Background(_Batches(self), loader.prefetch_factor or 2))
        if loader._device is not None:
            # A batch is copied ahead only when the pinning stage has it at hand: waiting for
            # it would hold back the batch the caller asked for.
            ready = self._source.ready if isinstance(self._source, Background) else lambda: False
            self._source = self._stage(ToDevice(self._source or _Batches(self), loader._device,
                                                ready))
        loader._on_pass_start(self)

    def _put_dataset_back(self) -> None:
        """Load the dataset's saved state, if it has one still to load (and, saved after its
        pass ended, go past that pass's empty rest: see ``Resume.dataset_after_pass``)."""
        state, self._dataset_state = self._dataset_state, None
        if state is not None:
            self._loader.dataset.load_state_dict(state)
            if self._taken is not None and self._taken.dataset_after_pass:
                iter(self._loader.dataset)

    def _open_indices(self, first: bool, resume: Resume | None, restored: dict[str, Any]
                      ) -> None:
        """Start the pass's indices (and the workers), drawing as torch's loader draws.

        torch's order: a datapipe's shared seed, an iterator, the base seed, the workers, a second
        iterator and, with worker processes, a second shared seed. A resume replays the
        interrupted pass's draws from its saved random states, skips the indices of the first
        batches all delivered (and passes over later ones delivered early), and seeds new workers
        with the saved base seed.
        """
        loader = self._loader
        replay = resume is not None and bool(resume.randomness)
        if replay:  # the generators go back to where the saved pass began, and go on from there
            restore_randomness(loader, resume.randomness)
        self._shared_seed = draw_shared_seed(loader)
        if not self._processes:  # one stream in this process: it keeps this rank's shard
            shard_for_rank(loader.dataset)
        self._indices = iter(loader._index_sampler)
        if resume is None or resume.base_seed is None:  # a pass from its start
            if first:
                self._base_seed = self._draw_base_seed()
            self.record.drew_base_seed = first
        else:
            if replay and resume.drew_base_seed:
                self._draw_base_seed()  # drawn and dropped: later draws stay aligned
            if first:
                self._base_seed = resume.base_seed
            self.record.drew_base_seed = resume.drew_base_seed
        if resume is not None:
            self.record.randomness = resume.randomness or self.record.randomness
            self.record.resumed_batches = resume.resumed_batches
        if not first:  # the persistent workers' seed
            self._base_seed = self._pool_owner.base_seed
        self.record.base_seed = self._base_seed
        started: list[dict[str, Any] | None] = []  # new worker processes' states as they began
        if self._num_workers:
            if first:
                if loader._dataset_kind == _DatasetKind.Iterable:
                    self._put_dataset_back()  # before thread workers make the stream's iterator
                new_passes = (resume.new_passes(self._num_workers) if resume is not None
                              else [True] * self._num_workers)
                self._pool = self._start_pool(self.record.worker_states, new_passes, restored)
                if self._processes:
                    failure, started = self._pool.wait_started(loader.timeout or None)
                    # torch draws (and drops) one after starting them: a datapipe's is sent to
                    # every rank, which a rank whose worker_init_fn failed takes part in too.
                    draw_shared_seed(loader)
                    if failure is not None:  # raised here, at iter() (see _failed_start)
                        self._init_failed = True
                        failure.reraise()
            elif any(carried := self._pool.new_epoch(self._shared_seed, loader.timeout or None)):
                self.record.worker_states = carried  # batches fetched ahead of delivery too
            self._workers = list(getattr(self._pool, "procs", None) or self._pool.threads)
            self._indices = iter(loader._index_sampler)
        # (a replayed pass's state says what its sampler had drawn; a sampler's own state, whether
        # the pass it counts in has begun)
        self._indices = _counted(self._indices, self.record)
        skip = resume.skip if resume is not None else 0
        self._drop = 0
        if skip and loader._dataset_kind == _DatasetKind.Map:
            for _ in itertools.islice(self._indices, skip):
                pass  # the delivered batches' indices: nothing is loaded for them
        elif not (restored or any(self.record.worker_states)):
            self._drop = skip  # a stream's delivered batches are loaded again and dropped
        if resume is not None and not self._drop and self._num_workers:  # it goes on as it was
            self.record.next_worker = resume.next_worker % self._num_workers
            self.record.ended = [w for w in resume.ended if w < self._num_workers]
            if resume.within:
                self.record.begun = set(resume.begun)
        for worker, states in enumerate(started):
            if states is not None:  # its copy's, once it made its iterator: it has begun
                self.record.moved_on(worker, states)
        self._map = loader._dataset_kind == _DatasetKind.Map
        if resume is not None and self._map:  # later batches delivered already are passed over
            self.record.ahead = dict(resume.ahead)
        if replay:
            # What the saved pass had drawn from its sampler (the batches delivered, and those
            # sent ahead to workers) is drawn now, from the replayed states, before the process-
            # wide generators go back to where they stood as it was saved; a pass that had
            # delivered nothing draws its first batch now (a sampler draws lazily).
            drawn = 1 if resume.taken is None else max(resume.taken - self.record.taken, 0)
            self._indices = itertools.chain(list(itertools.islice(self._indices, drawn)),
                                            self._indices)
        # The process-wide generators as they stood when the state was saved, put back once the
        # pass's own draws are replayed (a stream's dropped batches loaded again too).
        self._randomness_now = resume.randomness_now if replay else None
        if not self._drop:
            self._caught_up()
        if self.record.ahead:
            self._indices = _placed(self._indices, set(self.record.ahead))
        else:
            self._indices = enumerate(self._indices)

    def _draw_base_seed(self) -> int:
        return int(torch.empty((), dtype=torch.int64).random_(generator=self._loader.generator)
                   .item())

    def _start_pool(self, states: list[dict[str, Any] | None], new_passes: list[bool],
                    stream_states: dict[str, Any]) -> ProcessPool | ThreadPool:
        """Start the workers: processes from their datasets' ``states`` (each then on a new
        pass, or within the saved one), threads reading a stream from its ``stream_states``."""
        loader = self._loader
        init_fn = sharding_init_fn(loader.dataset, loader.worker_init_fn)
        spec = WorkerSpec(loader.dataset, loader._dataset_kind, self._auto, loader.collate_fn,
                          loader.drop_last, init_fn, init_fn is not None or keeps_states(
                              loader.dataset), self._num_workers, loader.prefetch_factor)
        if loader.worker_type == "thread":
            pool: ProcessPool | ThreadPool = ThreadPool(spec, stream_states)
        else:
            context = start_method_context(loader.multiprocessing_context)
            pool = ProcessPool(spec, self._base_seed, self._shared_seed, context,
                               pin=loader._pinning, states=states, new_passes=new_passes)
        # Persistent workers live as long as the loader; others as long as this pass.
        owner = loader if loader.persistent_workers else self
        self._pool_owner = Workers(pool, self._base_seed, owner)
        if loader.persistent_workers:
            loader._workers = self._pool_owner
        return pool

    def _stage(self, stage: Any) -> Any:
        self._stages.append(stage)
        return stage

    # -- delivery --------------------------------------------------------------------------------

    def __iter__(self) -> LoaderIterator:
        return self

    def __next__(self) -> Any:
        if self.waiting:
            self._decide()
        elif self._unchecked and not self._closed:
            self._check_ranks(self._taken)
        if self._closed:
            if self._stopped_by is not None:  # not an end: the rest of the pass is lost
                raise RuntimeError(f"this pass ended at an earlier error ({self._stopped_by}), its "
                                   "workers with it: begin a new pass with iter(loader)")
            raise StopIteration
        while True:
            asked = time.perf_counter()
            try:
                batch, count = self._next_pair() if self._source is None else next(self._source)
            except StopIteration:
                self._note_ends(self._passed_ends)
                self.record.finished = True
                self.clock.stop()
                self._loader._on_pass_end(self)
                if not self._loader.persistent_workers:
                    self.close()
                raise
            except TimedOut:
                raise  # the pass goes on: asking again waits again
            except BaseException as error:  # a dead worker, Ctrl-C: the workers stop now
                self._stop(type(error).__name__)
                raise
            worker, states, place, ends = self._fetched.popleft()
            self._note_ends(ends)
            if self._dropped():
                continue  # a resumed stream's batch, passed already (its error told then too)
            self._advance(count, worker, place)
            if states is not None and self.record.worker_states:
                self.record.moved_on(worker, states)
                if states.get("ended"):  # a short last batch ended its stream
                    self._note_end(worker, None)
            elif states is not None:  # from this process: its dataset is the one
                self.record.dataset_states = states
            if isinstance(batch, _Failed):
                # A dataset's error fails only its batch: the pass goes on, and so does its
                # position (a resume does not read that batch again, nor the ones after it twice).
                # Nor does this frame, in the error's traceback, hold the error: a pass dropped
                # after a failed batch stops its workers at once, with no garbage collection.
                error = batch.exception()
                del batch
                try:
                    raise error
                finally:
                    del error
            self.clock.waited(time.perf_counter() - asked)
            self.clock.delivered(worker, count)
            self._loader._on_batch(self)
            if self._told_length is not None and self.record.batches > self._told_length:
                self._warn_past_length()
            return batch

    def _note_ends(self, ends: Sequence[Event]) -> None:
        """Record the ends of worker streams that delivery has passed."""
        for end in ends:
            self._note_end(end.worker, end.states)

    def _note_end(self, worker: int, states: dict[str, Any] | None) -> None:
        """Record that ``worker``'s stream ended (with its dataset's ``states`` then: a dataset
        may reset itself for its next pass as its stream ends)."""
        if worker not in self.record.ended:
            self.record.ended.append(worker)
        if states is not None:
            self.record.moved_on(worker, states)

    def _dropped(self) -> bool:
        """Whether this batch is one a resumed stream already delivered (and so is dropped)."""
        if self._drop:
            self._drop -= 1
            if not self._drop:
                self._caught_up()
            return True
        return False

    def _caught_up(self) -> None:
        """The resumed pass has replayed what the saved one had drawn: the process-wide
        generators go back to where they stood as it was saved."""
        if self._randomness_now is not None:
            restore_randomness(None, self._randomness_now)
            self._randomness_now = None

    def _advance(self, count: int, worker: int | None, place: int) -> None:
        """Count a batch (of ``count`` indices, from ``worker``, at ``place`` in the pass) as
        past: delivered, or failed and passed over."""
        self.record.batches += 1
        if self._map:  # (a stream's places are not kept: it resumes by count, or by its state)
            self.record.past(place, count)
        if worker is not None:
            self.record.next_worker = (worker + 1) % self._num_workers
        if self.record.batches == 1:  # the sampler's pass has begun: note where it stands
            self.record.sampler_placement = (None if self._sampler is None
                                             else placement(self._sampler))

    def _warn_past_length(self) -> None:
        """torch's warning: an IterableDataset gave more than its ``len`` (compared as torch does)."""
        message = (f"Length of IterableDataset {self._loader.dataset} was reported to be "
                   f"{self._told_length}(when accessing len(dataloader)), but "
                   f"{self.record.batches} samples have been fetched. ")
        if self._num_workers:
            message += ("For multiprocessing data-loading, this could be caused by not properly "
                        "configuring the IterableDataset replica at each worker. Please see "
                        "https://pytorch.org/docs/stable/data.html#torch.utils.data.IterableDataset "
                        "for examples.")
        warnings.warn(message, stacklevel=3)

    @property
    def pending_global_states(self) -> dict[str, Any] | None:
        """The process-wide generators' states a resumed pass puts back once it has replayed
        the saved pass's draws; ``None`` once it has (or if it has none to put back)."""
        return self._randomness_now

    def look_for_end(self) -> None:
        """Draw from the sampler until it ends, as the next ``next()`` would, so that a state
        taken on an epoch's last batch holds the generators as the next epoch finds them (a
        sampler may draw as it ends: torch's ``RandomSampler`` does). Worker passes draw ahead
        already; a pinning thread draws the next batch as soon as the last one is taken, and
        only it may draw from the sampler: its draw is waited for."""
        if self._fetcher is None:
            return
        pinning = next((stage for stage in self._stages if isinstance(stage, Background)), None)
        if pinning is not None:
            pinning.settle()
            return
        try:
            following = next(self._indices)
        except StopIteration:
            self._indices = iter(())
        else:  # (a sampler longer than its length says) kept for the next next()
            self._indices = itertools.chain([following], self._indices)

    def _next_pair(self) -> tuple[Any, int]:
        """The next ``(batch, indices behind it)`` in delivery order; ``StopIteration`` at the end."""
        if self._fetcher is not None:  # no workers: fetch right here
            place, index = next(self._indices)
            count = len(index) if self._auto else 1
            batch = _fetch_here(self._fetcher, index)
            self._fetched.append((None, dataset_states(
                self._loader.dataset, self._iterator, ended=getattr(self._fetcher, "ended", False))
                if self._keeps_states else None, place, _NO_ENDS))
        else:
            batch, count = self._next_from_workers()
        # torch's pinning, for what it does besides tensors (a batch's own pin_memory(), tuples
        # made lists); tensors from worker processes were copied out into pinned memory, and stay.
        if self._loader._pinning and not isinstance(batch, _Failed):
            batch = pin_batch(batch)
        try:
            return batch, count
        finally:  # a dataset error's frames here lead back to this one: it must not hold it
            del batch

    def _next_from_workers(self) -> tuple[Any, int]:
        while True:
            while self._received < self._sent:  # pass over tasks of workers whose stream ended
                task = self._tasks.get(self._received)
                if task is not None and task.event is not None and task.event.kind == "end":
                    self._passed_ends.append(task.event)
                elif task is not None and (task.event is not None or self._active[task.worker]):
                    break
                self._tasks.pop(self._received, None)
                self._received += 1
            else:
                raise StopIteration
            task = self._tasks[self._received]
            if task.event is not None:
                del self._tasks[self._received]
                self._received += 1
                return self._deliver(task)
            event = self._wait()
            if event.kind == "end":
                if self._active[event.worker]:  # its first (the tasks it had after end too)
                    self._active[event.worker] = False
                    self._tasks[event.task_id].event = event  # noted when delivery passes it
                self._dispatch()
                continue
            done = self._tasks[event.task_id]
            done.event = event
            if event.task_id == self._received:
                del self._tasks[event.task_id]
                self._received += 1
                return self._deliver(done)
            if not self._loader.in_order:
                del self._tasks[event.task_id]
                self.record.out_of_order = True
                return self._deliver(done)

    def _wait(self) -> Event:
        """The next event from the workers, within the loader's ``timeout``. A stage's thread
        waits in slices, each ending in ``_NothingYet``: between them it lets go of the pass,
        so that a pass dropped (``break``) or closed (Ctrl-C) while a slow sample is loading
        stops at once, not after it."""
        timeout = self._loader.timeout or None
        if not self._in_stage:
            event = self._pool.receive(timeout)
        else:
            now = time.monotonic()
            self._waiting_since = since = self._waiting_since or now
            left = None if timeout is None else since + timeout - now
            event = self._pool.receive(STAGE_WAIT_SECONDS if left is None
                                       else max(0.0, min(STAGE_WAIT_SECONDS, left)))
            if event is None and (left is None or left > STAGE_WAIT_SECONDS):
                raise _NothingYet
            self._waiting_since = None  # (a timeout too: asking again waits anew)
        if event is None:
            raise TimedOut(f"DataLoader timed out after {self._loader.timeout} seconds")
        self.clock.worked(event.worker, event.busy)
        return event

    def _deliver(self, task: _Task) -> tuple[Any, int]:
        self._in_flight[task.worker] -= 1
        self._dispatch()
        ends = _NO_ENDS
        if self._passed_ends:  # rare: a new list only when a stream's end was passed
            ends, self._passed_ends = self._passed_ends, []
        self._fetched.append((task.worker, task.event.states, task.place, ends))
        if task.event.kind == "error":
            return _Failed(task.event.payload), task.count
        return task.event.payload, task.count

    def _dispatch(self) -> None:
        """Send the next indices to the next worker with room, as torch's loader does."""
        if not any(self._active):
            return
        room = (self._loader.prefetch_factor * self._num_workers) // sum(self._active)
        for _ in range(self._num_workers):
            worker = next(self._cycle)
            if self._active[worker] and (self._loader.in_order or self._in_flight[worker] < room):
                break
        else:
            return
        try:
            place, index = next(self._indices)
        except StopIteration:
            return
        self._pool.submit(worker, self._sent, index)
        self._tasks[self._sent] = _Task(worker, len(index) if self._auto else 1, place)
        self._in_flight[worker] += 1
        self._sent += 1

    def __len__(self) -> int:
        return len(self._loader)

    def __getstate__(self) -> Any:
        raise NotImplementedError(f"{type(self).__name__} cannot be pickled")  # as torch's

    @property
    def waiting(self) -> bool:
        """Whether the pass waits for its first ``next()`` to begin (see ``__init__``)."""
        return self._undecided is not None and not self._closed

    def retire(self) -> None:
        """End this pass for a new one on the same persistent workers: ``next`` raises
        ``StopIteration`` from here on, and its stages stop (the workers go on)."""
        self._closed = True
        self._stop_clock()
        self._stop_stages()
        self._pool_owner = self._pool = None  # the workers are the new pass's now

    def _stop_clock(self) -> None:
        clock = getattr(self, "clock", None)  # (none before the pass began)
        if clock is not None:
            clock.stop()

    def _stop(self, cause: str) -> None:
        """End the pass early, for ``cause``: its workers stop at once."""
        self._stopped_by = cause
        self.close(grace=ABORT_GRACE_SECONDS)

    def close(self, grace: float = GRACE_SECONDS) -> None:
        """Stop the workers now (persistent ones too: the next pass starts new ones), giving
        each ``grace`` seconds to finish the sample it is on.

        The pass is over: ``next`` raises ``StopIteration`` from here on.
        """
        self._closed = True
        self._stop_clock()
        self._stop_stages()
        if self._pool_owner is not None:
            self._pool_owner.close(grace)


_NO_ENDS: tuple[Event, ...] = ()  # what most batches have passed over
STAGE_WAIT_SECONDS = 0.05  # a stage's thread lets go of the pass this often while it waits


def _fetch_here(fetcher: Any, index: Any) -> Any:
    """The batch of ``index``, or its dataset's error in its place (an IterableDataset's end is
    raised)."""
    try:
        return fetcher.fetch(index)
    except StopIteration:
        raise
    except Exception as error:  # noqa: BLE001 - any error of the dataset's fails its batch
        return _Failed(error)


def _counted(indices: Iterator[Any], record: PassRecord) -> Iterator[Any]:
    """``indices``, each batch's drawn from the sampler counted in ``record.taken``."""
    for index in indices:
        record.taken += 1
        yield index


def _close_stages(stages: list[Any]) -> None:
    for stage in reversed(stages):
        stage.close()
    stages.clear()


def _placed(indices: Iterator[Any], passed: set[int]) -> Iterator[tuple[int, Any]]:
    """Each batch's indices with its place in the pass, but those at a ``passed`` place."""
    for place, index in enumerate(indices):
        if place not in passed:
            yield place, index


class _NothingYet(Exception):
    """No batch came within a stage's slice of waiting (see ``LoaderIterator._wait``)."""


class _Batches(Iterator[tuple[Any, int]]):
    """A pass's ``(batch, count)`` pairs for a stage, through a weak reference to the pass."""

    def __init__(self, source: LoaderIterator) -> None:
        self._source = weakref.ref(source)
        source._in_stage = True

    def __next__(self) -> tuple[Any, int]:
        while True:
            source = self._source()
            if source is None or source._closed:
                raise StopIteration
            try:
                batch, count = source._next_pair()
                break
            except _NothingYet:
                del source  # for a moment the pass is the caller's alone: dropped, it ends
        if isinstance(batch, _Failed) and isinstance(batch.error, BaseException):
            detached(batch.error)  # a stage holds it: not its frames, which hold the pass
        return batch, count
