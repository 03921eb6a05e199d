"""A rank's share of ``fvec`` lines (``id,f1,...,fk``): ids and a dense float array."""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace

import numpy as np

from shardwise.files.columnar import TablePlan
from shardwise.files.load import LoadStats, load_records
from shardwise.files.pages import plain_pages
from shardwise.files.patterns import Format, LineParser
from shardwise.files.plan import Plan
from shardwise.files.records import gather_values
from shardwise.files.sorting import sort_with_order
from shardwise.files.sources import Paths, StorageOptions


@dataclass(frozen=True, eq=False)
class Vectors:
    """Row ``i`` of ``values`` is the vector of ``ids[i]``; ids ascending. Unpacks as ``ids, values``."""

    ids: np.ndarray
    values: np.ndarray
    stats: LoadStats | None = None

    def __iter__(self) -> Iterator[np.ndarray]:
        return iter((self.ids, self.values))


@plain_pages()
def load_vectors(
    paths: Paths | Plan | TablePlan,
    *,
    delimiter: str = ",",
    ids: str = "int",
    parser: LineParser | None = None,
    on_error: str = "raise",
    features: int | None = None,
    storage_options: StorageOptions | None = None,
    columns: Sequence[str] | None = None,
    **pipeline,
) -> Vectors:
    """The vectors whose ids this rank owns (ids hashed over the ranks).

    Every line needs ``features`` values, by default as many as the input's first line has; a
    line with another number is malformed (``on_error`` decides). Parquet or Arrow IPC inputs
    give their vectors from ``columns``: ``(id, values)`` with ``values`` a list column, or
    ``(id, f1, ..., fk)``, one value per column. ``pipeline`` takes ``block_bytes``,
    ``round_bytes``, ``progress`` and ``threads`` (see ``load_records``).

    >>> import tempfile, pathlib
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "v.txt"
    >>> _ = path.write_text("1002 0.3 0.4\\n1001 0.1 0.2\\n")
    >>> ids, values = load_vectors(path, delimiter=" ")
    >>> ids.tolist(), values.tolist()
    ([1001, 1002], [[0.1, 0.2], [0.3, 0.4]])
    """
    records, stats = load_records(
        paths, lambda: Format("fvec", delimiter, ids, parser, on_error, features),
        storage_options=storage_options, columns=columns, **pipeline)
    started = time.perf_counter()
    ids, order = sort_with_order(records["id"])
    vectors = Vectors(ids, gather_values(records, order))
    seconds = {**stats.seconds, "build": time.perf_counter() - started}
    return replace(vectors, stats=replace(stats, seconds=seconds))
