"""Parse a chunk of lines into records, by pattern: vectorised with pyarrow, per line when needed.

=========  ==========================================  ==================================
pattern    a line                                      records
=========  ==========================================  ==================================
fmap       ``a,b`` (weight 1.0) or ``a,b,w``            one edge; owned by ``a``
smap       as fmap                                     one edge; owned by ``b``
fsmap      as fmap                                     one edge; owned by the grid cell
fset       ``a,b,c`` or ``a,b|0.2,c:0.4``              one edge per target; owned by ``a``
fvec       ``id,f1,...,fk``                            one vector of ``k`` floats
=========  ==========================================  ==================================

The fast path hands the chunk's bytes to ``pyarrow.csv`` (or to pyarrow string kernels for
``fset``). When that fails, the chunk is halved until the pieces are small, and only the small
pieces holding bad lines go through the per-line Python path, which names each bad line's file
and line number. A ``parser`` hook (one line in, its fields out) always takes the per-line path.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

from shardwise.files.ids import check_distinct, hash_binary, string_ids
from shardwise.files.read import Chunk, chunk_lines
from shardwise.files.records import edges, join, vector_dtype

PATTERNS = ("fmap", "smap", "fsmap", "fset", "fvec")
Pattern = Literal["fmap", "smap", "fsmap", "fset", "fvec"]
LineParser = Callable[[str], Sequence[object]]

MAX_EXAMPLES = 10  # bad lines kept (with their location) for the report; all are counted
_SLOW_PATH_BYTES = 64 * 2**10  # below this, a failing chunk is parsed line by line
# One pyarrow block per default chunk (read.py): each column comes back as one array, no concatenation.
_CSV_BLOCK_BYTES = 32 * 2**20
_INT64_RANGE = range(-(2**63), 2**63)


@dataclass(frozen=True)
class Format:
    """How to read lines into records.

    ``ids="int"`` parses ids as ``int64`` (any value up to 2**63 - 1); ``ids="str"`` maps each id
    string to a stable 63-bit integer (see ``string_ids``). ``parser`` turns one line (without its
    terminator) into fields, for formats a single-character delimiter cannot describe.

    >>> Format("fset", delimiter="\\t").pattern
    'fset'
    """

    pattern: Pattern = "fmap"
    delimiter: str = ","
    ids: Literal["int", "str"] = "int"
    parser: LineParser | None = field(default=None, compare=False)
    on_error: Literal["raise", "skip"] = "raise"

    def __post_init__(self) -> None:
        if self.pattern == "linesplit":
            raise ValueError("pattern 'linesplit' has no records: use read_lines() for raw lines")
        if self.pattern not in PATTERNS:
            raise ValueError(f"unknown pattern {self.pattern!r}: choose one of {', '.join(PATTERNS)}")
        if len(self.delimiter) != 1 or self.delimiter in "\r\n\"":
            raise ValueError(
                f"delimiter must be one character other than a line break or quote, got "
                f"{self.delimiter!r} (use parser= for anything more complex)"
            )
        if self.pattern == "fset" and self.delimiter in "|:":
            raise ValueError(f"fset uses '|' and ':' before weights, so the delimiter cannot be {self.delimiter!r}")
        if self.ids not in ("int", "str"):
            raise ValueError(f"ids must be 'int' or 'str', got {self.ids!r}")
        if self.on_error not in ("raise", "skip"):
            raise ValueError(f"on_error must be 'raise' or 'skip', got {self.on_error!r}")


@dataclass(frozen=True)
class BadLine:
    """A line that did not parse: where it is, what it says, and why it failed."""

    file: str
    line: int
    text: str
    reason: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {self.reason}: {self.text[:200]!r}"


class ParseError(ValueError):
    """A malformed line, with ``on_error="raise"``; ``.bad`` says which line and why."""

    def __init__(self, bad: BadLine) -> None:
        super().__init__(f"{bad} (fix the line, or pass on_error='skip' to count and skip such lines)")
        self.bad = bad


@dataclass(frozen=True)
class Parsed:
    """What one chunk gave: its records, its line count, and the lines skipped as malformed."""

    records: np.ndarray
    lines: int
    skipped: int = 0
    examples: tuple[BadLine, ...] = ()


def parse_chunk(chunk: Chunk, fmt: Format) -> Parsed:
    """Parse one chunk of whole lines into records (``EDGE`` or ``vector_dtype(k)``)."""
    records, bad = _parse(chunk, fmt)
    return Parsed(records, chunk.line_count(), len(bad), tuple(bad[:MAX_EXAMPLES]))


def concat_records(parts: Sequence[np.ndarray], pattern: str, where: str) -> np.ndarray:
    """Concatenate record arrays, ignoring empty ones; vectors must agree on their length."""
    nonempty = [p for p in parts if len(p)]
    if not nonempty:
        return parts[0][:0] if parts else _empty(pattern)
    dtypes = {p.dtype for p in nonempty}
    if len(dtypes) > 1:
        counts = sorted(d["values"].shape[0] for d in dtypes)
        raise ValueError(f"fvec lines in {where} have different numbers of features: {counts}")
    return join(nonempty)


def _parse(chunk: Chunk, fmt: Format) -> tuple[np.ndarray, list[BadLine]]:
    if fmt.parser is None:
        try:
            return _FAST[fmt.pattern](chunk.data, fmt), []
        except (pa.ArrowInvalid, _NeedsSlowPath):
            pass
        halves = _halves(chunk)
        if halves:
            (left, left_bad), (right, right_bad) = (_parse(half, fmt) for half in halves)
            return concat_records([left, right], fmt.pattern, chunk.source.name), left_bad + right_bad
    return _slow(chunk, fmt)


class _NeedsSlowPath(Exception):
    """The fast path cannot parse this chunk as it is (odd line, ragged columns)."""


def _halves(chunk: Chunk) -> tuple[Chunk, Chunk] | None:
    if len(chunk.data) <= _SLOW_PATH_BYTES:
        return None
    cut = chunk.data.find(b"\n", len(chunk.data) // 2) + 1
    if cut <= 0 or cut >= len(chunk.data):
        return None
    return (Chunk(chunk.source, chunk.start, chunk.data[:cut]),
            Chunk(chunk.source, chunk.start + cut, chunk.data[cut:]))


# ---- the fast, vectorised path -------------------------------------------------------------

def _fast_pairs(data: bytes, fmt: Format) -> np.ndarray:
    columns = _field_count(data, fmt)
    if columns == 0:
        return _empty(fmt.pattern)
    if columns not in (2, 3):
        raise _NeedsSlowPath
    table = _read_csv(data, fmt, [_id_type(fmt)] * 2 + [pa.float64()] * (columns - 2))
    src, dst = _ids([table.column(0), table.column(1)], fmt)
    return edges(src, dst, table.column(2).to_numpy() if columns == 3 else 1.0)


def _fast_vectors(data: bytes, fmt: Format) -> np.ndarray:
    columns = _field_count(data, fmt)
    if columns == 0:
        return _empty(fmt.pattern)
    if columns < 2:
        raise _NeedsSlowPath
    table = _read_csv(data, fmt, [_id_type(fmt)] + [pa.float64()] * (columns - 1))
    records = np.empty(table.num_rows, dtype=vector_dtype(columns - 1))
    (records["id"],) = _ids([table.column(0)], fmt)
    for index in range(1, columns):
        records["values"][:, index - 1] = table.column(index).to_numpy()
    return records


def _fast_sets(data: bytes, fmt: Format) -> np.ndarray:
    lines = _line_array(data)
    fields = pc.split_pattern(lines, fmt.delimiter)
    counts = pc.list_value_length(fields).to_numpy()
    if counts.size and counts.min() < 2:
        raise _NeedsSlowPath
    flat = pc.list_flatten(fields)
    starts = fields.offsets.to_numpy()[:-1] - fields.offsets[0].as_py()
    is_source = np.zeros(len(flat), dtype=bool)
    is_source[starts] = True
    sources = flat.filter(pa.array(is_source))
    targets = pc.split_pattern(pc.replace_substring(flat.filter(pa.array(~is_source)), ":", "|"),
                               "|", max_splits=1)
    has_weight = pc.list_value_length(targets).to_numpy() == 2
    src, dst = _ids([sources, pc.list_element(targets, 0)], fmt)
    weight = np.ones(len(targets))
    weighted = pc.list_element(targets.filter(pa.array(has_weight)), 1)
    weight[has_weight] = pc.cast(weighted, pa.float64()).to_numpy()
    return edges(np.repeat(src, counts - 1), dst, weight)


_FAST: dict[str, Callable[[bytes, Format], np.ndarray]] = {
    "fmap": _fast_pairs, "smap": _fast_pairs, "fsmap": _fast_pairs,
    "fset": _fast_sets, "fvec": _fast_vectors,
}


def _field_count(data: bytes, fmt: Format) -> int:
    """Fields on the first non-blank line; 0 when the chunk is all blank lines."""
    start = 0
    while start < len(data):
        end = data.find(b"\n", start)
        end = len(data) if end < 0 else end
        line = data[start:end].rstrip(b"\r")
        if line:
            return line.count(fmt.delimiter.encode()) + 1
        start = end + 1
    return 0


def _read_csv(data: bytes, fmt: Format, types: list[pa.DataType]) -> pa.Table:
    names = [f"f{i}" for i in range(len(types))]
    return pacsv.read_csv(
        pa.py_buffer(data),
        # One thread per rank: the ranks are the parallelism.
        read_options=pacsv.ReadOptions(column_names=names, use_threads=False,
                                       block_size=_CSV_BLOCK_BYTES),
        parse_options=pacsv.ParseOptions(delimiter=fmt.delimiter, quote_char=False,
                                         newlines_in_values=False, ignore_empty_lines=True),
        convert_options=pacsv.ConvertOptions(column_types=dict(zip(names, types)), null_values=[],
                                             strings_can_be_null=False, check_utf8=False),
    )


def _id_type(fmt: Format) -> pa.DataType:
    return pa.int64() if fmt.ids == "int" else pa.binary()


def _ids(columns: list[pa.Array | pa.ChunkedArray], fmt: Format) -> list[np.ndarray]:
    if fmt.ids == "int":
        return [np.asarray(pc.cast(column, pa.int64()).to_numpy()) for column in columns]
    strings = [(pa.chunked_array([column]) if isinstance(column, pa.Array) else column)
               .cast(pa.binary()) for column in columns]
    if any(len(s) and pc.min(pc.binary_length(s)).as_py() == 0 for s in strings):
        raise _NeedsSlowPath  # an empty id: let the per-line path name the line
    ids = [hash_binary(s) for s in strings]
    everything = pa.chunked_array([c for s in strings for c in s.chunks], type=pa.binary())
    check_distinct(everything, np.concatenate(ids))
    return ids


def _line_array(data: bytes) -> pa.Array:
    """The non-blank lines of ``data`` as a pyarrow string array, terminators removed."""
    raw = np.frombuffer(data, dtype=np.uint8)
    newlines = np.flatnonzero(raw == 10)
    ends = newlines if data.endswith(b"\n") else np.append(newlines, raw.size)
    starts = np.concatenate([[0], newlines + 1])[: ends.size]
    carriage = (ends > starts) & (raw[np.maximum(ends - 1, 0)] == 13)
    keep = raw != 10
    keep[ends[carriage] - 1] = False
    lengths = (ends - starts - carriage)[ends - starts - carriage > 0]
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    return pa.StringArray.from_buffers(lengths.size, pa.py_buffer(offsets), pa.py_buffer(raw[keep]))


def _empty(pattern: str) -> np.ndarray:
    return np.empty(0, dtype=vector_dtype(0) if pattern == "fvec" else edges([], []).dtype)


# ---- the per-line path ---------------------------------------------------------------------

def _slow(chunk: Chunk, fmt: Format) -> tuple[np.ndarray, list[BadLine]]:
    split = fmt.parser or (lambda line: line.split(fmt.delimiter))
    convert_id = _int_id if fmt.ids == "int" else _str_id
    rows: list[tuple] = []
    bad: list[BadLine] = []
    first_line_number: int | None = None
    features: int | None = None
    for index, line in enumerate(chunk_lines(chunk)):
        if not line:
            continue
        try:
            parsed = _INTERPRET[fmt.pattern](list(split(line)), convert_id)
            if fmt.pattern == "fvec":
                features = len(parsed[0][1]) if features is None else features
                if len(parsed[0][1]) != features:
                    raise ValueError(f"expected {features} features as on earlier lines, got {len(parsed[0][1])}")
        except (ValueError, TypeError, IndexError, OverflowError) as error:
            if first_line_number is None:
                first_line_number = chunk.line_number()
            problem = BadLine(chunk.source.name, first_line_number + index, line, str(error))
            if fmt.on_error == "raise":
                raise ParseError(problem) from None
            bad.append(problem)
            continue
        rows.extend(parsed)
    return _rows_to_records(rows, fmt, features), bad


def _rows_to_records(rows: list[tuple], fmt: Format, features: int | None) -> np.ndarray:
    if fmt.pattern == "fvec":
        records = np.empty(len(rows), dtype=vector_dtype(features or 0))
        if rows:
            ids, values = zip(*rows)
            records["id"] = _finish_ids(list(ids), fmt)
            records["values"] = values
        return records
    if not rows:
        return _empty(fmt.pattern)
    src, dst, weight = zip(*rows)
    src_ids, dst_ids = np.split(_finish_ids(list(src) + list(dst), fmt), 2)
    return edges(src_ids, dst_ids, np.array(weight, dtype=np.float64))


def _finish_ids(ids: list, fmt: Format) -> np.ndarray:
    if fmt.ids == "int":
        return np.array(ids, dtype=np.int64)
    hashed = string_ids(ids)
    check_distinct(pa.array(ids, type=pa.string()), hashed)
    return hashed


def _int_id(token: object) -> int:
    if isinstance(token, bool) or not isinstance(token, (str, int)):
        raise TypeError(f"id {token!r} must be a str or int")
    try:
        value = int(token)
    except ValueError:
        raise ValueError(f"id {token!r} is not an integer (pass ids='str' for string ids)") from None
    if value not in _INT64_RANGE:
        raise ValueError(f"id {token!r} does not fit in int64 (pass ids='str' to hash it)")
    return value


def _str_id(token: object) -> str:
    text = str(token)
    if not text:
        raise ValueError("empty id")
    return text


def _pair(fields: list, convert_id: Callable) -> list[tuple]:
    if len(fields) not in (2, 3):
        raise ValueError(f"expected 2 or 3 fields (src, dst[, weight]), got {len(fields)}")
    weight = float(fields[2]) if len(fields) == 3 else 1.0
    return [(convert_id(fields[0]), convert_id(fields[1]), weight)]


def _set(fields: list, convert_id: Callable) -> list[tuple]:
    if len(fields) < 2:
        raise ValueError("expected a source and at least one target")
    source = convert_id(fields[0])
    rows = []
    for target in fields[1:]:
        dst, _, weight = str(target).replace(":", "|").partition("|")
        rows.append((source, convert_id(dst), float(weight) if weight else 1.0))
    return rows


def _vector(fields: list, convert_id: Callable) -> list[tuple]:
    if len(fields) < 2:
        raise ValueError("expected an id and at least one feature")
    return [(convert_id(fields[0]), [float(value) for value in fields[1:]])]


_INTERPRET: dict[str, Callable[[list, Callable], list[tuple]]] = {
    "fmap": _pair, "smap": _pair, "fsmap": _pair, "fset": _set, "fvec": _vector,
}
