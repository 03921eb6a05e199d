"""The builders' views agree with each other and with networkx on the same edges."""

from __future__ import annotations

from pathlib import Path

import networkx as nx
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardwise.files import Graph, MatrixBlock, load_graph, load_matrix, load_vectors, string_ids


def test_graph_views_agree(tmp_path: Path) -> None:
    path = tmp_path / "g.txt"
    path.write_text("1,2,0.5\n1,3\n2,3,2\n1,2,0.25\n3,3\n")
    graph = load_graph(path)
    assert graph.vertices().tolist() == [1, 2, 3]
    assert (graph.num_vertices, graph.num_edges) == (3, 5)
    assert [a.tolist() for a in graph.adjacent(1)] == [[2, 3, 2], [0.5, 1.0, 0.25]]
    assert [a.tolist() for a in graph.adjacent(99)] == [[], []]
    assert (graph.out_degree(1), graph.in_degree(3), graph.in_degree(1)) == (3, 3, 0)
    block = graph.to_scipy()
    assert block.matrix.toarray().tolist() == [[0.75, 1.0], [0.0, 2.0], [0.0, 1.0]]
    assert (block.row_ids.tolist(), block.col_ids.tolist()) == ([1, 2, 3], [2, 3])
    net = graph.to_networkx()
    assert isinstance(net, nx.DiGraph) and net[1][2]["weight"] == 0.75 and net.number_of_edges() == 4
    assert graph.stats.lines == 5 and graph.stats.records_owned == 5
    assert set(graph.stats.seconds) == {"read+parse", "exchange", "build"}


def test_undirected_stores_both_directions_and_bigraph_keeps_sides_apart(tmp_path: Path) -> None:
    path = tmp_path / "g.txt"
    path.write_text("1,2\n2,2\n")
    undirected = load_graph(path, kind="undirected")
    assert sorted(zip(*(a.tolist() for a in undirected.edges()))) == [(1, 2, 1.0), (2, 1, 1.0), (2, 2, 1.0)]
    assert sorted(undirected.to_networkx().edges()) == [(1, 2), (2, 2)]
    bigraph = load_graph(path, kind="bigraph").to_networkx()
    assert sorted(bigraph.edges()) == [((0, 1), (1, 2)), ((0, 2), (1, 2))]
    assert dict(bigraph.nodes(data="bipartite")) == {(0, 1): 0, (0, 2): 0, (1, 2): 1}


def test_matrix_and_vectors(tmp_path: Path) -> None:
    (tmp_path / "m.txt").write_text("5,7,1.5\n5,7,1\n6,5\n")
    block = load_matrix(tmp_path / "m.txt")
    assert isinstance(block, MatrixBlock)
    assert block.matrix.toarray().tolist() == [[0.0, 2.5], [1.0, 0.0]]
    assert (block.row_ids.tolist(), block.col_ids.tolist()) == ([5, 6], [5, 7])
    (tmp_path / "n.txt").write_text("1,2,0.5\n3,4\n")  # no duplicates: scipy keeps the data given
    assert load_matrix(tmp_path / "n.txt").matrix.data.flags.c_contiguous
    (tmp_path / "v.txt").write_text("9,1,2\n4,3,4\n")
    ids, values = load_vectors(tmp_path / "v.txt")
    assert ids.tolist() == [4, 9] and values.tolist() == [[3.0, 4.0], [1.0, 2.0]]


@settings(max_examples=100, deadline=None)
@given(entries=st.lists(st.tuples(st.integers(-3, 2**40), st.integers(-3, 5), st.floats(-2, 2)),
                        max_size=60))
def test_sparse_block_sums_duplicates_over_the_distinct_rows_and_columns(
        entries: list[tuple[int, int, float]]) -> None:
    src, dst, weight = (np.array(column) for column in zip(*entries)) if entries else ([], [], [])
    block = MatrixBlock.from_records(np.asarray(src, np.int64), np.asarray(dst, np.int64),
                                     np.asarray(weight, np.float64))
    row_ids, rows = np.unique(np.asarray(src, np.int64), return_inverse=True)
    col_ids, cols = np.unique(np.asarray(dst, np.int64), return_inverse=True)
    expected = np.zeros((row_ids.size, col_ids.size))
    np.add.at(expected, (rows, cols), weight)
    assert block.row_ids.tolist() == row_ids.tolist() and block.col_ids.tolist() == col_ids.tolist()
    assert block.matrix.has_canonical_format and np.allclose(block.matrix.toarray(), expected)


def test_empty_input_gives_an_empty_partition(tmp_path: Path) -> None:
    (tmp_path / "empty.txt").write_text("")
    graph = load_graph(tmp_path / "empty.txt")
    assert graph.num_vertices == graph.num_edges == 0 and graph.to_scipy().matrix.shape == (0, 0)
    ids, values = load_vectors(tmp_path / "empty.txt")
    assert ids.size == 0 and values.shape[0] == 0


def test_builder_errors_name_the_fix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "g.txt").write_text("1,2\n")
    with pytest.raises(ValueError, match="unknown graph kind 'tree'"):
        load_graph(tmp_path / "g.txt", kind="tree")
    with pytest.raises(ValueError, match="use load_vectors"):
        load_graph(tmp_path / "g.txt", "fvec")
    with pytest.raises(ValueError, match="unknown graph kind"):
        Graph.from_edges(np.array([1]), np.array([2]), np.array([1.0]), "tree")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(RuntimeError, match="WORLD_SIZE is 2 but no process group"):
        load_graph(tmp_path / "g.txt")


def test_a_string_vertex_is_a_type_error_naming_string_ids(tmp_path: Path) -> None:
    # A graph of ids="str" is keyed by the strings' 63-bit ids: asking for a name answered
    # "no edges" (and in_degree 0), as if the vertex were not there.
    (tmp_path / "g.txt").write_text("alice,bob\nbob,alice\n")
    graph = load_graph(tmp_path / "g.txt", ids="str")
    alice = int(string_ids(["alice"])[0])
    assert graph.out_degree(alice) == graph.in_degree(alice) == 1
    for call in (graph.adjacent, graph.out_degree, graph.in_degree):
        for name in ("alice", b"alice", np.str_("alice")):
            with pytest.raises(TypeError, match=r"string_ids\(\['alice'\]\)"):
                call(name)
