"""Stable ordering of integer keys, by NumPy's fast (unstable) sort on packed keys.

``np.argsort(kind="stable")`` on ``int64`` is a merge sort, more than 10x slower than ``np.sort``
of the same keys (which NumPy vectorises). Packing each key's bits above its position makes every
packed key distinct, so sorting them plainly is stable. A key too wide to share 64 bits with its
position is sorted digit by digit, least significant first (an LSD radix sort of two passes
whenever there are fewer than 2**32 keys). Work arrays are reused in place: on a machine where
fresh memory is slow to touch, every array allocated costs more than the sort itself.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import numpy as np

T = TypeVar("T")

_SIGN = np.uint64(1 << 63)


def sort_with_order(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(sorted keys, order)``, ``order`` the same as ``np.argsort(keys, kind="stable")``.

    For ``int64`` (or narrower integer) keys; others go to ``np.argsort``.

    >>> [a.tolist() for a in sort_with_order(np.array([3, -1, 3, 2**62, -1]))]
    [[-1, -1, 3, 3, 4611686018427387904], [1, 4, 0, 2, 3]]
    """
    keys = np.asarray(keys)
    n = keys.size
    if keys.ndim != 1 or keys.dtype.kind not in "iu" or keys.dtype == np.uint64 or n < 2:
        order = np.argsort(keys, kind="stable")
        return keys[order], order
    # Offsets from the smallest key, in uint64: small ids need few bits, whatever their sign.
    packed = keys.astype(np.int64)  # a copy: it becomes the packed keys, then the sorted keys
    low = packed.min()
    work = packed.view(np.uint64)
    work -= np.int64(low).view(np.uint64)  # wraps to the exact offset, which fits in 64 bits
    key_bits = int(work.max()).bit_length()
    position_bits = max((n - 1).bit_length(), 1)
    digit_bits = 64 - position_bits
    mask = np.uint64((1 << position_bits) - 1)
    positions = np.arange(n, dtype=np.uint64)
    if key_bits <= digit_bits:  # one pass: the keys come back out of the packed keys
        work <<= np.uint64(position_bits)
        work |= positions
        work.sort()
        np.bitwise_and(work, mask, out=positions)
        work >>= np.uint64(position_bits)
        work += np.int64(low).view(np.uint64)
        return packed.astype(keys.dtype, copy=False), positions.view(np.int64)
    offsets, order = work.copy(), None
    for shift in range(0, key_bits, digit_bits):
        digits = offsets.copy() if order is None else offsets[order]
        digits >>= np.uint64(shift)
        digits &= np.uint64((1 << digit_bits) - 1)
        digits <<= np.uint64(position_bits)
        digits |= np.arange(n, dtype=np.uint64)
        digits.sort()
        digits &= mask
        step = digits.view(np.int64)
        order = step if order is None else order[step]
    return keys[order], order


def unique_inverse(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(keys, return_inverse=True)`` for integer keys, by one ``sort_with_order``.

    >>> [a.tolist() for a in unique_inverse(np.array([7, 3, 7, 5]))]
    [[3, 5, 7], [2, 0, 2, 1]]
    """
    ordered, order = sort_with_order(keys)
    starts = group_starts(ordered)
    unique = ordered[starts]
    ranks = np.cumsum(starts, dtype=np.int64)
    ranks -= 1
    inverse = np.empty(ordered.size, dtype=np.int64)
    inverse[order] = ranks
    return unique, inverse


def group_rows(keys: np.ndarray, gather: Callable[[np.ndarray], T]) -> tuple[np.ndarray, np.ndarray, T]:
    """Records grouped by integer key, as CSR rows: ``(distinct keys ascending, indptr, gathered)``.

    ``gather(order)`` takes the records' other columns in ``order``, each key's records in their
    given order; row ``i`` is ``gathered[indptr[i]:indptr[i + 1]]``.

    >>> values = np.array([10, 20, 30])
    >>> rows, indptr, grouped = group_rows(np.array([5, 2, 5]), lambda order: values[order])
    >>> rows.tolist(), indptr.tolist(), grouped.tolist()
    ([2, 5], [0, 1, 3], [20, 10, 30])
    """
    ordered, order = sort_with_order(keys)
    # One thread gathers: on a rank's first build the output's pages are fresh, and two threads
    # faulting them in at once built 2x slower than one (on a 2-core VM).
    gathered = gather(order)
    del order  # before the rows are made: a lower peak
    starts = group_starts(ordered)
    rows = ordered[starts]
    del ordered
    indptr = np.flatnonzero(np.append(starts, True)).astype(np.int64, copy=False)
    return rows, indptr, gathered


def group_starts(ordered: np.ndarray) -> np.ndarray:
    """Where each run of equal values of a sorted array starts (a boolean mask).

    >>> group_starts(np.array([1, 1, 4, 9, 9])).tolist()
    [True, False, True, True, False]
    """
    starts = np.empty(ordered.size, dtype=bool)
    starts[:1] = True
    np.not_equal(ordered[1:], ordered[:-1], out=starts[1:])
    return starts
