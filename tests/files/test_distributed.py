"""Loading over real gloo groups: every input record lands on exactly one rank, the one that owns it."""

from __future__ import annotations

import tempfile
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shardwise.distributed.launch import spawn_local
from shardwise.distributed.world import group_world
from shardwise.files import grid, load_graph, load_matrix, load_vectors, string_ids
from shardwise.files.owners import bucket

# Few distinct ids (so vertices repeat), some far above 2**31.
IDS = st.sampled_from([0, 1, 2, 3, 17, 2**31, 2**31 + 1, 2**40 + 5, 2**63 - 1, -5])
WEIGHT = st.sampled_from([1.0, 0.5, 2.25, -3.0])
ROWS = st.lists(st.tuples(IDS, IDS, WEIGHT), max_size=30)
SETS = st.lists(st.tuples(IDS, st.lists(st.tuples(IDS, WEIGHT), min_size=1, max_size=3)), max_size=10)
VECTORS = st.lists(st.tuples(IDS, st.tuples(WEIGHT, WEIGHT)), max_size=15)
QUIRKS = st.tuples(st.booleans(), st.booleans(), st.booleans())  # crlf, final newline, blank lines
CASE = st.fixed_dictionaries({
    "pairs": st.lists(st.tuples(ROWS, QUIRKS), min_size=1, max_size=3),
    "sets": st.lists(st.tuples(SETS, QUIRKS), min_size=1, max_size=2),
    "vectors": st.lists(st.tuples(VECTORS, QUIRKS), min_size=1, max_size=2),
})


def _text(lines: list[str], quirks: tuple[bool, bool, bool]) -> str:
    crlf, final_newline, blanks = quirks
    if blanks:
        lines = [part for line in lines for part in (line, "")]
    end = "\r\n" if crlf else "\n"
    return end.join(lines) + (end if final_newline and lines else "")


def _write_case(folder: Path, case: dict) -> tuple[dict, dict]:
    """Write a case's files; return their paths by kind and the records they hold."""
    formats = {
        "pairs": lambda row: [f"{a},{b},{w}" if w != 1.0 else f"{a},{b}" for a, b, w in row],
        "sets": lambda row: [",".join([str(s)] + [f"{d}|{w}" for d, w in targets]) for s, targets in row],
        "vectors": lambda row: [f"{i},{x},{y}" for i, (x, y) in row],
    }
    folder.mkdir(exist_ok=True)
    paths: dict[str, list[str]] = {}
    for kind, files in case.items():
        for index, (rows, quirks) in enumerate(files):
            path = folder / f"{kind}-{index}.txt"
            path.write_text(_text(formats[kind](rows), quirks), newline="")
            paths.setdefault(kind, []).append(str(path))
    records = {
        "pairs": [row for rows, _ in case["pairs"] for row in rows],
        "sets": [(s, d, w) for rows, _ in case["sets"] for s, targets in rows for d, w in targets],
        "vectors": [(i, v) for rows, _ in case["vectors"] for i, v in rows],
    }
    return paths, records


def _edges(graph) -> list[tuple]:
    return list(zip(*(a.tolist() for a in graph.edges())))


def _load_everything(batch: list[dict]) -> list[dict]:
    """On each rank: load every case every way; return what this rank holds."""
    out = []
    for paths in batch:
        small_rounds = {"round_bytes": 48 * group_world()[0]}  # many exchange rounds
        fmap = load_graph(paths["pairs"], "fmap", **small_rounds)
        smap = load_graph(paths["pairs"], "smap")
        block = load_matrix(paths["pairs"], "fsmap")
        entries = block.matrix.tocoo()
        ids, values = load_vectors(paths["vectors"])
        out.append({
            "fmap": _edges(fmap),
            "out_degree": {v: fmap.out_degree(v) for v in fmap.vertices().tolist()},
            "smap": _edges(smap),
            "in_degree": {v: smap.in_degree(v) for v in np.unique(smap.dst).tolist()},
            "fsmap": _edges(load_graph(paths["pairs"], "fsmap")),
            "matrix": {(int(block.row_ids[r]), int(block.col_ids[c])): float(x)
                       for r, c, x in zip(entries.row, entries.col, entries.data)},
            "undirected": _edges(load_graph(paths["pairs"], "fmap", "undirected")),
            "fset": _edges(load_graph(paths["sets"], "fset", "bigraph")),
            "vectors": list(zip(ids.tolist(), map(tuple, values.tolist()))),
        })
    return out


def _owner_ok(pattern: str, world_size: int, rank: int, src: int, dst: int) -> bool:
    if pattern == "smap":
        return bucket(np.array([dst]), world_size)[0] == rank
    if pattern == "fsmap":
        npx, npy = grid(world_size)
        return bucket(np.array([src]), npx)[0] * npy + bucket(np.array([dst]), npy)[0] == rank
    return bucket(np.array([src]), world_size)[0] == rank


def _check(world_size: int, per_rank: list[list[dict]], expected: list[dict]) -> None:
    for case_index, records in enumerate(expected):
        held = [rank_results[case_index] for rank_results in per_rank]
        pairs = records["pairs"]
        mirrored = pairs + [(b, a, w) for a, b, w in pairs if a != b]
        for key, want, rule in (("fmap", pairs, "fmap"), ("smap", pairs, "smap"),
                                ("fsmap", pairs, "fsmap"), ("undirected", mirrored, "fmap"),
                                ("fset", records["sets"], "fset")):
            union = Counter(edge for rank_held in held for edge in rank_held[key])
            assert union == Counter(want), key  # exactly once: nothing lost, nothing doubled
            for rank, rank_held in enumerate(held):
                assert all(_owner_ok(rule, world_size, rank, s, d) for s, d, _ in rank_held[key]), key
        out_degree = Counter(a for a, _, _ in pairs)
        in_degree = Counter(b for _, b, _ in pairs)
        for rank_held in held:
            assert rank_held["out_degree"] == {v: out_degree[v] for v in rank_held["out_degree"]}
            assert rank_held["in_degree"] == {v: in_degree[v] for v in rank_held["in_degree"]}
        matrix: Counter = Counter()
        for a, b, w in pairs:
            matrix[(a, b)] += w
        merged: dict = {}
        for rank_held in held:
            assert not merged.keys() & rank_held["matrix"].keys()  # one owner per cell
            merged.update(rank_held["matrix"])
        assert merged == pytest.approx(dict(matrix))
        vectors = Counter(v for rank_held in held for v in rank_held["vectors"])
        assert vectors == Counter((i, tuple(v)) for i, v in records["vectors"])


@pytest.mark.parametrize("world_size", [2, 3])
@settings(max_examples=3, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batch=st.lists(CASE, min_size=4, max_size=4))
def test_every_record_lands_once_on_its_owner_over_real_gloo_groups(world_size: int, batch: list) -> None:
    with tempfile.TemporaryDirectory() as folder:
        written = [_write_case(Path(folder) / str(i), case) for i, case in enumerate(batch)]
        per_rank = spawn_local(_load_everything, world_size, [paths for paths, _ in written])
        _check(world_size, per_rank, [records for _, records in written])


@settings(max_examples=25, deadline=None)
@given(case=CASE)
def test_without_a_process_group_one_rank_owns_everything(case: dict) -> None:
    with tempfile.TemporaryDirectory() as folder:
        paths, records = _write_case(Path(folder), case)
        _check(1, [_load_everything([paths])], [records])


def _undirected_neighbours(path: str) -> dict:
    """On each rank: v -> (adjacent(v) targets, in_degree(v)) for the vertices it owns, by pattern."""
    rank, world_size = group_world()[1], group_world()[0]
    out = {}
    for pattern in ("fmap", "smap"):
        graph = load_graph(path, pattern, "undirected", ids="str")
        src, dst, _ = graph.edges()
        key = src if pattern == "fmap" else dst
        assert (bucket(key, world_size) == rank).all(), pattern  # the pattern's rule, mirrored too
        owned = np.unique(np.concatenate([src, dst]))
        owned = owned[bucket(owned, world_size) == rank]
        out[pattern] = {int(v): (sorted(graph.adjacent(v)[0].tolist()), graph.in_degree(v))
                        for v in owned}
    return out


@pytest.mark.timeout(120)
def test_undirected_edges_go_by_the_patterns_rule(tmp_path: Path) -> None:
    # Both directions of every edge are routed by the pattern's rule: under fmap a vertex's owner
    # holds all its neighbours as adjacent(v); under smap it holds them as its in-edges.
    names = ["ann", "bo", "cy", "di", "ed", "flo"]
    edges = [(a, b) for i, a in enumerate(names) for b in names[i:] if (i + len(b)) % 2 == 0]
    (tmp_path / "g.txt").write_text("".join(f"{a},{b}\n" for a, b in edges))
    neighbours: dict = {}
    for a, b in edges:
        neighbours.setdefault(a, []).append(b)
        if a != b:  # a self-loop is stored once
            neighbours.setdefault(b, []).append(a)
    ids = dict(zip(names, string_ids(names).tolist()))
    want = {ids[v]: sorted(ids[n] for n in ns) for v, ns in neighbours.items()}
    per_rank = spawn_local(_undirected_neighbours, 2, str(tmp_path / "g.txt"), timeout=100)
    fmap = {v: got for rank in per_rank for v, got in rank["fmap"].items()}
    smap = {v: got for rank in per_rank for v, got in rank["smap"].items()}
    assert {v: adjacent for v, (adjacent, _) in fmap.items()} == want
    assert {v: in_degree for v, (_, in_degree) in smap.items()} == {v: len(n) for v, n in want.items()}
    assert any(adjacent != want[v] for v, (adjacent, _) in smap.items())  # not adjacent(v) there
