"""``DistributedSampler``: torch's sampler, bit for bit by default, that scales, resumes and
survives a change of world size."""

from __future__ import annotations

import numbers
import warnings
from collections.abc import Iterator, Mapping, Sized
from dataclasses import dataclass
from typing import Any

import numpy as np
from torch.utils.data import DistributedSampler as TorchDistributedSampler

from shardwise.checks import require_bool, require_choice, require_int, same_saved
from shardwise.distributed.world import resolve_world
from shardwise.mix import mix_ints
from shardwise.order import PERMUTATIONS, Order, make_order
from shardwise.samplers.passes import (
    MAX_SIZE,
    OTHER_VERSION_HINT,
    SEED_MAX,
    SEED_MIN,
    EpochSampler,
    bounds,
    saved_by,
)
from shardwise.segments import Segments
from shardwise.split import (
    LAYOUTS,
    REMAINDERS,
    rank_count,
    rank_positions,
    remaining_intervals,
    split_total,
)

STATE_VERSION = 2  # 2: Feistel orders of six or more rounds
# Fields that must match between a saved state and the sampler that loads it.
STATE_IDENTITY = ("size", "seed", "permutation")
STATE_FIELDS = ("version", *STATE_IDENTITY, "epoch", "layout", "remainder", "num_replicas",
                "consumed", "segments")
TORCH_ORDER_WARN_SIZE = 2**25
_FINGERPRINT_POINTS = 64

_warned_torch_scale = False


@dataclass(frozen=True)
class _Position:
    """Where a pass starts: an epoch, the order positions it splits, and this rank's offset."""

    epoch: int
    segments: Segments  # all of [0, size) in a fresh epoch; what was left after an elastic resume
    offset: int  # positions of this rank's share consumed before the pass (a same-world resume)

    @classmethod
    def start_of(cls, epoch: int, size: int) -> _Position:
        return cls(epoch, Segments.whole(size), 0)


class DistributedSampler(EpochSampler, TorchDistributedSampler):
    """Give each of ``num_replicas`` ranks its own disjoint share of the dataset, epoch by epoch.

    A drop-in for :class:`torch.utils.data.DistributedSampler`, and an instance of it (so
    Lightning, Fabric and Accelerate keep it as it is): with the default keyword options it
    yields exactly what torch's sampler yields for the same arguments and epoch.

    Args:
        dataset: a dataset (anything with ``__len__``), or its size as an ``int``.
        num_replicas: number of ranks; default: the process group's world size, else
            ``WORLD_SIZE`` from the environment, else 1.
        rank: this rank; default: the process group's rank, else ``RANK``, else 0.
        shuffle: shuffle each epoch from ``(seed, epoch)``; else dataset order.
        seed: the same on every rank; any int ``torch.Generator.manual_seed`` takes.
        drop_last: torch's flag; ``True`` means ``remainder="drop"`` (which sets it).
        remainder: ``"pad"`` (torch's default: repeat samples so every rank gets as many),
            ``"drop"`` (cut the tail) or ``"uneven"`` (every sample exactly once; rank
            lengths differ by at most one). Train DDP with ``pad`` or ``drop``, which give
            every rank the same number of steps; evaluate with ``uneven`` for exact metrics
            (train with it only under ``torch.distributed.algorithms.Join``).
        layout: ``"strided"`` (rank r takes r, r+W, ...) or ``"block"`` (one contiguous run).
        permutation: ``"torch"`` (``torch.randperm``, 8 bytes a sample) or ``"feistel"``
            (O(1) memory, for billions of samples).

    Each ``iter(sampler)`` is a pass fixed when it is made: ``set_epoch``, ``load_state_dict``
    or another ``iter()`` never change a live pass. ``set_epoch(e)`` makes the next pass use
    exactly epoch ``e``, as torch's does; if you never call it, each pass starts the next epoch
    (0, 1, 2, ...) instead of repeating epoch 0. A pass counts once it is first asked for an
    index, so an iterator made and dropped unused (torch's DataLoader makes one) changes nothing.

    Example::

        >>> sampler = DistributedSampler(7, num_replicas=3, rank=0, shuffle=False)
        >>> list(sampler)
        [0, 3, 6]
        >>> DistributedSampler(7, 3, 2, shuffle=False, remainder="uneven").indices().tolist()
        [2, 5]
    """

    def __init__(
        self,
        dataset: Sized | int,
        num_replicas: int | None = None,
        rank: int | None = None,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
        *,
        remainder: str | None = None,
        layout: str = "strided",
        permutation: str = "torch",
    ) -> None:
        self.dataset = dataset
        self.size = _size_of(dataset)
        self.num_replicas, self.rank = resolve_world(num_replicas, rank)
        # None is False, as torch's sampler takes it (a wrapper's unset option, say)
        self.shuffle = require_bool("shuffle", False if shuffle is None else shuffle)
        drop_last = require_bool("drop_last", False if drop_last is None else drop_last)
        self.seed = require_int("seed", seed, minimum=SEED_MIN, maximum=SEED_MAX)
        if remainder is None:
            remainder = "drop" if drop_last else "pad"
        elif drop_last and remainder != "drop":
            raise ValueError(
                f"drop_last=True means remainder='drop' but remainder={remainder!r} was given; "
                "pass only one of them"
            )
        self.remainder = require_choice("remainder", remainder, REMAINDERS)
        self.drop_last = self.remainder == "drop"  # torch's attribute, for those who read it
        self.layout = require_choice("layout", layout, LAYOUTS)
        self.permutation = require_choice("permutation", permutation, PERMUTATIONS)
        if self.shuffle and permutation == "torch" and self.size >= TORCH_ORDER_WARN_SIZE:
            _warn_torch_scale(self.size)
        self._cached_order: tuple[tuple[Any, ...], Order] | None = None
        self._init_epochs()

    # -- the epoch ---------------------------------------------------------------------------

    def _start_of(self, epoch: int) -> _Position:
        return _Position.start_of(epoch, self.size)

    @property
    def effective_permutation(self) -> str:
        """``"identity"`` without shuffle, else the permutation's name."""
        return self.permutation if self.shuffle else "identity"

    def _order_of(self, epoch: int) -> Order:
        key = (self.size, self.seed, epoch, self.effective_permutation)
        if self._cached_order is None or self._cached_order[0] != key:
            self._cached_order = None  # free a large torch permutation before making the next
            order = make_order(self.size, self.seed, epoch,
                               self.permutation if self.shuffle else None)
            self._cached_order = (key, order)
        return self._cached_order[1]

    # -- this rank's sequence ------------------------------------------------------------------

    # torch's num_samples and total_size are plain attributes, which samplers written as its
    # subclasses assign (Lightning's UnrepeatedDistributedSampler does, with its own __iter__):
    # a value assigned is the one read back, and len() gives such a num_samples, as torch's does.
    _assigned_num_samples: int | None = None
    _assigned_total_size: int | None = None

    @property
    def num_samples(self) -> int:
        """This rank's share of an epoch, as torch's attribute (and ``len()``)."""
        if self._assigned_num_samples is not None:
            return self._assigned_num_samples
        return super().__len__()

    @num_samples.setter
    def num_samples(self, value: int) -> None:
        self._assigned_num_samples = value

    @property
    def total_size(self) -> int:
        """All ranks' shares together, repeats included, as torch's attribute."""
        if self._assigned_total_size is not None:
            return self._assigned_total_size
        return split_total(self.size, self.num_replicas, self.remainder)

    @total_size.setter
    def total_size(self, value: int) -> None:
        self._assigned_total_size = value

    def __len__(self) -> int:
        return self.num_samples  # as torch's

    def __iter__(self) -> Iterator[int]:
        # torch's __iter__ asserts that its pass holds num_samples indices; an assigned value
        # this pass cannot keep would make len() and the loader's batch count lie.
        assigned, share = self._assigned_num_samples, self._share(self._at)
        if assigned is not None and assigned != share:
            raise ValueError(
                f"num_samples was set to {assigned} but rank {self.rank}'s pass holds {share} "
                "indices: a subclass that sets num_samples must also override __iter__ to "
                "yield that many")
        return super().__iter__()

    def _share(self, at: _Position) -> int:
        return rank_count(at.segments.length, self.num_replicas, self.rank, self.remainder)

    def _pass_length(self, at: _Position) -> int:
        return max(0, self._share(at) - at.offset)

    def _pass_context(self, at: _Position) -> Order:
        return self._order_of(at.epoch)

    def _positions(self, at: _Position, start: int, stop: int) -> np.ndarray:
        """Unwrapped split positions (uint64) of pass positions ``[start, stop)`` from ``at``."""
        return rank_positions(at.segments.length, self.num_replicas, self.rank, self.layout,
                              self.remainder, at.offset + start, at.offset + stop)

    def _take(self, at: _Position, order: Order, start: int, stop: int) -> np.ndarray:
        """The samples at pass positions ``[start, stop)`` from ``at``, as int64."""
        positions, length = self._positions(at, start, stop), at.segments.length
        if self.remainder == "pad" and positions.size and positions[-1] >= length:
            positions = positions % np.uint64(length)  # padding repeats wrap around
        return order.take(at.segments.take(positions.astype(np.int64)))

    def padding_mask(self, start: int = 0, stop: int | None = None) -> np.ndarray:
        """``True`` where position ``start:stop`` of this rank's pass is a padding repeat.

        Weight those samples 0 to keep equal step counts and exact metrics.

        >>> DistributedSampler(7, 3, 2, shuffle=False).padding_mask().tolist()
        [False, False, True]
        """
        start, stop = bounds(start, stop, self.pass_length)
        return self._positions(self._at, start, stop) >= self._at.segments.length

    def dropped(self, limit: int | None = None) -> np.ndarray:
        """The samples no rank takes in this pass: only ``remainder="drop"`` leaves any (< W);
        ``limit``: only the first ``limit`` of them, the only ones computed.

        >>> DistributedSampler(7, 3, 0, shuffle=False, drop_last=True).dropped().tolist()
        [6]
        """
        length = self._at.segments.length
        kept = split_total(length, self.num_replicas, self.remainder)
        return self._samples_at(min(kept, length), length, limit)

    def repeated(self, distinct: bool = False, limit: int | None = None) -> np.ndarray:
        """The samples that padding hands out again in this pass, one entry per repeat (< W);
        ``distinct``: each such sample once (at most the pass's length, whatever W is);
        ``limit``: only the first ``limit`` of them, the only ones computed.

        >>> DistributedSampler(7, 3, 0, shuffle=False).repeated().tolist()
        [0, 1]
        >>> DistributedSampler(2, 10**12, 0, shuffle=False).repeated(distinct=True).tolist()
        [0, 1]
        >>> DistributedSampler(10**12 + 1, 10**12, 0, shuffle=False).repeated(limit=3).tolist()
        [0, 1, 2]
        """
        length = self._at.segments.length
        extra = max(0, split_total(length, self.num_replicas, self.remainder) - length)
        return self._samples_at(0, min(extra, length) if distinct else extra, limit)

    def _samples_at(self, start: int, stop: int, limit: int | None) -> np.ndarray:
        """The samples at split positions ``[start, stop)`` of this pass, wrapped around its
        length as padding wraps; only the first ``limit`` of them if given."""
        if limit is not None:  # W - 1 positions can be 10**12: the rest are never built
            stop = min(stop, start + require_int("limit", limit, minimum=0))
        positions = np.arange(start, stop, dtype=np.int64) % max(self._at.segments.length, 1)
        return self._order_of(self._at.epoch).take(self._at.segments.take(positions))

    # -- checks across ranks -------------------------------------------------------------------

    def config(self) -> dict[str, Any]:
        """What every rank must agree on: compared by :func:`shardwise.check_consistent`."""
        return {
            "size": self.size, "seed": self.seed, "epoch": self.epoch, "shuffle": self.shuffle,
            "layout": self.layout, "remainder": self.remainder,
            "permutation": self.effective_permutation, "num_replicas": self.num_replicas,
        }

    def fingerprint(self) -> int:
        """A 64-bit digest of the epoch's global order, sampled at a few fixed positions.

        Ranks whose torch builds shuffle differently, or that resumed differently, disagree here.
        """
        last, steps = self.size - 1, _FINGERPRINT_POINTS - 1
        points = sorted({i * last // steps for i in range(_FINGERPRINT_POINTS)}) if self.size else []
        values = self._order_of(self.epoch).take(np.array(points, dtype=np.int64)).tolist()
        bounds = [bound for interval in self._at.segments.intervals for bound in interval]
        offset = self._at.offset
        if self.remainder == "uneven":  # a short rank that finished records the long ranks'
            # count (see state_dict): ranks that each resumed from their own state agree
            offset = min(offset, rank_count(self._at.segments.length, self.num_replicas,
                                            self.num_replicas - 1, self.remainder))
        return mix_ints(self.size, *values, *bounds, offset)

    # -- checkpoints ---------------------------------------------------------------------------

    def state_dict(self, consumed: int | None = None, *, batch_size: int | None = None,
                   drop_last: bool = False, begun: bool = False) -> dict[str, Any]:
        """Where the epoch stands, enough for every rank (of any world size) to resume.

        Args:
            consumed: how many samples this rank really used in the current pass. By default,
                how many indices the pass has handed out, which is ahead of training when a
                ``DataLoader`` prefetches: with workers, add up the lengths of the batches
                trained (the last, partial batch too) and pass that.
            batch_size, drop_last: how the pass is batched. With ``remainder="uneven"``, a
                shorter rank that used its whole share then knows whether the longer ranks had
                a batch left at that step (a checkpoint taken before their last one). Without
                them it takes that they had none, as at a pass's end.
            begun: the pass ``consumed`` counts in has drawn from this sampler already (a
                loader's pass under way). Else ``consumed=0`` after a pass that drew every index
                describes the next pass, the one a loader's new iterator is about to draw.

        The state is plain data (ints, strings, lists): ``json`` and ``torch.save`` keep it.
        """
        self._before_state(consumed, begun)
        if (ended := self._state_if_ended(consumed)) is not None:
            return ended
        share = self.pass_length
        if consumed is None:
            used, finished = self._used()
        else:
            used = require_int("consumed", consumed, minimum=0)
            if used > share:
                raise ValueError(f"consumed={used} but this rank's pass has only {share} samples")
            finished = used == share
        done = self._at.offset + used
        if self.remainder == "uneven" and finished:
            # Shares differ by one: record where the longest ranks stand, or a short rank's state
            # would hand their last samples out again (or skip those they had still to take).
            longest = rank_count(self._at.segments.length, self.num_replicas, 0, self.remainder)
            done = longest
            if batch_size is not None:
                size = require_int("batch_size", batch_size, minimum=1)
                steps = used // size if drop_last else -(-used // size)
                their_steps = ((longest - self._at.offset) // size if drop_last
                               else -(-(longest - self._at.offset) // size))
                if their_steps > steps:  # their last batch is still to come
                    done = self._at.offset + steps * size
        return {
            "version": STATE_VERSION,
            **{key: value for key, value in self.config().items() if key != "shuffle"},
            "consumed": done,
            "segments": self._at.segments.to_state(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue the saved epoch where it stopped, on this sampler's world size.

        With the same world size, layout and remainder each rank continues its own sequence.
        Otherwise the positions that no rank consumed are split afresh over this sampler's
        ranks by its layout and remainder. The next epoch is an ordinary one. A state saved as
        its epoch ended resumes with the next epoch, as the run would have gone on
        (``set_epoch`` with the saved epoch gives its empty rest instead). Every field is
        checked first; a bad one is named.
        """
        saved = _read_state(state, self)
        if (saved.num_replicas, saved.layout, saved.remainder) == (
            self.num_replicas, self.layout, self.remainder,
        ):
            longest = rank_count(saved.segments.length, self.num_replicas, 0, self.remainder)
            self._resume_at(_Position(saved.epoch, saved.segments, saved.consumed), state,
                            ended=saved.consumed >= longest)
        else:
            left = remaining_intervals(saved.segments.length, saved.num_replicas, saved.layout,
                                       saved.remainder, saved.consumed)
            self._resume_at(_Position(saved.epoch, saved.segments.subset(left), 0), state,
                            ended=not left)

    def __repr__(self) -> str:
        options = ", ".join(f"{key}={value!r}" for key, value in self.config().items())
        return f"{type(self).__name__}(rank={self.rank}, {options})"


@dataclass(frozen=True)
class _SavedState:
    epoch: int
    layout: str
    remainder: str
    num_replicas: int
    consumed: int
    segments: Segments


def _argument_for(key: str, saved: Any) -> str:
    """What gives a sampler a saved identity field (``permutation="identity"`` is what
    ``shuffle=False`` gives)."""
    if key == "size":
        return f"a dataset of {saved!r} samples"
    if key != "permutation":
        return f"{key}={saved!r}"
    if saved == "identity":
        return "shuffle=False"
    if saved in PERMUTATIONS:
        return f"shuffle=True, permutation={saved!r}"
    return f"a {saved}" if str(saved).startswith("wrapped ") else f"the permutation {saved!r}"


def _read_state(state: Mapping[str, Any], sampler: DistributedSampler) -> _SavedState:
    """The fields of a saved state, each checked, or an error naming the first bad one."""
    if not isinstance(state, Mapping):
        raise TypeError(f"a sampler state is a dict, got {type(state).__name__}")
    if state.get("sampler") in ("ClassBalancedSampler", "WeightedDistributedSampler"):
        raise ValueError(f"the state was saved by a {saved_by(state)}, not a "
                         f"{type(sampler).__name__}: load it into the sampler it was saved from")
    missing = [key for key in STATE_FIELDS if key not in state]
    if missing:
        raise ValueError(f"not a shardwise sampler state: missing {', '.join(missing)}")
    if not same_saved(state["version"], STATE_VERSION):
        raise ValueError(f"sampler state version {state['version']!r} is not {STATE_VERSION}: "
                         f"{OTHER_VERSION_HINT}")
    mine = sampler.config()
    for key in STATE_IDENTITY:
        if not same_saved(state[key], mine[key]):
            raise ValueError(
                f"the state was saved with {key}={state[key]!r} but this sampler has "
                f"{key}={mine[key]!r}; build the sampler with {_argument_for(key, state[key])} "
                "to resume")
    epoch = sampler._checked_epoch(state["epoch"])
    layout = require_choice("saved layout", state["layout"], LAYOUTS)
    remainder = require_choice("saved remainder", state["remainder"], REMAINDERS)
    world = require_int("saved num_replicas", state["num_replicas"], minimum=1)
    segments = _read_segments(state["segments"], sampler.size)
    most = rank_count(segments.length, world, 0, remainder)
    consumed = require_int("saved consumed", state["consumed"], minimum=0)
    if consumed > most:
        raise ValueError(f"the state says consumed={consumed} but no rank had more than {most}")
    return _SavedState(epoch, layout, remainder, world, consumed, segments)


def _read_segments(pairs: object, size: int) -> Segments:
    """Saved segments: ``[begin, end)`` pairs, non-empty, sorted, disjoint, inside ``[0, size)``."""
    if isinstance(pairs, (str, bytes)) or not isinstance(pairs, (list, tuple)):
        raise TypeError(f"saved segments must be a list of [begin, end] pairs, got {pairs!r}")
    previous_end = 0
    intervals = []
    for i, pair in enumerate(pairs):
        name = f"saved segments[{i}]"
        if isinstance(pair, (str, bytes)) or not isinstance(pair, (list, tuple)) or len(pair) != 2:
            raise TypeError(f"{name} must be a [begin, end] pair, got {pair!r}")
        begin, end = (require_int(name, value) for value in pair)
        if not previous_end <= begin < end <= size:
            raise ValueError(
                f"{name} = {list(pair)} must be non-empty, inside [0, {size}) and after the "
                f"previous segment (which ends at {previous_end}); the state is corrupt"
            )
        intervals.append((begin, end))
        previous_end = end
    return Segments(tuple(intervals))


def _size_of(dataset: object) -> int:
    if isinstance(dataset, numbers.Integral) and not isinstance(dataset, (bool, np.bool_)):
        return require_int("dataset size", dataset, minimum=0, maximum=MAX_SIZE)
    if not hasattr(dataset, "__len__"):
        raise TypeError(
            f"dataset must be an int or have __len__, got {type(dataset).__name__}; "
            "for an iterable dataset pass its size as an int"
        )
    return require_int("len(dataset)", len(dataset), minimum=0, maximum=MAX_SIZE)  # type: ignore[arg-type]


def _warn_torch_scale(size: int) -> None:
    global _warned_torch_scale
    if not _warned_torch_scale:
        _warned_torch_scale = True
        warnings.warn(
            f"permutation='torch' materialises a {size:,}-sample permutation on every rank every "
            f"epoch ({size * 8 / 2**30:.1f} GiB); permutation='feistel' needs O(1) memory",
            stacklevel=3,
        )
