"""The loading pipeline every builder shares: plan, read, parse, then route records to owners.

A load is collective, and ranks fail together: the ranks agree on the plan and settings before
reading (``agreement.plan_together``), and on the outcome of reading and parsing before the
exchange (``agreement.read_together``, which also checks that each rank's lines end where the next
rank's begin), so an error on one rank (a missing file, a malformed line, a bad
argument) is raised on every rank, naming it, instead of leaving the others waiting in the
exchange.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from shardwise.checks import require_int
from shardwise.distributed.exchange import DEFAULT_ROUND_BYTES
from shardwise.distributed.world import group_world, resolve_world
from shardwise.files.agreement import plan_together, read_together
from shardwise.files.columnar import TablePlan
from shardwise.files.owners import owners
from shardwise.files.pages import plain_pages
from shardwise.files.patterns import (
    MAX_EXAMPLES,
    BadLine,
    Format,
    RecordBuilder,
    first_line_features,
    parse_chunk,
)
from shardwise.files.plan import Plan, input_plan
from shardwise.files.read import DEFAULT_BLOCK_BYTES, iter_chunks, leading_lines
from shardwise.files.records import edges, join
from shardwise.files.route import exchange_groups, group_by_owner
from shardwise.files.sources import Paths, StorageOptions
from shardwise.files.tables import (
    check_columns,
    check_schema,
    read_table_records,
    stretch_bytes,
    vector_features,
)
from shardwise.files.threads import ordered_map, rank_threads

Progress = Callable[[int, int], None]  # (bytes done, bytes planned) on this rank


@dataclass(frozen=True)
class LoadStats:
    """What one rank did: bytes and lines read, records parsed and owned, time per stage.

    For columnar inputs, ``lines`` counts rows and ``bytes_read`` their compressed bytes.
    """

    rank: int
    world_size: int
    bytes_read: int
    lines: int
    records_read: int
    records_owned: int
    skipped: int
    seconds: dict[str, float] = field(default_factory=dict)
    examples: tuple[BadLine, ...] = ()
    row_groups: int = 0  # row groups (or stretches of one) read, for columnar inputs

    @property
    def total_seconds(self) -> float:
        return sum(self.seconds.values())


@plain_pages()
def read_records(
    paths: Paths | Plan | TablePlan,
    fmt: Format,
    rank: int | None = None,
    world_size: int | None = None,
    *,
    block_bytes: int = DEFAULT_BLOCK_BYTES,
    progress: Progress | None = None,
    storage_options: StorageOptions | None = None,
    columns: Sequence[str] | None = None,
    threads: int | None = None,
) -> tuple[np.ndarray, LoadStats]:
    """Parse this rank's share of the lines (or rows) into records, before any exchange.

    Text files are parsed by ``fmt``'s pattern; Parquet and Arrow IPC files give the records of
    their ``columns`` (``(src, dst[, weight])`` for edges, ``(id, f1, ..., fk)`` or ``(id,
    values)`` for vectors), each rank reading its own row groups. With
    ``on_error="skip"`` malformed lines are counted in the stats (and a warning names the first
    few); with ``"raise"`` the first one raises ``ParseError`` naming its file and line. No
    communication: it reads the share of ``rank`` of the plan it makes (or is given).
    ``threads`` chunks of text are parsed at once (default ``rank_threads()``: this machine's
    cores shared among its ranks); the records and any error are the same whatever the number.
    """
    world_size, rank = resolve_world(world_size, rank, name="world_size")
    if threads is not None:
        require_int("threads", threads, minimum=1)
    started = time.perf_counter()
    the_plan = input_plan(paths, world_size, storage_options=storage_options)
    fmt, columns = _prepared(the_plan, fmt, columns)
    records, stats = _read_prepared(the_plan, fmt, columns, rank, block_bytes, progress, threads)
    return records, replace(stats, seconds={"read+parse": time.perf_counter() - started})


def _read_prepared(the_plan: Plan | TablePlan, fmt: Format, columns: tuple[str, ...], rank: int,
                   block_bytes: int, progress: Progress | None, threads: int | None
                   ) -> tuple[np.ndarray, LoadStats]:
    """``read_records`` once the plan is made and ``fmt`` and ``columns`` are checked."""
    started = time.perf_counter()
    tables = isinstance(the_plan, TablePlan)
    if tables:
        parts = read_table_records(the_plan, rank, fmt, columns)
        planned = sum(stretch_bytes(*stretch) for stretch in the_plan.share(rank))
        # How much of the share is read goes by rows: row groups compress unevenly, and a
        # small first one would make its bytes promise many times the records there are.
        planned_rows = sum(end - first for _, first, end in the_plan.share(rank))
    else:
        chunks = iter_chunks(the_plan, rank, the_plan.world_size, block_bytes=block_bytes)
        parts = ordered_map(lambda chunk: (parse_chunk(chunk, fmt), len(chunk.data)), chunks,
                            rank_threads() if threads is None else threads)
        planned = the_plan.bounds(rank)[1] - the_plan.bounds(rank)[0]
    builder = RecordBuilder(fmt.record_dtype())
    bytes_read, lines, skipped, examples, row_groups = 0, 0, 0, [], 0
    for parsed, size in parts:
        bytes_read += size
        lines += parsed.lines
        read, whole = (lines, planned_rows) if tables else (bytes_read, planned)
        builder.append(parsed.columns, done=min(read / whole, 1.0) if whole else 1.0)
        skipped += parsed.skipped
        examples.extend(parsed.examples[: MAX_EXAMPLES - len(examples)])
        row_groups += tables
        if progress is not None:
            progress(min(bytes_read, planned), planned)
    records = builder.finish()
    if skipped:
        warnings.warn(
            f"rank {rank} skipped {skipped} malformed "
            f"{'row' if tables else 'line'}(s); the first: "
            + "; ".join(str(bad) for bad in examples[:3]),
            stacklevel=3,
        )
    stats = LoadStats(rank, the_plan.world_size, bytes_read, lines, len(records), len(records),
                      skipped, {"read+parse": time.perf_counter() - started}, tuple(examples),
                      row_groups)
    return records, stats


def _prepared(the_plan: Plan | TablePlan, fmt: Format, columns: Sequence[str] | None
              ) -> tuple[Format, tuple[str, ...]]:
    """``fmt`` with its fvec width found (the same on every rank), and ``columns`` checked."""
    if isinstance(the_plan, Plan):
        if columns is not None:
            raise ValueError("columns= names the columns of Parquet or Arrow IPC inputs; text "
                             "lines are read by pattern: drop columns=")
        if fmt.pattern == "fvec" and fmt.features is None:
            fmt = replace(fmt, features=first_line_features(leading_lines(the_plan), fmt))
        return fmt, ()
    if columns is None:
        raise ValueError(f"name the columns to read from {the_plan.sources[0].name}: "
                         + ("columns=('id', 'values') or columns=('id', 'f1', 'f2')"
                            if fmt.pattern == "fvec" else
                            "columns=('src', 'dst') or columns=('src', 'dst', 'weight')"))
    columns = check_columns(columns, fmt)
    check_schema(the_plan, fmt, columns)
    if fmt.pattern == "fvec":
        fmt = replace(fmt, features=vector_features(the_plan, columns, fmt.features))
    return fmt, columns


@plain_pages()
def load_records(
    paths: Paths | Plan | TablePlan,
    fmt: Format | Callable[[], Format],
    *,
    mirror: bool = False,
    block_bytes: int = DEFAULT_BLOCK_BYTES,
    round_bytes: int = DEFAULT_ROUND_BYTES,
    progress: Progress | None = None,
    storage_options: StorageOptions | None = None,
    columns: Sequence[str] | None = None,
    threads: int | None = None,
) -> tuple[np.ndarray, LoadStats]:
    """Read, parse and route: the records this rank owns, over the current process group.

    Text inputs are split by bytes; Parquet and Arrow IPC inputs by row groups, their records
    taken from ``columns`` (see ``read_records``).

    Every rank must call it together. ``mirror`` adds the reverse of every edge (self-loops once)
    before routing, for undirected graphs: each direction then lives with the owner of its own
    key. ``fmt`` may be a function that builds the ``Format``: it is then called inside the load,
    so a bad argument on one rank raises on every rank. ``threads``: see ``read_records``.
    Raises on every rank, naming the rank, when any rank fails; ``InconsistentRanksError`` when
    the ranks planned different files or passed different settings.
    """
    started = time.perf_counter()
    world_size, rank = resolve_world()
    if group_world()[0] != world_size:
        raise RuntimeError(
            f"WORLD_SIZE is {world_size} but no process group of that size is initialised: call "
            "torch.distributed.init_process_group() first (torchrun sets the environment for it)"
        )

    def prepare(world: int) -> tuple[Plan | TablePlan, tuple[Format, tuple[str, ...]],
                                     dict[str, Any]]:
        """Check the arguments and plan, before any rank reads."""
        the_format = fmt() if callable(fmt) else fmt
        require_int("round_bytes", round_bytes, minimum=world)
        require_int("block_bytes", block_bytes, minimum=1)
        if threads is not None:
            require_int("threads", threads, minimum=1)
        the_plan = input_plan(paths, world, storage_options=storage_options)
        the_format, names = _prepared(the_plan, the_format, columns)
        settings = {**the_format.settings(), "mirror": mirror, "round_bytes": round_bytes,
                    "columns": names}
        return the_plan, (the_format, names), settings

    the_plan, (the_format, names) = plan_together(prepare, caller="loading files")
    planned = time.perf_counter()

    def read_grouped() -> tuple[np.ndarray, np.ndarray | None, LoadStats]:
        """This rank's records, grouped by owner (and the counts) when others own some; the
        records are freed once grouped, so the receive buffer reuses their memory."""
        records, stats = _read(the_plan, the_format, names, rank, mirror, block_bytes, progress,
                               threads)
        if world_size == 1:  # one rank owns everything: no owners to compute, nothing to send
            return records, None, stats
        # Grouped inside the agreement: the grouped copy is a rank's peak memory, and a rank
        # that failed to make it after the others agreed would leave them in the exchange.
        return (*group_by_owner(records, owners(records, the_format.pattern, world_size),
                                world_size), stats)

    # Each rank's line-aligned ends travel with its outcome: ranks whose copies of a file break
    # lines differently at a cut agree on names and sizes, yet would lose or repeat lines.
    records, counts, stats = read_together(read_grouped, the_plan, rank)
    if counts is not None:
        records = exchange_groups(records, counts, round_bytes=round_bytes)
    # Planning counts as reading; the exchange starts after this rank's last parsed line, so
    # waiting for the other ranks to finish theirs is part of it.
    read = planned - started + stats.seconds["read+parse"]
    seconds = {"read+parse": read, "exchange": time.perf_counter() - started - read}
    return records, replace(stats, records_owned=len(records), seconds=seconds)


def _read(the_plan: Plan | TablePlan, fmt: Format, columns: tuple[str, ...], rank: int,
          mirror: bool, block_bytes: int, progress: Progress | None, threads: int | None
          ) -> tuple[np.ndarray, LoadStats]:
    records, stats = _read_prepared(the_plan, fmt, columns, rank, block_bytes, progress, threads)
    if mirror:
        kept = records[records["src"] != records["dst"]]
        records = join([records, edges(kept["dst"], kept["src"], kept["weight"])])
    return records, stats
