"""Parsing by pattern: the vectorised path agrees with the per-line reference on any input."""

from __future__ import annotations

import os
import pickle
import re
import subprocess
import sys
import tempfile
import tracemalloc
import warnings
from dataclasses import replace
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardwise.files import BadLine, Format, ParseError, read_lines, read_records, string_ids
from shardwise.files.ids import check_distinct

INT64 = st.integers(-(2**63), 2**63 - 1)
WEIGHT = st.floats(-1e6, 1e6, allow_nan=False).map(lambda w: round(w, 3))


def _write(folder: Path, text: str, name: str = "in.txt") -> Path:
    path = folder / name
    path.write_bytes(text.encode("utf-8"))
    return path


def _edges(records: np.ndarray) -> list[tuple]:
    return [(int(r["src"]), int(r["dst"]), float(r["weight"])) for r in records]


@settings(max_examples=60, deadline=None)
@given(
    rows=st.lists(st.tuples(INT64, INT64, WEIGHT), max_size=40),
    weighted=st.booleans(), crlf=st.booleans(), blank_every=st.integers(0, 5),
    delimiter=st.sampled_from([",", "\t", " ", ";"]), world_size=st.integers(1, 4),
)
def test_pair_lines_parse_exactly_on_both_paths(rows, weighted, crlf, blank_every, delimiter, world_size):
    end = "\r\n" if crlf else "\n"
    lines = [delimiter.join(map(str, (a, b, w) if weighted else (a, b))) for a, b, w in rows]
    if blank_every:
        lines = [line for i, l in enumerate(lines) for line in ([l, ""] if i % blank_every == 0 else [l])]
    expected = [(a, b, w if weighted else 1.0) for a, b, w in rows]
    with tempfile.TemporaryDirectory() as folder:
        path = _write(Path(folder), end.join(lines))
        for parser in (None, lambda line: line.split(delimiter)):
            fmt = Format("fmap", delimiter=delimiter, parser=parser)
            got = [e for r in range(world_size) for e in _edges(read_records(path, fmt, r, world_size)[0])]
            assert got == expected


@settings(max_examples=40, deadline=None)
@given(
    rows=st.lists(st.tuples(INT64, st.lists(st.tuples(INT64, st.none() | WEIGHT, st.sampled_from("|:")),
                                             min_size=1, max_size=5)), max_size=20)
)
def test_fset_lines_give_one_edge_per_target_with_mixed_weights(rows):
    text = "\n".join(
        ",".join([str(src)] + [f"{dst}{mark}{w}" if w is not None else str(dst) for dst, w, mark in targets])
        for src, targets in rows
    )
    expected = [(src, dst, 1.0 if w is None else w) for src, targets in rows for dst, w, _ in targets]
    with tempfile.TemporaryDirectory() as folder:
        path = _write(Path(folder), text)
        for parser in (None, lambda line: line.split(",")):
            assert _edges(read_records(path, Format("fset", parser=parser), 0, 1)[0]) == expected


def test_paracel_examples(tmp_path: Path) -> None:
    # fmap / fsmap lines with and without a weight, fset with the mix flag, fvec by space.
    pairs = _write(tmp_path, "1,2\n1,3,0.2\n", "pairs.txt")
    assert _edges(read_records(pairs, Format("fsmap"), 0, 1)[0]) == [(1, 2, 1.0), (1, 3, 0.2)]
    sets = _write(tmp_path, "a,b,c\na,b|0.2,c:0.4\n", "sets.txt")
    a, b, c = string_ids(["a", "b", "c"]).tolist()
    assert _edges(read_records(sets, Format("fset", ids="str"), 0, 1)[0]) == [
        (a, b, 1.0), (a, c, 1.0), (a, b, 0.2), (a, c, 0.4)]
    vectors = _write(tmp_path, "1001 0.1\n1002 0.5\n", "vec.txt")
    records, _ = read_records(vectors, Format("fvec", delimiter=" "), 0, 1)
    assert records["id"].tolist() == [1001, 1002] and records["values"].tolist() == [[0.1], [0.5]]
    # Paracel's own parser hook shape: "src\ttarget|target|..." split by a Python function.
    hook = _write(tmp_path, "7\t8|9\n", "hook.txt")
    split = lambda line: [line.split("\t")[0], *line.split("\t")[1].split("|")]
    assert _edges(read_records(hook, Format("fset", parser=split), 0, 1)[0]) == [(7, 8, 1.0), (7, 9, 1.0)]


def test_ids_above_2_31_are_exact_and_above_2_63_a_clear_error(tmp_path: Path) -> None:
    big = [2**31, 2**32 + 7, 2**62 + 1, 2**63 - 1, -(2**63)]
    path = _write(tmp_path, "".join(f"{v},{v - 1 if v > -(2**63) else v}\n" for v in big))
    assert read_records(path, Format(), 0, 1)[0]["src"].tolist() == big
    too_big = _write(tmp_path, "1,2\n9223372036854775808,1\n", "big.txt")
    with pytest.raises(ParseError, match=r"big.txt:2: id '9223372036854775808' does not fit in int64"):
        read_records(too_big, Format(), 0, 1)


def test_a_bad_line_is_named_by_file_and_line_from_whichever_rank_reads_it(tmp_path: Path) -> None:
    lines = [f"{i},{i + 1}" for i in range(5000)]
    lines[3999] = "4000,oops"
    _write(tmp_path, "\n".join(lines[:2000]) + "\n", "a.txt")
    path = _write(tmp_path, "\n".join(lines[2000:]) + "\n", "b.txt")
    errors = []
    for rank in range(3):
        try:
            read_records(tmp_path, Format(), rank, 3)
        except ParseError as error:
            errors.append((rank, error.bad.file, error.bad.line, error.bad.text))
    assert errors == [(2, str(path), 2000, "4000,oops")]


def test_skip_counts_bad_lines_and_keeps_every_good_one(tmp_path: Path) -> None:
    good = [f"{i},{i * 2},{i / 4}" for i in range(100_000)]  # large enough to bisect
    lines = good[:]
    for at, bad in ((10, "x,1"), (50_000, "1,2,3,4"), (99_990, ",5")):
        lines.insert(at, bad)
    path = _write(tmp_path, "\n".join(lines) + "\n")
    with pytest.warns(UserWarning, match="skipped 3 malformed line"):
        records, stats = read_records(path, Format(on_error="skip"), 0, 1)
    assert stats.skipped == 3 and stats.lines == len(lines)
    assert [e.line for e in stats.examples] == [11, 50_001, 99_991]
    assert _edges(records) == [(i, i * 2, i / 4) for i in range(100_000)]


def test_string_ids_are_the_same_whatever_rank_or_path_parses_them(tmp_path: Path) -> None:
    names = ["alice", "bob", "ünïcødé", "a-much-longer-name-than-eight-bytes", "x"]
    path = _write(tmp_path, "".join(f"{a},{b}\n" for a in names for b in names))
    expected = [tuple(string_ids([a, b]).tolist()) for a in names for b in names]
    for parser in (None, lambda line: line.split(",")):
        for world_size in (1, 3):
            fmt = Format(ids="str", parser=parser)
            got = [(int(r["src"]), int(r["dst"])) for rank in range(world_size)
                   for r in read_records(path, fmt, rank, world_size)[0]]
            assert got == expected
    assert (string_ids(names) >= 0).all()


def test_colliding_string_ids_are_detected() -> None:
    check_distinct(pa.array([b"a", b"b", b"a"]), np.array([1, 2, 1]))
    with pytest.raises(ValueError, match="string ids b'a' and b'b' hash to the same 63-bit id 1"):
        check_distinct(pa.array([b"a", b"b"]), np.array([1, 1]))


def test_fvec_lines_must_have_as_many_features_as_the_first(tmp_path: Path) -> None:
    path = _write(tmp_path, "\n7\n1,0.5,0.5\n2,0.5\n")  # the first line with a feature has 2
    with pytest.raises(ParseError, match=r"in.txt:2: expected 2 features, got 0"):
        read_records(path, Format("fvec"), 0, 1)
    with pytest.warns(UserWarning, match="skipped 2 malformed"):
        records, stats = read_records(path, Format("fvec", on_error="skip"), 0, 1)
    assert records["id"].tolist() == [1] and [bad.line for bad in stats.examples] == [2, 4]
    with pytest.raises(ParseError, match=r"in.txt:2: expected 1 features, got 0"):
        read_records(path, Format("fvec", features=1, parser=lambda line: line.split(",")), 0, 1)
    # Every rank takes the number from the input's first line, even a rank that never reads it.
    empty_rank, _ = read_records(_write(tmp_path, "1,0.5,0.5\n", "one.txt"), Format("fvec"), 1, 2)
    assert empty_rank.dtype["values"].shape == (2,) and len(empty_rank) == 0


@pytest.mark.parametrize("delimiter", [" ", "\t", ","])
def test_fvec_takes_its_width_past_lines_of_only_spaces_and_tabs(tmp_path: Path, delimiter: str) -> None:
    """Such lines are blank everywhere else: counting the delimiters of one gave a width."""
    path = _write(tmp_path, f"  \t\n1{delimiter}0.5\n \n2{delimiter}0.25\n")
    records, stats = read_records(path, Format("fvec", delimiter=delimiter), 0, 1)
    assert records["id"].tolist() == [1, 2] and records["values"].tolist() == [[0.5], [0.25]]
    assert stats.skipped == 0


def _ragged_vectors(folder: Path) -> tuple[Path, list[int], list[tuple]]:
    """100,000 3-feature lines with ragged ones placed where chunks, halves and ranks begin."""
    lines = [f"{i},{i / 2},{i / 4},{i / 8}" for i in range(100_000)]
    ragged = [2, 9_000, 30_001, 50_000, 50_001, 66_667, 99_999]  # 1-based line numbers
    for number in ragged:
        lines[number - 1] = f"{number},0.5" if number % 2 else f"{number},1,2,3,4"
    good = [(i, (i / 2, i / 4, i / 8)) for i in range(100_000) if i + 1 not in ragged]
    return _write(folder, "\n".join(lines) + "\n", "ragged.txt"), ragged, good


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_ragged_fvec_lines_are_skipped_and_each_is_named(tmp_path: Path, world_size: int) -> None:
    path, ragged, good = _ragged_vectors(tmp_path)
    got, named = [], []
    for rank in range(world_size):
        with pytest.warns(UserWarning, match="malformed line"):
            records, stats = read_records(path, Format("fvec", on_error="skip"), rank, world_size,
                                          block_bytes=200_000)
        got += [(int(r["id"]), tuple(r["values"].tolist())) for r in records]
        named += [(bad.file, bad.line, bad.reason) for bad in stats.examples]
    assert got == good
    assert [line for _, line, _ in named] == ragged
    assert all(file == str(path) and "expected 3 features" in reason for file, _, reason in named)


@pytest.mark.parametrize("kwargs, message", [
    ({"pattern": "linesplit"}, "use read_lines"),
    ({"pattern": "fmapp"}, "unknown pattern 'fmapp'"),
    ({"delimiter": "::"}, "delimiter must be one character"),
    ({"pattern": "fset", "delimiter": "|"}, "cannot be '|'"),
    ({"ids": "uuid"}, "ids must be 'int' or 'str'"),
    ({"on_error": "ignore"}, "on_error must be 'raise' or 'skip'"),
])
def test_bad_formats_are_clear_errors(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Format(**kwargs)


_GOOD_LINE = {
    "fmap": lambda i, p: f"{p}{i},{p}{i + 1},0.5",
    "fset": lambda i, p: f"{p}{i},{p}{i + 1}|0.5,{p}{i + 2}",
    "fvec": lambda i, p: f"{p}{i},0.5,{i / 4}",
}
_NOT_UTF8 = [b"\xff\xfe", b"7\xe9,8,0.5", b"1,2,0.\xe95", b"x\xc3(,y,z"]  # bad byte anywhere


@pytest.mark.parametrize("pattern", ["fmap", "fset", "fvec"])
@pytest.mark.parametrize("ids", ["int", "str"])
@pytest.mark.parametrize("per_line", [False, True])
def test_lines_that_are_not_utf8_are_skipped_or_named_on_every_path(
    tmp_path: Path, pattern: str, ids: str, per_line: bool
) -> None:
    prefix = "n" if ids == "str" else ""
    good = [_GOOD_LINE[pattern](i, prefix).encode() for i in range(20_000)]  # fast path, halved
    lines, bad_numbers = good[:], []
    for at, bad in zip((0, 7_000, 7_001, 19_999), _NOT_UTF8):
        lines.insert(at, bad)
        bad_numbers.append(at + 1)
    dirty = tmp_path / "dirty.txt"
    dirty.write_bytes(b"\n".join(lines) + b"\n")
    clean = tmp_path / "clean.txt"
    clean.write_bytes(b"\n".join(good) + b"\n")
    parser = (lambda line: line.split(",")) if per_line else None
    fmt = Format(pattern, ids=ids, parser=parser)
    with pytest.raises(ParseError, match=r"dirty.txt:1: not valid UTF-8 \(invalid start byte"):
        read_records(dirty, fmt, 0, 1)
    with pytest.warns(UserWarning, match="skipped 4 malformed"):
        records, stats = read_records(dirty, replace(fmt, on_error="skip"), 0, 1)
    assert records.tobytes() == read_records(clean, fmt, 0, 1)[0].tobytes()
    assert stats.skipped == 4 and [bad.line for bad in stats.examples] == bad_numbers
    assert all("not valid UTF-8" in bad.reason for bad in stats.examples)


def test_whatever_a_parser_hook_raises_names_the_line(tmp_path: Path) -> None:
    path = _write(tmp_path, "1 2\n3\n")
    fields = lambda line: dict(zip("ab", line.split()))["b"] and line.split()
    with pytest.raises(ParseError, match=r"in.txt:2: KeyError: 'b': '3'"):
        read_records(path, Format(parser=fields), 0, 1)


def test_parse_errors_pickle_whole() -> None:
    error = ParseError(BadLine("data/b.txt", 3, "1,x", "id 'x' is not an integer"), "rank 1: boom")
    again = pickle.loads(pickle.dumps(error))
    assert (type(again), again.bad, str(again)) == (ParseError, error.bad, "rank 1: boom")


def test_wide_fvec_lines_parse_like_the_per_line_path(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    rows = [(i * 7 - 9, rng.random(3_000).round(6)) for i in range(5)]  # wider than a CSV's columns
    path = _write(tmp_path, "\r\n".join(f"{i}," + ",".join(map(str, v)) for i, v in rows) + "\n\n")
    for ids in ("int", "str"):
        fast = read_records(path, Format("fvec", ids=ids), 0, 1)[0]
        per_line = Format("fvec", ids=ids, parser=lambda line: line.split(","))
        slow = read_records(path, per_line, 0, 1)[0]
        assert fast.tobytes() == slow.tobytes()
    assert [int(i) for i in fast["id"]] == [int(i) for i in string_ids([str(i) for i, _ in rows])]
    assert np.array_equal(read_records(path, Format("fvec"), 0, 1)[0]["values"],
                          [v for _, v in rows])


_PEAK_MEMORY = """
import sys
from shardwise.files import load_vectors

def resident(field):
    return next(int(line.split()[1]) * 1024 for line in open("/proc/self/status")
                if line.startswith(field))

load_vectors(sys.argv[2])  # pyarrow's kernels and allocator warmed up on a short wide line
before = resident("VmRSS:")
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # the peak (VmHWM) starts again from here
ids, values = load_vectors(sys.argv[1])
print(resident("VmHWM:") - before, values.shape[1])
"""


@pytest.mark.timeout(120)
def test_a_long_fvec_line_needs_memory_of_a_few_times_its_bytes(tmp_path: Path) -> None:
    if not os.access("/proc/self/clear_refs", os.W_OK):
        pytest.skip("needs Linux's /proc/self/clear_refs to measure a peak")
    values = np.random.default_rng(5).random(500_000).round(6)
    line = "42," + ",".join(map(str, values.tolist())) + "\n"
    wide = _write(tmp_path, line, "wide.txt")
    warm = _write(tmp_path, "1," + ",".join(["0.5"] * 2_000) + "\n", "warm.txt")
    probe = subprocess.run([sys.executable, "-c", _PEAK_MEMORY, str(wide), str(warm)],
                           capture_output=True, text=True, check=True)
    growth, features = map(int, probe.stdout.split())
    assert features == values.size
    # pyarrow.csv took ~1.2 GB per MB of such a line; the string-kernel path ~6x its bytes.
    assert growth < 10 * len(line), f"peak grew by {growth / len(line):.1f}x the line's bytes"


def test_records_stay_within_a_small_factor_of_their_bytes_whatever_the_line_lengths(
        tmp_path: Path) -> None:
    """A dense file of short lines in front of long-lined ones: the share read so far projects
    many times the records there are (about 20x here), which the record array must not grow to."""
    pad = "0" * 200
    _write(tmp_path, "".join(f"{i % 10},{i % 7}\n" for i in range(20_000)), "a.txt")
    _write(tmp_path, "".join(f"{pad}{i},{pad}{i + 1}\n" for i in range(5_000)), "b.txt")
    tracemalloc.start()  # NumPy reports its buffers to tracemalloc, resizes included
    try:
        records, _ = read_records(tmp_path, Format("fmap"), block_bytes=64 * 2**10, threads=1)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert _edges(records[-1:]) == [(4_999, 5_000, 1.0)] and len(records) == 25_000
    assert peak < 3 * records.nbytes, f"peak {peak / records.nbytes:.1f}x the records' bytes"


def _outcome(path: Path, fmt: Format) -> object:
    """The records read, or the first bad line's number and reason."""
    try:
        records, _ = read_records(path, fmt)
    except ParseError as error:
        return error.bad.line, error.bad.reason
    return records.tolist()


@pytest.mark.parametrize(("pattern", "text"), [
    ("fmap", "0x10,2\n"), ("fmap", "0xFFFFFFFFFFFFFFFF,2\n"), ("fmap", "1,0X1\n"),
    ("fmap", "+5,2\n"), ("fmap", "1_000,2\n"), ("fmap", "\u0661\u0662,2\n"),
    ("fmap", "1,2,1_5\n"), ("fset", "0x10,2|0.5\n"), ("fset", "1,2|\n"), ("fset", "1,3:\n"),
    ("fvec", "0x10,0.5\n"), ("fvec", "1,0.5,1_5\n"),
    ("fmap", "1,2\n3,4\r5,6\n"), ("fvec", "1,0.5\n2,0.5\r3,0.5\n"),
    ("fmap", "1,2,0.5\x0b\n"), ("fvec", "1,\x0c0.5\n"), ("fmap", "1,2,nan(a-b)\n"),
])
def test_a_line_means_the_same_on_every_path(tmp_path, pattern, text):
    """A hostile line is read, or refused, alike by pyarrow, the per-line path and a chunk with
    a bad line beside it: no hex id wraps, no lone \\r splits a line, no '1_5' is a number."""
    alone = _write(tmp_path, text, "alone.txt")
    fmt = Format(pattern, features=1 if pattern == "fvec" else None)
    per_line = replace(fmt, parser=lambda line: line.split(","))
    outcome = _outcome(alone, fmt)
    assert isinstance(outcome, tuple), outcome  # each of these inputs holds a bad line
    assert outcome == _outcome(alone, per_line)
    with_bad = _write(tmp_path, text + "x,y\n", "with_bad.txt")
    assert _outcome(with_bad, fmt) == outcome  # the first bad line is still the one named
    with pytest.warns(UserWarning, match="skipped 2 malformed line"):
        read_records(with_bad, replace(fmt, on_error="skip"))  # each holds one bad line, and x,y


@pytest.mark.parametrize("pattern", ["fmap", "fset", "fvec"])
def test_a_nan_as_c_libraries_print_it_is_a_nan_on_every_path(tmp_path, pattern):
    line = {"fmap": "1,2,-nan(ind)\n", "fset": "1,2|nan(1)\n", "fvec": "1,NaN(x_1)\n"}[pattern]
    alone = _write(tmp_path, line, "alone.txt")
    fmt = Format(pattern, features=1 if pattern == "fvec" else None)
    per_line = replace(fmt, parser=lambda line: line.split(","))
    with_bad = _write(tmp_path, line + "x,y\n", "with_bad.txt")
    for path, form in [(alone, fmt), (alone, per_line), (with_bad, replace(fmt, on_error="skip"))]:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # (x,y skipped)
            records, _ = read_records(path, form)
        assert len(records) == 1 and np.isnan(records[0][-1]).all()


def test_a_byte_order_mark_and_blank_lines_are_not_records(tmp_path):
    text = "\ufeff1,2\n   \n\t\n3,4\n"
    path = _write(tmp_path, text)
    expected = [(1, 2, 1.0), (3, 4, 1.0)]
    assert _edges(read_records(path, Format("fmap"))[0]) == expected
    assert _edges(read_records(path, Format("fmap", parser=lambda line: line.split(",")))[0]) == expected
    assert _edges(read_records(path, Format("fset"))[0]) == expected
    with_bad = _write(tmp_path, text + "x,y\n", "bad.txt")
    records, stats = read_records(with_bad, Format("fmap", on_error="skip"))
    assert (_edges(records), stats.skipped, stats.examples[0].line) == (expected, 1, 5)
    assert read_lines(path, 0, 1)[0] == "1,2"  # raw lines too
    assert read_lines(_write(tmp_path, "\ufeff", "mark.txt"), 0, 1) == []  # as an empty file
    named = read_records(_write(tmp_path, "\ufeffa,b\n", "s.txt"), Format("fmap", ids="str"))[0]
    assert named["src"].tolist() == string_ids(["a"]).tolist()


@pytest.mark.parametrize("pattern", ["fmap", "fset", "fvec"])
@pytest.mark.parametrize("ids", ["int", "str"])
@pytest.mark.parametrize("per_line", [False, True])
def test_a_file_of_only_a_byte_order_mark_is_an_empty_file(tmp_path, pattern, ids, per_line):
    """Once its mark is taken off, such a file leaves an empty chunk, which every path reads as
    no lines and no records (fset's string kernels indexed its first byte)."""
    (tmp_path / "edges.txt").write_bytes(b"1,2|0.5,3\n" if pattern == "fset" else b"1,2\n")
    fmt = Format(pattern, ids=ids, parser=(lambda line: line.split(",")) if per_line else None)
    alone, alone_stats = read_records(tmp_path, fmt)
    (tmp_path / "mark.txt").write_bytes(b"\xef\xbb\xbf")
    records, stats = read_records(tmp_path, fmt)
    assert records.tolist() == alone.tolist() and stats.lines == alone_stats.lines == 1


@pytest.mark.parametrize("pattern", ["fmap", "fset", "fvec"])
@pytest.mark.parametrize("ids", ["int", "str"])
def test_a_byte_order_mark_inside_a_file_reads_alike_however_the_file_is_cut(tmp_path, pattern, ids):
    """Two marked files run together (``cat a.csv b.csv``): the second mark is part of its line
    whether a rank's share or a chunk begins there or not (pyarrow drops a mark opening a piece)."""
    mark = b"\xef\xbb\xbf"
    path = tmp_path / "joined.csv"
    path.write_bytes(mark + b"1,2\n" + mark + b"3,4\n5,6\n")
    fmt = Format(pattern, ids=ids, on_error="skip")
    results = []
    for world_size, block_bytes in [(1, 16 * 2**20), (2, 16 * 2**20), (1, 7), (3, 5)]:
        records, skipped = [], 0
        for rank in range(world_size):
            part, stats = read_records(path, fmt, rank, world_size, block_bytes=block_bytes)
            records += part.tolist()
            skipped += stats.skipped
        results.append((sorted(records), skipped))
    assert all(result == results[0] for result in results), results
    assert results[0][1] == (1 if ids == "int" else 0)  # an int id cannot hold the mark


def test_doubled_carriage_returns_end_a_line_as_one_does(tmp_path):
    expected = [(1, 2, 1.0), (3, 4, 1.0)]
    path = _write(tmp_path, "1,2\r\r\n3,4\r\n")
    assert _edges(read_records(path, Format("fmap"))[0]) == expected
    named = read_records(_write(tmp_path, "a,b\r\r\n", "s.txt"), Format("fmap", ids="str"))[0]
    assert named["dst"].tolist() == string_ids(["b"]).tolist()


def test_a_reason_quotes_a_long_token_cut_short(tmp_path):
    path = _write(tmp_path, "9" * 100_000 + ",2\n")
    with pytest.raises(ParseError) as caught:
        read_records(path, Format("fmap"))
    assert "does not fit in int64" in str(caught.value) and "9" * 300 not in str(caught.value)


@pytest.mark.parametrize("delimiter", ["é", "\0", "→"])
def test_a_delimiter_pyarrow_cannot_take_is_parsed_line_by_line_alike(tmp_path: Path,
                                                                    delimiter: str) -> None:
    for pattern in ("fmap", "fvec"):
        lines = ["1,2,0.5", "3,4,1.5", "5,6,2.5"]
        (tmp_path / "comma.txt").write_text("".join(f"{line}\n" for line in lines))
        (tmp_path / "odd.txt").write_text(
            "".join(f"{line.replace(',', delimiter)}\n" for line in lines), encoding="utf-8")
        comma, _ = read_records(tmp_path / "comma.txt", Format(pattern), 0, 1)
        odd, _ = read_records(tmp_path / "odd.txt", Format(pattern, delimiter=delimiter), 0, 1)
        assert [odd[name].tolist() for name in odd.dtype.names] == [
            comma[name].tolist() for name in comma.dtype.names] and len(odd) == 3


def test_a_parser_may_give_numpy_integer_ids_and_a_first_line_not_utf8_sets_no_width(
        tmp_path: Path) -> None:
    path = tmp_path / "e.txt"
    path.write_bytes(b"1,2\n3,4\n")
    def parser(line: str) -> list:
        return [np.int64(field) for field in line.split(",")]

    records, _ = read_records(path, Format("fmap", parser=parser), 0, 1)
    assert records["src"].tolist() == [1, 3] and records["dst"].tolist() == [2, 4]
    path.write_bytes(b"\xff,1,2,3\n1,0.5\n2,0.25\n")
    with pytest.warns(UserWarning, match="skipped 1 malformed line"):
        vectors, stats = read_records(path, Format("fvec", on_error="skip"), 0, 1)
    assert vectors["id"].tolist() == [1, 2] and stats.skipped == 1


def test_the_fvec_width_comes_from_the_first_line_as_the_parse_reads_it(tmp_path: Path) -> None:
    # A hook that fails on a header with any exception passes it over (the parse skips it too),
    # and a byte order mark is not part of the first line a hook is given.
    path = tmp_path / "v.txt"
    path.write_text("# id x y\n1 0.5 0.25\n2 1.5 2.5\n")
    def match(line: str) -> tuple:
        return re.fullmatch(r"(\d+)\s+(\S+)\s+(\S+)", line).groups()  # None.groups(): an error

    with pytest.warns(UserWarning, match="skipped 1 malformed line.*AttributeError"):
        vectors, _ = read_records(path, Format("fvec", parser=match, on_error="skip"), 0, 1)
    assert vectors["id"].tolist() == [1, 2]
    with pytest.raises(ParseError, match="v.txt:1: AttributeError"):  # (the search stops there)
        read_records(path, Format("fvec", parser=match), 0, 1)
    path.write_bytes("\ufeff1 0.5 0.25\n2 0.75\n".encode())
    def strict(line: str) -> list:
        first, *values = line.split()
        return [int(first), *values]

    with pytest.warns(UserWarning, match="v.txt:2: expected 2 features, got 1"):
        vectors, _ = read_records(path, Format("fvec", parser=strict, on_error="skip"), 0, 1)
    assert vectors["id"].tolist() == [1] and vectors["values"].tolist() == [[0.5, 0.25]]


@pytest.mark.parametrize("pattern", ["fmap", "fset", "fvec"])
def test_an_int_id_with_thousands_of_leading_zeros_reads_alike_on_every_path(tmp_path, pattern):
    """pyarrow reads 4300 leading zeros and a 5 as 5; the per-line path called it too large for
    int64 (Python's int() refuses strings of over 4300 digits), so a line beside bad ones was
    skipped where alone it was read."""
    line = "0" * 4300 + ("5,0.5\n" if pattern == "fvec" else "5,2\n")
    fmt = Format(pattern, on_error="skip", features=1 if pattern == "fvec" else None)
    path = _write(tmp_path, line, "alone.txt")
    alone, _ = read_records(path, fmt)
    dense = _write(tmp_path, "x,y\n" + line + "x" * 5000 + ",y\n", "dense.txt")  # all per line
    with pytest.warns(UserWarning, match="skipped 2 malformed line"):
        beside_bad, _ = read_records(dense, fmt)
    hooked, _ = read_records(path, replace(fmt, parser=lambda text: text.split(",")))
    assert alone.tolist() == beside_bad.tolist() == hooked.tolist() and len(alone) == 1
    assert alone[0][0] == 5
    with pytest.raises(ParseError, match="does not fit in int64"):
        read_records(_write(tmp_path, "-" + "0" * 4300 + "9" * 20 + ",2\n", "big.txt"),
                     Format("fmap"))
