"""Epochs and passes, shared by every shardwise sampler.

A sampler here is a pure function of ``(seed, epoch)`` and a position in the epoch; this base
class keeps that position and turns it into passes:

- ``set_epoch(e)`` makes the next passes use exactly epoch ``e``, as torch's sampler does; until
  it is first called, each pass starts the next epoch (0, 1, 2, ...) instead of repeating one.
- ``iter(sampler)`` is a pass fixed when it is made: ``set_epoch``, ``load_state_dict`` or another
  ``iter()`` never change a live pass. It counts once it is asked for an index, so an iterator
  made and dropped (torch's DataLoader makes one) changes nothing.
- Indices come in chunks through C-level chained list iterators: handing one out costs no more
  than iterating a list, and the chunk in hand tells how many were handed out.

A subclass says where an epoch starts (``_start_of``), how long a pass from a position is
(``_pass_length``), what a pass needs computed once (``_pass_context``, e.g. a permutation) and
which indices a stretch of the pass holds (``_take``).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping
from dataclasses import replace
from typing import Any, Protocol

import numpy as np
from torch.utils.data import Sampler

from shardwise.checks import require_int

# What torch.Generator.manual_seed takes; seed + epoch, torch's generator seed, must fit too.
SEED_MIN, SEED_MAX = -(2**63), 2**64 - 1
MAX_SIZE = 2**63 - 1  # sample indices (and positions in a rank's stream) are int64
FIRST_CHUNK = 256  # the first index must come at once, even when a pass is costly to start
CHUNK = 1 << 16
# What a sampler says of a state another version saved: its orders may differ (version 2 of
# DistributedSampler's states, 3 of the stream samplers': Feistel orders of six or more rounds).
OTHER_VERSION_HINT = ("it was saved by another version of shardwise, whose orders may differ: "
                      "resume it with that version, or begin the next epoch with set_epoch")


def saved_by(state: Mapping[str, Any]) -> str:
    """The kind of sampler that saved ``state``, as its fields tell.

    >>> saved_by({"sampler": "ClassBalancedSampler"}), saved_by({"segments": [[0, 5]]})
    ('ClassBalancedSampler', 'DistributedSampler')
    """
    if "segments" in state:  # (a wrapper's "sampler" is the class it wraps)
        return "DistributedSamplerWrapper" if "sampler" in state else "DistributedSampler"
    saved = state.get("sampler")
    return saved if isinstance(saved, str) else "sampler of another kind"


class Position(Protocol):
    """Where a pass starts (a frozen dataclass): its epoch, and how far into it."""

    epoch: int
    offset: int


class EpochSampler(Sampler[int]):
    """The epoch and pass machinery; see the module docstring."""

    seed: int

    def _start_of(self, epoch: int) -> Any:
        """The position at the start of ``epoch``."""
        raise NotImplementedError

    def _pass_length(self, at: Any) -> int:
        """How many indices a pass from ``at`` yields."""
        raise NotImplementedError

    def _pass_context(self, at: Any) -> Any:
        """What a pass from ``at`` computes once and reuses for every chunk (default: nothing)."""
        return None

    def _take(self, at: Any, context: Any, start: int, stop: int) -> np.ndarray:
        """Indices ``start:stop`` of the pass from ``at``, as int64."""
        raise NotImplementedError

    # -- the epoch ---------------------------------------------------------------------------

    def _init_epochs(self) -> None:
        self._generation = 0  # counts the moves of set_epoch and load_state_dict
        self._restarts = 0  # counts the epochs set_epoch began anew
        self._chosen = False  # set_epoch was called: passes keep its epoch, as torch's do
        self._loaded: Any = None  # the position load_state_dict last stood at
        self._stand_at(self._start_of(self._checked_epoch(0)))

    @property
    def epoch(self) -> int:
        """The epoch of the current pass, or of the next one after ``set_epoch``."""
        return self._at.epoch

    @property
    def placement(self) -> tuple[int, int]:
        """The epoch of the next pass, with how many times ``set_epoch`` began an epoch anew: a
        loader's count of batches delivered in this epoch holds only while this stays the same
        (an epoch left and then set again begins whole)."""
        return self._at.epoch, self._restarts

    @epoch.setter
    def epoch(self, epoch: int) -> None:  # torch's attribute: assigning it is set_epoch
        self.set_epoch(epoch)

    def set_epoch(self, epoch: int) -> None:
        """Make the next passes use exactly ``epoch``, until it is called again (as torch's).

        A position restored by ``load_state_dict`` for this same epoch is kept, so the usual
        ``load_state_dict(...); for e in ...: set_epoch(e)`` loop resumes mid-epoch (a state
        saved as its epoch ended gives that loop an empty rest of the epoch).
        """
        epoch = self._checked_epoch(epoch)
        if self._ended is not None and epoch == self._ended[0].epoch:
            self._stand_at(self._ended[0])
        elif epoch != self._at.epoch or (self._active is not None and self._active.finished):
            self._stand_at(self._start_of(epoch))  # (a pass that ran out: its epoch anew)
            self._restarts += 1
        # The epoch already standing: a pass begun in it goes on counting (Lightning and
        # torchdata's loader make the pass before set_epoch), and the next pass starts it whole.
        self._chosen = True

    def _resume_at(self, at: Any, state: Mapping[str, Any], ended: bool) -> None:
        """Stand at the position ``at`` a saved ``state`` gives. If the state was saved as its
        epoch ended (nothing left on any rank), stand where the pass after that epoch would
        start, the next epoch, as an uninterrupted run goes on; ``set_epoch`` with the saved
        epoch still gives its empty rest, and until a pass begins ``state_dict()`` is the saved
        state. So does ``set_epoch`` with the saved epoch just before: torchdata's loader loads
        the state after the caller's ``set_epoch``, and ``set_epoch`` with another epoch just
        before wins over the state, as it would after it. (A rank whose share ran out before
        the others' goes on in the epoch.)"""
        chose = self._chosen and self._fresh
        if chose and self._at.epoch != at.epoch:
            # set_epoch moved on to another epoch before the state came (torchdata's loader
            # loads it inside iter()): that epoch, whole, as after a load and then set_epoch
            return
        if ended and not chose:  # (set_epoch chose the saved epoch: its empty rest)
            try:
                self._stand_at(self._start_of(self._checked_epoch(at.epoch + 1)))
            except ValueError:  # the last epoch the seed allows: stay at its end
                self._stand_at(at)
                return
        else:
            self._stand_at(at)
        self._loaded = at
        if ended:
            self._ended = at, dict(state)

    def _state_if_ended(self, consumed: int | None) -> dict[str, Any] | None:
        """The saved state of an ended epoch this sampler was loaded at, if no pass began since."""
        if self._ended is None or consumed:
            return None
        return dict(self._ended[1])

    def _checked_epoch(self, epoch: object) -> int:
        epoch = require_int("epoch", epoch)
        if not SEED_MIN <= self.seed + epoch <= SEED_MAX:
            raise ValueError(
                f"epoch {epoch} with seed {self.seed} gives the generator seed "
                f"{self.seed + epoch}, outside [{SEED_MIN}, {SEED_MAX}]; use a smaller seed"
            )
        return epoch

    def _stand_at(self, at: Any) -> None:
        """Move to ``at`` with no pass begun there yet: the next pass starts from it."""
        self._at = at
        self._fresh = True
        self._active: Pass | None = None
        # An ended epoch's position and the state saved there, until a pass begins (_resume_at)
        self._ended: tuple[Any, dict[str, Any]] | None = None
        self._generation += 1

    def _begin(self, run: Pass) -> None:
        """``run`` was asked for its first index: unless the sampler moved since, it is current."""
        if run.generation == self._generation:
            self._at, self._fresh, self._active, self._ended = run.at, False, run, None

    def _used(self) -> tuple[int, bool]:
        """How many indices the current pass handed out, and whether it was asked past its end."""
        run = self._active
        return (run.yielded, run.finished) if run is not None else (0, False)

    # -- this rank's sequence ------------------------------------------------------------------

    def __len__(self) -> int:
        """How many indices a whole epoch yields here, as torch's ``len()``; a pass resumed
        mid-epoch yields only the rest (``pass_length``)."""
        return self._pass_length(self._start_of(self._at.epoch))

    @property
    def pass_length(self) -> int:
        """How many indices the current pass, or the next one after ``set_epoch`` or
        ``load_state_dict``, yields here."""
        return self._pass_length(self._at)

    def indices(self, start: int = 0, stop: int | None = None) -> np.ndarray:
        """Indices ``start:stop`` of this rank's current pass, as int64; computes only those."""
        start, stop = bounds(start, stop, self.pass_length)
        return self._take(self._at, self._pass_context(self._at), start, stop)

    def __iter__(self) -> Iterator[int]:
        return Pass(self, self._next_start(), self._generation).iterator()

    def _next_start(self) -> Any:
        """Where the next pass starts."""
        if self._fresh:
            return self._at
        if self._chosen:  # a pass already began here: the epoch set_epoch chose, again
            # ... but a loaded rest, once run out, stays at its end: torchdata's loader, resuming
            # a pass that had ended (empty, or its last batch dropped by drop_last), draws that
            # rest and drops it before the pass it delivers
            run = self._active
            if run is not None and (run.length == 0 or run.finished and run.at is self._loaded):
                return replace(run.at, offset=run.at.offset + run.length)
            return self._start_of(self._at.epoch)
        # a pass already began here and set_epoch was never called: the next epoch
        return self._start_of(self._checked_epoch(self._at.epoch + 1))

    def _before_state(self, consumed: int | None, begun: bool) -> None:
        """A state of a pass that has used nothing yet (``consumed=0``, a loader's pass not yet
        begun) after one that ran out describes the next pass: the sampler stands where it
        starts (the next epoch, without set_epoch), as its ``__iter__`` will. A pass that has
        drawn its indices (``begun``: a loader's, all drawn, none delivered yet) is the one
        that ran out: its state is its start."""
        if consumed == 0 and not begun and self._active is not None and self._active.finished:
            self._stand_at(self._next_start())

    def __getstate__(self) -> dict[str, Any]:
        # A copy keeps the position, not a live pass or anything cached.
        return {key: None if key == "_active" or key.startswith("_cached") else value
                for key, value in self.__dict__.items()}


class Pass:
    """One iteration over a sampler's share from a fixed position."""

    def __init__(self, sampler: EpochSampler, at: Any, generation: int) -> None:
        self.sampler, self.at, self.generation = sampler, at, generation
        self.length = sampler._pass_length(at)
        self._context: Any = None
        self._begun = False
        self._cursor: tuple[int, Iterator[int]] = (0, iter(()))
        self.finished = False  # asked for an index after its last one

    def iterator(self) -> Iterator[int]:
        return itertools.chain.from_iterable(itertools.starmap(self._open, self._pieces()))

    def _pieces(self) -> Iterator[tuple[int, int]]:
        """``(start, stop)`` chunks of the pass: a small first one, so the first index is quick.

        An empty pass still gives one empty chunk, so asking it for an index begins it.
        """
        start, size = 0, FIRST_CHUNK
        while True:
            yield start, min(self.length, start + size)
            start, size = start + size, CHUNK
            if start >= self.length:
                break
        self.finished = True  # runs only when the last chunk is used up and one more is asked

    def _open(self, start: int, stop: int) -> Iterator[int]:
        if not self._begun:  # the first request: the pass begins
            self._begun = True
            self.sampler._begin(self)
            self._context = self.sampler._pass_context(self.at)
        block = iter(self.sampler._take(self.at, self._context, start, stop).tolist())
        self._cursor = (stop, block)
        return block

    @property
    def yielded(self) -> int:
        """Indices handed out: the chunk's end less what it still holds."""
        stop, block = self._cursor
        return stop - block.__length_hint__()


def bounds(start: int, stop: int | None, length: int) -> tuple[int, int]:
    """``start:stop`` of a sequence of ``length`` as non-negative, ordered bounds."""
    start, stop, _ = slice(start, stop).indices(length)
    return start, max(start, stop)
