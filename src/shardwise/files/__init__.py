"""Parallel file loading: many text files split over ranks by bytes, parsed, sent to owners.

``plan`` cuts the total bytes of the inputs into one near-equal range per rank (``agreed_plan``
also checks that every rank of the process group planned the same); ``read_lines`` /
``iter_chunks`` read a rank's lines; ``load_graph`` / ``load_matrix`` / ``load_vectors`` parse
them by pattern, hash each record to its owner, exchange all-to-all over ``torch.distributed``
and build the rank's partition. See docs/files.md.
"""

from shardwise.files.agreement import agreed_plan
from shardwise.files.columnar import TablePlan, read_table, table_plan
from shardwise.files.graph import Graph, load_graph
from shardwise.files.ids import string_ids
from shardwise.files.load import LoadStats, load_records, read_records
from shardwise.files.matrix import MatrixBlock, load_matrix
from shardwise.files.owners import grid, owners
from shardwise.files.patterns import PATTERNS, BadLine, Format, ParseError
from shardwise.files.plan import Plan, plan
from shardwise.files.read import Chunk, iter_chunks, read_bytes, read_lines
from shardwise.files.vectors import Vectors, load_vectors

__all__ = [
    "PATTERNS",
    "BadLine",
    "Chunk",
    "Format",
    "Graph",
    "LoadStats",
    "MatrixBlock",
    "ParseError",
    "Plan",
    "TablePlan",
    "Vectors",
    "agreed_plan",
    "grid",
    "iter_chunks",
    "load_graph",
    "load_matrix",
    "load_records",
    "load_vectors",
    "owners",
    "plan",
    "read_bytes",
    "read_lines",
    "read_records",
    "read_table",
    "string_ids",
    "table_plan",
]
