"""``ShuffleBuffer``: a local shuffle of a sequential stream (TFRecord's paradigm: read 256, draw).

A stream that cannot be shuffled globally (records read in order from files) is shuffled
locally: the first ``buffer_size`` items fill a buffer; then each new item takes the place of
one drawn at random, which is yielded; at the end the rest is yielded in random order. An item
can move at most about ``buffer_size`` places, so the buffer should span several shards' worth
of neighbours. Deterministic from ``(seed, epoch)`` and the consumer (rank and DataLoader
worker) that reads it, so that consumers draw unlike each other.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import numpy as np
from torch.utils.data import IterableDataset, get_worker_info

from shardwise.checks import require_int, require_saved_state
from shardwise.mix import mix_ints
from shardwise.samplers.passes import SEED_MAX, SEED_MIN

# 2: each consumer draws its own places, and a state says whose it is; 3: the buffer drains by
# swapping the drawn item with the last (a state read again by its count skips other items)
STATE_VERSION = 3
_STATE_KEYS = ("epoch", "seed", "buffer_size", "buffer", "rng", "yielded", "consumer", "ended")


class ShuffleBuffer(IterableDataset):
    """Shuffle ``iterable`` through a buffer of ``buffer_size`` items.

    ``state_dict()`` holds the buffer's items, the generator's state and, when ``iterable`` has
    a ``state_dict`` of its own (a :class:`ShardedIterable`), the upstream position: a resume
    continues exactly, reading nothing twice. Without one, or given the state of another rank
    or worker (Lightning gives every rank rank 0's), a resume reads this consumer's stream again
    from its start, drawing as before, and passes over as many items as the state had yielded.

    >>> sorted(ShuffleBuffer(range(10), buffer_size=4, seed=1)) == list(range(10))
    True
    """

    def __init__(self, iterable: Iterable[Any], buffer_size: int, seed: int = 0) -> None:
        self.iterable = iterable
        self.buffer_size = require_int("buffer_size", buffer_size, minimum=1)
        self.seed = require_int("seed", seed, minimum=SEED_MIN, maximum=SEED_MAX)
        self.epoch = 0
        self._epoch_set = False  # set_epoch was called: a state saved as its pass ended keeps it
        self._resume: dict[str, Any] | None = None
        self._live: dict[str, Any] | None = None  # the running pass's buffer, draws and count

    def set_epoch(self, epoch: int) -> None:
        """Shuffle the next pass with ``epoch``'s draws (and pass it on upstream)."""
        self.epoch = require_int("epoch", epoch)
        self._epoch_set = True
        if callable(getattr(self.iterable, "set_epoch", None)):
            self.iterable.set_epoch(epoch)

    def __iter__(self) -> Iterator[Any]:
        # The pass is set up now, not when the first item is asked for: a loader that puts a
        # state back and then begins a new pass makes two iterators and reads only the second,
        # and a state taken before the first item is this pass's, not the one before.
        me, consumers = _consumer(self.iterable)
        resume = self._resume
        saved = None if resume is None else resume["consumer"]
        if saved is not None and saved[1] != consumers:
            raise ValueError(
                f"the state was saved by a ShuffleBuffer read by {saved[1]} consumers (ranks x "
                f"DataLoader workers) but this pass has {consumers}: resume with as many "
                "workers, or the stream would read some items twice and others never")
        epoch = self.epoch if resume is None else resume["epoch"]
        rng = np.random.Generator(np.random.PCG64(mix_ints(self.seed, epoch, me)))
        live: dict[str, Any] = {"buffer": [], "rng": rng, "yielded": 0, "skip": 0,
                                "consumer": [me, consumers], "epoch": epoch, "ended": False,
                                "exhausted": False}
        if resume is not None:
            if "upstream" in resume and saved == [me, consumers]:  # this consumer's own
                self.iterable.load_state_dict(resume["upstream"])
                live.update(buffer=list(resume["buffer"]), yielded=resume["yielded"])
                rng.bit_generator.state = resume["rng"]
            else:  # read this consumer's stream again and pass over what was yielded
                self._check_placeable(resume.get("exhausted", False), saved, consumers)
                live.update(skip=resume["yielded"], loaded=resume)
        self._resume, self._live = None, live  # (a refusal above leaves the state loaded)
        return _shuffled(iter(self.iterable), self.buffer_size, live)

    def _check_placeable(self, exhausted: bool, saved: list[int] | None, consumers: int
                         ) -> None:
        """Refuse another consumer's state whose stream was found at its end while its rank's
        other workers went on: they took its turns, so counts of yielded items no longer match
        (as ``ShardedIterable`` refuses such a state)."""
        world_size = getattr(self.iterable, "world_size", 1)
        if exhausted and consumers > world_size:
            raise ValueError(
                f"the state is another rank's, whose consumer {saved[0]} of {saved[1]} had found "
                "its stream's end: after that its rank's other workers took its turns, unlike "
                "this rank's, so this consumer's place cannot be known from it; save a state "
                "on every rank and load each rank's own")

    def state_dict(self) -> dict[str, Any]:
        """The buffer, the draws so far and the upstream position: enough to go on exactly
        (a state loaded and not yet gone past: that state)."""
        live = self._live
        if self._resume is not None or (live and live["skip"]):
            return dict(self._resume if self._resume is not None else live["loaded"])
        state: dict[str, Any] = {"version": STATE_VERSION, "epoch": self.epoch,
                                 "seed": self.seed, "buffer_size": self.buffer_size,
                                 "buffer": [], "rng": None, "yielded": 0, "consumer": None,
                                 "ended": False, "exhausted": False}
        if live:
            state.update(epoch=live["epoch"], buffer=list(live["buffer"]),
                         rng=live["rng"].bit_generator.state, yielded=live["yielded"],
                         consumer=list(live["consumer"]), ended=live["ended"],
                         exhausted=live["exhausted"])
        if callable(getattr(self.iterable, "state_dict", None)):
            state["upstream"] = self.iterable.state_dict()
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Make the next pass continue the saved one (one saved as its pass ended gives that
        pass's empty rest, and the epoch ``set_epoch`` chose, if it was called, stays)."""
        require_saved_state(state, "ShuffleBuffer", STATE_VERSION)
        missing = [key for key in _STATE_KEYS if key not in state]
        if missing:
            raise ValueError(f"the state has no {', '.join(map(repr, missing))}: pass what "
                             "state_dict() gave")
        for key in ("seed", "buffer_size"):  # another would draw other places: repeats, losses
            if state[key] != getattr(self, key):
                raise ValueError(f"the state was saved with {key}={state[key]!r} but this "
                                 f"ShuffleBuffer has {key}={getattr(self, key)!r}: build it as "
                                 "it was when the state was saved")
        epoch = require_int("saved epoch", state["epoch"])
        saved = state["consumer"]
        if saved is not None and not (isinstance(saved, (list, tuple)) and len(saved) == 2):
            raise TypeError(f"the state's consumer is [consumer, consumers], got {saved!r}")
        if not (state["ended"] and self._epoch_set):
            self.epoch = epoch
        self._live = None
        # Put back as the pass begins, which knows its consumer: another's upstream position
        # (another rank's, as Lightning gives every rank) is not this consumer's.
        self._resume = None if state["rng"] is None else {  # (None: saved before any pass)
            **state, "epoch": epoch,
            "consumer": None if saved is None else [int(saved[0]), int(saved[1])]}
        if self._resume is None and "upstream" in state:
            self.iterable.load_state_dict(state["upstream"])


def _consumer(iterable: Iterable[Any]) -> tuple[int, int]:
    """``(this consumer, all consumers)`` of the stream: its ``ShardedIterable``'s rank and
    DataLoader worker, else this worker among the loader's."""
    if callable(getattr(iterable, "consumer", None)):
        return iterable.consumer()
    worker = get_worker_info()
    return (0, 1) if worker is None else (worker.id, worker.num_workers)


def _shuffled(items: Iterator[Any], size: int, live: dict[str, Any]) -> Iterator[Any]:
    """``items`` through the buffer of ``size`` in ``live`` (with its draws and count), passing
    over the first ``live["skip"]`` that come out."""
    buffer, rng = live["buffer"], live["rng"]

    def passed_over() -> bool:
        live["yielded"] += 1
        if live["skip"]:
            live["skip"] -= 1
            return True
        return False

    for item in items:
        if len(buffer) < size:
            buffer.append(item)
            continue
        slot = int(rng.integers(len(buffer)))
        out, buffer[slot] = buffer[slot], item
        if not passed_over():
            yield out
    while buffer:
        # The drawn item swaps places with the last, which goes: list.pop(slot) would move
        # every item after the slot, quadratic in the buffer (seconds a pass at 10^5 items).
        slot = int(rng.integers(len(buffer)))
        buffer[slot], buffer[-1] = buffer[-1], buffer[slot]
        out = buffer.pop()
        live["ended"] = not buffer  # (a state taken on the last item has seen the end)
        if not passed_over():
            yield out
    if live["skip"]:  # this stream ended before the other consumer's count: not in step
        me, consumers = live["consumer"]
        raise ValueError(
            f"consumer {me} of {consumers} yielded its whole stream ({live['yielded']} items) "
            f"before the {live['yielded'] + live['skip']} that the state says were yielded: "
            "its consumer did not take as many batches as this one, so this consumer's place "
            "cannot be known from it; save a state on every rank and load each rank's own")
    # Asked for more after its last item: a loader's other workers take this one's turns now.
    live["ended"] = live["exhausted"] = True
