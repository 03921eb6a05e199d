"""Cut the total bytes of many files into one contiguous, near-equal byte range per rank.

The ranges ignore file boundaries, so a 15,000-line file next to a 50-line file does not
unbalance the ranks: rank ``r`` of ``W`` gets global bytes ``[T*r//W, T*(r+1)//W)`` of the
``T`` bytes. A line belongs to the range that holds its first byte (see ``read.py``), so every
line is read by exactly one rank, and no rank needs to talk to another to know its share.
"""

from __future__ import annotations

import io
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cached_property

import numpy as np
from rich.console import Console
from rich.table import Table
from rich.text import Text

from shardwise.checks import require_int
from shardwise.files.columnar import TablePlan, columnar_format
from shardwise.files.sources import Paths, Source, StorageOptions, expand


@dataclass(frozen=True)
class Piece:
    """Bytes ``[start, stop)`` of one file, inside one rank's range (before line alignment)."""

    file: int
    source: Source
    start: int
    stop: int


@dataclass(frozen=True)
class Plan:
    """Which bytes of which files each of ``world_size`` ranks reads.

    >>> import tempfile, pathlib
    >>> folder = pathlib.Path(tempfile.mkdtemp())
    >>> _ = (folder / "a.txt").write_text("1,2\\n3,4\\n"); _ = (folder / "b.txt").write_text("5,6\\n")
    >>> p = plan(folder, 2)
    >>> p.total_bytes, p.bounds(0), p.bounds(1)
    (12, (0, 6), (6, 12))
    """

    sources: tuple[Source, ...]
    world_size: int

    @cached_property
    def offsets(self) -> np.ndarray:
        """Global byte offset of each file's first byte, then the total (``len(sources) + 1``)."""
        return np.concatenate([[0], np.cumsum([s.size for s in self.sources], dtype=np.int64)])

    @property
    def total_bytes(self) -> int:
        return int(self.offsets[-1])

    def bounds(self, rank: int) -> tuple[int, int]:
        """Global bytes ``[start, stop)`` of ``rank``'s range."""
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank must be in [0, {self.world_size}), got {rank}")
        total = self.total_bytes
        return total * rank // self.world_size, total * (rank + 1) // self.world_size

    def pieces(self, rank: int) -> list[Piece]:
        """The non-empty per-file parts of ``rank``'s range, in file order."""
        start, stop = self.bounds(rank)
        first = int(np.searchsorted(self.offsets, start, side="right")) - 1
        pieces = []
        for index in range(max(first, 0), len(self.sources)):
            file_start = int(self.offsets[index])
            if file_start >= stop:
                break
            lo, hi = max(start - file_start, 0), min(stop - file_start, self.sources[index].size)
            if lo < hi:
                pieces.append(Piece(index, self.sources[index], lo, hi))
        return pieces

    def table(self, ranks: Iterable[int] | None = None) -> Table:
        """The plan as a rich table: one row per rank (of ``ranks``, all by default) with its bytes
        and the files it starts in."""
        files = f"{len(self.sources)} file{'s' if len(self.sources) != 1 else ''}"
        table = Table(title=f"{files}, {self.total_bytes:,} bytes, {self.world_size} ranks")
        for column in ("rank", "bytes", "from", "to"):
            table.add_column(column, justify="right" if column in ("rank", "bytes") else "left")
        for rank in range(self.world_size) if ranks is None else ranks:
            pieces = self.pieces(rank)
            start, stop = self.bounds(rank)
            # Text: a file name is shown as it is, never read as markup ("[bold]a.txt")
            ends = [Text(f"{p.source.name}@{p.start:,}") for p in pieces[:1]] + [
                Text(f"{p.source.name}@{p.stop:,}") for p in pieces[-1:]]
            table.add_row(str(rank), f"{stop - start:,}", *(ends or ["-", "-"]))
        return table

    def __rich__(self) -> Table:
        return self.table()

    def __str__(self) -> str:
        buffer = io.StringIO()
        # Wide enough never to wrap a path: the table itself only takes the width it needs.
        Console(file=buffer, width=10_000, color_system=None).print(self.table())
        return buffer.getvalue()


def plan(
    paths: Paths | Plan, world_size: int, *, storage_options: StorageOptions | None = None
) -> Plan:
    """Plan how ``world_size`` ranks split the bytes of ``paths`` (files, directories, globs, URLs).

    URLs are opened with ``storage_options`` (fsspec's, such as ``{"endpoint_url": ...}`` for
    ``s3://``). A missing file raises ``FileNotFoundError`` naming it. Passing a ``Plan`` re-plans
    its files (with the filesystems it holds).
    """
    world_size = require_int("world_size", world_size, minimum=1)
    sources = paths.sources if isinstance(paths, Plan) else tuple(expand(paths, storage_options))
    return Plan(sources, world_size)


def input_plan(
    paths: Paths | Plan | TablePlan, world_size: int, *, storage_options: StorageOptions | None = None
) -> Plan | TablePlan:
    """The plan a load follows: text files split by bytes, columnar ones by row groups.

    Parquet and Arrow IPC files (known by their suffix) are planned as a ``TablePlan``, anything
    else as text; a mix of the two is an error naming one of each.

    >>> import tempfile, pathlib
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "a.txt"
    >>> _ = path.write_text("1,2\\n")
    >>> type(input_plan(path, 2)).__name__
    'Plan'
    """
    world_size = require_int("world_size", world_size, minimum=1)
    if isinstance(paths, TablePlan):
        return paths.resized(world_size)  # its footers are not read again
    if isinstance(paths, Plan):
        return plan(paths, world_size)  # planned as text by the caller
    sources = tuple(expand(paths, storage_options))
    columnar = [columnar_format(source.name) is not None for source in sources]
    if all(columnar):
        return TablePlan.of(sources, world_size)
    if any(columnar):
        table, text = (next(s.name for s, c in zip(sources, columnar) if c is kind)
                       for kind in (True, False))
        raise ValueError(f"the inputs mix columnar files ({table}) with text files ({text}): "
                         "load each kind on its own")
    return Plan(sources, world_size)
