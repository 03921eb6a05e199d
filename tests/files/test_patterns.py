"""Parsing by pattern: the vectorised path agrees with the per-line reference on any input."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardwise.files import Format, ParseError, read_records, string_ids
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


def test_seed_003_examples(tmp_path: Path) -> None:
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
    split = lambda line: [line.split("\t")[0], *line.split("\t")[1].split("|")]  # noqa: E731
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


def test_fvec_lines_must_agree_on_their_length(tmp_path: Path) -> None:
    path = _write(tmp_path, "1,0.5,0.5\n2,0.5\n")
    with pytest.raises(ParseError, match=r"in.txt:2: expected 2 features as on earlier lines, got 1"):
        read_records(path, Format("fvec"), 0, 1)


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
