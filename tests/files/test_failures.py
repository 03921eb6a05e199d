"""Ranks fail together: an error or a disagreement on one rank raises on every rank, naming it.

Each rank of a real gloo group works in its own copy of a folder tree (as ranks on different
machines would), so one rank can be given a file the others lack, a larger file, or another
option. After each failed load the group is used again: no rank may be left inside a collective.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from functools import partial
from pathlib import Path

import pytest

from shardwise.distributed.launch import spawn_local
from shardwise.distributed.world import group_world
from shardwise.files import ParseError, agreed_plan, load_graph, load_vectors, read_lines

WORLD = 3
EDGES = [(i, i + 1) for i in range(300)]


def _outcome(load: Callable[[], object]) -> tuple[str, str, object]:
    """What ``load()`` raised: its type, message and ``.bad`` line, or ``("ok", "", None)``."""
    try:
        load()
    except Exception as exc:  # noqa: BLE001 - the test compares what each rank raised
        return type(exc).__name__, str(exc), getattr(exc, "bad", None)
    return "ok", "", None


def _rank_tree(root: Path, rank: int) -> None:
    """Work in this rank's copy of ``data/`` (``root/<rank>/data``), as on its own machine."""
    os.chdir(root / str(rank))


def _write_tree(root: Path, change: Callable[[int, Path], None] | None = None) -> None:
    """Three equal files of 100 edges per rank's tree; ``change(rank, data)`` alters one tree."""
    for rank in range(WORLD):
        data = root / str(rank) / "data"
        data.mkdir(parents=True)
        for index, name in enumerate(("a.txt", "b.txt", "c.txt")):
            rows = EDGES[100 * index : 100 * (index + 1)]
            (data / name).write_text("".join(f"{a:05d},{b:05d}\n" for a, b in rows))
        if change is not None:
            change(rank, data)


def _edges(graph) -> list[tuple[int, int]]:
    src, dst, _ = graph.edges()
    return list(zip(src.tolist(), dst.tolist()))


def _split_by(separator: str, line: str) -> list[str]:
    return line.split(separator)


def _failures(root: Path) -> dict[str, tuple]:
    """Every scenario, one after another in one group, as this rank saw it."""
    _, rank = group_world()
    out = {}
    _rank_tree(root / "bad-line", rank)
    out["bad line"] = _outcome(lambda: load_graph("data"))
    _rank_tree(root / "missing", rank)
    out["missing file"] = _outcome(lambda: load_graph(["data/a.txt", "data/b.txt"]))
    out["missing from listing"] = _outcome(lambda: load_graph("data"))
    _rank_tree(root / "larger", rank)
    out["larger"] = _outcome(lambda: load_graph("data"))
    _rank_tree(root / "same", rank)
    in_order = ["data/a.txt", "data/b.txt", "data/c.txt"]
    out["reordered"] = _outcome(lambda: load_graph(in_order[::-1] if rank == 1 else in_order))
    round_bytes = 2**20 if rank == 1 else 2**30
    out["round_bytes"] = _outcome(lambda: load_graph("data", round_bytes=round_bytes))
    out["pattern"] = _outcome(lambda: load_graph("data", "smap" if rank == 2 else "fmap"))
    kind = "tree" if rank == 2 else "digraph"
    out["bad argument"] = _outcome(lambda: load_graph("data", kind=kind))
    out["agreed plan"] = _outcome(lambda: agreed_plan(in_order[::-1] if rank == 0 else in_order))
    # Parsers that share a name: every partial is a functools.partial, every split a "split".
    split = partial(_split_by, ";" if rank == 1 else ",")
    out["partial parser"] = _outcome(lambda: load_graph("data", parser=split))
    split_at = re.compile("[,;]" if rank == 2 else ",").split
    out["bound parser"] = _outcome(lambda: load_graph("data", parser=split_at))
    out["same parsers"] = _outcome(lambda: load_graph("data", parser=partial(_split_by, ",")))
    out["afterwards"] = sorted(_edges(load_graph("data")))  # the group still works
    return out


@pytest.mark.timeout(240)
def test_every_rank_raises_what_one_rank_met_naming_it(tmp_path: Path) -> None:
    def bad_line(rank: int, data: Path) -> None:
        lines = (data / "b.txt").read_text().splitlines()
        lines[2] = "00102,oops!"  # line 3 of b.txt, in rank 1's share only
        (data / "b.txt").write_text("\n".join(lines) + "\n")

    def missing(rank: int, data: Path) -> None:
        if rank == 1:
            (data / "b.txt").unlink()

    def larger(rank: int, data: Path) -> None:
        if rank == 1:
            with open(data / "b.txt", "a") as f:
                f.write("99999,99998\n")

    for name, change in (("bad-line", bad_line), ("missing", missing), ("larger", larger),
                         ("same", None)):
        _write_tree(tmp_path / name, change)
    per_rank = spawn_local(_failures, WORLD, tmp_path, timeout=180)
    raised = [{k: v for k, v in out.items() if k != "afterwards"} for out in per_rank]
    assert all(out == raised[0] for out in raised)  # every rank raised the same error
    out = raised[0]

    kind, message, bad = out["bad line"]
    assert kind == "ParseError" and message.startswith("rank 1: data/b.txt:3: id 'oops!' is not an")
    assert (bad.file, bad.line, bad.text) == ("data/b.txt", 3, "00102,oops!")

    not_found = "rank 1: input file not found: 'data/b.txt' (check the path or URL)"
    assert out["missing file"][:2] == ("FileNotFoundError", not_found)
    kind, message, _ = out["missing from listing"]
    assert kind == "InconsistentRanksError"
    assert "data/b.txt is missing on rank 1 (2 files there, 3 on ranks 0, 2)" in message
    kind, message, _ = out["larger"]
    assert kind == "InconsistentRanksError"
    assert "data/b.txt has 1,212 bytes on rank 1 but 1,200 on ranks 0, 2" in message
    kind, message, _ = out["reordered"]
    assert ("file 1 is data/c.txt on rank 1 but data/a.txt on ranks 0, 2 (the same files in "
            "another order)") in message and "a sorted list, not a set" in message
    round_bytes = "rank 1 has round_bytes=1048576 where ranks 0, 2 have round_bytes=1073741824"
    assert round_bytes in out["round_bytes"][1]
    assert "rank 2 has pattern='smap' where ranks 0, 1 have pattern='fmap'" in out["pattern"][1]
    unknown = "rank 2: unknown graph kind 'tree': choose one of digraph, bigraph, undirected"
    assert out["bad argument"][:2] == ("ValueError", unknown)
    assert "file 1 is data/c.txt on rank 0 but data/a.txt on ranks 1, 2" in out["agreed plan"][1]
    kind, message, _ = out["partial parser"]
    assert kind == "InconsistentRanksError" and re.search(
        r"rank 1 has parser=\"partial\(\S+\._split_by, ';'\)\" where ranks 0, 2 have "
        r"parser=\"partial\(\S+\._split_by, ','\)\"", message), message
    kind, message, _ = out["bound parser"]
    assert kind == "InconsistentRanksError" and (
        "rank 2 has parser=\"re.compile('[,;]', 32).split\" where ranks 0, 1 have "
        "parser=\"re.compile(',', 32).split\"") in message, message
    assert out["same parsers"] == ("ok", "", None)  # no address or id in a description
    assert sorted(e for r in range(WORLD) for e in per_rank[r]["afterwards"]) == sorted(EDGES)


def _set_of_paths(folder: Path) -> dict:
    """Load a set of paths (each process iterates a set in its own order) every way."""
    paths = {str(path) for path in sorted(folder.glob("*.txt"))}
    return {
        "graph": _edges(load_graph(paths)),
        "lines": read_lines(agreed_plan(frozenset(paths))),
    }


@pytest.mark.timeout(180)
def test_a_set_of_paths_gives_every_line_exactly_once(tmp_path: Path) -> None:
    lines = []
    for index in range(12):
        rows = [f"{index * 100 + i},{i}" for i in range(37 + index)]
        (tmp_path / f"part-{index:02d}.txt").write_text("\n".join(rows) + "\n")
        lines += rows
    per_rank = spawn_local(_set_of_paths, WORLD, tmp_path, timeout=120)
    assert sorted(e for out in per_rank for e in out["graph"]) == sorted(
        tuple(map(int, line.split(","))) for line in lines)
    assert [line for out in per_rank for line in out["lines"]] == lines  # sorted file order


def _vectors(folder: Path) -> dict:
    vectors = load_vectors(folder / "ragged.txt", on_error="skip")
    tiny = load_vectors(folder / "tiny.txt")
    seconds = vectors.stats.seconds
    return {
        "vectors": list(zip(vectors.ids.tolist(), map(tuple, vectors.values.tolist()))),
        "named": [(bad.file, bad.line) for bad in vectors.stats.examples],
        "skipped": vectors.stats.skipped,
        "tiny shape": tiny.values.shape[1],
        "stats types": {name: type(getattr(vectors.stats, name)).__name__ for name in (
            "rank", "world_size", "bytes_read", "lines", "records_read", "records_owned",
            "skipped")} | {"seconds": sorted({type(s).__name__ for s in seconds.values()})},
    }


@pytest.mark.timeout(180)
@pytest.mark.filterwarnings("ignore:rank .* skipped")
def test_ragged_vectors_are_skipped_and_named_and_all_ranks_know_the_length(tmp_path: Path) -> None:
    rows = [(i, (i / 2, i / 4)) for i in range(3_000)]
    lines = [f"{i},{a},{b}" for i, (a, b) in rows]
    ragged = [1_000, 1_001, 2_500]
    for number in ragged:
        lines[number - 1] = f"{number},1,2,3"
    (tmp_path / "ragged.txt").write_text("\n".join(lines) + "\n")
    (tmp_path / "tiny.txt").write_text("5,0.5,0.25,0.125\n")  # one line: two ranks read nothing
    per_rank = spawn_local(_vectors, WORLD, tmp_path, timeout=120)
    got = sorted(v for out in per_rank for v in out["vectors"])
    assert got == [(i, v) for i, v in rows if i + 1 not in ragged]
    named = sorted(n for out in per_rank for n in out["named"])
    assert named == [(str(tmp_path / "ragged.txt"), number) for number in ragged]
    assert sum(out["skipped"] for out in per_rank) == len(ragged)
    assert [out["tiny shape"] for out in per_rank] == [3, 3, 3]
    assert per_rank[0]["stats types"] == {
        "rank": "int", "world_size": "int", "bytes_read": "int", "lines": "int",
        "records_read": "int", "records_owned": "int", "skipped": "int", "seconds": ["float"]}


def test_one_process_is_rank_0_and_keeps_the_exception_type(tmp_path: Path) -> None:
    (tmp_path / "g.txt").write_text("1,2\n1,x\n")
    with pytest.raises(ParseError, match=r"^rank 0: .*g.txt:2: id 'x' is not an integer") as caught:
        load_graph(tmp_path / "g.txt")
    assert caught.value.bad.line == 2
    with pytest.warns(UserWarning, match="rank 0 skipped 1 malformed line"):
        graph = load_graph(tmp_path / "g.txt", on_error="skip")
    assert graph.dst.tolist() == [2]
    stats = graph.stats
    assert (stats.bytes_read, stats.lines, stats.records_owned, stats.skipped) == (8, 2, 1, 1)
    assert all(type(getattr(stats, name)) is int for name in (
        "rank", "world_size", "bytes_read", "lines", "records_read", "records_owned", "skipped"))
    assert all(type(seconds) is float for seconds in stats.seconds.values())


def test_a_parser_in_the_script_is_described_alike_in_spawned_ranks() -> None:
    from shardwise.files.describe import describe

    def split(line: str) -> list[str]:
        return line.split(",")

    def spawned(line: str) -> list[str]:
        return line.split(",")

    # A rank running the script is __main__; one spawned by multiprocessing, __mp_main__.
    split.__module__, spawned.__module__, spawned.__qualname__ = ("__main__", "__mp_main__",
                                                                  split.__qualname__)
    assert describe(split) == describe(spawned) == describe(partial(split))[8:-1]


def _grouping_fails_on_rank_1(folder: Path) -> dict:
    """Rank 1 runs out of memory grouping its records by owner (the copy that is a rank's peak),
    then goes on, as a notebook or a retrying job does, to use the group again."""
    import shardwise.files.load as load

    _, rank = group_world()
    group_by_owner = load.group_by_owner

    def short_of_memory(*args, **kwargs):
        if rank == 1:
            raise MemoryError("unable to allocate 3.0 GiB for the grouped records")
        return group_by_owner(*args, **kwargs)

    load.group_by_owner = short_of_memory
    try:
        out = {"failed": _outcome(lambda: load_graph(folder))}
    finally:
        load.group_by_owner = group_by_owner
    out["afterwards"] = _edges(load_graph(folder))  # no rank was left inside the exchange
    return out


@pytest.mark.timeout(120)
def test_a_rank_failing_between_the_read_and_the_exchange_fails_every_rank(tmp_path: Path) -> None:
    (tmp_path / "g.txt").write_text("".join(f"{a},{b}\n" for a, b in EDGES))
    per_rank = spawn_local(_grouping_fails_on_rank_1, WORLD, tmp_path, timeout=60)
    for out in per_rank:
        kind, message, _ = out["failed"]
        assert (kind, message) == ("MemoryError", "rank 1: unable to allocate 3.0 GiB for the "
                                                  "grouped records")
    assert sorted(e for out in per_rank for e in out["afterwards"]) == EDGES


def _load_own_copy(root: Path) -> dict:
    _, rank = group_world()
    _rank_tree(root, rank)
    return {"loaded": _outcome(lambda: load_graph("data/g.txt")),
            "afterwards": _edges(load_graph("data/a.txt"))}  # no rank left in a collective


@pytest.mark.timeout(120)
def test_copies_of_one_size_whose_lines_break_elsewhere_at_a_cut_are_refused(tmp_path: Path) -> None:
    # 300 lines of 12 bytes: the ranks' cuts fall at bytes 1,200 and 2,400, between lines.
    text = "".join(f"{a:05d},{b:05d}\n" for a, b in EDGES)

    def shifted(rank: int, data: Path) -> None:
        # Rank 1's copy has the same size, but the line break before the cut one byte earlier:
        # rank 0 ends its share at byte 1,200 of its copy, rank 1 begins at byte 1,212 of its own.
        (data / "g.txt").write_text(
            text.replace("00099,00100\n00100,", "0099,00100\n000100,") if rank == 1 else text)

    _write_tree(tmp_path, shifted)
    per_rank = spawn_local(_load_own_copy, WORLD, tmp_path, timeout=60)
    for out in per_rank:
        kind, message, _ = out["loaded"]
        assert kind == "InconsistentRanksError", message
        assert ("rank 0's lines of data/g.txt end at byte 1,200 but rank 1's begin at byte 1,212"
                in message), message
    assert sorted(e for out in per_rank for e in out["afterwards"]) == EDGES[:100]
