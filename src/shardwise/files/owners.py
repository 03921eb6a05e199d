"""Which rank owns each record: a stable 64-bit mix of the record's key, modulo the ranks.

Mixing first matters: structured ids (all even, all multiples of the rank count, consecutive
blocks) would pile onto a few ranks under ``id % W``, as they do under C++'s identity
``std::hash``. The mix spreads any id set evenly, and gives the same owner on every run.
"""

from __future__ import annotations

import math

import numpy as np

from shardwise.checks import require_int
from shardwise.mix import mix64


def grid(world_size: int) -> tuple[int, int]:
    """The ``fsmap`` grid ``(npx, npy)``: npx is the largest divisor of the world not above its root.

    >>> grid(6), grid(7), grid(16)
    ((2, 3), (1, 7), (4, 4))
    """
    world_size = require_int("world_size", world_size, minimum=1)
    npx = max(d for d in range(1, math.isqrt(world_size) + 1) if world_size % d == 0)
    return npx, world_size // npx


def bucket(keys: np.ndarray, buckets: int) -> np.ndarray:
    """The bucket in ``[0, buckets)`` of each ``int64`` key, through the mixing hash.

    >>> bucket(np.array([0, 1, 2**62]), 4).tolist()
    [3, 1, 3]
    """
    return (mix64(keys) % np.uint64(buckets)).astype(np.int64)


def owners(records: np.ndarray, pattern: str, world_size: int) -> np.ndarray:
    """The owning rank of each record under ``pattern``'s rule.

    fmap and fset: by src; smap: by dst; fvec: by id; fsmap: the cell (src row, dst column) of
    the ``grid(world_size)``, so each rank holds one block of the matrix.
    """
    if pattern in ("fmap", "fset"):
        return bucket(records["src"], world_size)
    if pattern == "smap":
        return bucket(records["dst"], world_size)
    if pattern == "fvec":
        return bucket(records["id"], world_size)
    if pattern == "fsmap":
        npx, npy = grid(world_size)
        return bucket(records["src"], npx) * npy + bucket(records["dst"], npy)
    raise ValueError(f"no ownership rule for pattern {pattern!r}")
