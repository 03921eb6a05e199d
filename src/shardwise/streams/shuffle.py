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

from shardwise.checks import require_int
from shardwise.mix import mix_ints
from shardwise.samplers.passes import SEED_MAX, SEED_MIN

STATE_VERSION = 1


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
        self._resume: dict[str, Any] | None = None
        self._live: dict[str, Any] | None = None  # the running pass's buffer, draws and count

    def set_epoch(self, epoch: int) -> None:
        """Shuffle the next pass with ``epoch``'s draws (and pass it on upstream)."""
        self.epoch = require_int("epoch", epoch)
        if callable(getattr(self.iterable, "set_epoch", None)):
            self.iterable.set_epoch(epoch)

    def __iter__(self) -> Iterator[Any]:
        # The pass is set up now, not when the first item is asked for: a loader that puts a
        # state back and then begins a new pass makes two iterators and reads only the second,
        # and a state taken before the first item is this pass's, not the one before.
        resume, self._resume = self._resume, None
        me, consumers = _consumer(self.iterable)
        rng = np.random.Generator(np.random.PCG64(mix_ints(self.seed, self.epoch, me)))
        live: dict[str, Any] = {"buffer": [], "rng": rng, "yielded": 0, "consumer": [me, consumers]}
        skip = 0
        if resume is not None:
            saved = resume.get("consumer")
            if saved is not None and saved[1] != consumers:
                raise ValueError(
                    f"the state was saved by a ShuffleBuffer read by {saved[1]} consumers (ranks "
                    f"x DataLoader workers) but this pass has {consumers}: resume with as many "
                    "workers, or the stream would read some items twice and others never")
            if "upstream" in resume and saved in (None, [me, consumers]):  # this consumer's
                self.iterable.load_state_dict(resume["upstream"])
                live["buffer"] = list(resume["buffer"])
                rng.bit_generator.state = resume["rng"]
                live["yielded"] = resume["yielded"]
            else:  # read this consumer's stream again and pass over what was yielded
                skip = resume["yielded"]
        self._live = live
        return _shuffled(iter(self.iterable), self.buffer_size, live, skip)

    def state_dict(self) -> dict[str, Any]:
        """The buffer, the draws so far and the upstream position: enough to go on exactly
        (a state loaded and not yet resumed: that state)."""
        if self._resume is not None:
            return dict(self._resume)
        live = self._live
        state: dict[str, Any] = {"version": STATE_VERSION, "epoch": self.epoch,
                                 "seed": self.seed, "buffer_size": self.buffer_size,
                                 "buffer": list(live["buffer"]) if live else [],
                                 "rng": live["rng"].bit_generator.state if live else None,
                                 "yielded": live["yielded"] if live else 0}
        if live:
            state["consumer"] = list(live["consumer"])
        if callable(getattr(self.iterable, "state_dict", None)):
            state["upstream"] = self.iterable.state_dict()
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Make the next pass continue the saved one."""
        if not isinstance(state, Mapping):
            raise TypeError(f"a ShuffleBuffer state is the dict state_dict() gave, got "
                            f"{type(state).__name__}")
        if state.get("version") != STATE_VERSION:
            raise ValueError(f"not a ShuffleBuffer state (version {STATE_VERSION}): {state!r:.200}")
        for key in ("seed", "buffer_size"):  # another would draw other places: repeats, losses
            if key in state and state[key] != getattr(self, key):
                raise ValueError(f"the state was saved with {key}={state[key]!r} but this "
                                 f"ShuffleBuffer has {key}={getattr(self, key)!r}: build it as "
                                 "it was when the state was saved")
        self.epoch = require_int("saved epoch", state["epoch"])
        saved = state.get("consumer")
        if saved is not None and not (isinstance(saved, (list, tuple)) and len(saved) == 2):
            raise TypeError(f"the state's consumer is [consumer, consumers], got {saved!r}")
        # Put back as the pass begins, which knows its consumer: another's upstream position
        # (another rank's, as Lightning gives every rank) is not this consumer's.
        self._resume = None if state.get("rng") is None else {  # (None: saved before any pass)
            **state, "consumer": None if saved is None else [int(saved[0]), int(saved[1])]}


def _consumer(iterable: Iterable[Any]) -> tuple[int, int]:
    """``(this consumer, all consumers)`` of the stream: its ``ShardedIterable``'s rank and
    DataLoader worker, else this worker among the loader's."""
    if callable(getattr(iterable, "consumer", None)):
        return iterable.consumer()
    worker = get_worker_info()
    return (0, 1) if worker is None else (worker.id, worker.num_workers)


def _shuffled(items: Iterator[Any], size: int, live: dict[str, Any], skip: int) -> Iterator[Any]:
    """``items`` through the buffer of ``size`` in ``live`` (with its draws and count), passing
    over the first ``skip`` that come out."""
    buffer, rng = live["buffer"], live["rng"]
    for item in items:
        if len(buffer) < size:
            buffer.append(item)
            continue
        slot = int(rng.integers(len(buffer)))
        out, buffer[slot] = buffer[slot], item
        live["yielded"] += 1
        if skip:
            skip -= 1
            continue
        yield out
    while buffer:
        out = buffer.pop(int(rng.integers(len(buffer))))
        live["yielded"] += 1
        if skip:
            skip -= 1
            continue
        yield out
