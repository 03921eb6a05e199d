"""``shardwise.DataLoader``: torch's DataLoader, argument for argument, that resumes exactly and
moves batches through shared memory instead of pickling them."""

from __future__ import annotations

import numbers
import operator
import threading
import warnings
import weakref
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

import torch
import torch.distributed as torch_dist
from torch.utils.data import DataLoader as TorchDataLoader
from torch.utils.data import Dataset, IterableDataset, Sampler
from torch.utils.data import DistributedSampler as TorchDistributedSampler

from shardwise.checks import require_choice, require_int
from shardwise.distributed.consistency import check_consistent
from shardwise.loader.default_samplers import RandomSampler, SequentialSampler
from shardwise.loader.iterator import LoaderIterator
from shardwise.loader.pools import Workers
from shardwise.loader.position import (
    PassRecord,
    Resume,
    epoch_owner,
    loader_state,
    pass_batches,
    read_state,
    resumable_sampler,
    resumed_batches,
    sampler_placement,
    worker_streams,
)
from shardwise.loader.progress import EpochBar
from shardwise.loader.stats import Clock, LoaderStats
from shardwise.samplers import DistributedSampler

WORKER_TYPES = ("process", "thread")

T_co = TypeVar("T_co", covariant=True)


class DataLoader(TorchDataLoader[T_co]):
    """torch's ``DataLoader`` with the same arguments, errors and batches, plus what it lacks.

    Replacing the import is all it takes: for the same arguments and seeds it yields the same
    batches as ``torch.utils.data.DataLoader``. On top of that:

    - ``state_dict()`` / ``load_state_dict()`` count the batches delivered to you, however far
      the workers ran ahead, and resume at exactly the next one: in O(1) through a shardwise
      sampler (on any world size), by replaying the random draws and skipping indices for
      torch's samplers. torchdata and Lightning can save it (it is ``Stateful``).
    - Worker processes return batches through reusable shared memory, collated once, in the
      worker; ``worker_type="thread"`` runs workers as threads for GIL-releasing work.
    - A worker's exception is raised here with the worker and the batch's indices; a worker that
      dies is reported with its exit code or signal at once; nothing is left behind.
    - ``device="cuda"`` copies the next batch on a side stream while you train on this one.
    - ``stats`` (throughput, time spent waiting for data), ``progress=True`` (a progress bar),
      and, with a process group up, a check at each epoch that every rank's shardwise sampler
      and batch size agree (one collective as each pass reads its order, so every rank
      iterates the loader). ``verify=True`` checks torch's ``DistributedSampler`` too (split
      over the whole group), which by default is left alone as torch leaves it (a loop on one
      rank stays possible); ``False`` skips it.
    - ``distributed=True`` builds a :class:`shardwise.DistributedSampler` from ``shuffle``,
      ``drop_last`` and ``seed`` (a ``seed`` other than 0 without it, and without a sampler of
      your own, is refused: it would seed nothing).

    Example::

        >>> loader = DataLoader(torch.arange(10), batch_size=4)
        >>> [batch.tolist() for batch in loader]
        [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    """

    # Where passes stand, set as they run (class defaults: a subclass with an __init__ of its
    # own, as torchdata's StatefulDataLoader has, still works).
    _resume: Resume | None = None
    _loaded: dict[str, Any] | None = None
    _loaded_placement: Any = None  # where its sampler stood, as the state was loaded
    _record: PassRecord | None = None
    _live: weakref.ref[LoaderIterator] | None = None  # the pass it records, while it lives
    _clock: Clock | None = None
    _workers: Workers | None = None  # persistent workers, between passes
    _pass: weakref.ref[LoaderIterator] | None = None  # the pass on them, if still alive
    _bar: EpochBar | None = None
    _datapipe_group: Any = None  # the gloo group a datapipe's shared seed is sent over

    def __init__(
        self,
        dataset: Dataset[Any],
        batch_size: int | None = 1,
        shuffle: bool | None = None,
        sampler: Sampler[Any] | Iterable[Any] | None = None,
        batch_sampler: Sampler[Sequence[Any]] | Iterable[Sequence[Any]] | None = None,
        num_workers: int = 0,
        collate_fn: Callable[[Any], Any] | None = None,
        pin_memory: bool = False,
        drop_last: bool = False,
        timeout: float = 0,
        worker_init_fn: Callable[[int], None] | None = None,
        multiprocessing_context: Any = None,
        generator: torch.Generator | None = None,
        *,
        prefetch_factor: int | None = None,
        persistent_workers: bool = False,
        pin_memory_device: str = "",
        in_order: bool = True,
        worker_type: str = "process",
        device: str | torch.device | None = None,
        progress: bool = False,
        verify: bool | None = None,
        distributed: bool = False,
        seed: int = 0,
        snapshot_every_n_steps: int | None = 1,
    ) -> None:
        # torchdata's StatefulDataLoader argument, taken so that code written for it runs
        # unchanged: here the state is built when asked for, exact at any step, so it sets nothing.
        if snapshot_every_n_steps is not None:
            require_int("snapshot_every_n_steps", snapshot_every_n_steps, minimum=0)
        self.snapshot_every_n_steps = snapshot_every_n_steps
        given = sampler if sampler is not None else getattr(batch_sampler, "sampler", None)
        if distributed and not isinstance(given, TorchDistributedSampler):
            # A distributed sampler given with it, or in a batch sampler, is kept: trainers that
            # rebuild a loader (Lightning, for predict) pass the one it made back in, with the
            # same arguments.
            if sampler is not None or batch_sampler is not None:
                raise ValueError("distributed=True builds the sampler from shuffle, drop_last and "
                                 "seed; pass a sampler or distributed=True, not both")
            if isinstance(dataset, IterableDataset):
                raise ValueError("distributed=True splits a dataset by index; split an "
                                 "IterableDataset over the ranks inside the dataset instead")
            sampler = DistributedSampler(dataset, shuffle=bool(shuffle), seed=seed,
                                         drop_last=drop_last)
        if distributed:
            shuffle = None  # the sampler shuffles
        elif sampler is None and batch_sampler is None and not _is_default_seed(seed):
            # Only the sampler distributed=True builds reads it: this loader's own would shuffle
            # from torch's global generator, in another order each run, with no word said.
            raise ValueError(f"seed={seed!r} seeds the sampler that distributed=True builds, but "
                             "this loader has distributed=False: pass distributed=True, or seed "
                             "shuffle=True with generator=torch.Generator().manual_seed(seed)")
        if sampler is None and batch_sampler is None and not isinstance(dataset, IterableDataset):
            # The samplers torch's loader would make, which also keep the epoch a trainer sets:
            # a state saved on an epoch's last batch needs it (see default_samplers).
            sampler = (RandomSampler(dataset, generator=generator) if shuffle
                       else SequentialSampler(dataset))
            shuffle = None
        worker_type = require_choice("worker_type", worker_type, WORKER_TYPES)
        try:  # torch's fails at iter() on a float, deep in its own code
            num_workers = operator.index(num_workers)
        except TypeError:
            raise TypeError(f"num_workers must be an int (0 loads batches in this process), got "
                            f"{num_workers!r}") from None
        if worker_type == "thread" and multiprocessing_context is not None:
            raise ValueError("multiprocessing_context starts worker processes, but "
                             "worker_type='thread' runs threads: pass one of them")
        super().__init__(
            dataset, batch_size, shuffle, sampler, batch_sampler, num_workers, collate_fn,
            pin_memory, drop_last, timeout, worker_init_fn, multiprocessing_context, generator,
            prefetch_factor=prefetch_factor, persistent_workers=persistent_workers,
            pin_memory_device=pin_memory_device, in_order=in_order,
        )
        # torch fails on these only at iter(): prefetch_factor=0 and a timeout without workers
        # there, a bad generator later.
        if self.num_workers:  # (batches each worker loads ahead)
            self.prefetch_factor = require_int("prefetch_factor", self.prefetch_factor)
        if self.num_workers and self.prefetch_factor == 0:
            raise ValueError(f"prefetch_factor=0 with num_workers={num_workers} gives the workers "
                             "no batch to fetch: pass prefetch_factor=1 or more (2 by default)")
        if not self.num_workers and self.timeout:
            raise ValueError(f"timeout={timeout} bounds the wait for workers, but num_workers=0 "
                             "loads batches in this process, where nothing can interrupt them: "
                             "pass num_workers=1 or more, or timeout=0")
        if generator is not None and not isinstance(generator, torch.Generator):
            raise TypeError(f"generator must be a torch.Generator, got {generator!r}")
        self.worker_type = worker_type
        self.progress = progress
        if verify is not None and not isinstance(verify, bool):
            raise TypeError(f"verify must be None, True or False, got {verify!r}")
        self.verify = verify
        self.seed = seed
        self.device = device  # as given: trainers that rebuild a loader (Lightning) read it back
        self._device = _cuda_device(device)
        self._pinning = pin_memory and _accelerator_available()

    # -- iteration -------------------------------------------------------------------------------

    def _get_iterator(self) -> LoaderIterator:
        if self.pin_memory and self.pin_memory_device:
            warnings.warn(
                "pin_memory_device is deprecated, the current accelerator will be used as the "
                f"device,ignore pin_memory_device='{self.pin_memory_device}'.", stacklevel=3)
        if self.pin_memory and not self._pinning:  # torch's own words
            warnings.warn("'pin_memory' argument is set as true but no accelerator is found, "
                          "then device pinned memory won't be used.", stacklevel=3)
        if self.num_workers and self.worker_type == "process":
            self.check_worker_number_rationality()
        kept = self._workers if self._workers is not None and self._workers.alive else None
        previous = self._pass() if self._pass is not None else None
        if previous is not None and (kept is not None or previous.waiting):
            # Its stages must not read the workers the new pass starts over; one that has not
            # begun must not start workers of its own beside the new pass's.
            previous.retire()
        current = LoaderIterator(self, kept)
        self._pass = weakref.ref(current) if self.persistent_workers else None
        return current

    def __getstate__(self) -> dict[str, Any]:
        """A copy (``copy.deepcopy``, pickling) is the same loader, at the same place, with no
        workers or pass of its own: it starts its own when iterated."""
        state = self.__dict__.copy()
        state.update(_workers=None, _pass=None, _live=None, _kept=None, _bar=None,
                     _datapipe_group=None)
        return state

    def __iter__(self) -> LoaderIterator:
        # Not torch's: it keeps the iterator to reuse persistent workers, and the iterator
        # keeps the loader; here the loader keeps only the workers, so no cycle outlives a pass
        # (only an iterator a subclass makes itself is kept, as torch keeps it).
        kept = self.__dict__.get("_kept")
        if kept is not None:  # a subclass's own iterator on persistent workers, as torch's
            kept._reset(self)
            return kept
        iterator = self._get_iterator()
        if self.persistent_workers and self.num_workers > 0:
            self._iterator = iterator
        return iterator

    @property
    def _iterator(self) -> Any:
        """Where torch keeps the iterator of persistent workers: here the live pass on them, or
        the iterator a subclass's ``_get_iterator`` made instead, kept and restarted as torch's."""
        kept = self.__dict__.get("_kept")
        if kept is not None:
            return kept
        return self._pass() if self._pass is not None else None

    @_iterator.setter
    def _iterator(self, value: Any) -> None:
        # Trainers (Lightning, as fit ends) shut persistent workers down by setting it to None,
        # as torch's own __init__ sets it: here that stops them.
        self.__dict__["_kept"] = None if isinstance(value, LoaderIterator) else value
        if value is None:
            self._let_go_of_workers()

    def _let_go_of_workers(self) -> None:
        """Stop the persistent workers, or leave them to the pass still running on them, which
        stops them when it is done (as torch's iterator keeps its workers)."""
        if self._workers is None:
            return
        live = self._pass() if self._pass is not None else None
        if live is not None and live._pool_owner is self._workers and not live._closed:
            self._workers.hand_to(live)
        else:
            self._workers.close()
        self._workers = None

    def __len__(self) -> int:
        """Batches in the epoch, as torch counts them. A pass resumed mid-epoch yields only those
        still to come. On another world size the resumed epoch's steps (those delivered before
        the resume, then the rest) differ from a fresh epoch's: more on more ranks, fewer on
        fewer. The length is the larger: Lightning keeps the length it reads after the load as
        every later epoch's step count, and ends an epoch whose loader ends sooner there."""
        whole = super().__len__()
        before = resumed_batches(self, self._resume, self._record)
        own = pass_batches(self, resumable_sampler(self)) if before else None
        return whole if own is None else max(whole, before + own)

    def set_epoch(self, epoch: int) -> None:
        """``set_epoch`` on the loader's sampler (or its batch sampler's), for one-line loops."""
        owner = epoch_owner(self)
        if owner is None:
            raise TypeError(f"this loader's sampler ({type(self.sampler).__name__}) has no "
                            "set_epoch")
        owner.set_epoch(epoch)

    # -- the position ----------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Where the epoch stands: the batches delivered so far, enough to resume at the next.

        Built when asked for; costs nothing per step. Pass it to :meth:`load_state_dict` on a
        loader built the same way (with a shardwise sampler, on any world size).
        """
        if self._record is None and self._loaded is not None:
            if sampler_placement(self) == self._loaded_placement:
                return self._loaded
            # Its sampler moved since (to another epoch, or this one begun anew): the next pass
            # begins that epoch whole.
            return loader_state(self, None)
        return loader_state(self, self._record, self._live and self._live())

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Make the next pass continue the saved one at its next undelivered batch."""
        self._resume = read_state(self, state)
        self._loaded, self._record = state, None
        self._loaded_placement = sampler_placement(self)
        self._let_go_of_workers()  # persistent workers hold another pass's seed and dataset

    @property
    def stats(self) -> LoaderStats:
        """The current (or last) pass: batches, samples per second, time waiting for data."""
        if self._clock is None or self._record is None:
            return LoaderStats(0, 0, 0.0, 0.0)
        return self._clock.stats()

    # -- hooks the iterator calls ----------------------------------------------------------------

    def _take_resume(self) -> Resume | None:
        if self._resume is not None:  # refused before it is taken: a loader mended can resume
            self._resume.check_fit(self)
        resume, self._resume = self._resume, None
        return None if resume is None else resume.applied(self)

    def _check_ranks(self, resume: Resume | None, problem: Exception | None = None) -> None:
        """Compare this rank's sampler and batching with every other rank's (one collective),
        for a pass that takes ``resume``; or, where this rank cannot begin the pass (``problem``),
        raise that on every rank that checks, so none waits for this one."""
        sampler = None
        if self.verify is not False and _group_size() > 1:
            sampler = _checked_sampler(self, torch_samplers=self.verify is True)
            if sampler is None and self.verify is True:  # every rank joins, or the others wait
                sampler = _Unsplit(self.sampler)
        if sampler is None:
            if problem is not None:
                raise problem
            return
        batching = {"batch_size": getattr(self.batch_sampler, "batch_size", self.batch_size),
                    "drop_last": getattr(self.batch_sampler, "drop_last", self.drop_last)}
        placed = callable(getattr(sampler, "fingerprint", None))  # (its place is in it)
        if not placed or not self.in_order:
            # The batches delivered before the pass: out of order, each rank's sampler stands
            # at its own place (before its first undelivered batch), so that place is left out.
            batching["resumed_after_batches"] = 0 if resume is None else resume.saved_batches
            sampler = _Unplaced(sampler) if placed else sampler
        # A rank that skips the check leaves the others waiting in it (until the process group's
        # timeout): a rank that has waited long says what to look for.
        waiting = threading.Timer(CHECK_PATIENCE_SECONDS, _say_the_check_waits, (sampler.rank,))
        waiting.daemon = True
        waiting.start()
        try:
            check_consistent(sampler, batching=batching, problem=problem)
        finally:
            waiting.cancel()

    def _on_pass_start(self, current: LoaderIterator) -> None:
        self._clock, self._record, self._loaded = current.clock, current.record, None
        self._live = weakref.ref(current)
        if self.progress:
            if self._bar is not None:  # a pass left early (break, an error): its bar goes
                self._bar.close()
            # The pass takes it down with its stages if it is left early (or dropped).
            self._bar = current._stage(EpochBar(_length(self), getattr(self.sampler, "epoch",
                                                                         None)))

    def _on_batch(self, current: LoaderIterator) -> None:
        if self._bar is not None:
            self._bar.advance()

    def _on_pass_end(self, current: LoaderIterator) -> None:
        if self._bar is not None:
            self._bar.close(self.stats)
            self._bar = None


CHECK_PATIENCE_SECONDS = 60.0
"""How long a rank waits in the check across ranks before it warns that another may skip it."""


def _say_the_check_waits(rank: int) -> None:
    warnings.warn(
        f"rank {rank} has waited {CHECK_PATIENCE_SECONDS:.0f} s for the other ranks in the "
        "loader's check that all samplers agree, made as each pass reads its order: a rank that "
        "does not iterate this loader, or whose loader skips the check (verify=False, a sampler "
        "for num_replicas=1, torch's DistributedSampler without verify=True, no distributed "
        "sampler), leaves the others waiting here. Build the loader alike on every rank and "
        "iterate it on all of them, or pass verify=False where only some ranks iterate it",
        RuntimeWarning, stacklevel=1)


def _checked_sampler(loader: DataLoader, torch_samplers: bool) -> Any | None:
    """The sampler the ranks must agree on: a shardwise sampler, or (``torch_samplers``)
    torch's DistributedSampler; for an IterableDataset, the stream that splits itself over the
    ranks (a ``ShardedIterable``, or one that a ``ShuffleBuffer`` reads)."""
    stream = loader.dataset if isinstance(loader.dataset, IterableDataset) else None
    while stream is not None and not callable(getattr(stream, "config", None)):
        stream = getattr(stream, "iterable", None)  # what a wrapper such as ShuffleBuffer reads
    if getattr(stream, "world_size", 1) == 1:
        stream = None  # split over workers only (rank 0 evaluating alone, say): nothing to compare
    for sampler in (loader.sampler, getattr(loader.batch_sampler, "sampler", None), stream):
        if getattr(sampler, "num_replicas", None) == 1 and not torch_samplers:
            return None  # it splits nothing over the ranks (rank 0 evaluating alone, say)
        if callable(getattr(sampler, "config", None)) and callable(
                getattr(sampler, "fingerprint", None)):
            return _ReadStream(sampler, worker_streams(loader)) if sampler is stream else sampler
        if torch_samplers and isinstance(sampler, TorchDistributedSampler):
            return sampler
    return None


class _ReadStream:
    """A stream as a pass reads it: split over the ranks' worker processes too, so every rank
    must have as many (a rank with another count would read other shares than the rest think)."""

    def __init__(self, stream: Any, workers: int) -> None:
        self.stream, self.rank, self.workers = stream, stream.rank, workers

    def config(self) -> dict[str, Any]:
        return {**self.stream.config(), "worker_processes": self.workers}

    def fingerprint(self) -> int:
        return self.stream.fingerprint()


class _Unplaced:
    """A sampler compared by its configuration only."""

    def __init__(self, sampler: Any) -> None:
        self.sampler, self.rank = sampler, sampler.rank

    def config(self) -> dict[str, Any]:
        return self.sampler.config()


class _Unsplit:
    """A rank whose loader splits nothing over the ranks, compared with the others all the same
    (with ``verify=True`` every rank joins the check: the ones that did would wait forever)."""

    def __init__(self, sampler: Any) -> None:
        self.rank = torch_dist.get_rank()
        self._fields = {"sampler": type(sampler).__name__}

    def config(self) -> dict[str, Any]:
        return self._fields


def _is_default_seed(seed: object) -> bool:
    """Whether ``seed`` is the default, 0 (an int, or a NumPy integer)."""
    return isinstance(seed, numbers.Integral) and not isinstance(seed, bool) and int(seed) == 0


def _group_size() -> int:
    return torch_dist.get_world_size() if torch_dist.is_available() and \
        torch_dist.is_initialized() else 1


def _length(loader: DataLoader) -> int | None:
    try:
        return len(loader)
    except TypeError:
        return None


def _accelerator_available() -> bool:
    accelerator = getattr(torch, "accelerator", None)
    if accelerator is not None:
        return accelerator.is_available()
    return torch.cuda.is_available()


def _cuda_device(device: str | torch.device | None) -> torch.device | None:
    """The CUDA device to copy batches to, or ``None`` (no device, the CPU, or no CUDA here)."""
    if device is None:
        return None
    device = torch.device(device)
    if device.type == "cpu":
        return None
    if device.type != "cuda":
        raise ValueError(f"device={str(device)!r}: batches are copied ahead to 'cuda' devices "
                         "(or left on the 'cpu')")
    if not torch.cuda.is_available():
        warnings.warn(f"device={str(device)!r} was given but CUDA is not available: batches "
                      "stay on the CPU", stacklevel=3)
        return None
    return device if device.index is not None else torch.device("cuda", torch.cuda.current_device())
