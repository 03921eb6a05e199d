"""Columnar inputs (Parquet, Arrow IPC / Feather): each rank reads whole row groups of its own.

A Parquet file is a run of row groups, an Arrow IPC file a run of record batches: units a rank
reads whole, decoding nothing it does not keep. The units of all inputs, in order, are dealt to
the ranks as contiguous runs balanced by their compressed bytes (each rank in turn takes units
while the middle of the next one falls within an equal share of the bytes still to deal, and at
least one with rows), so every unit is read by exactly one rank and no rank is idle. With fewer
units with rows than ranks that would leave ranks idle, so the rows are split instead: rank
``r`` reads rows ``[R*r//W, R*(r+1)//W)`` of the ``R`` rows, slicing them out of the units that
hold them.

URLs (``s3://``, ``gs://``...) are opened with ``storage_options``, as by the text loader: every
request (a listing, a footer, a column chunk) is retried on transient errors and names the object
without its credentials (``remote.py``).
"""

from __future__ import annotations

import io
import warnings
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from functools import cached_property
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from pyarrow import ipc
from rich.console import Console, Group
from rich.table import Table

from shardwise.checks import require_int
from shardwise.distributed.world import resolve_world
from shardwise.files.arrow_types import widest
from shardwise.files.credentials import hide
from shardwise.files.ids import string_ids
from shardwise.files.ipc_footer import record_batches
from shardwise.files.pages import plain_pages
from shardwise.files.sources import Paths, Source, StorageOptions, expand
from shardwise.mix import mix_ints

_METADATA_READ_BYTES = 16 * 2**10  # a request made to plan asks for at least this many bytes
SUFFIXES = {".parquet": "parquet", ".parq": "parquet", ".pq": "parquet",
            ".arrow": "arrow", ".feather": "arrow", ".ipc": "arrow"}


def columnar_format(name: str) -> str | None:
    """``"parquet"``, ``"arrow"``, or ``None`` for a file that is not columnar, by its suffix.

    >>> columnar_format("s3://bucket/part-0001.parquet"), columnar_format("edges.csv")
    ('parquet', None)
    """
    lowered = name.lower()
    return next((kind for suffix, kind in SUFFIXES.items() if lowered.endswith(suffix)), None)


@dataclass(frozen=True)
class Unit:
    """One row group (Parquet) or record batch (Arrow IPC) of one input file."""

    source: Source
    index: int
    rows: int
    bytes: int  # compressed, as stored


@dataclass(frozen=True)
class TablePlan:
    """Which row groups (or rows) of which columnar files each of ``world_size`` ranks reads.

    >>> import tempfile, pathlib
    >>> folder = pathlib.Path(tempfile.mkdtemp())
    >>> pq.write_table(pa.table({"x": range(10)}), folder / "a.parquet", row_group_size=4)
    >>> plan = table_plan(folder, 2)
    >>> [u.rows for u in plan.units], plan.by_rows, [len(plan.share(r)) for r in range(2)]
    ([4, 4, 2], False, [1, 2])
    """

    sources: tuple[Source, ...]
    units: tuple[Unit, ...]
    world_size: int
    schemas: tuple[pa.Schema, ...] = ()  # each source's, from the footer read for its units

    @classmethod
    def of(cls, sources: Sequence[Source], world_size: int) -> TablePlan:
        """The plan of files already listed: reads each one's footer for its row groups."""
        world_size = require_int("world_size", world_size, minimum=1)
        found = [_units(source) for source in sources]
        return cls(tuple(sources), tuple(unit for units, _ in found for unit in units),
                   world_size, tuple(schema for _, schema in found))

    def resized(self, world_size: int) -> TablePlan:
        """The same units dealt to ``world_size`` ranks (no footer is read again)."""
        world_size = require_int("world_size", world_size, minimum=1)
        return self if world_size == self.world_size else replace(self, world_size=world_size)

    @cached_property
    def units_with_rows(self) -> int:
        """How many units hold rows: one of none (an empty file's) is no work for a rank."""
        return sum(1 for unit in self.units if unit.rows)

    @property
    def by_rows(self) -> bool:
        """Whether rows are split inside units (fewer units with rows than ranks) rather than
        whole units."""
        return self.units_with_rows < self.world_size

    @cached_property
    def _row_starts(self) -> np.ndarray:
        return np.concatenate([[0], np.cumsum([u.rows for u in self.units], dtype=np.int64)])

    @cached_property
    def _dealt(self) -> list[int]:
        """Where each rank's run of whole units starts, and where the last one ends.

        Each rank in turn takes units while the middle of the next one falls within its equal
        share of the bytes still to deal (the rest over the ranks still to serve), and at least
        one with rows while every later rank can still have one: a few small units in front of
        a large one, or units of no rows, leave no rank idle, and each rank's bytes stay within a
        unit of an equal share.
        """
        sizes, world = [u.bytes for u in self.units], self.world_size
        bounds, left, filled = [0], sum(sizes), self.units_with_rows  # (those still to deal)
        for rank in range(world - 1):
            end, before = bounds[-1], filled
            taken, target = 0, left / (world - rank)
            while filled > world - rank - 1 and (
                    filled == before or taken + sizes[end] / 2 <= target):
                taken += sizes[end]
                filled -= self.units[end].rows > 0
                end += 1
            bounds.append(end)
            left -= taken
        bounds.append(len(self.units))
        return bounds

    @property
    def total_rows(self) -> int:
        return int(self._row_starts[-1])

    def share(self, rank: int) -> list[tuple[Unit, int, int]]:
        """``(unit, first row, end row)`` of each stretch ``rank`` reads, rows counted in the unit."""
        rank = require_int("rank", rank, minimum=0)
        if rank >= self.world_size:
            raise ValueError(f"rank must be in [0, {self.world_size}), got {rank}")
        world = self.world_size
        if not self.by_rows:
            first, end = self._dealt[rank], self._dealt[rank + 1]
            return [(unit, 0, unit.rows) for unit in self.units[first:end]]
        lo, hi = self.total_rows * rank // world, self.total_rows * (rank + 1) // world
        stretches = []
        for i, unit in enumerate(self.units):
            start, end = int(self._row_starts[i]), int(self._row_starts[i + 1])
            first, last = max(lo, start), min(hi, end)
            if first < last:
                stretches.append((unit, first - start, last - start))
        return stretches

    def digest(self) -> int:
        """A 64-bit digest of the files, their units and sizes: ranks compare it to agree."""
        names = string_ids([u.source.name for u in self.units]).tolist()
        return mix_ints(self.world_size, *(mix_ints(name, u.index, u.rows, u.bytes)
                                           for name, u in zip(names, self.units)))

    def describe(self) -> str:
        """One line: the inputs, and how they are split."""
        how = ("rows split inside row groups: fewer row groups than ranks" if self.by_rows
               else "whole row groups, balanced by compressed bytes")
        return (f"{len(self.units)} row groups, {self.total_rows:,} rows, {self.world_size} ranks: "
                f"{how}")

    def table(self, ranks: Iterable[int] | None = None) -> Table:
        """One row per rank (of ``ranks``, all by default): its row groups (or row ranges), rows
        and compressed bytes read."""
        table = Table()
        for column in ("rank", "row groups", "rows", "bytes"):
            table.add_column(column, justify="right")
        for rank in range(self.world_size) if ranks is None else ranks:
            share = self.share(rank)
            table.add_row(str(rank), str(len(share)), f"{sum(e - s for _, s, e in share):,}",
                          f"{sum(u.bytes for u, _, _ in share):,}")
        return table

    def __rich__(self) -> Group:
        return Group(self.describe(), self.table())

    def __str__(self) -> str:
        buffer = io.StringIO()
        Console(file=buffer, width=10_000, color_system=None).print(self)  # never wraps a line
        return buffer.getvalue()


def column_names(columns: Sequence[str] | None) -> tuple[str, ...] | None:
    """``columns`` as a tuple of names (None: every column); a lone name is refused, not read
    as its letters, and so is a name given twice.

    >>> column_names(["src", "dst"]), column_names(None)
    (('src', 'dst'), None)
    """
    if columns is None:
        return None
    if isinstance(columns, str) or not isinstance(columns, Iterable):
        raise TypeError(f"columns must be a sequence of column names, got {columns!r}")
    if isinstance(columns, (set, frozenset)):  # (its order follows string hashes, per process)
        raise TypeError(f"columns must be in order, the same on every rank, got the set "
                        f"{columns!r}: pass them as a list")
    names = tuple(columns)  # (read once: a generator checked, then read, would give no names)
    if not all(isinstance(c, str) for c in names):
        raise TypeError(f"columns must be a sequence of column names, got {list(names)!r}")
    if len(set(names)) != len(names):  # (Parquet reads such a column once, Arrow IPC refuses)
        raise ValueError(f"columns names a column twice: {list(names)}")
    return names


def table_plan(paths: Paths, world_size: int, *,
               storage_options: StorageOptions | None = None) -> TablePlan:
    """Plan how ``world_size`` ranks split the row groups of columnar ``paths``.

    URLs are opened with ``storage_options`` (fsspec's, such as ``{"endpoint_url": ...}`` for
    ``s3://``).
    """
    world_size = require_int("world_size", world_size, minimum=1)
    return TablePlan.of(expand(paths, storage_options), world_size)


@plain_pages()
def read_table(
    paths: Paths | TablePlan,
    rank: int | None = None,
    world_size: int | None = None,
    *,
    columns: Sequence[str] | None = None,
    storage_options: StorageOptions | None = None,
) -> pa.Table:
    """This rank's rows of Parquet or Arrow IPC ``paths``, as one table; no exchange.

    ``rank`` / ``world_size`` default to the process group (or ``RANK`` / ``WORLD_SIZE``).
    Every row of the inputs is in exactly one rank's table, in the inputs' order. URLs are
    opened with ``storage_options``; each rank requests only its own row groups' bytes (and the
    footers). Parts whose columns differ only in the layout of text or lists (pyarrow's
    ``string`` and polars' ``large_string``) come back in the widest layout (``large_string``,
    ``large_binary``, ``large_list``) on every rank, whichever parts it reads.

    >>> import tempfile, pathlib
    >>> folder = pathlib.Path(tempfile.mkdtemp())
    >>> pq.write_table(pa.table({"x": range(6), "y": range(6)}), folder / "t.parquet",
    ...                row_group_size=2)
    >>> [read_table(folder, r, 3, columns=["x"])["x"].to_pylist() for r in range(3)]
    [[0, 1], [2, 3], [4, 5]]
    """
    columns = column_names(columns)
    world_size, rank = resolve_world(world_size, rank, name="world_size")
    if isinstance(paths, TablePlan):
        plan = paths.resized(world_size)
    else:
        plan = table_plan(paths, world_size, storage_options=storage_options)
    say_if_split_by_rows(plan, rank)
    model, _, layouts = check_one_schema(plan, columns)
    # (an empty piece adds nothing, whatever its types: pandas writes an empty frame's text as
    # nulls)
    shared = [stretch for stretch in plan.share(rank) if stretch[2] > stretch[1]]
    # (nothing for this rank: an empty table of the inputs' columns)
    pieces = list(read_stretches(shared, columns)) or [file_schema(model, columns).empty_table()]
    schema = pieces[0].schema
    types = [widest(kind) for kind in schema.types]
    for (unit, _, _), piece in zip(shared, pieces):
        # Names and types: files that differ only in which columns may hold nulls concatenate,
        # and those that differ only in the layout of text or lists (pyarrow's and polars'
        # parts in one folder) are cast to the widest layout.
        if (piece.schema.names, [widest(kind) for kind in piece.schema.types]) != (
                schema.names, types):
            raise ValueError(f"{unit.source.name} has columns {piece.schema.names} of types "
                             f"{piece.schema.types}, unlike the inputs before it "
                             f"({schema.names}, {schema.types}); give files of one schema")
    # The widest layout where any file with rows has another, not only one this rank read: every
    # rank's table has the same types.
    if layouts or any(piece.schema.types != schema.types for piece in pieces):
        pieces = [piece.cast(pa.schema([field.with_type(kind) for field, kind in
                                        zip(piece.schema, types)], piece.schema.metadata))
                  for piece in pieces]
    if not schema.names:  # (columns=[]: concat_tables counts no rows in tables of no columns)
        return pa.Table.from_batches([b for piece in pieces for b in piece.to_batches()], schema)
    return pa.concat_tables(pieces, promote_options="default")


def say_if_split_by_rows(plan: TablePlan, rank: int) -> None:
    """Warn (on rank 0 only) when there are fewer row groups than ranks, so rows are split."""
    if plan.total_rows and plan.by_rows and rank == 0:
        warnings.warn(
            f"{plan.units_with_rows} row group(s) for {plan.world_size} ranks: rows are split "
            "inside row groups so that no rank is idle, and a rank decodes each row group it "
            "shares whole; write smaller row groups (row_group_size=) for each rank to read only "
            "its own",
            stacklevel=3)


def _units(source: Source) -> tuple[list[Unit], pa.Schema]:
    kind = columnar_format(source.name)
    if kind is None:
        raise ValueError(f"{source.name} is not a Parquet or Arrow IPC file (by its name); "
                         f"columnar inputs end in {', '.join(SUFFIXES)}")
    # Small reads ask for little: an IPC file's batch metadata lies between the batches' bodies.
    with source.open(buffer_bytes=_METADATA_READ_BYTES) as handle:
        if kind == "parquet":
            with _named(source):
                parquet = pq.ParquetFile(handle)
                schema = parquet.schema_arrow
            meta = parquet.metadata
            units = [Unit(source, i, meta.row_group(i).num_rows, _compressed(meta.row_group(i)))
                     for i in range(meta.num_row_groups)]
            # (pyarrow refuses to read it; planned, it would shift every rank's rows)
            if bad := next((unit for unit in units if unit.rows < 0), None):
                raise ValueError(f"{source.name} is a damaged Parquet file: its row group "
                                 f"{bad.index} has {bad.rows} rows; write it again whole")
            return units, schema
        batches = record_batches(handle, source.size, source.name)  # no batch body is read
        with _named(source):  # (pyarrow verifies the footer: an empty list may be a damaged one)
            reader = ipc.open_file(handle)
            schema = reader.schema
            schema.names  # noqa: B018 - decoded here, where a damaged name's error names the file
            # A batch of no rows is no rank's work, never read, and damaged metadata may read
            # as no rows: pyarrow verifies each such batch (its body is a few bytes)
            for i, (rows, _) in enumerate(batches):
                if not rows and (held := reader.get_batch(i).num_rows):
                    raise ValueError(f"{source.name} is a damaged Arrow IPC file: record batch "
                                     f"{i} holds {held} rows, its metadata says none")
        return [Unit(source, i, rows, stored) for i, (rows, stored) in enumerate(batches)], schema


def check_one_schema(plan: TablePlan, columns: Sequence[str] | None
                     ) -> tuple[Source, pa.Schema | None, bool]:
    """Refuse inputs whose columns (those named) differ in names or types, or lack one named, on
    every rank alike and whatever the rows (none at all, too): a rank reads some of the files,
    but the plan holds every file's footer. Types that differ only in the layout of text or
    lists are alike (see ``widest``); a file with no rows adds nothing, whatever its types
    (pandas writes an empty frame's text as nulls). Returns the file whose columns the table has
    (the first with rows, else the first), its schema (None in a plan made without them), and
    whether the files with rows hold those columns in more than one layout."""
    def shape(schema: pa.Schema, as_held: bool = False) -> list[tuple[str, pa.DataType | None]]:
        """The named columns and their types: in the widest layout, unless ``as_held``."""
        names = schema.names if columns is None else [c for c in columns if "." not in c]
        kinds = [schema.field(name).type if name in schema.names else None for name in names]
        return [(name, kind if as_held or kind is None else widest(kind))
                for name, kind in zip(names, kinds)]  # (a nested field's path: checked as read)

    rows: dict[Source, int] = {}
    for unit in plan.units:
        rows[unit.source] = rows.get(unit.source, 0) + unit.rows
    model = next((source for source in plan.sources if rows.get(source)), plan.sources[0])
    if not plan.schemas:  # (a plan made without the footers' schemas: checked as read)
        return model, None, False
    schemas = dict(zip(plan.sources, plan.schemas))
    expected, held = schemas[model], [source for source in plan.sources if rows.get(source)]
    named = [c for c in columns or () if "." not in c]
    for source in held or [model]:  # (with no rows anywhere, the first file's columns)
        _check_has(source, schemas[source], named)  # (named, rather than a schema unlike)
        if shape(schemas[source]) != shape(expected):
            raise ValueError(f"{source.name} has columns {schemas[source].names} of types "
                             f"{schemas[source].types}, unlike {model.name} ({expected.names}, "
                             f"{expected.types}); give files of one schema")
    return model, expected, any(shape(schemas[source], True) != shape(expected, True)
                                for source in held)


def file_schema(source: Source, columns: Sequence[str] | None = None) -> pa.Schema:
    """The columns of one Parquet or Arrow IPC file (only ``columns`` when given), from its footer."""
    with source.open() as handle, _named(source):
        if columnar_format(source.name) == "parquet":
            reader = pq.ParquetFile(handle)
            if columns is not None:  # (a nested field's path, "st.x", too)
                _check_has(source, reader, columns)
                return reader.read_row_groups([], columns=list(columns)).schema
            return reader.schema_arrow
        schema = ipc.open_file(handle).schema
    if columns is None:
        return schema
    _check_has(source, schema, columns)
    return pa.schema([schema.field(c) for c in columns])


def _check_has(source: Source, reader: pq.ParquetFile | pa.Schema, columns: Sequence[str]
               ) -> None:
    """Raise, naming the ``columns`` that ``source`` lacks and those it has, if it lacks any:
    an Arrow IPC file's columns are its top-level fields; a Parquet file also takes the path of
    a nested field (``st.x``) and of a group of them."""
    names = reader.names if isinstance(reader, pa.Schema) else reader.schema_arrow.names
    taken = set(names)
    if isinstance(reader, pq.ParquetFile):
        for i in range(len(reader.schema)):
            parts = reader.schema.column(i).path.split(".")
            taken.update(".".join(parts[:end]) for end in range(1, len(parts) + 1))
    missing = [repr(c) for c in columns if c not in taken]
    if missing:
        raise ValueError(f"{source.name} has no column{'s' * (len(missing) > 1)} "
                         f"{', '.join(missing)}: its columns are "
                         f"{', '.join(names)}; name them in columns=")


@contextmanager
def _named(source: Source) -> Iterator[None]:
    """pyarrow's errors about a file's contents, as errors that name the file."""
    try:
        yield
    # (a damaged footer is an OSError; a damaged column name, not UTF-8, a UnicodeDecodeError)
    except (pa.ArrowException, OSError, UnicodeDecodeError) as error:
        # Out of memory is not the file's fault; an error naming the file is one already (a
        # request to an object store that failed)
        if isinstance(error, MemoryError) or source.name in str(error):
            raise
        kind = "Parquet" if columnar_format(source.name) == "parquet" else "Arrow IPC"
        raise ValueError(f"{source.name} is not a readable {kind} file "
                         f"({hide(str(error), source.secrets)}); check that it is one, whole, "
                         "or rename it") from None


def _compressed(row_group: Any) -> int:
    return sum(row_group.column(j).total_compressed_size for j in range(row_group.num_columns))


def read_unit(unit: Unit, first: int, end: int, columns: Sequence[str] | None = None) -> pa.Table:
    """Rows ``first:end`` of one row group (or record batch), only ``columns`` when given."""
    return next(read_stretches([(unit, first, end)], columns))


def read_stretches(stretches: Iterable[tuple[Unit, int, int]],
                   columns: Sequence[str] | None = None) -> Iterator[pa.Table]:
    """The rows of each ``(unit, first row, end row)`` in turn (only ``columns`` when given).

    Consecutive units of one file share one opened file and one reading of its footer: for an
    object in a bucket, every footer read is a request.
    """
    source, handle, reader = None, None, None
    try:
        for unit, first, end in stretches:
            if unit.source is not source:
                if handle is not None:
                    handle.close()
                source, handle = unit.source, unit.source.open()
                with _named(source):
                    reader = (pq.ParquetFile(handle) if columnar_format(source.name) == "parquet"
                              else ipc.open_file(handle))
                if columns is not None:  # (Parquet would leave out a column it lacks)
                    _check_has(source, reader if isinstance(reader, pq.ParquetFile)
                               else reader.schema, columns)
            with _named(source):
                if isinstance(reader, pq.ParquetFile):
                    table = reader.read_row_group(unit.index, columns=columns)
                else:
                    table = pa.Table.from_batches([reader.get_batch(unit.index)])
                    if columns is not None:
                        table = table.select(list(columns))
            yield table if (first, end) == (0, unit.rows) else table.slice(first, end - first)
    finally:
        if handle is not None:
            handle.close()
