"""Records from columnar inputs: named columns of Parquet / Arrow IPC row groups as edges or vectors.

A text line is parsed by pattern; a row group already holds typed columns, so ``columns`` names
the ones that hold what: ``(src, dst)`` or ``(src, dst, weight)`` for edges, ``(id, f1, ..., fk)``
or ``(id, values)`` (one list column) for vectors. With ``ids="int"`` id columns must hold
integers; with ``ids="str"`` they hold text (integers are read as their decimal text), hashed as
the text loader hashes string ids, so the same id gets the same integer from either kind of input.

Text is any of Arrow's string types (string_view, as polars writes, included). Dictionary-encoded
(categorical) columns are read as their values, and a binary id column's bytes (fixed-size or
not) are hashed as they are (they need not be UTF-8).

A null in a named column, an id the text loader would refuse too (an empty string, an unsigned
integer past 2**63 - 1), or a vector of the wrong length or holding a null, is a bad row:
``on_error="raise"`` raises ``ParseError`` naming its file and row (counted from 1 in the file,
as lines are); ``"skip"`` counts it and goes on. A column of the wrong type, or one the file
lacks, is an error naming it whatever ``on_error`` says, as no row of that input can be right:
told by the footers before any row is read, so on every rank, whatever rows there are.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import closing

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from shardwise.files.arrow import from_numpy, to_numpy
from shardwise.files.arrow_types import is_text
from shardwise.files.columnar import (
    TablePlan,
    Unit,
    check_one_schema,
    column_names,
    file_schema,
    read_stretches,
    say_if_split_by_rows,
)
from shardwise.files.ids import hash_together
from shardwise.files.patterns import MAX_EXAMPLES, BadLine, Format, Parsed, ParseError

EDGE_PATTERNS = ("fmap", "smap", "fsmap")  # which rank owns an edge; fset is a text format


def check_columns(columns: Sequence[str], fmt: Format) -> tuple[str, ...]:
    """``columns`` as a tuple, checked to suit ``fmt`` before any file is read.

    >>> check_columns(["src", "dst"], Format("fmap"))
    ('src', 'dst')
    >>> check_columns(["src"], Format("fmap"))
    Traceback (most recent call last):
    ...
    ValueError: columns for edges are (src, dst) or (src, dst, weight), got ['src']: name 2 or 3 columns
    """
    columns = column_names(columns)
    if fmt.parser is not None:
        raise ValueError("parser= reads text lines; columnar inputs have typed columns: drop it")
    if fmt.pattern == "fvec":
        if len(columns) < 2:
            raise ValueError(f"columns for vectors are (id, values) or (id, f1, ..., fk), got "
                             f"{list(columns)}: name the id column and at least one value column")
    elif fmt.pattern not in EDGE_PATTERNS:
        raise ValueError(f"pattern {fmt.pattern!r} describes text lines; for columnar edges "
                         f"choose the owner with {', '.join(EDGE_PATTERNS)}")
    elif len(columns) not in (2, 3):
        raise ValueError(f"columns for edges are (src, dst) or (src, dst, weight), got "
                         f"{list(columns)}: name 2 or 3 columns")
    return columns


def vector_features(the_plan: TablePlan, columns: tuple[str, ...], features: int | None) -> int:
    """How many values each vector holds: one per value column, else ``features``, else the
    length of the inputs' first list that holds a value (the same on every rank).
    """
    first = next((u for u in the_plan.units if u.rows), None)
    if first is None:
        return features or 1  # no rows anywhere: any width makes the same empty result
    schema = file_schema(first.source, columns)
    if len(columns) > 2 or not _is_list(schema.field(columns[-1]).type):
        if features not in (None, len(columns) - 1):
            raise ValueError(f"features={features}, but columns names {len(columns) - 1} value "
                             "column(s): drop features=, or name one list column of vectors")
        return len(columns) - 1
    if features is not None:
        return features
    # A null or empty vector is a bad row, passed over as the text loader passes over a line with
    # no value; only the list column is decoded, a row group at a time until one holds a value.
    stretches = [(unit, 0, unit.rows) for unit in the_plan.units if unit.rows]
    with closing(read_stretches(stretches, columns[-1:])) as tables:
        for table in tables:
            lengths = pc.list_value_length(table[columns[-1]])
            held = pc.filter(lengths, pc.greater(lengths, 0))  # (a null vector's length is null)
            if len(held):
                return held[0].as_py()
    raise ValueError(f"no vector in column {columns[-1]!r} holds a value; pass features= to say "
                     "how many values every vector holds")


def check_schema(the_plan: TablePlan, fmt: Format, columns: tuple[str, ...]) -> None:
    """Refuse ``columns`` that the inputs lack, or hold in a type unfit for their role, by the
    footers: on every rank alike, whatever the rows (a rank with none of its own, or inputs with
    none at all, have no row to check them by)."""
    model, schema, _ = check_one_schema(the_plan, columns)
    if schema is None or any("." in c for c in columns):  # (a nested field's path: by its file)
        schema = file_schema(model, columns)
    table = _named_columns(schema.empty_table(), columns)
    for role, name in enumerate(columns):
        kind = table.schema.field(name).type
        if pa.types.is_null(kind) and not the_plan.total_rows:
            continue  # no rows, no type: pandas writes an empty frame's text as nulls
        if role < (1 if fmt.pattern == "fvec" else 2):
            _check_id_type(kind, name, fmt, model.name)
        elif fmt.pattern == "fvec" and len(columns) == 2 and _is_list(kind):
            _check_numbers(kind.value_type, name, model.name)
        else:
            _check_numbers(kind, name, model.name)


def read_table_records(
    the_plan: TablePlan, rank: int, fmt: Format, columns: tuple[str, ...]
) -> Iterator[tuple[Parsed, int]]:
    """Each stretch of rows in ``rank``'s share, in order, parsed, with its compressed bytes
    (a share of its row group's when only some rows are read)."""
    say_if_split_by_rows(the_plan, rank)
    first_rows = _first_rows(the_plan)
    share = the_plan.share(rank)
    with closing(read_stretches(share, columns)) as tables:  # its file closed on any exit
        for (unit, first, end), table in zip(share, tables):
            parsed = table_records(table, fmt, columns, unit.source.name,
                                   first_rows[unit] + first)
            yield parsed, stretch_bytes(unit, first, end)


def stretch_bytes(unit: Unit, first: int, end: int) -> int:
    """The compressed bytes of rows ``[first, end)`` of ``unit``, pro rata."""
    return round(unit.bytes * (end - first) / unit.rows) if unit.rows else unit.bytes


def table_records(table: pa.Table, fmt: Format, columns: tuple[str, ...], name: str = "table",
                  first_row: int = 0) -> Parsed:
    """The edge (or, for ``fvec``, vector) record columns of ``table``'s named columns.

    ``first_row`` is the row number of the table's first row in file ``name`` (from 0).

    >>> table = pa.table({"a": [1, 2], "b": [3, None], "w": [0.5, 1.0]})
    >>> part = table_records(table, Format("fmap", on_error="skip"), ("a", "b", "w"), "e.parquet")
    >>> [c.tolist() for c in part.columns], [str(bad) for bad in part.examples]
    ([[1], [3], [0.5]], ["e.parquet:2: null in column 'b': '{a: 2, b: None, w: 1.0}'"])
    """
    if table.num_rows == 0:  # whatever its columns' types (a table of empty lists has nulls)
        return Parsed((np.empty(0, np.int64),), 0, 0, ())
    table = _named_columns(table, columns)
    bad_rows = np.zeros(table.num_rows, dtype=bool)
    for column in columns:
        bad_rows |= _nulls(table[column])
    if fmt.pattern == "fvec":
        ids, values, wrong_length = _vectors(table, fmt, columns, bad_rows, name)
        bad_rows |= wrong_length
    else:
        ids = _ids(table, columns[:2], fmt, name, bad_rows)
        weight = (_floats(table[columns[2]], columns[2], name) if len(columns) == 3
                  else np.ones(table.num_rows))
    examples = tuple(_bad_row(table, row, columns, name, first_row, fmt) for row in
                     np.flatnonzero(bad_rows)[: 1 if fmt.on_error == "raise" else MAX_EXAMPLES])
    if examples and fmt.on_error == "raise":
        raise ParseError(examples[0], f"{examples[0]} (fix the row, or pass on_error='skip' to "
                                      "count and skip such rows)")
    records = (ids, values) if fmt.pattern == "fvec" else (*ids, weight)
    if bad_rows.any():
        keep = ~bad_rows
        records = tuple([v[keep] for v in c] if isinstance(c, list) else c[keep]
                        for c in records)
    return Parsed(records, table.num_rows, int(bad_rows.sum()), examples)


def _first_rows(the_plan: TablePlan) -> dict[Unit, int]:
    """The row number, within its file, of each unit's first row."""
    first, before = {}, {}
    for unit in the_plan.units:
        first[unit] = before.get(unit.source.name, 0)
        before[unit.source.name] = first[unit] + unit.rows
    return first


def _ids(table: pa.Table, names: Sequence[str], fmt: Format, file: str,
         bad_rows: np.ndarray) -> list[np.ndarray]:
    """The id columns ``names``; string ids hashed and checked for collisions across them.

    Rows whose id the text loader would refuse (an unsigned id past 2**63 - 1, an empty string)
    are marked in ``bad_rows``: ``_bad_row`` says why.
    """
    for name in names:
        _check_id_type(table[name].type, name, fmt, file)
    if fmt.ids == "int":
        columns = []
        for name in names:
            column = table[name]
            if column.type == pa.uint64():
                too_big = pc.greater(column, pa.scalar(_INT64_MAX, pa.uint64()))
                bad_rows |= _true(too_big)
                column = pc.if_else(too_big, pa.scalar(0, pa.uint64()), column)
            columns.append(_filled(column, pa.int64(), 0))
        return columns
    # Bytes as they are (a binary id need not be UTF-8); integers as their decimal text.
    texts = [_id_bytes(table[name]) for name in names]
    for text in texts:
        bad_rows |= _true(pc.equal(pc.binary_length(text), 0))
    return hash_together(texts)


_INT64_MAX = 2**63 - 1


def _check_id_type(kind: pa.DataType, name: str, fmt: Format, file: str) -> None:
    if fmt.ids == "int" and not pa.types.is_integer(kind):
        hint = " (pass ids='str' for text ids)" if is_text(kind) else ""
        raise TypeError(f"{file}: id column {name!r} holds {kind}, not integers{hint}")
    if fmt.ids != "int" and not (is_text(kind) or pa.types.is_integer(kind)):
        raise TypeError(f"{file}: id column {name!r} holds {kind}, not text or integers")


def _id_bytes(column: pa.ChunkedArray) -> pa.ChunkedArray:
    if pa.types.is_integer(column.type):
        column = column.cast(pa.string())
    return pc.fill_null(column.cast(pa.binary()), pa.scalar(b"", pa.binary()))


def _true(mask: pa.ChunkedArray) -> np.ndarray:
    """A boolean column as NumPy, nulls as False."""
    return to_numpy(pc.fill_null(mask, False).cast(pa.int32())).astype(bool)


def _named_columns(table: pa.Table, columns: Sequence[str]) -> pa.Table:
    """``table`` with its named columns at the top level (a nested field's path, ``st.x``, names
    a flattened column), those dictionary-encoded (categorical) as plain values."""
    while any(pa.types.is_struct(kind) for kind in table.schema.types) and not set(
            columns) <= set(table.column_names):
        table = table.flatten()
    for name in columns:
        kind = table.schema.field(name).type if name in table.column_names else None
        if kind is not None and pa.types.is_dictionary(kind):
            table = table.set_column(table.column_names.index(name), name,
                                     table[name].cast(kind.value_type))
    return table


def _floats(column: pa.ChunkedArray, name: str, file: str) -> np.ndarray:
    _check_numbers(column.type, name, file)
    return _filled(column, pa.float64(), 0.0)


def _check_numbers(kind: pa.DataType, name: str, file: str) -> None:
    if not (pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_decimal(kind)):
        raise TypeError(f"{file}: column {name!r} holds {kind}, not numbers")


def _vectors(table: pa.Table, fmt: Format, columns: tuple[str, ...], bad_rows: np.ndarray,
             file: str) -> tuple[np.ndarray, np.ndarray | list[np.ndarray], np.ndarray]:
    """Ids, the values (a ``(rows, features)`` array from a list column, else one array per
    value column), and which rows hold a vector of another length (or with a null value)."""
    ids, = _ids(table, columns[:1], fmt, file, bad_rows)
    wrong_length = np.zeros(table.num_rows, dtype=bool)
    if len(columns) > 2 or not _is_list(table[columns[1]].type):
        # One array per feature, which the record builder copies in column by column.
        return ids, [_floats(table[c], c, file) for c in columns[1:]], wrong_length
    lists = table[columns[1]].combine_chunks()
    lengths = to_numpy(pc.fill_null(pc.list_value_length(lists), 0).cast(pa.int64()))
    wrong_length = (lengths != fmt.features) & ~bad_rows
    flat = lists.flatten()
    if flat.null_count:  # a vector holding a null value is as bad as one of the wrong length
        parents = to_numpy(pc.list_parent_indices(lists).cast(pa.int64()))
        wrong_length[parents[_nulls(pa.chunked_array([flat]))]] = True
        wrong_length &= ~bad_rows
    good = ~(wrong_length | bad_rows)
    values = np.zeros((table.num_rows, fmt.features))
    if good.any():
        kept = lists.filter(from_numpy(good))
        values[good] = _floats(pa.chunked_array([kept.flatten()]), columns[1], file
                               ).reshape(-1, fmt.features)
    return ids, values, wrong_length


def _bad_row(table: pa.Table, row: int, columns: tuple[str, ...], file: str, first_row: int,
             fmt: Format) -> BadLine:
    values = {c: table[c][int(row)].as_py() for c in columns}
    nulls = [c for c in columns if values[c] is None]
    ids = columns[: 1 if fmt.pattern == "fvec" else 2]
    too_big = [c for c in ids if isinstance(values[c], int) and values[c] > _INT64_MAX]
    empty = [c for c in ids if values[c] in ("", b"")]
    if nulls:
        reason = f"null in column {nulls[0]!r}"
    elif too_big and fmt.ids == "int":
        reason = (f"id {values[too_big[0]]} in column {too_big[0]!r} does not fit in int64 "
                  "(pass ids='str' to hash it)")
    elif empty and fmt.ids != "int":
        reason = f"empty id in column {empty[0]!r}"
    elif None in values[columns[1]]:
        reason = f"null value in the vector in column {columns[1]!r}"
    else:
        reason = f"vector of {len(values[columns[1]])} values, not {fmt.features}"
    shown = "{" + ", ".join(f"{c}: {values[c]}" for c in columns) + "}"
    return BadLine(file, first_row + int(row) + 1, shown, reason)


def _nulls(column: pa.ChunkedArray) -> np.ndarray:
    if column.null_count == 0:
        return np.zeros(len(column), dtype=bool)
    return to_numpy(pc.is_null(column).cast(pa.int32())).astype(bool)


def _filled(column: pa.ChunkedArray, kind: pa.DataType, fill: float) -> np.ndarray:
    """The column cast to ``kind`` as NumPy, nulls (bad rows, dropped later) filled; through its
    buffers, as pyarrow's own ``to_numpy`` imports pandas."""
    if column.null_count:
        column = pc.fill_null(column, pa.scalar(fill).cast(column.type))
    # To floats, an integer past 2**53 rounds as its text parses (pyarrow's safe cast refuses it)
    return to_numpy(column.cast(kind, safe=not pa.types.is_floating(kind)))


def _is_list(kind: pa.DataType) -> bool:
    return pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(
        kind)
