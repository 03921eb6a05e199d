"""Files as the shards of a stream: each text file's lines, or each Parquet row group's rows.

Give them to :func:`shard_iterable` as ``shards=``: with at least as many shards as consumers
(ranks x DataLoader workers), each consumer reads whole files (or row groups) of its own, and a
resume reopens the shard it was in. Local paths, directories, globs and fsspec URLs are accepted,
as by the file loader.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from shardwise.files.columnar import Unit, read_unit, table_plan
from shardwise.files.sources import Paths, Source, expand


@dataclass(frozen=True)
class LineShard:
    """The lines of one text file, decoded as UTF-8, without their terminators."""

    source: Source

    def __iter__(self) -> Iterator[str]:
        with self.source.open() as handle:
            for raw in handle:
                line = raw.decode("utf-8")
                line = line[:-1] if line.endswith("\n") else line
                yield line[:-1] if line.endswith("\r") else line


@dataclass(frozen=True)
class RowGroupShard:
    """The rows of one Parquet row group (or Arrow IPC record batch), as dicts."""

    unit: Unit
    columns: tuple[str, ...] | None = None

    def __iter__(self) -> Iterator[dict[str, Any]]:
        table: pa.Table = read_unit(self.unit, 0, self.unit.rows, self.columns)
        yield from table.to_pylist()


def line_shards(paths: Paths) -> list[LineShard]:
    """One shard per text file of ``paths``.

    >>> import tempfile, pathlib
    >>> folder = pathlib.Path(tempfile.mkdtemp())
    >>> _ = (folder / "a.txt").write_text("one\\ntwo\\n"); _ = (folder / "b.txt").write_text("three")
    >>> [list(shard) for shard in line_shards(folder)]
    [['one', 'two'], ['three']]
    """
    return [LineShard(source) for source in expand(paths)]


def row_group_shards(paths: Paths, columns: Sequence[str] | None = None) -> list[RowGroupShard]:
    """One shard per row group of the Parquet (or Arrow IPC) files of ``paths``."""
    chosen = tuple(columns) if columns is not None else None
    return [RowGroupShard(unit, chosen) for unit in table_plan(paths, 1).units]
