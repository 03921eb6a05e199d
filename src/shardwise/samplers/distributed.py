"""``DistributedSampler``: torch's sampler, bit for bit by default, that scales, resumes and
survives a change of world size."""

from __future__ import annotations

import itertools
import numbers
import warnings
from collections.abc import Iterator, Mapping, Sized
from typing import Any

import numpy as np
from torch.utils.data import Sampler

from shardwise.checks import require_choice, require_int
from shardwise.distributed.world import resolve_world
from shardwise.mix import mix_ints
from shardwise.order import PERMUTATIONS, Order, make_order
from shardwise.segments import Segments
from shardwise.split import (
    LAYOUTS,
    REMAINDERS,
    rank_count,
    rank_positions,
    remaining_intervals,
    split_total,
)

STATE_VERSION = 1
# Fields that must match between a saved state and the sampler that loads it.
STATE_IDENTITY = ("size", "seed", "permutation")
TORCH_ORDER_WARN_SIZE = 2**25
_FIRST_CHUNK = 256  # the first index must come at once, even when an order is costly
_CHUNK = 1 << 16
_FINGERPRINT_POINTS = 64

_warned_torch_scale = False


class DistributedSampler(Sampler[int]):
    """Give each of ``num_replicas`` ranks its own disjoint share of ``[0, size)`` per epoch.

    With the default keyword options it yields exactly what
    :class:`torch.utils.data.DistributedSampler` yields for the same arguments and epoch.

    Args:
        dataset_or_size: a dataset (anything with ``__len__``) or its size as an ``int``.
        num_replicas: number of ranks; default: the process group's world size, else
            ``WORLD_SIZE`` from the environment, else 1.
        rank: this rank; default: the process group's rank, else ``RANK``, else 0.
        shuffle: shuffle each epoch from ``(seed, epoch)``; else dataset order.
        seed: the same on every rank.
        drop_last: torch's flag; ``True`` means ``remainder="drop"``.
        remainder: ``"pad"`` (torch's default: repeat samples so every rank gets as many),
            ``"drop"`` (cut the tail) or ``"uneven"`` (every sample exactly once; rank
            lengths differ by at most one).
        layout: ``"strided"`` (rank r takes r, r+W, ...) or ``"block"`` (one contiguous run).
        permutation: ``"torch"`` (``torch.randperm``, 8 bytes a sample) or ``"feistel"``
            (O(1) memory, for billions of samples).

    .. note::
        ``set_epoch(e)`` works as in torch: the next pass uses exactly epoch ``e``. If you never
        call it, each new pass starts the next epoch (0, 1, 2, ...) instead of repeating epoch 0.

    .. warning::
        Resume assumes every rank consumed the same number of samples, as DDP's lock-step
        training gives; ``state_dict()`` of any one rank then resumes all of them.

    Example::

        >>> sampler = DistributedSampler(7, num_replicas=3, rank=0, shuffle=False)
        >>> list(sampler)
        [0, 3, 6]
        >>> DistributedSampler(7, 3, 2, shuffle=False, remainder="uneven").indices().tolist()
        [2, 5]
    """

    def __init__(
        self,
        dataset_or_size: Sized | int,
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
        self.dataset = dataset_or_size
        self.size = _size_of(dataset_or_size)
        self.num_replicas, self.rank = resolve_world(num_replicas, rank)
        if not isinstance(shuffle, bool):
            raise TypeError(f"shuffle must be a bool, got {shuffle!r}")
        if not isinstance(drop_last, bool):
            raise TypeError(f"drop_last must be a bool, got {drop_last!r}")
        if drop_last and remainder not in (None, "drop"):
            raise ValueError(
                f"drop_last=True means remainder='drop' but remainder={remainder!r} was given; "
                "pass only one of them"
            )
        self.shuffle = shuffle
        self.seed = require_int("seed", seed)
        self.drop_last = drop_last
        self.remainder = require_choice(
            "remainder", remainder or ("drop" if drop_last else "pad"), REMAINDERS
        )
        self.layout = require_choice("layout", layout, LAYOUTS)
        self.permutation = require_choice("permutation", permutation, PERMUTATIONS)
        if shuffle and permutation == "torch" and self.size >= TORCH_ORDER_WARN_SIZE:
            _warn_torch_scale(self.size)
        self._order_key: tuple[int, str] | None = None
        self._order: Order | None = None
        self._start_epoch(0)
        self._pinned = True  # the next pass uses self.epoch as it is

    # -- the epoch ---------------------------------------------------------------------------

    def set_epoch(self, epoch: int) -> None:
        """Make the next pass use exactly ``epoch``.

        A position restored by :meth:`load_state_dict` for this same epoch is kept, so the
        usual ``load_state_dict(...); for e in ...: set_epoch(e)`` loop resumes mid-epoch.
        """
        epoch = require_int("epoch", epoch)
        if not (self._pinned and epoch == self.epoch):
            self._start_epoch(epoch)
        self._pinned = True

    def _start_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        self._segments = Segments.whole(self.size)  # the positions this epoch splits
        self._offset = 0  # positions of this rank's share consumed before this pass (resume)
        self._cursor: tuple[int, Iterator[int]] = (0, iter([]))  # where the pass stands

    @property
    def effective_permutation(self) -> str:
        """``"identity"`` without shuffle, else the permutation's name."""
        return self.permutation if self.shuffle else "identity"

    def _current_order(self) -> Order:
        key = (self.epoch, self.effective_permutation)
        if self._order_key != key:
            self._order = None  # free a large torch permutation before making the next
            self._order = make_order(
                self.size, self.seed, self.epoch, self.permutation if self.shuffle else None
            )
            self._order_key = key
        assert self._order is not None
        return self._order

    # -- this rank's sequence ------------------------------------------------------------------

    @property
    def num_samples(self) -> int:
        """This rank's share of the whole (or resumed) epoch, as torch's attribute."""
        return rank_count(self._segments.length, self.num_replicas, self.rank, self.remainder)

    @property
    def total_size(self) -> int:
        """All ranks' shares together, repeats included, as torch's attribute."""
        return split_total(self._segments.length, self.num_replicas, self.remainder)

    def __len__(self) -> int:
        """How many indices the current (or next) pass yields on this rank."""
        return max(0, self.num_samples - self._offset)

    def _positions(self, start: int, stop: int | None) -> np.ndarray:
        """Unwrapped split positions of this pass's ``[start, stop)``."""
        start, stop, _ = slice(start, stop).indices(len(self))
        return rank_positions(
            self._segments.length, self.num_replicas, self.rank, self.layout, self.remainder,
            self._offset + start, self._offset + max(start, stop),
        )

    def indices(self, start: int = 0, stop: int | None = None) -> np.ndarray:
        """Indices ``start:stop`` of this rank's current pass, as int64; computes only those.

        >>> DistributedSampler(10, 2, 1, permutation="feistel").indices(0, 3).shape
        (3,)
        """
        positions = self._positions(start, stop)
        length = self._segments.length
        if self.remainder == "pad" and positions.size and positions[-1] >= length:
            positions = positions % length
        return self._current_order().take(self._segments.take(positions))

    def padding_mask(self, start: int = 0, stop: int | None = None) -> np.ndarray:
        """``True`` where position ``start:stop`` of this rank's pass is a padding repeat.

        Weight those samples 0 to keep equal step counts and exact metrics.

        >>> DistributedSampler(7, 3, 2, shuffle=False).padding_mask().tolist()
        [False, False, True]
        """
        return self._positions(start, stop) >= self._segments.length

    def dropped(self) -> np.ndarray:
        """The samples no rank takes in this pass: only ``remainder="drop"`` leaves any (< W).

        >>> DistributedSampler(7, 3, 0, shuffle=False, drop_last=True).dropped().tolist()
        [6]
        """
        length = self._segments.length
        kept = split_total(length, self.num_replicas, self.remainder)
        positions = np.arange(min(kept, length), length, dtype=np.int64)
        return self._current_order().take(self._segments.take(positions))

    def __iter__(self) -> Iterator[int]:
        if not self._pinned:
            self._start_epoch(self.epoch + 1)
        self._pinned = False
        self._cursor = (0, iter([]))
        # C-level chaining of list iterators: per index, no more work than torch's iter(list).
        return itertools.chain.from_iterable(itertools.starmap(self._open_chunk, _chunks(len(self))))

    def _open_chunk(self, start: int, stop: int) -> Iterator[int]:
        block = iter(self.indices(start, stop).tolist())
        self._cursor = (stop, block)
        return block

    @property
    def _yielded(self) -> int:
        """Indices the current pass has handed out: the chunk's end less what it still holds."""
        stop, block = self._cursor
        return stop - block.__length_hint__()

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
        values = self._current_order().take(np.array(points, dtype=np.int64)).tolist()
        bounds = [bound for interval in self._segments.intervals for bound in interval]
        return mix_ints(self.size, *values, *bounds, self._offset)

    # -- checkpoints ---------------------------------------------------------------------------

    def state_dict(self, consumed: int | None = None) -> dict[str, Any]:
        """Where the epoch stands, enough for every rank (of any world size) to resume.

        Args:
            consumed: how many samples this rank really used in the current pass (a
                prefetching DataLoader runs ahead of training); default: how many the current
                pass has yielded.
        """
        used = self._yielded if consumed is None else require_int("consumed", consumed, 0)
        if used > len(self):
            raise ValueError(
                f"consumed={used} but this rank's pass has only {len(self)} samples"
            )
        return {
            "version": STATE_VERSION,
            **{key: value for key, value in self.config().items() if key != "shuffle"},
            "consumed": self._offset + used,
            "segments": self._segments.to_state(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue the saved epoch where it stopped, on this sampler's world size.

        With the same world size, layout and remainder each rank continues its own sequence.
        Otherwise the positions that no rank consumed are split afresh over this sampler's
        ranks by its layout and remainder (a finished epoch leaves an empty pass). The next
        epoch is an ordinary one.
        """
        _check_state(state, self)
        saved_world, consumed = int(state["num_replicas"]), int(state["consumed"])
        segments = Segments.from_state(state["segments"])
        left = remaining_intervals(
            segments.length, saved_world, state["layout"], state["remainder"], consumed
        )
        self._start_epoch(int(state["epoch"]))
        if (saved_world, state["layout"], state["remainder"]) == (
            self.num_replicas, self.layout, self.remainder,
        ):
            self._segments, self._offset = segments, consumed
        else:
            self._segments = segments.subset(left)
        self._pinned = True

    def __repr__(self) -> str:
        options = ", ".join(f"{key}={value!r}" for key, value in self.config().items())
        return f"{type(self).__name__}(rank={self.rank}, {options})"


def _chunks(count: int) -> Iterator[tuple[int, int]]:
    """``(start, stop)`` pieces of ``[0, count)``: a small first one, so the first index is quick."""
    start, size = 0, _FIRST_CHUNK
    while start < count:
        yield start, min(count, start + size)
        start, size = start + size, _CHUNK


def _size_of(dataset_or_size: object) -> int:
    if isinstance(dataset_or_size, numbers.Integral) and not isinstance(dataset_or_size, bool):
        return require_int("dataset size", dataset_or_size, minimum=0)
    if not hasattr(dataset_or_size, "__len__"):
        raise TypeError(
            f"dataset_or_size must be an int or have __len__, got {type(dataset_or_size).__name__}; "
            "for an iterable dataset pass its size as an int"
        )
    return require_int("len(dataset)", len(dataset_or_size), minimum=0)  # type: ignore[arg-type]


def _check_state(state: Mapping[str, Any], sampler: DistributedSampler) -> None:
    required = ("version", *STATE_IDENTITY, "epoch", "layout", "remainder", "num_replicas",
                "consumed", "segments")
    missing = [key for key in required if key not in state]
    if missing:
        raise ValueError(f"not a shardwise sampler state: missing {', '.join(missing)}")
    if state["version"] != STATE_VERSION:
        raise ValueError(f"sampler state version {state['version']!r} is not {STATE_VERSION}")
    mine = sampler.config()
    for key in STATE_IDENTITY:
        if state[key] != mine[key]:
            raise ValueError(
                f"the state was saved with {key}={state[key]!r} but this sampler has "
                f"{key}={mine[key]!r}; build the sampler with the saved {key} to resume"
            )
    require_choice("saved layout", state["layout"], LAYOUTS)
    require_choice("saved remainder", state["remainder"], REMAINDERS)
    require_int("saved num_replicas", state["num_replicas"], minimum=1)
    consumed = require_int("saved consumed", state["consumed"], minimum=0)
    length = Segments.from_state(state["segments"]).length
    most = rank_count(length, int(state["num_replicas"]), 0, state["remainder"])
    if consumed > most:
        raise ValueError(f"the state says consumed={consumed} but no rank had more than {most}")


def _warn_torch_scale(size: int) -> None:
    global _warned_torch_scale
    if not _warned_torch_scale:
        _warned_torch_scale = True
        warnings.warn(
            f"permutation='torch' materialises a {size:,}-sample permutation on every rank every "
            f"epoch ({size * 8 / 2**30:.1f} GiB); permutation='feistel' needs O(1) memory",
            stacklevel=3,
        )

