"""String ids as 63-bit integers: the same string gets the same id on every rank and every run.

An id is SplitMix64 folded over the UTF-8 bytes 8 at a time, seeded with the length, then shifted
right by one so it is a non-negative ``int64``. Two distinct strings share an id with probability
about ``n**2 / 2**64`` for ``n`` distinct strings (about 5e-4 at a hundred million); the loader
checks each parsed chunk and raises if two of its strings collide.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from shardwise.files.arrow import from_numpy, to_numpy
from shardwise.mix import mix64

_SEED = np.uint64(0x5EED_F11E_5EED_F11E)
# _MASKS[k] keeps the first k bytes of a little-endian 8-byte word.
_MASKS = np.array([(1 << (8 * k)) - 1 for k in range(8)] + [2**64 - 1], dtype=np.uint64)


def string_ids(strings: Iterable[str]) -> np.ndarray:
    """The ``int64`` id of each string, as the loader assigns it with ``ids="str"``.

    >>> ids = string_ids(["alice", "bob", "alice"])
    >>> bool(ids[0] == ids[2]), bool(ids[0] != ids[1]), bool((ids >= 0).all())
    (True, True, True)
    """
    return hash_binary(pa.array([s.encode("utf-8") for s in strings], type=pa.binary()))


def hash_binary(values: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """63-bit ids of a pyarrow ``binary`` / ``string`` array, vectorised (no loop per string)."""
    if isinstance(values, pa.ChunkedArray):
        parts = [hash_binary(chunk) for chunk in values.chunks]
        return np.concatenate(parts) if parts else np.empty(0, dtype=np.int64)
    n = len(values)
    _, offsets_buffer, data_buffer = values.buffers()
    offsets = np.frombuffer(offsets_buffer, dtype=np.int32, count=n + 1, offset=4 * values.offset)
    offsets = offsets.astype(np.int64)
    lengths = np.diff(offsets)
    # Pad so the last string's final word can be read whole; view every byte offset as a word.
    total = int(offsets[-1])
    padded = np.empty(total + 8, dtype=np.uint8)
    padded[total:] = 0
    if data_buffer is not None:
        padded[:total] = np.frombuffer(data_buffer, dtype=np.uint8, count=total)
    words = np.ndarray(shape=(padded.size - 7,), dtype="<u8", buffer=padded, strides=(1,))
    hashes = mix64(lengths.astype(np.uint64) ^ _SEED)
    word_counts = (lengths + 7) // 8
    starts, shortest = offsets[:-1], int(lengths.min(initial=0))
    for j in range(int(word_counts.max(initial=0))):
        if 8 * j < shortest:  # every string has word j: no rows to pick out
            word = words[starts + 8 * j]
            if shortest < 8 * (j + 1):
                word &= _MASKS[np.minimum(lengths - 8 * j, 8)]
            hashes = mix64(hashes ^ word)
            continue
        rows = np.flatnonzero(word_counts > j)
        word = words[starts[rows] + 8 * j] & _MASKS[np.minimum(lengths[rows] - 8 * j, 8)]
        hashes[rows] = mix64(hashes[rows] ^ word)
    return (hashes >> np.uint64(1)).astype(np.int64)


def hash_together(strings: Sequence[pa.ChunkedArray]) -> list[np.ndarray]:
    """The ids of each ``binary`` column in ``strings``, checked for collisions across them all.

    A source and a target are ids of one kind: two different strings, one in each column, must
    not share an id either.

    >>> [i.size for i in hash_together([pa.chunked_array([[b"a"]]), pa.chunked_array([[b"b"]])])]
    [1, 1]
    """
    ids = [hash_binary(column) for column in strings]
    everything = pa.chunked_array([chunk for column in strings for chunk in column.chunks],
                                  type=pa.binary())
    check_distinct(everything, np.concatenate(ids))
    return ids


def check_distinct(strings: pa.Array | pa.ChunkedArray, ids: np.ndarray) -> None:
    """Raise if two different strings in ``strings`` were given the same id in ``ids``.

    Sorts the ids and compares only the strings of equal neighbours, so the check costs one
    sort, or two when some id repeats (hashing every string into a set, as ``count_distinct``
    does, took several times longer).

    >>> check_distinct(pa.array([b"a", b"b", b"a"]), np.array([1, 2, 1]))
    """
    if not np.any(np.diff(np.sort(ids)) == 0):  # no id repeats: settled by NumPy's fast sort
        return
    # Any order of equal ids will do (equal neighbours are compared), so not a stable sort,
    # which on 63-bit hashes is a radix sort of two passes: 1-4x slower.
    order = np.argsort(ids)
    ordered = ids[order]
    pairs = np.flatnonzero(ordered[1:] == ordered[:-1])
    left, right = strings.take(from_numpy(order[pairs])), strings.take(from_numpy(order[pairs + 1]))
    differ = pc.not_equal(left, right)
    if pc.any(differ).as_py():
        first = int(np.argmax(to_numpy(pc.cast(differ, pa.int32()))))
        raise ValueError(
            f"string ids {left[first].as_py()!r} and {right[first].as_py()!r} hash to the same "
            f"63-bit id {int(ordered[pairs[first]])}; rename one of them, or map the strings to "
            "integers before loading"
        )
