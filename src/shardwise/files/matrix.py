"""A rank's block of a sparse matrix, loaded from edge lines (``fsmap``: one grid cell per rank)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import partial

import numpy as np
import scipy.sparse

from shardwise.files.columnar import TablePlan
from shardwise.files.load import LoadStats, load_records
from shardwise.files.pages import plain_pages
from shardwise.files.patterns import Format, LineParser
from shardwise.files.plan import Plan
from shardwise.files.records import gather_targets
from shardwise.files.sorting import group_rows, unique_inverse
from shardwise.files.sources import Paths, StorageOptions


@dataclass(frozen=True, eq=False)
class MatrixBlock:
    """``matrix[i, j]`` is the summed weight of entries (``row_ids[i]``, ``col_ids[j]``) held here.

    >>> block = MatrixBlock.from_records(np.array([1, 1, 9]), np.array([5, 5, 7]), np.ones(3))
    >>> block.matrix.toarray().tolist(), block.row_ids.tolist(), block.col_ids.tolist()
    ([[2.0, 0.0], [0.0, 1.0]], [1, 9], [5, 7])
    """

    matrix: scipy.sparse.csr_array
    row_ids: np.ndarray
    col_ids: np.ndarray
    stats: LoadStats | None = None

    @classmethod
    def from_records(
        cls, src: np.ndarray, dst: np.ndarray, weight: np.ndarray, stats: LoadStats | None = None
    ) -> MatrixBlock:
        """The block over the distinct rows and columns present, duplicates summed."""
        return cls._by_row(src, lambda order: (dst[order], weight[order]), stats)

    @classmethod
    def _by_row(
        cls, src: np.ndarray, gather: Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]],
        stats: LoadStats | None = None,
    ) -> MatrixBlock:
        """``from_records``, with ``gather(order)`` giving the columns and values in ``order``."""
        # Grouped into rows by one sort; scipy then only sorts each row's few entries and sums
        # their duplicates (building from (row, col) pairs cost another sort and scatter).
        row_ids, indptr, (dst, weight) = group_rows(src, gather)
        col_ids, cols = unique_inverse(dst)
        # Contiguous, and apart from the targets' half of the gathered pairs, which goes: scipy
        # keeps a strided array as it is, and copies it again in every product.
        weight = np.ascontiguousarray(weight)
        del dst
        matrix = scipy.sparse.csr_array((weight, cols, indptr), shape=(row_ids.size, col_ids.size))
        matrix.sum_duplicates()
        return cls(matrix, row_ids, col_ids, stats)


@plain_pages()
def load_matrix(
    paths: Paths | Plan | TablePlan,
    pattern: str = "fsmap",
    *,
    delimiter: str = ",",
    ids: str = "int",
    parser: LineParser | None = None,
    on_error: str = "raise",
    storage_options: StorageOptions | None = None,
    columns: Sequence[str] | None = None,
    **pipeline,
) -> MatrixBlock:
    """This rank's block of the matrix in ``paths`` (``src,dst[,weight]`` lines).

    With ``fsmap`` rank ``r`` holds the rows hashing to ``r // npy`` and the columns hashing to
    ``r % npy`` of the ``grid(world_size)``; ``fmap`` / ``smap`` give whole rows / columns.
    Parquet or Arrow IPC inputs give their entries from ``columns``: ``(row, col)`` or
    ``(row, col, value)``. ``pipeline`` takes ``block_bytes``, ``round_bytes``, ``progress`` and
    ``threads`` (see ``load_records``).
    """

    def entry_format() -> Format:  # checked inside the load: a bad argument fails every rank
        if pattern == "fvec":
            raise ValueError("pattern 'fvec' holds vectors, not matrix entries: use load_vectors()")
        return Format(pattern, delimiter, ids, parser, on_error)

    records, stats = load_records(paths, entry_format, storage_options=storage_options,
                                  columns=columns, **pipeline)
    started = time.perf_counter()
    block = MatrixBlock._by_row(records["src"], partial(gather_targets, records))
    seconds = {**stats.seconds, "build": time.perf_counter() - started}
    return replace(block, stats=replace(stats, seconds=seconds))
