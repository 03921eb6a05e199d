"""Which positions of an epoch's order belong to rank ``r`` of ``W``: pure arithmetic.

A split sees a sequence of ``length`` positions and returns, for one rank, the positions it
takes, unwrapped: with ``remainder="pad"`` a position ``q >= length`` is a padding repeat of
position ``q % length``, exactly as torch's ``DistributedSampler`` wraps.

==========  ============================================================================
layout      ``strided``: rank r takes r, r+W, r+2W, ... (torch's Python sampler);
            ``block``: rank r takes one contiguous run (torch's C++ samplers)
remainder   ``pad``: repeat from the start until W divides the length (torch's default);
            ``drop``: cut to a multiple of W (torch's ``drop_last=True``);
            ``uneven``: nothing repeated or dropped, rank counts differ by at most one
==========  ============================================================================

>>> rank_positions(7, 3, 2, "strided", "pad").tolist()   # 2, 5, then 8 = repeat of 1
[2, 5, 8]
>>> rank_positions(7, 3, 0, "block", "uneven").tolist()
[0, 1, 2]
"""

from __future__ import annotations

import numpy as np

LAYOUTS = ("strided", "block")
REMAINDERS = ("pad", "drop", "uneven")

Interval = tuple[int, int]


def rank_count(length: int, world: int, rank: int, remainder: str) -> int:
    """How many positions rank ``rank`` takes.

    >>> [rank_count(7, 3, r, "uneven") for r in range(3)]
    [3, 2, 2]
    """
    if remainder == "pad":
        return -(-length // world)
    if remainder == "drop":
        return length // world
    return length // world + (rank < length % world)


def split_total(length: int, world: int, remainder: str) -> int:
    """Positions taken by all ranks together (repeats included).

    >>> split_total(7, 3, "pad"), split_total(7, 3, "drop"), split_total(7, 3, "uneven")
    (9, 6, 7)
    """
    if remainder == "uneven":
        return length
    return rank_count(length, world, 0, remainder) * world


def block_start(length: int, world: int, rank: int, remainder: str) -> int:
    """Where rank ``rank``'s contiguous run begins in the ``block`` layout."""
    if remainder == "uneven":
        return rank * (length // world) + min(rank, length % world)
    return rank * rank_count(length, world, 0, remainder)


def rank_positions(
    length: int,
    world: int,
    rank: int,
    layout: str,
    remainder: str,
    start: int = 0,
    stop: int | None = None,
) -> np.ndarray:
    """Positions ``start:stop`` of rank ``rank``'s share, unwrapped, as uint64.

    Computes only the ``stop - start`` positions asked for. Unsigned because a padding
    position of a split near ``length = 2**63 - 1`` passes the largest int64.
    """
    count = rank_count(length, world, rank, remainder)
    start, stop, _ = slice(start, stop).indices(count)
    steps = np.arange(start, max(start, stop), dtype=np.uint64)
    if layout == "strided":
        return steps * np.uint64(world) + np.uint64(rank)
    return steps + np.uint64(block_start(length, world, rank, remainder))


def consumed_intervals(
    length: int, world: int, layout: str, remainder: str, consumed: int
) -> list[Interval]:
    """The positions in ``[0, length)`` used once every rank has taken ``consumed`` of its share.

    A padding repeat (a position at ``length`` or beyond) uses nothing: the position it repeats
    may still be ahead in another rank's block, and ``padding_mask`` counts it there. Sorted,
    disjoint, merged.

    >>> consumed_intervals(7, 3, "strided", "uneven", 2)
    [(0, 6)]
    >>> consumed_intervals(7, 3, "block", "uneven", 1)
    [(0, 1), (3, 4), (5, 6)]
    """
    if layout == "strided":
        runs = [(0, min(consumed * world, split_total(length, world, remainder)))]
    else:
        runs = [
            (begin, begin + min(consumed, rank_count(length, world, rank, remainder)))
            for rank in range(world)
            for begin in [block_start(length, world, rank, remainder)]
        ]
    return _merge((begin, min(end, length)) for begin, end in runs if begin < min(end, length))


def remaining_intervals(
    length: int, world: int, layout: str, remainder: str, consumed: int
) -> list[Interval]:
    """The positions in ``[0, length)`` that no rank has used yet: the rest of the epoch.

    >>> remaining_intervals(7, 3, "block", "uneven", 1)
    [(1, 3), (4, 5), (6, 7)]
    """
    remaining, cursor = [], 0
    for begin, end in consumed_intervals(length, world, layout, remainder, consumed):
        if begin > cursor:
            remaining.append((cursor, begin))
        cursor = end
    if cursor < length:
        remaining.append((cursor, length))
    return remaining


def _merge(runs) -> list[Interval]:
    merged: list[Interval] = []
    for begin, end in sorted(runs):
        if merged and begin <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((begin, end))
    return merged
