"""Files as the shards of a stream: each text file's lines, or each Parquet row group's rows.

Give them to :func:`shard_iterable` as ``shards=``: with at least as many shards as consumers
(ranks x DataLoader workers), each consumer reads whole files (or row groups) of its own, and a
resume reopens the shard it was in. Local paths, directories, globs and fsspec URLs are accepted,
as by the file loader, with its ``storage_options``: an object in a bucket is read by retried
range requests, a chunk ahead of the consumer, and named without credentials in any error.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from shardwise.files.columnar import Unit, column_names, read_unit, table_plan
from shardwise.files.plan import Plan
from shardwise.files.read import chunk_lines, iter_chunks
from shardwise.files.sources import Paths, Source, StorageOptions, expand

# A consumer holds one chunk's decoded lines at a time (and one chunk of bytes ahead): smaller
# than the loader's 16 MiB, as each DataLoader worker holds its own.
_BLOCK_BYTES = 4 * 2**20


@dataclass(frozen=True)
class LineShard:
    """The lines of one text file, decoded as UTF-8, without their terminators.

    Read in line-aligned chunks as the file loader reads them (``iter_chunks``): a remote object
    by retried range requests, the next chunk requested while this one's lines are consumed.
    """

    source: Source

    def identity(self) -> str:
        """The same on every rank that names the same file: its name and size."""
        return f"lines of {self.source.name} ({self.source.size} bytes)"

    def __iter__(self) -> Iterator[str]:
        for chunk in iter_chunks(Plan((self.source,), 1), 0, 1, block_bytes=_BLOCK_BYTES):
            yield from chunk_lines(chunk)


@dataclass(frozen=True)
class RowGroupShard:
    """The rows of one Parquet row group (or Arrow IPC record batch), as dicts."""

    unit: Unit
    columns: tuple[str, ...] | None = None

    def identity(self) -> str:
        """The same on every rank that names the same row group of the same file."""
        return (f"row group {self.unit.index} of {self.unit.source.name} ({self.unit.rows} rows, "
                f"columns {self.columns})")

    def __iter__(self) -> Iterator[dict[str, Any]]:
        table: pa.Table = read_unit(self.unit, 0, self.unit.rows, self.columns)
        yield from table.to_pylist()


def line_shards(paths: Paths, storage_options: StorageOptions | None = None) -> list[LineShard]:
    """One shard per text file of ``paths``; URLs are opened with ``storage_options``.

    >>> import tempfile, pathlib
    >>> folder = pathlib.Path(tempfile.mkdtemp())
    >>> _ = (folder / "a.txt").write_text("one\\ntwo\\n"); _ = (folder / "b.txt").write_text("three")
    >>> [list(shard) for shard in line_shards(folder)]
    [['one', 'two'], ['three']]
    """
    return [LineShard(source) for source in expand(paths, storage_options)]


def row_group_shards(paths: Paths, columns: Sequence[str] | None = None,
                     storage_options: StorageOptions | None = None) -> list[RowGroupShard]:
    """One shard per row group of the Parquet (or Arrow IPC) files of ``paths``.

    >>> import tempfile, pathlib, pyarrow.parquet as pq
    >>> folder = pathlib.Path(tempfile.mkdtemp())
    >>> pq.write_table(pa.table({"x": range(5)}), folder / "t.parquet", row_group_size=2)
    >>> [[row["x"] for row in shard] for shard in row_group_shards(folder)]
    [[0, 1], [2, 3], [4]]
    """
    chosen = column_names(columns)
    return [RowGroupShard(unit, chosen)
            for unit in table_plan(paths, 1, storage_options=storage_options).units]
