"""Where a loader stands in its epoch, as a state that resumes at exactly the next batch.

The count is of batches *delivered to the caller*, however far the workers ran ahead. Resuming
takes one of three routes, by what the loader iterates:

- a shardwise sampler (a ``DistributedSampler`` or anything with ``state_dict(consumed)``): its
  own state, at the samples delivered; O(1), and on any world size;
- any other sampler (torch's ``RandomSampler``, ``SequentialSampler``, ``BatchSampler``, ...):
  the random generator states the pass started from, and a skip of the delivered batches'
  indices (no data is loaded for them);
- an ``IterableDataset``: the random states the pass started from, and the delivered batches
  are loaded again and dropped (by as many worker processes as the saved pass had).

A Stateful dataset (or its stream's iterator) is put back by its own state instead, kept as
the pass begins (each worker reports its copy's once it made its iterator) and as each batch is
delivered: one per worker process, each worker's after its last delivered batch.

A state taken before a pass begins, or after one ends, is the start of the next pass (with the
random states it will draw from): a resume then begins the next epoch whole. So is one taken
once a pass delivered its last batch, before it saw its end (a checkpoint on an epoch's last
step), which also keeps the epoch its sampler was told: a loader resumed from it waits for its
first ``next()`` to begin, and gives the saved epoch's empty rest if the sampler's epoch is still
the saved one (as torchdata's loader resumes it), or the next epoch whole if it moved on
(Lightning sets the next epoch after ``iter()``). Per step, only a few counters move (and a
Stateful dataset's states are kept); the state is built when asked for, of plain numbers,
strings and lists.
"""

from __future__ import annotations

import copy
import warnings
from dataclasses import dataclass, field, replace
from typing import Any

from torch.utils.data import BatchSampler
from torch.utils.data.dataloader import _DatasetKind

from shardwise.loader.default_samplers import RandomSampler, SequentialSampler
from shardwise.loader.randomness import decoded, encoded, global_states, random_states
from shardwise.samplers.passes import EpochSampler

STATE_VERSION = 2  # 2: dataset states in torchdata's layout


def resumable_sampler(loader: Any) -> Any | None:
    """The sampler whose own state can place the loader: one with ``state_dict(consumed=...)``."""
    candidates = [loader.sampler]
    if isinstance(loader.batch_sampler, BatchSampler):
        # (a subclass need not have one: accelerate's skipping and sharding batch samplers)
        candidates.append(getattr(loader.batch_sampler, "sampler", None))
    for sampler in candidates:
        if callable(getattr(sampler, "state_dict", None)) and hasattr(sampler, "fingerprint"):
            return sampler
    return None


def sampler_placement(loader: Any) -> Any:
    """Where a shardwise sampler stands (None without one): its epoch, and how many times
    ``set_epoch`` began an epoch anew. A resume or a record made elsewhere no longer applies."""
    sampler = resumable_sampler(loader)
    return None if sampler is None else placement(sampler)


def placement(sampler: Any) -> tuple[Any, int]:
    """A resumable sampler's ``placement`` (one that has none: its epoch alone)."""
    return getattr(sampler, "placement", (getattr(sampler, "epoch", None), 0))


@dataclass
class PassRecord:
    """One pass of a loader: how it began and what it has delivered."""

    route: str  # "sampler", "replay" or "iterable": how a resume finds the place
    randomness: dict[str, Any] = field(default_factory=dict)  # the generators' as it began
    sampler_placement: Any = None  # the resumable sampler's, once the pass delivered a batch
    base_seed: int | None = None  # the workers' base seed, once the pass has begun (or theirs
    # already, for persistent workers' next pass)
    drew_base_seed: bool = False  # the pass drew the base seed (the first pass of its workers)
    resumed_batches: int = 0  # batches a resumed pass started after
    batches: int = 0  # delivered by this pass
    taken: int = 0  # batches of indices drawn from the sampler (delivered, or sent ahead)
    finished: bool = False
    out_of_order: bool = False
    dataset_states: dict[str, Any] | None = None  # a Stateful dataset's, after the last batch
    # With worker processes, each one's copy of a Stateful dataset: its states after the last
    # batch it delivered (None: as it started).
    worker_states: list[dict[str, Any] | None] = field(default_factory=list)
    # The workers whose states are from this pass (they reported them as it began, after making
    # their iterators, or delivered a batch, or their stream ended); the others' are where they
    # stood before the pass, and a resume starts them on it anew.
    begun: set[int] = field(default_factory=set)
    next_worker: int = 0  # the worker the next batch's task goes to (they take turns)
    ended: list[int] = field(default_factory=list)  # workers whose stream ended, in order
    # A map dataset's batches by their place in the pass (in_order=False may deliver a later one
    # first): how many of the first are all past, their indices, and the later ones past
    # already (place: indices), counted from where the pass (or its resume) began.
    prefix: int = 0
    prefix_samples: int = 0
    ahead: dict[int, int] = field(default_factory=dict)

    def moved_on(self, worker: int, states: dict[str, Any]) -> None:
        """Keep ``worker``'s dataset states as they stand within this pass."""
        self.worker_states[worker] = states
        self.begun.add(worker)

    def past(self, place: int, count: int) -> None:
        """Note the batch at ``place`` in the pass (of ``count`` indices) as past."""
        if place == self.prefix and not self.ahead:  # in order, as nearly always
            self.prefix += 1
            self.prefix_samples += count
            return
        self.ahead[place] = count
        while self.prefix in self.ahead:
            self.prefix_samples += self.ahead.pop(self.prefix)
            self.prefix += 1


def new_record(loader: Any) -> PassRecord:
    """The record of a pass about to begin (its random state taken now, before any draw)."""
    route = _route(loader, resumable_sampler(loader))
    return PassRecord(route, random_states(loader) if route != "sampler" else {})


def current(loader: Any, record: PassRecord) -> bool:
    """Whether ``record`` still describes where the loader stands (its sampler has not moved on)."""
    if record.route != "sampler" or record.sampler_placement is None:
        return True
    return sampler_placement(loader) == record.sampler_placement


def resumed_batches(loader: Any, resume: Resume | None, record: PassRecord | None) -> int:
    """Batches of this epoch delivered before a resume that the sampler's pass no longer holds."""
    if resume is not None:
        resume = resume.applied(loader)
        return resume.resumed_batches if resume.skip == 0 else 0
    if record is not None and record.route == "sampler" and current(loader, record):
        return record.resumed_batches
    return 0


def pass_batches(loader: Any, sampler: Any) -> int | None:
    """The batches of ``sampler``'s current pass, where a shardwise sampler says how many
    indices it holds (``pass_length``: a resumed one, the rest of its epoch on whatever world
    size resumed it) and the loader batches them itself; else ``None``."""
    length, own = getattr(sampler, "pass_length", None), _own_batching(loader, sampler)
    if length is None or own is None:
        return None
    size, drop_last = own
    return length // size if drop_last else -(-length // size)


def _own_batching(loader: Any, sampler: Any) -> tuple[int, bool] | None:
    """``(batch size, drop_last)`` when the loader batches ``sampler``'s indices itself (a step
    a sample without batching); ``None`` when a batch sampler of its own does."""
    batcher = loader.batch_sampler
    if batcher is None:
        return 1, False
    if type(batcher) is BatchSampler and batcher.sampler is sampler:  # batches as its length says
        return batcher.batch_size, batcher.drop_last
    return None


def loader_state(loader: Any, record: PassRecord | None, live: Any = None) -> dict[str, Any]:
    """The state of ``loader`` after what ``record`` says was delivered (``live``: the pass that
    keeps it, if still going)."""
    sampler = resumable_sampler(loader)
    unseen_end = (record is not None and record.route != "sampler" and not record.finished
                  and _delivered_all(loader, record, sampler))
    keeper = epoch_keeper(loader) if unseen_end else None
    if unseen_end and live is not None and live.record is record:
        live.look_for_end()  # the sampler's last draws, made before the next pass's states
    after_pass = False  # the dataset's own state is from after its pass ended (see Resume)
    if record is None or not current(loader, record) or unseen_end or (
            record.route != "sampler" and record.finished):
        # No pass yet, the sampler moved on, or the pass ended (or delivered its last batch,
        # as a checkpoint on an epoch's last step sees it): the state is the next pass's start,
        # so a resume begins the next epoch whole, as this loader's next pass would (a
        # sampler's own state, saved as its epoch ended, resumes with the next one too). A
        # sampler told its epoch also lets a resume give that epoch's empty rest (Resume).
        ended, record = record, new_record(loader)
        if not worker_streams(loader):  # the dataset here, as the next pass finds it
            record.dataset_states = dataset_states(loader.dataset, None)
            after_pass = ended is not None and ended.route == "iterable" and ended.finished
        record.worker_states = next_pass_states(loader, ended)
        if loader._workers is not None and loader._workers.alive:  # they go on, drawing no seed
            record.base_seed = loader._workers.base_seed
    if record.out_of_order and record.route == "iterable":
        warnings.warn("in_order=False delivered an IterableDataset's batches out of order: the "
                      "state counts the batches delivered, so a resume may repeat or skip a "
                      "few; pass in_order=True for an exact resume", stacklevel=3)
    # Plain numbers, strings and lists (and a Stateful dataset's own state): json can write it.
    # A map dataset's pass resumes after its first batches that are all past, passing over the
    # later ones delivered already.
    batches = record.resumed_batches + (record.batches if record.route == "iterable"
                                        else record.prefix + len(record.ahead))
    # Before a pass delivers anything, its state is its start: a resume begins it anew, drawing
    # its base seed again from the same random states (and so the same seed) if it drew one;
    # persistent workers' seed, drawn by an earlier pass, is kept.
    state: dict[str, Any] = {"version": STATE_VERSION, "route": record.route,
                             "batches": batches, "finished": record.finished,
                             "base_seed": (record.base_seed if batches or not record.drew_base_seed
                                           else None),
                             "drew_base_seed": record.drew_base_seed}
    if record.route != "sampler":
        state["batching"] = batching(loader)
    if record.route == "sampler":
        # A pass that delivered its whole epoch used the sampler's share, the samples a
        # drop_last batch left out too: the sampler's state then says the epoch ended.
        whole = record.finished or _delivered_all(loader, record, sampler)
        state["sampler"] = sampler.state_dict(
            consumed=getattr(sampler, "pass_length", len(sampler)) if whole
            else record.prefix_samples, **_batched(loader, sampler), **_begun(sampler, record))
    else:
        state["randomness"] = encoded(record.randomness)
        if batches and not record.finished:
            # Where the process-wide generators stand now: a resume replays the pass's own draws,
            # then puts these back, which also hold what the caller drew since (dropout, say),
            # so the rest of the epoch and the ones after it draw as this job would have.
            # (Until a resumed pass has replayed its draws, they are the ones it will put back.)
            pending = live.pending_global_states if live is not None else None
            state["randomness_now"] = encoded(global_states() if pending is None else pending)
            if record.route == "replay":  # what the sampler had drawn by then (a stream's
                state["taken"] = record.taken  # placeholders draw nothing)
    if record.ahead:
        state["ahead"] = [[place - record.prefix, count]
                          for place, count in sorted(record.ahead.items())]
        if record.route == "sampler":  # its places count batches of this size
            state["batching"] = {key: value for key, value in batching(loader).items()
                                 if key in ("batch_sampler", "batch_size")}
    if record.route == "sampler" and not loader.in_order:  # its places are this rank's own
        state["ahead_of"] = _rank_of(sampler)
    state["streams"] = streams = worker_streams(loader)
    iterable = record.route == "iterable"
    worker_states = (next_pass_states(loader, record) if record.finished
                     else list(record.worker_states))
    if streams:
        state["_snapshot"] = {"_worker_snapshots": {
            f"worker_{worker}": {"worker_id": worker, **torchdata_entry(
                states, iterable, ended=worker in record.ended and not record.finished)}
            for worker, states in enumerate(worker_states)}}
    else:
        state.update(torchdata_entry(record.dataset_states, iterable))
    if batches and not record.finished:
        state["next_worker"] = record.next_worker
        state["ended"] = list(record.ended)
    if any(worker_states) and not record.finished:
        state["begun"] = sorted(record.begun)
    if keeper is not None:
        state["end_unseen"] = {"epoch": keeper.epoch}
    if after_pass and record.dataset_states:
        state["dataset_after_pass"] = True
    return state


def _batched(loader: Any, sampler: Any) -> dict[str, Any]:
    """How the loader batches an uneven split's share, for its state: a shorter rank's whole
    share may end a step before the longer ranks' (see ``DistributedSampler.state_dict``)."""
    own = _own_batching(loader, sampler)
    if getattr(sampler, "remainder", None) != "uneven" or own is None:
        return {}  # (batched otherwise: the sampler's own rule)
    return {"batch_size": own[0], "drop_last": own[1]}


def _begun(sampler: Any, record: PassRecord) -> dict[str, Any]:
    """Whether the pass has drawn from a shardwise sampler, for its state: every index drawn,
    none delivered, is this pass's start, not the next one's (see ``state_dict``). Said only
    then, for a subclass that overrides ``state_dict(consumed)`` alone."""
    drew_only = record.taken and not record.prefix_samples
    return {"begun": True} if drew_only and isinstance(sampler, EpochSampler) else {}


def _delivered_all(loader: Any, record: PassRecord, sampler: Any) -> bool:
    """Whether a map dataset's pass delivered every batch of its epoch (its end not yet seen)."""
    if record.route == "iterable" or record.ahead:
        return False
    length = getattr(sampler, "pass_length", None)
    if record.route == "sampler" and length is not None:
        own = pass_batches(loader, sampler)  # batched otherwise: every sample of it delivered
        return record.prefix >= own if own is not None else record.prefix_samples >= length
    try:
        return record.resumed_batches + record.prefix >= len(loader)
    except TypeError:  # a sampler without a length
        return False


def batching(loader: Any) -> dict[str, Any]:
    """What a count of delivered batches means, for a resume that passes over that many: the
    loader's batches, of its sampler's order, split over as many ranks."""
    sampler, batcher = loader.sampler, loader.batch_sampler
    size, drop_last = loader.batch_size, loader.drop_last
    if batcher is not None:  # (given, or made from batch_size): it says how it batches
        sampler = getattr(batcher, "sampler", sampler)
        size = getattr(batcher, "batch_size", size)
        drop_last = getattr(batcher, "drop_last", drop_last)
    try:
        length = None if loader._dataset_kind == _DatasetKind.Iterable else len(sampler)
    except TypeError:  # a sampler without a length
        length = None
    return {"num_replicas": getattr(sampler, "num_replicas", None),
            "sampler": type(sampler).__qualname__, "samples": length,
            "batch_sampler": None if batcher is None else type(batcher).__qualname__,
            "batch_size": size, "drop_last": drop_last}


def _check_batching(saved: dict[str, Any], loader: Any, ahead_only: bool) -> None:
    """Refuse a count of batches made otherwise than this loader makes them: passing over as
    many of its own would repeat or skip samples. (``ahead_only``: only the places of the
    batches delivered ahead of earlier ones count batches; a sampler's place counts samples.)"""
    for key, now in batching(loader).items():
        if key in saved and saved[key] != now:
            hint = (f"a {saved['sampler']} resumes only on the world size it was saved on: "
                    f"resume on {saved[key]} ranks, or use shardwise.DistributedSampler, which "
                    "resumes on any" if key == "num_replicas"
                    else "build the loader as the one that saved it")
            if ahead_only:
                hint += (" (its sampler's place resumes on any batch size, but the later "
                         "batches that in_order=False delivered ahead of earlier ones are "
                         "known by their places among batches of that size)")
            raise StateMismatchError(
                f"the state counts batches of a loader with {key}={saved[key]!r}, but this one "
                f"has {key}={now!r}: passing over as many of its batches would repeat or skip "
                f"samples; {hint}")


def epoch_owner(loader: Any) -> Any | None:
    """What a trainer tells the epoch: the sampler (or batch sampler) with ``set_epoch``."""
    for owner in (loader.sampler, getattr(loader.batch_sampler, "sampler", None),
                  loader.batch_sampler):
        if callable(getattr(owner, "set_epoch", None)):
            return owner
    return None


def orders_by_epoch(loader: Any) -> bool:
    """Whether the loader's order follows the epoch a trainer tells its sampler, which reads
    it as its pass begins (torch's ``DistributedSampler``): not the loader's own samplers, which
    only note it, nor a shardwise sampler, which places its pass itself."""
    owner = epoch_owner(loader)
    return owner is not None and resumable_sampler(loader) is None and not isinstance(
        owner, (RandomSampler, SequentialSampler))


def epoch_keeper(loader: Any) -> Any | None:
    """The ``epoch_owner`` if its ``epoch`` is plain (an int, or None before it is first set)."""
    owner = epoch_owner(loader)
    epoch = getattr(owner, "epoch", None)
    return owner if epoch is None or type(epoch) is int else None


def stateful(thing: Any) -> bool:
    """Whether ``thing`` keeps a state of its own (torchdata's ``Stateful`` protocol)."""
    return not isinstance(thing, type) and callable(getattr(thing, "state_dict", None)) and \
        callable(getattr(thing, "load_state_dict", None))  # (a class has them unbound)


def keeps_states(dataset: Any, iterator: Any = None) -> bool:
    """Whether a dataset, or the iterator it gave, has a state of its own to keep."""
    return stateful(dataset) or stateful(iterator)


def dataset_states(dataset: Any, iterator: Any, *, ended: bool = False, copied: bool = True
                   ) -> dict[str, Any]:
    """The own states of a Stateful dataset and of its iterator (an IterableDataset's), as they
    stand now (``copied``: a dataset may hand out what it goes on changing; a worker's are
    pickled at once instead), and whether the stream has ``ended`` (a short last batch ends it:
    the dataset may have reset itself already).

    A dataset that is its own iterator is kept as the iterator only, as torchdata keeps it: its
    state is where its stream stands, which its ``__iter__`` sets up anew.
    """
    keep = copy.deepcopy if copied else (lambda state: state)
    states: dict[str, Any] = {}
    if stateful(dataset) and not callable(getattr(dataset, "__next__", None)):
        states["dataset"] = keep(dataset.state_dict())
    if iterator is not None and stateful(iterator):
        states["dataset_iter"] = keep(iterator.state_dict())
    if ended:
        states["ended"] = True
    return states


def torchdata_entry(states: dict[str, Any] | None, iterable: bool, *, ended: bool = False
                    ) -> dict[str, Any]:
    """One stream's dataset states, laid out as torchdata's ``StatefulDataLoader`` lays out a
    worker's (tools and tests written for its states find them where they look). A stream
    ``ended`` says so whether or not it keeps states.

    >>> torchdata_entry({"dataset_iter": {"at": 3}}, iterable=True, ended=True)
    {'dataset_state': None, 'fetcher_state': {'dataset_iter_state': {'at': 3}, 'fetcher_ended': True}}
    """
    states = states or {}
    fetcher = {"dataset_iter_state": states.get("dataset_iter"),
               "fetcher_ended": ended or bool(states.get("ended"))}
    return {"dataset_state": states.get("dataset"), "fetcher_state": fetcher if iterable else None}


def from_torchdata_entry(entry: Any) -> dict[str, Any] | None:
    """The dataset states that ``torchdata_entry`` laid out (None: it keeps none; where a stream
    that keeps none ended, the state's ``ended`` list says)."""
    if not isinstance(entry, dict):
        return None
    fetcher = entry.get("fetcher_state") or {}
    states = {"dataset": entry.get("dataset_state"),
              "dataset_iter": fetcher.get("dataset_iter_state")}
    states = {key: value for key, value in states.items() if value is not None}
    if states and fetcher.get("fetcher_ended"):
        states["ended"] = True
    return states or None


def next_pass_states(loader: Any, record: PassRecord | None) -> list[dict[str, Any] | None]:
    """The worker processes' dataset states as the next pass starts: persistent workers go on
    from where ``record`` left them (and then make a new iterator), new ones start as forked."""
    if record is None or not loader.persistent_workers:
        return [None] * worker_streams(loader)
    return list(record.worker_states)


def worker_streams(loader: Any) -> int:
    """How many copies of an IterableDataset a pass reads: one per worker process, else one."""
    return loader.num_workers if loader.worker_type == "process" else 0


def _route(loader: Any, sampler: Any | None) -> str:
    if sampler is not None:
        return "sampler"
    if loader._dataset_kind == _DatasetKind.Iterable:
        return "iterable"
    return "replay"


class StateMismatchError(ValueError, AssertionError):
    """A saved state that this loader cannot resume (an ``AssertionError`` too, as torchdata's
    ``StatefulDataLoader`` raises one)."""


@dataclass(frozen=True)
class Resume:
    """What the next pass must do to continue a saved one."""

    skip: int  # batches to pass over without delivering them again
    resumed_batches: int  # where the count of delivered batches starts
    randomness: dict[str, Any]  # the interrupted pass's starting random states
    base_seed: int | None  # None: saved before the pass began, which begins as any pass does
    # (a state from within a pass, or for persistent workers' next one, has the workers' seed)
    drew_base_seed: bool
    dataset_states: dict[str, Any]  # a Stateful dataset's (and its iterator's) own states
    worker_states: list[dict[str, Any] | None]  # the same, for each worker process's copy
    next_worker: int  # the worker whose turn it is, when the resumed pass goes on as it was
    ended: list[int]  # the workers whose stream had ended, when it goes on as it was
    ahead: dict[int, int]  # a map dataset's later batches delivered already (place: indices)
    begun: set[int]  # the workers whose states are from within the saved pass
    iterable: bool  # read from an IterableDataset (a stream, not a sampler's indices)
    streams: int | None  # the worker processes it needs: a stream's shares or a Stateful
    # dataset's states are each worker's own (None: any number)
    sampler_placement: Any = None  # a resumable sampler's, standing in the saved pass's epoch
    # Saved as its pass delivered its last batch, its end unseen: the epoch its sampler was told
    # then, in a tuple (the epoch may be None); the first next() decides (rest_is_empty).
    unseen_end_of: tuple[int | None] | None = None
    randomness_now: dict[str, Any] | None = None  # the process-wide generators' as it was saved
    taken: int | None = None  # batches of indices its sampler had drawn by then
    # How the batches it passes over were made (None: it passes over none, or its dataset is
    # put back by its own state)
    batching: dict[str, Any] | None = None
    # The stream's own state was saved after its pass ended: it is that pass's, which the
    # stream's first iterator after it is put back goes on with (an empty rest). torchdata's
    # loader makes that iterator and drops it; so does a resumed pass here.
    dataset_after_pass: bool = False
    # The batches the saved pass had delivered (the same on every rank that saved at one step,
    # or that loads one rank's state), as ranks compare them; 0 once an epoch begins anew.
    saved_batches: int = 0

    def applied(self, loader: Any) -> Resume:
        """This resume as it stands now: once the sampler stands in another epoch (``set_epoch``
        before ``iter()``, or a state saved as its epoch ended), or in the saved one begun anew
        (``set_epoch`` to another and back), that epoch begins whole, as the
        pass after the saved one: its count, early batches and workers' places no longer apply,
        and non-persistent workers draw a new seed."""
        if self.sampler_placement is None or sampler_placement(loader) == self.sampler_placement:
            return self
        persistent = loader.persistent_workers
        return replace(self, resumed_batches=0, saved_batches=0, ahead={}, begun=set(),
                       next_worker=0, ended=[], batching=None,
                       base_seed=self.base_seed if persistent else None,
                       worker_states=(list(self.worker_states) if persistent
                                      else [None] * len(self.worker_states)))

    def rest_is_empty(self, loader: Any) -> bool:
        """Whether a resume saved at an epoch's unseen end gives that epoch's empty rest: the
        sampler's epoch is still the saved one (or, as saved, never set). Else the next epoch
        begins whole, as the pass after the saved one."""
        keeper = epoch_keeper(loader)
        return self.unseen_end_of == (getattr(keeper, "epoch", None),)

    @property
    def within(self) -> bool:
        """Whether the saved pass had delivered anything (else the resume begins a pass)."""
        return self.resumed_batches > 0 or bool(self.ahead)

    def check_fit(self, loader: Any) -> None:
        """Refuse to resume on another number of worker processes than the state needs, or
        over batches made otherwise than those it counted (checked as a pass begins, since
        ``num_workers``, or a dataset's length, may be set after the state is loaded)."""
        batching = self.applied(loader).batching  # (none once its epoch begins anew)
        if batching is not None:
            _check_batching(batching, loader, ahead_only=self.sampler_placement is not None)
        streams = worker_streams(loader)
        if self.streams is None or self.streams == streams:
            return
        if self.iterable:
            saved = (f"was saved by a loader reading its IterableDataset as "
                     f"{_streams(self.streams)}, each reading its own share,")
        else:
            saved = (f"was saved with {_streams(self.streams)}, each with its own copy of the "
                     "Stateful dataset's state,")
        raise StateMismatchError(
            f"the state {saved} but this loader has {_streams(streams)}: build it with "
            + (f"num_workers={self.streams} worker processes" if self.streams
               else "num_workers=0 (or thread workers)"))

    def new_passes(self, workers: int) -> list[bool]:
        """For each worker, whether its saved states are from before the pass, so that it makes
        a new iterator after putting them back."""
        return [worker not in self.begun for worker in range(workers)]


def read_state(loader: Any, state: Any) -> Resume | None:
    """Check a saved loader state, place a resumable sampler, and say what the next pass does
    (None: it is an ordinary pass)."""
    if not isinstance(state, dict) or "route" not in state:
        raise ValueError(f"not a shardwise loader state: {state!r:.200}")
    if state.get("version") != STATE_VERSION:
        raise ValueError(f"the state was saved by another version of shardwise (its loader state "
                         f"version {state.get('version')!r}; this one reads {STATE_VERSION}): "
                         "resume it with the version that saved it")
    sampler = resumable_sampler(loader)
    route = _route(loader, sampler)
    if state.get("route") != route:
        raise ValueError(f"the state was saved by a loader that resumes by {state.get('route')!r} "
                         f"but this loader resumes by {route!r}: build it with the same kind of "
                         "dataset and sampler")
    batches, drew = int(state["batches"]), bool(state["drew_base_seed"])
    seed = None if state["base_seed"] is None else int(state["base_seed"])
    datasets = from_torchdata_entry(state) or {}
    snapshots = (state.get("_snapshot") or {}).get("_worker_snapshots") or {}
    workers = [from_torchdata_entry(snapshots.get(f"worker_{worker}"))
               for worker in range(len(snapshots))]
    # A stream's shares, and a Stateful dataset's states, fit only the copies they came from.
    streams = int(state["streams"])
    bound = route == "iterable" or bool(any(workers) or datasets) or keeps_states(loader.dataset)
    begun = state.get("begun", ())
    common = {"base_seed": seed, "drew_base_seed": drew, "dataset_states": datasets,
              "worker_states": workers, "next_worker": int(state.get("next_worker", 0)),
              "ended": [int(w) for w in state.get("ended", [])],
              "ahead": {int(place): int(count) for place, count in state.get("ahead", [])},
              "begun": {int(w) for w in begun}, "iterable": route == "iterable",
              "streams": streams if bound else None,
              "dataset_after_pass": bool(state.get("dataset_after_pass")),
              "saved_batches": batches}
    before = batches - len(common["ahead"])  # the batches before the ones passed over
    if route == "sampler":
        sampler.load_state_dict(state["sampler"])  # the sampler places the pass itself
        # The saved pass's epoch: a sampler loaded at an ended one stands at the next already.
        saved_epoch = (state["sampler"].get("epoch") if isinstance(state["sampler"], dict)
                       else None)
        saved, this = state.get("ahead_of"), _rank_of(sampler)
        if saved is not None and saved != this:
            warnings.warn(
                f"the state was saved with in_order=False by rank {saved[0]} of {saved[1]}; "
                f"this is rank {this[0]} of {this[1]}, whose batches came in another order, so "
                "its resume may repeat or skip a few: resume each rank from its own state, or "
                "use in_order=True", stacklevel=3)
            # Its places are passed over here too (which of ours were delivered is not known):
            # every rank then resumes with as many batches left, and none waits on the others.
        epoch, restarts = placement(sampler)
        places = state.get("batching") if common["ahead"] else None
        return Resume(skip=0, resumed_batches=before, randomness={},
                      sampler_placement=(epoch if saved_epoch is None else saved_epoch, restarts),
                      batching=places if isinstance(places, dict) else None, **common)
    saved_batching = state.get("batching")
    if not (batches and isinstance(saved_batching, dict)) or (
            route == "iterable" and (datasets or any(workers))):
        saved_batching = None  # it passes over none: any loader will do
    unseen = state.get("end_unseen")
    now = state.get("randomness_now")
    return Resume(skip=before, resumed_batches=before,
                  randomness=decoded(state.get("randomness", {})),
                  unseen_end_of=None if unseen is None else (unseen["epoch"],),
                  randomness_now=None if now is None else decoded(now),
                  taken=None if state.get("taken") is None else int(state["taken"]),
                  batching=saved_batching, **common)


def _rank_of(sampler: Any) -> list[Any]:
    """The rank and world size a sampler splits for (as a state records them)."""
    return [getattr(sampler, "rank", None), getattr(sampler, "num_replicas", None)]


def _streams(count: int) -> str:
    return f"{count} worker processes" if count else "one stream (no worker processes)"
