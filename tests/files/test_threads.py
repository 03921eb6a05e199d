"""Parsing on threads: the same records, counts and errors as one thread, in the same order."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest

from shardwise.files import Format, ParseError, plan, read_records
from shardwise.files.threads import ordered_map, rank_threads


def test_ordered_map_keeps_order_and_runs_on_worker_threads() -> None:
    seen = set()

    def square(x: int) -> int:
        seen.add(threading.get_ident())
        return x * x

    assert list(ordered_map(square, range(200), threads=3)) == [x * x for x in range(200)]
    assert seen and threading.get_ident() not in seen


def test_ordered_map_raises_the_first_failure_in_item_order() -> None:
    def fail_on_odd(x: int) -> int:
        if x % 2:
            raise ValueError(f"item {x}")
        return x

    results = ordered_map(fail_on_odd, range(10), threads=4)
    assert next(results) == 0
    with pytest.raises(ValueError, match="item 1"):
        next(results)


def test_ordered_map_raises_a_failure_to_take_an_item_after_the_items_before_it() -> None:
    def items():
        yield from range(3)
        raise OSError("the next file is gone")

    results = ordered_map(lambda x: x, items(), threads=2)
    assert [next(results) for _ in range(3)] == [0, 1, 2]
    with pytest.raises(OSError, match="gone"):
        next(results)


def test_a_file_gone_after_planning_is_named_after_an_earlier_bad_line(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("1,2\nbad\n3,4\n")
    (tmp_path / "b.txt").write_text("5,6\n")
    the_plan = plan([tmp_path / "a.txt", tmp_path / "b.txt"], 1)
    (tmp_path / "b.txt").unlink()
    for threads in (1, 2):  # the first error is the same whatever the threads
        with pytest.raises(ParseError, match="a.txt:2"):
            read_records(the_plan, Format(), 0, 1, threads=threads)
    with pytest.raises(FileNotFoundError, match="b.txt is gone: it was there when the load was "
                                                "planned"):
        read_records(the_plan, Format(on_error="skip"), 0, 1, threads=2)


def test_ordered_map_takes_items_as_threads_free_up() -> None:
    taken = []

    def items():
        for i in range(100):
            taken.append(i)
            yield i

    results = ordered_map(lambda x: x, items(), threads=2)
    next(results)
    assert len(taken) <= 3  # threads + 1 in flight, not the whole input


def test_rank_threads_share_the_cores_among_local_ranks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: set(range(8)), raising=False)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "3")
    assert rank_threads() == 2
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "16")
    assert rank_threads() == 1
    monkeypatch.delenv("LOCAL_WORLD_SIZE")
    assert rank_threads() == 8


def _lines(tmp_path: Path, bad: dict[int, str], pattern: str = "fmap") -> Path:
    line = "{i},{j}|{w},{k}" if pattern == "fset" else "{i},{j},{w}"
    lines = [line.format(i=i, j=i * 7 % 1000, w=i / 8, k=i + 1) for i in range(60_000)]
    for at, text in bad.items():
        lines[at] = text
    path = tmp_path / "edges.txt"
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize("pattern", ["fmap", "fset", "fvec"])
def test_threads_give_the_same_records_as_one_thread(tmp_path: Path, pattern: str) -> None:
    path = _lines(tmp_path, {}, pattern)
    fmt = Format(pattern)
    one, one_stats = read_records(path, fmt, 0, 1, block_bytes=20_000, threads=1)
    for threads in (2, 5):
        many, stats = read_records(path, fmt, 0, 1, block_bytes=20_000, threads=threads)
        assert many.tobytes() == one.tobytes() and stats.lines == one_stats.lines


def test_threads_skip_and_name_bad_lines_as_one_thread(tmp_path: Path) -> None:
    path = _lines(tmp_path, {5: "x,1", 30_000: "1,2,3,4", 59_000: "1,oops"})
    reports = []
    for threads in (1, 4):
        with pytest.warns(UserWarning, match="skipped 3"):
            records, stats = read_records(path, Format(on_error="skip"), 0, 1, block_bytes=50_000,
                                          threads=threads)
        where = [(e.file, e.line) for e in stats.examples]
        reports.append((records.tobytes(), stats.skipped, where))
        with pytest.raises(ParseError) as raised:
            read_records(path, Format(), 0, 1, block_bytes=50_000, threads=threads)
        assert raised.value.bad.line == 6  # the first bad line in the file, not the first parsed
    assert reports[0] == reports[1]
    assert [line for _, line in reports[0][2]] == [6, 30_001, 59_001]
    assert len(np.frombuffer(reports[0][0], dtype=np.uint8)) == (60_000 - 3) * 24
