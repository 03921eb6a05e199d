"""Send each record to the rank that owns it, as one byte payload per destination."""

from __future__ import annotations

import numpy as np

from shardwise.distributed.exchange import DEFAULT_ROUND_BYTES, all_to_all_joined


def route(
    records: np.ndarray, owner: np.ndarray, world_size: int, *, round_bytes: int = DEFAULT_ROUND_BYTES
) -> np.ndarray:
    """The records every rank sent here (all ranks call this together), in source-rank order.

    Within one source the records keep their order, so a load is deterministic.

    >>> route(np.arange(3), np.zeros(3, dtype=np.int64), 1).tolist()
    [0, 1, 2]
    """
    if world_size == 1:
        return records
    # A stable sort on 16-bit keys is a radix sort: linear in the number of records.
    order = np.argsort(owner.astype(np.uint16 if world_size <= 2**16 else np.int64), kind="stable")
    # Gathering whole rows of bytes is many times faster than NumPy's per-field structured copy.
    rows = np.ascontiguousarray(records).view(np.uint8).reshape(len(records), records.dtype.itemsize)
    grouped = np.take(rows, order, axis=0)
    counts = np.bincount(owner, minlength=world_size)
    received, _ = all_to_all_joined(
        grouped.reshape(-1), counts * records.dtype.itemsize, round_bytes=round_bytes
    )
    return received.view(records.dtype)
