"""The positions of an epoch's order still to be split, as sorted disjoint intervals.

A fresh epoch is one interval ``[0, size)``. After an elastic resume it is what no rank had
consumed yet, which the new ranks split as if it were a whole (shorter) epoch. Keeping
intervals rather than positions keeps resume O(ranks), whatever the dataset size.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from shardwise.split import Interval


@dataclass(frozen=True)
class Segments:
    """Intervals of order positions, read in sequence as one virtual run ``[0, length)``.

    >>> seq = Segments(((2, 4), (7, 9)))
    >>> seq.length, seq.take(np.arange(4)).tolist()
    (4, [2, 3, 7, 8])
    """

    intervals: tuple[Interval, ...]

    @classmethod
    def whole(cls, size: int) -> Segments:
        return cls(((0, size),) if size else ())

    @classmethod
    def from_state(cls, pairs: Iterable[Sequence[int]]) -> Segments:
        return cls(tuple((int(begin), int(end)) for begin, end in pairs))

    def to_state(self) -> list[list[int]]:
        return [[begin, end] for begin, end in self.intervals]

    @property
    def length(self) -> int:
        return sum(end - begin for begin, end in self.intervals)

    def take(self, virtual: np.ndarray) -> np.ndarray:
        """Order positions at the given virtual positions (int64, each in ``[0, length)``)."""
        if len(self.intervals) == 1:
            return virtual + self.intervals[0][0]
        lengths = np.array([end - begin for begin, end in self.intervals], dtype=np.int64)
        starts = np.cumsum(lengths) - lengths
        which = np.searchsorted(starts, virtual, side="right") - 1
        begins = np.array([begin for begin, _ in self.intervals], dtype=np.int64)
        return virtual - starts[which] + begins[which]

    def subset(self, virtual_intervals: Iterable[Interval]) -> Segments:
        """The segments that the given virtual intervals cover, in the same order.

        >>> Segments(((2, 4), (7, 9))).subset([(1, 3)]).intervals
        ((3, 4), (7, 8))
        """
        pieces: list[Interval] = []
        for v_begin, v_end in virtual_intervals:
            offset = 0
            for begin, end in self.intervals:
                lo, hi = max(v_begin, offset), min(v_end, offset + end - begin)
                if lo < hi:
                    pieces.append((begin + lo - offset, begin + hi - offset))
                offset += end - begin
        return Segments(tuple(pieces))
