"""Checkpoints of samplers whose pass is one rank's own stream: its epoch and how far into it.

A class-balanced or weighted stream is drawn for one rank from (seed, epoch, rank), so its
position is just the samples consumed, and it resumes only on the world size it was saved on.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from torch.utils.data import DistributedSampler as TorchDistributedSampler

from shardwise.checks import require_int, same_saved
from shardwise.samplers.passes import OTHER_VERSION_HINT, EpochSampler, saved_by

# 2: with the digest of the labels or weights drawn from; 3: Feistel orders of six or more rounds,
# each rank's own order of a class smaller than the world, draws without replacement dealt
# to the ranks at random
STATE_VERSION = 3


@dataclass(frozen=True)
class StreamPosition:
    epoch: int
    offset: int  # samples of this rank's stream consumed before the pass (a resume)


class RankStreamSampler(EpochSampler, TorchDistributedSampler):
    """An ``EpochSampler`` of ``num_samples`` per rank and epoch, with ``state_dict`` /
    ``load_state_dict``; subclasses give ``config()`` and what to do when a state does not fit.

    An instance of torch's ``DistributedSampler``, as :class:`shardwise.DistributedSampler` is:
    Lightning, Fabric and Accelerate keep it as it is, where they would wrap any other sampler
    in one of their own and leave each rank 1/W of its share.
    """

    num_samples: int
    shuffle = True  # torch's attributes, which trainers read: the streams are random draws
    drop_last = False
    _at: StreamPosition
    _RESUME_HINT = "build the sampler as it was when the state was saved"
    _WORLD_HINT = ("a rank's stream resumes only on the world size it was saved on: on another, "
                   "start the next epoch with set_epoch")

    @property
    def total_size(self) -> int:
        """Samples drawn over all ranks in an epoch, as torch's sampler names it."""
        return self.num_samples * self.num_replicas

    def config(self) -> dict[str, Any]:
        """The settings a saved state must match (and that ``check_consistent`` compares)."""
        raise NotImplementedError

    def drawn_from(self) -> dict[str, str]:
        """A digest of what the streams draw from (every label, every weight), which a saved
        state must match too: ``{name: hex digest}``."""
        raise NotImplementedError

    def _start_of(self, epoch: int) -> StreamPosition:
        return StreamPosition(epoch, 0)

    def _pass_length(self, at: StreamPosition) -> int:
        return max(0, self.num_samples - at.offset)

    def state_dict(self, consumed: int | None = None, *, begun: bool = False) -> dict[str, Any]:
        """Where this rank's stream stands; ``consumed`` and ``begun`` as in
        :class:`shardwise.DistributedSampler`."""
        self._before_state(consumed, begun)
        if (ended := self._state_if_ended(consumed)) is not None:
            return ended
        share = self.pass_length
        used = self._used()[0] if consumed is None else require_int("consumed", consumed, minimum=0)
        if used > share:
            raise ValueError(f"consumed={used} but this rank's pass has only {share} samples")
        return {"version": STATE_VERSION, **self.config(), **self.drawn_from(),
                "consumed": self._at.offset + used}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue the saved epoch at the saved stream position (on the same world size)."""
        if not isinstance(state, Mapping):
            raise TypeError(f"a sampler state is a dict, got {type(state).__name__}")
        missing = [key for key in ("version", "epoch", "consumed") if key not in state]
        if missing:
            raise ValueError(f"not a shardwise sampler state: missing {', '.join(missing)}")
        mine = self.config()["sampler"]
        if saved_by(state) != mine:  # (before the version: another class has its own)
            raise ValueError(f"the state was saved by a {saved_by(state)}, not a {mine}: load "
                             "it into the sampler it was saved from")
        drawn_from = self.drawn_from()
        expected = {"version": STATE_VERSION, **self.config(), **drawn_from,
                    "epoch": state["epoch"]}
        for key, value in expected.items():
            if not same_saved(state.get(key), value):
                hint = (f"build the sampler over the {key.split('_')[0]} it was saved with"
                        if key in drawn_from else OTHER_VERSION_HINT if key == "version"
                        else self._WORLD_HINT if key == "num_replicas" else self._RESUME_HINT)
                raise ValueError(
                    f"the state was saved with {key}={state.get(key)!r} but this sampler has "
                    f"{key}={value!r}; {hint}")
        epoch = self._checked_epoch(state["epoch"])
        consumed = require_int("saved consumed", state.get("consumed"), minimum=0)
        if consumed > self.num_samples:
            raise ValueError(f"the state says consumed={consumed} but this rank's stream holds "
                             f"only {self.num_samples} samples")
        # Every rank's stream has num_samples: the epoch ended for all once it did for one.
        self._resume_at(StreamPosition(epoch, consumed), state,
                        ended=consumed >= self.num_samples)
