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
``fset`` and for ``fvec`` lines too wide for one CSV column per feature). When that fails, the
chunk is halved until the pieces are small, and only the small pieces holding bad lines go through
the per-line Python path, which names each bad line's file and line number (a line that is not
valid UTF-8 is such a bad line). A ``parser`` hook (one line in, its fields out) always takes the
per-line path.
"""

from __future__ import annotations

import numbers
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

from shardwise.checks import require_int
from shardwise.files.arrow import from_numpy, to_numpy
from shardwise.files.describe import describe
from shardwise.files.ids import check_distinct, hash_together, string_ids
from shardwise.files.read import BOM, Chunk, split_lines, without_bom
from shardwise.files.records import EDGE, edges, record_columns, vector_dtype

PATTERNS = ("fmap", "smap", "fsmap", "fset", "fvec")
Pattern = Literal["fmap", "smap", "fsmap", "fset", "fvec"]
LineParser = Callable[[str], Sequence[object]]
# Records by field, as ``record_columns`` lists them; fvec values may come as one column per
# feature (a list), which the builder writes straight into place.
Columns = tuple[Any, ...]

MAX_EXAMPLES = 10  # bad lines kept (with their location) for the report; all are counted
# Below this, a failing chunk is parsed line by line. Small, for a bad line now and then (one
# every 60 KB took every byte through the per-line path at 64 KiB: 3.9 s for 23 MB, 1.4 s at
# 4 KiB); where bad lines are dense, a piece of _DENSE_CHECK_BYTES whose halves both fail goes
# line by line at once, rather than being halved on down.
_SLOW_PATH_BYTES = 4 * 2**10
_DENSE_CHECK_BYTES = 64 * 2**10
# One pyarrow block per default chunk (read.py): each column comes back as one array, no concatenation.
_CSV_BLOCK_BYTES = 32 * 2**20
# pyarrow.csv costs several KiB per column whatever the rows (1.2 GB for a 1 MB line of 100,000
# fields); wider fvec lines go through string kernels, whose memory follows the bytes instead.
_CSV_MAX_FIELDS = 1024
_INT64_RANGE = range(-(2**63), 2**63)
# What pyarrow reads as a number, so a line means the same on either path: decimal digits with an
# optional '-' (no '+', '_', hex or non-ASCII digits) around which spaces and tabs are trimmed.
_INT_TOKEN = re.compile(r"[ \t]*-?[0-9]+[ \t]*")
_NAN_WITH_PAYLOAD = re.compile(r"[+-]?nan\([0-9a-z_]*\)", re.IGNORECASE)


@dataclass(frozen=True)
class Format:
    """How to read lines into records.

    ``ids="int"`` parses ids as ``int64`` (any value up to 2**63 - 1); ``ids="str"`` maps each id
    string to a stable 63-bit integer (see ``string_ids``). ``parser`` turns one line (without its
    terminator) into fields, for formats a single-character delimiter cannot describe.
    ``features`` is how many values every ``fvec`` line holds; ``None`` takes the number on the
    input's first line that has an id and a value.

    >>> Format("fset", delimiter="\\t").pattern
    'fset'
    """

    pattern: Pattern = "fmap"
    delimiter: str = ","
    ids: Literal["int", "str"] = "int"
    parser: LineParser | None = field(default=None, compare=False)
    on_error: Literal["raise", "skip"] = "raise"
    features: int | None = None

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
        if self.features is not None:
            if self.pattern != "fvec":
                raise ValueError(f"features= is for pattern 'fvec' only, not {self.pattern!r}")
            require_int("features", self.features, minimum=1)

    def settings(self) -> dict[str, Any]:
        """The options as plain values that ranks can compare (the parser as ``describe`` says).

        >>> Format("fvec", delimiter=" ").settings()["delimiter"]
        ' '
        """
        parser = None if self.parser is None else describe(self.parser)
        return {"pattern": self.pattern, "delimiter": self.delimiter, "ids": self.ids,
                "on_error": self.on_error, "features": self.features, "parser": parser}

    def record_dtype(self) -> np.dtype:
        """The records this format gives: ``EDGE``, or ``vector_dtype(features)`` for fvec."""
        return vector_dtype(self.features or 0) if self.pattern == "fvec" else EDGE


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
    """A malformed line, with ``on_error="raise"``; ``.bad`` says which line and why.

    ``message`` defaults to the line, the reason and the fix. It pickles whole (``.bad`` and the
    message), so the error another rank raised arrives as itself.

    >>> import pickle
    >>> error = pickle.loads(pickle.dumps(ParseError(BadLine("a.txt", 3, "1,x", "bad id"))))
    >>> error.bad.line, str(error).split(" (")[0]
    (3, "a.txt:3: bad id: '1,x'")
    """

    def __init__(self, bad: BadLine, message: str | None = None) -> None:
        super().__init__(message or f"{bad} (fix the line, or pass on_error='skip' to count and "
                                    "skip such lines)")
        self.bad = bad

    def __reduce__(self) -> tuple[type[ParseError], tuple[BadLine, str]]:
        return type(self), (self.bad, str(self))


@dataclass(frozen=True)
class Parsed:
    """What one chunk gave: its records as columns, its line count, and the lines skipped."""

    columns: Columns
    lines: int
    skipped: int = 0
    examples: tuple[BadLine, ...] = ()


def parse_chunk(chunk: Chunk, fmt: Format) -> Parsed:
    """Parse one chunk of whole lines into columns (pyarrow's own buffers on the fast path).

    For ``fvec``, ``fmt.features`` must be set (``read_records`` sets it from the first line).
    """
    chunk = without_bom(chunk)
    columns, bad = _parse(chunk, fmt)
    return Parsed(columns, chunk.line_count(), len(bad), tuple(bad[:MAX_EXAMPLES]))


def first_line_features(lines: Iterable[bytes], fmt: Format) -> int | None:
    """The number of values on the first line with an id and a value (None: there is none).

    Every ``fvec`` line must have as many, so every rank takes the same number from the start of
    the input. Lines that are not valid UTF-8 are passed over.

    >>> first_line_features([b"", b" \\t", b"\\xff,1,2,3", b"7", b"1,0.5,0.25"], Format("fvec"))
    2
    """
    for line in lines:
        if not line.strip(b" \t"):
            continue  # blank, or spaces and tabs only: no line at all to the parser
        try:
            text = line.decode("utf-8")
        except UnicodeDecodeError:
            continue
        if fmt.parser is None:  # counting never splits a wide line into a list of strings
            fields = line.count(fmt.delimiter.encode()) + 1
        else:
            try:
                fields = len(fmt.parser(text))
            # Whatever the hook raises makes a bad line, as the parse takes it: passed over here,
            # or, where a bad line fails the load, the end of the search (the load fails on this
            # line, or on one before it, whatever the width).
            except Exception:  # noqa: BLE001
                if fmt.on_error == "raise":
                    return None
                continue
        if fields >= 2:
            return fields - 1
    return None


class RecordBuilder:
    """One record array of ``dtype`` (``EDGE`` or ``vector_dtype(k)``) filled from column parts.

    The array grows in place with ``ndarray.resize`` (``realloc``: a large buffer is remapped, not
    copied), so every record is written once. The grown tail is zero-filled, so each growth is
    sized to the final count that ``done`` (the share of the input these parts complete)
    projects, but kept between 1.125x and 2x the records it must hold then: a projection from a
    dense start of short lines can be many times the records (18x for a dense file in front of
    long-lined ones), and geometric growth keeps appends amortised O(1).
    """

    def __init__(self, dtype: np.dtype) -> None:
        self.dtype = dtype
        self.count = 0
        self._records: np.ndarray | None = None

    def append(self, columns: Columns, done: float = 1.0) -> None:
        """Copy a part's columns in after the records so far."""
        size = len(columns[0])
        if size == 0:
            return
        needed = self.count + size
        if self._records is None:
            self._records = np.empty(_capacity(needed, done), self.dtype)
        elif needed > len(self._records):
            self._records.resize(_capacity(needed, done), refcheck=False)  # nothing else refers to it
        part = self._records[self.count : self.count + size]
        for target, column in zip(record_columns(part), columns):
            if isinstance(column, list):  # fvec features one by one: no (rows, k) array between
                for feature, values in enumerate(column):
                    target[:, feature] = values
            else:
                target[...] = column
        self.count += size

    def finish(self) -> np.ndarray:
        """The records (once: the builder hands its array over)."""
        records, self._records = self._records, None
        if records is None:
            return np.empty(0, self.dtype)
        records.resize(self.count, refcheck=False)
        return records


def _capacity(needed: int, done: float) -> int:
    """Records to make room for, ``needed`` now with ``done`` of the input read: the projected
    final count (2% spare), within [1.125x, 2x] ``needed``, or exactly ``needed`` at the end.

    >>> _capacity(100, 0.9), _capacity(100, 0.01), _capacity(100, 0.99), _capacity(100, 1.0)
    (113, 200, 112, 100)
    """
    if done >= 1:
        return needed
    projected = int(needed / max(done, 1e-9) * 1.02)
    return min(max(projected, needed + needed // 8), 2 * needed)


_UNTRIED = object()  # the fast path has not been tried on the chunk yet


def _parse(chunk: Chunk, fmt: Format, fast: Any = _UNTRIED) -> tuple[Columns, list[BadLine]]:
    """``chunk``'s records and bad lines: the fast path where it takes the chunk, else halves of
    it, so that only pieces holding a bad line go line by line. A piece of at most
    ``_DENSE_CHECK_BYTES`` whose halves both fail has bad lines throughout: it goes line by line
    at once. (``fast``: what the fast path gave the chunk, if the caller tried it already.)"""
    if fast is _UNTRIED:
        fast = _fast(chunk, fmt)
    if fast is not None:
        return fast, []
    halves = _halves(chunk) if _takes_fast_path(fmt) else None
    if halves is None:
        return _slow(chunk, fmt)
    small = len(chunk.data) <= _DENSE_CHECK_BYTES
    tried = [_fast(half, fmt) if small else _UNTRIED for half in halves]
    if small and tried == [None, None]:
        return _slow(chunk, fmt)
    (left, left_bad), (right, right_bad) = (_parse(half, fmt, done)
                                            for half, done in zip(halves, tried))
    joined = RecordBuilder(fmt.record_dtype())
    joined.append(left)
    joined.append(right)
    return record_columns(joined.finish()), left_bad + right_bad


def _takes_fast_path(fmt: Format) -> bool:
    """pyarrow's CSV reader takes an ASCII delimiter other than NUL; fset splits lines itself."""
    return fmt.parser is None and (fmt.pattern == "fset" or (
        fmt.delimiter.isascii() and fmt.delimiter != "\0"))


def _fast(chunk: Chunk, fmt: Format) -> Columns | None:
    """``chunk``'s records by the fast path, or None where it cannot take them."""
    if not _takes_fast_path(fmt):
        return None
    try:
        if not _reads_alike(chunk.data, fmt):
            return None  # (an odd line: its piece goes line by line once halved down to it)
        return _FAST[fmt.pattern](chunk.data, fmt)
    except (pa.ArrowInvalid, _NeedsSlowPath):
        return None


def _reads_alike(data: bytes, fmt: Format) -> bool:
    """Whether pyarrow reads ``data`` as the per-line rules do. It does not where a lone ``\r``
    is in a line (pyarrow ends the line there), where an int id may be hex (``0x10``, which
    pyarrow takes, and wraps past 2**63), or where a piece from inside a file opens with a byte
    order mark (pyarrow drops it; inside a file it is part of the line, wherever the pieces are
    cut). Each test is a ``memchr``: a few ms in a 32 MB chunk."""
    if data.startswith(BOM):
        return False
    if b"\r" in data and data.count(b"\r") != data.count(b"\r\n"):
        return False
    return fmt.ids != "int" or not (b"x" in data or b"X" in data)


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

def _fast_pairs(data: bytes, fmt: Format) -> Columns:
    columns = _field_count(data, fmt)
    if columns == 0:
        return record_columns(np.empty(0, EDGE))
    if columns not in (2, 3):
        raise _NeedsSlowPath
    table = _read_csv(data, fmt, [_id_type(fmt)] * 2 + [pa.float64()] * (columns - 2))
    src, dst = _ids([table.column(0), table.column(1)], fmt)
    weight = to_numpy(table.column(2)) if columns == 3 else np.broadcast_to(1.0, len(src))
    return src, dst, weight


def _fast_vectors(data: bytes, fmt: Format) -> Columns:
    columns = _field_count(data, fmt)
    if columns == 0:
        return record_columns(np.empty(0, fmt.record_dtype()))
    if fmt.features is None or columns != fmt.features + 1:
        raise _NeedsSlowPath  # the per-line path names the line with the wrong number of values
    if columns > _CSV_MAX_FIELDS:
        return _wide_vectors(data, fmt)
    table = _read_csv(data, fmt, [_id_type(fmt)] + [pa.float64()] * fmt.features)
    features = [to_numpy(table.column(feature + 1)) for feature in range(fmt.features)]
    return (*_ids([table.column(0)], fmt), features)


def _wide_vectors(data: bytes, fmt: Format) -> Columns:
    """Long fvec lines, one at a time: each is split in place by string kernels and its values
    cast straight into one row, so memory stays a few times the longest line."""
    buffer, spans = pa.py_buffer(data), list(_line_spans(data))
    ids: list[bytes] = []
    values = np.empty((len(spans), fmt.features))
    for row, (start, end) in enumerate(spans):
        line = pa.Array.from_buffers(pa.binary(), 1, [None, pa.py_buffer(
            np.array([0, end - start], dtype=np.int32)), buffer.slice(start, end - start)])
        fields = pc.list_flatten(pc.split_pattern(line, fmt.delimiter))
        if len(fields) != fmt.features + 1:
            raise _NeedsSlowPath
        ids.append(fields[0].as_py())
        values[row] = to_numpy(pc.cast(fields.slice(1), pa.float64()))
    return (*_ids([pa.array(ids, type=pa.binary())], fmt), values)


def _line_spans(data: bytes) -> Iterator[tuple[int, int]]:
    """``(start, end)`` of each non-blank line of ``data``, terminators excluded, as found."""
    start = 0
    while start < len(data):
        end = data.find(b"\n", start)
        end = len(data) if end < 0 else end
        stop = end - 1 if end > start and data[end - 1] == 13 else end  # drop a \r
        if stop > start:
            yield start, stop
        start = end + 1


def _fast_sets(data: bytes, fmt: Format) -> Columns:
    fields = pc.split_pattern(_line_array(data), fmt.delimiter)
    counts = to_numpy(pc.list_value_length(fields))
    if counts.size and counts.min() < 2:
        raise _NeedsSlowPath
    flat = pc.list_flatten(fields)
    starts = to_numpy(fields.offsets)[:-1] - fields.offsets[0].as_py()
    is_source = np.zeros(len(flat), dtype=bool)
    is_source[starts] = True
    sources = flat.filter(from_numpy(is_source))
    targets = pc.split_pattern(pc.replace_substring(flat.filter(from_numpy(~is_source)), ":", "|"),
                               "|", max_splits=1)
    # Each target's parts by position in the flattened list, not pc.list_element (whose index
    # argument makes pyarrow import pandas).
    parts = pc.list_flatten(targets)
    firsts = to_numpy(targets.offsets)[:-1].astype(np.int64) - targets.offsets[0].as_py()
    has_weight = to_numpy(pc.list_value_length(targets)) == 2
    src, dst = _ids([sources, parts.take(from_numpy(firsts))], fmt)
    weight = np.ones(len(targets))
    weights = parts.take(from_numpy(firsts[has_weight] + 1))
    weight[has_weight] = to_numpy(pc.cast(weights, pa.float64()))
    return np.repeat(src, counts - 1), dst, weight


_FAST: dict[str, Callable[[bytes, Format], Columns]] = {
    "fmap": _fast_pairs, "smap": _fast_pairs, "fsmap": _fast_pairs,
    "fset": _fast_sets, "fvec": _fast_vectors,
}


def _field_count(data: bytes, fmt: Format) -> int:
    """Fields on the first non-blank line; 0 when the chunk is all blank lines."""
    for start, end in _line_spans(data):
        return data.count(fmt.delimiter.encode(), start, end) + 1  # counted in place: no copy
    return 0


def _read_csv(data: bytes, fmt: Format, types: list[pa.DataType]) -> pa.Table:
    names = [f"f{i}" for i in range(len(types))]
    return pacsv.read_csv(
        pa.py_buffer(data),
        # One thread per call: a rank parses several chunks at once instead (threads.py).
        read_options=pacsv.ReadOptions(column_names=names, use_threads=False,
                                       block_size=_CSV_BLOCK_BYTES),
        parse_options=pacsv.ParseOptions(delimiter=fmt.delimiter, quote_char=False,
                                         newlines_in_values=False, ignore_empty_lines=True),
        convert_options=pacsv.ConvertOptions(column_types=dict(zip(names, types)), null_values=[],
                                             strings_can_be_null=False, check_utf8=False),
        # The C library's malloc, not pyarrow's default mimalloc: each chunk's columns are freed
        # before the next ones are made, and malloc hands the same (already touched) memory back,
        # where mimalloc took fresh pages: a first load parsed 20-40% faster here.
        memory_pool=pa.system_memory_pool(),
    )


def _id_type(fmt: Format) -> pa.DataType:
    return pa.int64() if fmt.ids == "int" else pa.binary()


def _ids(columns: list[pa.Array | pa.ChunkedArray], fmt: Format) -> list[np.ndarray]:
    if fmt.ids == "int":
        return [to_numpy(pc.cast(column, pa.int64())) for column in columns]
    strings = [(pa.chunked_array([column]) if isinstance(column, pa.Array) else column)
               .cast(pa.binary()) for column in columns]
    if any(len(s) and pc.min(pc.binary_length(s)).as_py() == 0 for s in strings):
        raise _NeedsSlowPath  # an empty id: let the per-line path name the line
    for s in strings:
        s.cast(pa.string())  # checks they are UTF-8 (else ArrowInvalid: the per-line path names it)
    return hash_together(strings)


def _line_array(data: bytes) -> pa.Array:
    """The non-blank lines of ``data`` as a pyarrow string array, terminators removed."""
    raw = np.frombuffer(data, dtype=np.uint8)
    newlines = np.flatnonzero(raw == 10)
    # A last line without its \n ends at the end of the data; empty data (a file holding only a
    # byte order mark leaves none) has no such line.
    ends = newlines if data.endswith(b"\n") or not data else np.append(newlines, raw.size)
    starts = np.concatenate([[0], newlines + 1])[: ends.size]
    carriage = (ends > starts) & (raw[np.maximum(ends - 1, 0)] == 13)
    keep = raw != 10
    keep[ends[carriage] - 1] = False
    lengths = (ends - starts - carriage)[ends - starts - carriage > 0]
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    return pa.StringArray.from_buffers(lengths.size, pa.py_buffer(offsets), pa.py_buffer(raw[keep]))


# ---- the per-line path ---------------------------------------------------------------------

def _slow(chunk: Chunk, fmt: Format) -> tuple[Columns, list[BadLine]]:
    split = fmt.parser or (lambda line: line.split(fmt.delimiter))
    convert_id = _int_id if fmt.ids == "int" else _str_id
    rows: list[tuple] = []
    bad: list[BadLine] = []
    first_line_number: int | None = None
    for index, line in enumerate(_decoded_lines(chunk.data)):
        # More \r before a line's end (\r\r\n) end it too, as in pyarrow and pandas.
        line = line.rstrip(b"\r" if isinstance(line, bytes) else "\r")
        if not line.strip(b" \t" if isinstance(line, bytes) else " \t"):
            continue  # blank, or spaces and tabs only
        try:
            if isinstance(line, bytes):
                line.decode("utf-8")  # raises, saying where and why
            if fmt.pattern == "fvec" and fmt.parser is None:
                _check_features(line.count(fmt.delimiter), fmt)  # before splitting a wide line
            fields = list(split(line))
            if fmt.pattern == "fvec":
                _check_features(len(fields) - 1, fmt)
            parsed = _INTERPRET[fmt.pattern](fields, convert_id)
        except Exception as error:  # noqa: BLE001 - all a parser hook raises is about the line
            if first_line_number is None:
                first_line_number = chunk.line_number()
            problem = BadLine(chunk.source.name, first_line_number + index, _shown(line),
                              _reason(error))
            if fmt.on_error == "raise":
                raise ParseError(problem) from None
            bad.append(problem)
            continue
        rows.extend(parsed)
    return record_columns(_rows_to_records(rows, fmt)), bad


def _decoded_lines(data: bytes) -> list[str | bytes]:
    """The lines of ``data``, decoded; a line that is not valid UTF-8 stays ``bytes``."""
    try:
        return split_lines(data.decode("utf-8"))  # one decode, when the whole chunk is valid
    except UnicodeDecodeError:
        pass
    lines: list[str | bytes] = []
    for raw in split_lines(data):
        try:
            lines.append(raw.decode("utf-8"))
        except UnicodeDecodeError:
            lines.append(raw)
    return lines


def _shown(line: str | bytes) -> str:
    return line.decode("utf-8", "replace") if isinstance(line, bytes) else line


def _reason(error: Exception) -> str:
    if isinstance(error, UnicodeDecodeError):
        return (f"not valid UTF-8 ({error.reason} at byte {error.start}; re-encode the file as "
                "UTF-8)")
    if isinstance(error, (ValueError, TypeError)):  # the loader's own: their text says it all
        return str(error)
    return f"{type(error).__name__}: {error}"  # e.g. from a parser hook


def _check_features(count: int, fmt: Format) -> None:
    if fmt.features is None:  # the input has no line with an id and a value
        raise ValueError("expected an id and at least one feature")
    if count != fmt.features:
        raise ValueError(f"expected {fmt.features} features, got {count} (every fvec line needs "
                         "as many as the input's first line, or features=)")


def _rows_to_records(rows: list[tuple], fmt: Format) -> np.ndarray:
    records = np.empty(len(rows), dtype=fmt.record_dtype())
    if not rows:
        return records
    if fmt.pattern == "fvec":
        ids, values = zip(*rows)
        records["id"] = _finish_ids(list(ids), fmt)
        records["values"] = values
        return records
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
    if isinstance(token, (bool, np.bool_)) or not isinstance(token, (str, numbers.Integral)):
        raise TypeError(f"id {_cut(token)} must be a str or int")
    if isinstance(token, str):
        if not _INT_TOKEN.fullmatch(token):
            raise ValueError(f"id {_cut(token)} is not an integer (pass ids='str' for string ids)")
        # Leading zeros dropped first, as pyarrow reads them: int() refuses over 4300 digits
        # (sys.get_int_max_str_digits) even where all but one are zeros; 20 are past int64.
        text = token.strip(" \t")
        digits = text.lstrip("-").lstrip("0") or "0"
        sign = "-" if text.startswith("-") else ""
        value = 2**63 if len(digits) > 19 else int(sign + digits)
    else:
        value = int(token)
    if value not in _INT64_RANGE:
        raise ValueError(f"id {_cut(token)} does not fit in int64 (pass ids='str' to hash it)")
    return value


def _number(token: object, what: str = "weight") -> float:
    """A float as pyarrow reads one: Python's ``float`` alone also takes '1_5', non-ASCII digits
    and other spaces than ' ' and tab around it, and refuses a NaN with a payload ('-nan(ind)',
    as C libraries print one)."""
    if isinstance(token, str):
        text = token.strip(" \t")
        if _NAN_WITH_PAYLOAD.fullmatch(text):
            return float("nan")
        if not text or not text.isascii() or "_" in text or text != text.strip():
            raise ValueError(f"{what} {_cut(token)} is not a number")
    try:
        return float(token)  # type: ignore[arg-type]
    except (ValueError, TypeError):
        raise ValueError(f"{what} {_cut(token)} is not a number") from None


def _cut(token: object, limit: int = 40) -> str:
    """``repr(token)``, cut short: a reason names the token, the line is shown after it."""
    shown = repr(token)
    return shown if len(shown) <= limit else shown[:limit] + "..."


def _str_id(token: object) -> str:
    text = str(token)
    if not text:
        raise ValueError("empty id")
    return text


def _pair(fields: list, convert_id: Callable) -> list[tuple]:
    if len(fields) not in (2, 3):
        raise ValueError(f"expected 2 or 3 fields (src, dst[, weight]), got {len(fields)}")
    weight = _number(fields[2]) if len(fields) == 3 else 1.0
    return [(convert_id(fields[0]), convert_id(fields[1]), weight)]


def _set(fields: list, convert_id: Callable) -> list[tuple]:
    if len(fields) < 2:
        raise ValueError("expected a source and at least one target")
    source = convert_id(fields[0])
    rows = []
    for target in fields[1:]:
        dst, marked, weight = str(target).replace(":", "|").partition("|")
        rows.append((source, convert_id(dst), _number(weight) if marked else 1.0))
    return rows


def _vector(fields: list, convert_id: Callable) -> list[tuple]:
    return [(convert_id(fields[0]), [_number(value, "value") for value in fields[1:]])]


_INTERPRET: dict[str, Callable[[list, Callable], list[tuple]]] = {
    "fmap": _pair, "smap": _pair, "fsmap": _pair, "fset": _set, "fvec": _vector,
}
