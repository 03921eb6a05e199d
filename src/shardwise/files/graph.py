"""A rank's partition of a graph: its edges in CSR form, rows being the edges' source vertices."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import cached_property, partial
from typing import Any, Literal

import numpy as np

from shardwise.files.columnar import TablePlan
from shardwise.files.load import LoadStats, load_records
from shardwise.files.matrix import MatrixBlock
from shardwise.files.pages import plain_pages
from shardwise.files.patterns import Format, LineParser
from shardwise.files.plan import Plan
from shardwise.files.records import gather_targets
from shardwise.files.sorting import group_rows
from shardwise.files.sources import Paths, StorageOptions

Kind = Literal["digraph", "bigraph", "undirected"]
KINDS = ("digraph", "bigraph", "undirected")


@dataclass(frozen=True, eq=False)
class Graph:
    """The edges this rank holds, grouped by source vertex (CSR); duplicate edges are kept.

    ``vertices()`` are the sources of the edges held here. Under ``fmap`` / ``fset`` a vertex's
    out-edges all live on its owner, so ``out_degree`` there is global; under ``smap`` a vertex's
    in-edges do, so ``in_degree`` on its owner is. An undirected graph stores both directions
    of each edge (a self-loop once), each routed by that rule as an edge of its own: under
    ``fmap`` / ``fset`` ``adjacent(v)`` on v's owner lists all of v's neighbours, under ``smap``
    v's in-edges there come from all of them. A loaded graph's ``dst`` and ``weight`` are views
    of one array of (target, weight) pairs, 16 bytes apart: take ``np.ascontiguousarray`` of one
    where a contiguous buffer is needed (a collective, say).

    >>> g = Graph.from_edges(np.array([1, 1, 2]), np.array([2, 3, 3]), np.array([.5, 1., 2.]))
    >>> g.vertices().tolist(), g.num_edges, g.out_degree(1), g.in_degree(3)
    ([1, 2], 3, 2, 2)
    >>> [a.tolist() for a in g.adjacent(1)]
    [[2, 3], [0.5, 1.0]]
    """

    kind: Kind
    row_ids: np.ndarray
    indptr: np.ndarray
    dst: np.ndarray
    weight: np.ndarray
    stats: LoadStats | None = None

    @classmethod
    def from_edges(
        cls, src: np.ndarray, dst: np.ndarray, weight: np.ndarray, kind: Kind = "digraph",
        stats: LoadStats | None = None,
    ) -> Graph:
        """Group edges by source; each source's edges keep their given order."""
        return cls._by_source(src, lambda order: (dst[order], weight[order]), kind, stats)

    @classmethod
    def _by_source(
        cls, src: np.ndarray, gather: Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]],
        kind: Kind, stats: LoadStats | None = None,
    ) -> Graph:
        """``from_edges``, with ``gather(order)`` giving the targets and weights in ``order``."""
        if kind not in KINDS:
            raise ValueError(f"unknown graph kind {kind!r}: choose one of {', '.join(KINDS)}")
        row_ids, indptr, (dst, weight) = group_rows(src, gather)
        return cls(kind, row_ids, indptr, dst, weight, stats)

    def vertices(self) -> np.ndarray:
        """The source vertices of this rank's edges, ascending."""
        return self.row_ids

    @property
    def num_vertices(self) -> int:
        return int(self.row_ids.size)

    @property
    def num_edges(self) -> int:
        return int(self.dst.size)

    def adjacent(self, v: int) -> tuple[np.ndarray, np.ndarray]:
        """``(targets, weights)`` of ``v``'s edges held here (empty when it has none here)."""
        lo, hi = self._span(v)
        return self.dst[lo:hi], self.weight[lo:hi]

    def out_degree(self, v: int) -> int:
        lo, hi = self._span(v)
        return hi - lo

    def in_degree(self, v: int) -> int:
        """The number of this rank's edges that point at ``v``."""
        _check_vertex(v)
        targets, counts = self._in_counts
        index = int(np.searchsorted(targets, v))
        return int(counts[index]) if index < targets.size and targets[index] == v else 0

    def edges(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(src, dst, weight)`` arrays of every edge held here."""
        return np.repeat(self.row_ids, np.diff(self.indptr)), self.dst, self.weight

    def to_scipy(self) -> MatrixBlock:
        """A sparse block: rows are ``vertices()``, columns the distinct targets; duplicates summed."""
        return MatrixBlock.from_records(*self.edges())

    def to_networkx(self) -> Any:
        """A networkx graph of the edges held here, duplicate edges' weights summed.

        ``digraph`` gives a ``DiGraph``, ``undirected`` a ``Graph``; ``bigraph`` gives a
        ``DiGraph`` whose nodes are ``(0, u)`` for sources and ``(1, v)`` for targets (the two
        sides may reuse ids), with the ``bipartite`` node attribute networkx expects.
        """
        import networkx as nx  # optional: only needed here

        block = self.to_scipy()
        entries = block.matrix.tocoo()
        rows, cols = block.row_ids[entries.row], block.col_ids[entries.col]
        graph = nx.Graph() if self.kind == "undirected" else nx.DiGraph()
        if self.kind == "bigraph":
            graph.add_nodes_from(((0, u) for u in self.row_ids.tolist()), bipartite=0)
            graph.add_nodes_from(((1, v) for v in np.unique(self.dst).tolist()), bipartite=1)
            pairs = zip(((0, u) for u in rows.tolist()), ((1, v) for v in cols.tolist()))
        else:
            pairs = zip(rows.tolist(), cols.tolist())
        graph.add_weighted_edges_from((u, v, w) for (u, v), w in zip(pairs, entries.data.tolist()))
        return graph

    def _span(self, v: int) -> tuple[int, int]:
        _check_vertex(v)
        index = int(np.searchsorted(self.row_ids, v))
        if index < self.row_ids.size and self.row_ids[index] == v:
            return int(self.indptr[index]), int(self.indptr[index + 1])
        return 0, 0

    @cached_property
    def _in_counts(self) -> tuple[np.ndarray, np.ndarray]:
        return np.unique(self.dst, return_counts=True)


def _check_vertex(v: object) -> None:
    """Refuse a vertex given by name: vertices are integer ids (``ids="str"``: hashes)."""
    if isinstance(v, (str, bytes)):
        name = v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v)
        raise TypeError(f"vertex {v!r} is a name, but a graph's vertices are integer ids: for a "
                        f"graph loaded with ids='str' pass string_ids([{name!r}])[0]")


@plain_pages()
def load_graph(
    paths: Paths | Plan | TablePlan,
    pattern: str = "fmap",
    kind: Kind = "digraph",
    *,
    delimiter: str = ",",
    ids: str = "int",
    parser: LineParser | None = None,
    on_error: str = "raise",
    storage_options: StorageOptions | None = None,
    columns: Sequence[str] | None = None,
    **pipeline,
) -> Graph:
    """This rank's partition of the graph in ``paths``, over the current process group.

    ``pattern`` is ``fmap`` / ``smap`` / ``fsmap`` (``a,b[,w]`` lines) or ``fset`` (``a,b|w,c:w``);
    it decides both the line format and which rank owns each edge. Parquet or Arrow IPC inputs
    are read by row groups, the edges taken from ``columns``: ``(src, dst)`` or
    ``(src, dst, weight)``. ``pipeline`` takes ``block_bytes``, ``round_bytes``, ``progress``
    and ``threads`` (see ``load_records``).

    >>> import tempfile, pathlib
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "g.txt"
    >>> _ = path.write_text("a,b|0.2,c:0.4\\nb,c\\n")
    >>> load_graph(path, "fset", ids="str").num_edges
    3
    """

    def edge_format() -> Format:  # checked inside the load: a bad argument fails every rank
        if kind not in KINDS:
            raise ValueError(f"unknown graph kind {kind!r}: choose one of {', '.join(KINDS)}")
        if pattern == "fvec":
            raise ValueError("pattern 'fvec' holds vectors, not edges: use load_vectors()")
        return Format(pattern, delimiter, ids, parser, on_error)

    records, stats = load_records(paths, edge_format, mirror=kind == "undirected",
                                  storage_options=storage_options, columns=columns, **pipeline)
    started = time.perf_counter()
    graph = Graph._by_source(records["src"], partial(gather_targets, records), kind)
    seconds = {**stats.seconds, "build": time.perf_counter() - started}
    return replace(graph, stats=replace(stats, seconds=seconds))
