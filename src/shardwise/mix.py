"""A stable 64-bit mixing hash (SplitMix64's finaliser), vectorised over NumPy arrays.

The same input gives the same output in every process, run and platform, unlike Python's
``hash()``. Used to key the Feistel permutation and to hash records to their owning rank.
"""

from __future__ import annotations

import hashlib

import numpy as np
import numpy.typing as npt

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_LOW64 = 2**64 - 1


def mix64(values: npt.ArrayLike) -> np.ndarray:
    """SplitMix64 of each value (taken modulo 2**64), as ``uint64``.

    >>> int(mix64(0))
    16294208416658607535
    """
    # In place on an array (0-d for a scalar): wraps modulo 2**64 with no overflow warning,
    # which NumPy gives only for its scalars (and an errstate block costs more than the rest).
    x = np.asarray(values).astype(np.uint64, copy=True)
    x += _GOLDEN
    x ^= x >> np.uint64(30)
    x *= _M1
    x ^= x >> np.uint64(27)
    x *= _M2
    x ^= x >> np.uint64(31)
    return x


def mix_ints(*values: int) -> int:
    """Fold several Python ints (any sign, below 2**64 in magnitude) into one 64-bit key.

    >>> mix_ints(0, 1) != mix_ints(1, 0)
    True
    """
    key = 0
    for value in values:
        key = _mix64_int(key ^ (int(value) % 2**64))
    return key


def mix_arrays(*values: npt.ArrayLike) -> np.ndarray:
    """``mix_ints`` of each element of the broadcast ``values`` (ints or integer arrays), as
    ``uint64``: the same keys, many at once.

    >>> int(mix_arrays(7, np.array([3, -1]))[1]) == mix_ints(7, -1)
    True
    """
    key = np.uint64(0)
    for value in values:
        wrapped = np.uint64(value % 2**64) if isinstance(value, int) else np.asarray(value)
        key = mix64(key ^ wrapped.astype(np.uint64))  # (an int64's two's complement: mod 2**64)
    return key


def _mix64_int(x: int) -> int:
    """``mix64`` of one Python int below 2**64, in Python's ints: keys are made often, one at
    a time (a class's pool, a Feistel round), where NumPy's per-call cost is most of it."""
    x = (x + 0x9E3779B97F4A7C15) & _LOW64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _LOW64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _LOW64
    return x ^ (x >> 31)


def digest(*chunks: bytes | np.ndarray) -> int:
    """A 63-bit digest of every byte given (an array by its contents), for ranks to compare
    whole inputs, not samples of them: about 1 ms per MB.

    >>> digest(b"ab") == digest(np.frombuffer(b"ab", np.uint8)) != digest(b"ba")
    True
    """
    hashed = hashlib.blake2b(digest_size=8)
    for chunk in chunks:
        hashed.update(np.ascontiguousarray(chunk).data if isinstance(chunk, np.ndarray) else chunk)
    return int.from_bytes(hashed.digest(), "little") >> 1  # fits an int64
