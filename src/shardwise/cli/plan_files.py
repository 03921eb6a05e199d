"""``shardwise plan PATHS...``: how the ranks split input files, before a load reads a byte.

Text files: each rank's byte range (``shardwise.files.plan``); Parquet and Arrow IPC files: each
rank's row groups (``shardwise.files.table_plan``). URLs are listed with ``--storage-option``;
files are named without credentials.

    shardwise plan data/edges/ --world-size 4
    shardwise plan s3://bucket/table/ --storage-option endpoint_url=http://127.0.0.1:9000
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from rich.console import Console

from shardwise.cli.shown import check_shown, not_shown, shown_ranks
from shardwise.cli.storage import storage_options
from shardwise.files.columnar import TablePlan
from shardwise.files.plan import Plan, input_plan

MOST_JSON_RANKS = 1_000_000  # JSON lists every rank's share: about 50 MB at this many


def run(args: argparse.Namespace) -> int:
    if args.world_size < 1:
        raise ValueError(f"--world-size must be at least 1, got {args.world_size}")
    check_shown("--max-ranks", args.max_ranks)
    if args.format not in ("table", "json"):
        raise ValueError(f"--format {args.format} pictures a sampler's batches; a plan of files "
                         "is shown as a table or as JSON")
    if args.format == "json" and args.world_size > MOST_JSON_RANKS:
        raise ValueError(f"--format json lists every rank, at most {MOST_JSON_RANKS:,}; got "
                         f"--world-size {args.world_size:,}: use --format table, which shows the "
                         "first and last --max-ranks of any number of ranks")
    the_plan = input_plan(args.paths, args.world_size,
                          storage_options=storage_options(args.storage_options))
    if args.format == "json":
        print(json.dumps(as_json(the_plan)))
        return 0
    # Never wraps a path; draws ASCII boxes where the output takes nothing else.
    console = Console(width=10_000, color_system=None, highlight=False)
    shown = shown_ranks(args.world_size, args.max_ranks)
    if isinstance(the_plan, TablePlan):
        console.print(the_plan.describe())
    console.print(the_plan.table(shown))
    if len(shown) < args.world_size:
        console.print(not_shown(shown, args.world_size - len(shown)))
    return 0


def as_json(the_plan: Plan | TablePlan) -> dict[str, Any]:
    """The plan as plain data: the files, then each rank's byte ranges or row groups."""
    files = [{"name": source.name, "size": source.size} for source in the_plan.sources]
    if isinstance(the_plan, Plan):
        ranks = [{"rank": rank, "bytes": the_plan.bounds(rank)[1] - the_plan.bounds(rank)[0],
                  "pieces": [{"file": p.source.name, "start": p.start, "stop": p.stop}
                             for p in the_plan.pieces(rank)]}
                 for rank in range(the_plan.world_size)]
        return {"kind": "bytes", "world_size": the_plan.world_size,
                "total_bytes": the_plan.total_bytes, "files": files, "ranks": ranks}
    ranks = [{"rank": rank, "rows": sum(end - first for _, first, end in share),
              "row_groups": [{"file": unit.source.name, "row_group": unit.index, "first": first,
                              "end": end} for unit, first, end in share]}
             for rank, share in enumerate(map(the_plan.share, range(the_plan.world_size)))]
    return {"kind": "row groups", "world_size": the_plan.world_size,
            "total_rows": the_plan.total_rows, "by_rows": the_plan.by_rows, "files": files,
            "ranks": ranks}
