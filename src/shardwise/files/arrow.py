"""NumPy arrays to and from pyarrow without pyarrow's pandas shim.

``Array.to_numpy()`` and ``pa.array(ndarray)`` import pandas on first use (when it is installed),
which takes a quarter of a second in every rank. These build the same arrays from the buffers.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

_NUMPY_TYPES = {pa.int32(): np.dtype(np.int32), pa.int64(): np.dtype(np.int64),
                pa.float64(): np.dtype(np.float64)}


def to_numpy(column: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """An ``int32`` / ``int64`` / ``float64`` column without nulls as NumPy (zero-copy when it
    is one chunk).

    >>> to_numpy(pa.chunked_array([[1, 2], [3]])).tolist()
    [1, 2, 3]
    """
    if isinstance(column, pa.ChunkedArray):
        column = column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()
    dtype = _NUMPY_TYPES.get(column.type)
    if dtype is None or column.null_count:
        raise TypeError(f"expected numbers without nulls, got {column.type} "
                        f"({column.null_count} nulls)")
    if len(column) == 0:
        return np.empty(0, dtype)
    return np.frombuffer(column.buffers()[1], dtype, count=len(column),
                         offset=column.offset * dtype.itemsize)


def from_numpy(values: np.ndarray) -> pa.Array:
    """A 1-D ``int64`` or ``bool`` NumPy array as a pyarrow array (``int64`` shares its memory).

    >>> from_numpy(np.array([True, False, True])).to_pylist()
    [True, False, True]
    """
    if values.dtype == np.bool_:
        bits = np.packbits(values, bitorder="little")
        return pa.Array.from_buffers(pa.bool_(), values.size, [None, pa.py_buffer(bits)])
    values = np.ascontiguousarray(values, dtype=np.int64)
    return pa.Array.from_buffers(pa.int64(), values.size, [None, pa.py_buffer(values)])
