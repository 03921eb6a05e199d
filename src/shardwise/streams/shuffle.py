"""``ShuffleBuffer``: a local shuffle of a sequential stream (TFRecord's paradigm: read 256, draw).

A stream that cannot be shuffled globally (records read in order from files) is shuffled
locally: the first ``buffer_size`` items fill a buffer; then each new item takes the place of
one drawn at random, which is yielded; at the end the rest is yielded in random order. An item
can move at most about ``buffer_size`` places, so the buffer should span several shards' worth
of neighbours. Deterministic from ``(seed, epoch)``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import numpy as np
from torch.utils.data import IterableDataset

from shardwise.checks import require_int
from shardwise.mix import mix_ints
from shardwise.samplers.passes import SEED_MAX, SEED_MIN

STATE_VERSION = 1


class ShuffleBuffer(IterableDataset):
    """Shuffle ``iterable`` through a buffer of ``buffer_size`` items.

    ``state_dict()`` holds the buffer's items, the generator's state and, when ``iterable`` has
    a ``state_dict`` of its own (a :class:`ShardedIterable`), the upstream position: a resume
    continues exactly, reading nothing twice. Without one, a resume reads the stream again from
    its start and skips what was yielded.

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
        resume, self._resume = self._resume, None
        rng = np.random.Generator(np.random.PCG64(mix_ints(self.seed, self.epoch)))
        buffer: list[Any] = []
        yielded = 0
        skip = 0
        if resume is not None:
            buffer = list(resume["buffer"])
            rng.bit_generator.state = resume["rng"]
            yielded = resume["yielded"]
            if "upstream" not in resume:
                skip = yielded  # no upstream position: read it again, drop what was yielded
                buffer, yielded = [], 0
                rng = np.random.Generator(np.random.PCG64(mix_ints(self.seed, self.epoch)))
        live = {"buffer": buffer, "rng": rng, "yielded": yielded}
        self._live = live
        for item in self.iterable:
            if len(buffer) < self.buffer_size:
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

    def state_dict(self) -> dict[str, Any]:
        """The buffer, the draws so far and the upstream position: enough to go on exactly."""
        live = self._live
        state: dict[str, Any] = {"version": STATE_VERSION, "epoch": self.epoch,
                                 "seed": self.seed, "buffer_size": self.buffer_size,
                                 "buffer": list(live["buffer"]) if live else [],
                                 "rng": live["rng"].bit_generator.state if live else None,
                                 "yielded": live["yielded"] if live else 0}
        if callable(getattr(self.iterable, "state_dict", None)):
            state["upstream"] = self.iterable.state_dict()
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Make the next pass continue the saved one."""
        if state.get("version") != STATE_VERSION:
            raise ValueError(f"not a ShuffleBuffer state (version {STATE_VERSION}): {state!r:.200}")
        for key in ("seed", "buffer_size"):  # another would draw other places: repeats, losses
            if key in state and state[key] != getattr(self, key):
                raise ValueError(f"the state was saved with {key}={state[key]!r} but this "
                                 f"ShuffleBuffer has {key}={getattr(self, key)!r}: build it as "
                                 "it was when the state was saved")
        self.epoch = require_int("saved epoch", state["epoch"])
        if state.get("rng") is None:  # saved before any pass: nothing to continue
            return
        if "upstream" in state:
            self.iterable.load_state_dict(state["upstream"])
        self._resume = dict(state)
