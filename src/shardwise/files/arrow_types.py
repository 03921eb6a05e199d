"""Arrow's several layouts of one kind of value, as pyarrow and polars write them.

pyarrow writes text as ``string`` and lists as ``list``; polars writes ``large_string`` or
``string_view`` and ``large_list``. The values are the same: the loaders read every layout alike,
and ``read_table`` joins parts that differ only in layout into the widest one.
"""

from __future__ import annotations

import pyarrow as pa


def _views(*names: str) -> list[pa.DataType]:
    """The view types pyarrow has (they came in pyarrow 16)."""
    return [getattr(pa, name)() for name in names if hasattr(pa, name)]


TEXT = frozenset([pa.string(), pa.large_string(), *_views("string_view")])
BYTES = frozenset([pa.binary(), pa.large_binary(), *_views("binary_view")])


def is_text(kind: pa.DataType) -> bool:
    """Whether ``kind`` holds text or bytes, in any layout (fixed-size bytes too).

    >>> is_text(pa.large_string()), is_text(pa.binary(16)), is_text(pa.int64())
    (True, True, False)
    """
    return kind in TEXT or kind in BYTES or pa.types.is_fixed_size_binary(kind)


def widest(kind: pa.DataType) -> pa.DataType:
    """``kind`` in the layout that holds any value of its kind: ``large_string`` for text,
    ``large_binary`` for bytes, ``large_list`` for lists (of such items); others unchanged.

    >>> widest(pa.list_(pa.string()))
    LargeListType(large_list<item: large_string>)
    """
    if kind in TEXT:
        return pa.large_string()
    if kind in BYTES:
        return pa.large_binary()
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        return pa.large_list(kind.value_field.with_type(widest(kind.value_type)))
    return kind
