"""``shardwise load``: load files over N ranks (torchrun's, or N local gloo processes) and report.

    shardwise load data/*.csv --pattern fmap --nproc 2
    torchrun --nproc-per-node 4 -m shardwise load data/ --pattern fsmap --save out/
    shardwise load s3://bucket/edges/ --storage-option endpoint_url=http://127.0.0.1:9000
"""

from __future__ import annotations

import argparse
import os
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.measure import Measurement
from rich.progress import BarColumn, DownloadColumn, Progress, TransferSpeedColumn
from rich.table import Table

from shardwise.cli.folder import make_folder
from shardwise.cli.nproc import check_nproc
from shardwise.cli.storage import add_storage_option, storage_options
from shardwise.cli.wording import in_cli_words, warnings_in_cli_words
from shardwise.distributed.consistency import together
from shardwise.distributed.launch import process_group_from_env, spawn_local
from shardwise.distributed.world import gather_objects, group_world
from shardwise.files import (
    PATTERNS,
    BadLine,
    LoadStats,
    Plan,
    agreed_plan,
    load_graph,
    load_matrix,
    load_vectors,
)
from shardwise.files.agreement import read_together
from shardwise.files.columnar import columnar_format
from shardwise.files.graph import KINDS
from shardwise.files.patterns import MAX_EXAMPLES
from shardwise.files.read import chunk_lines, iter_chunks, split_lines, without_bom


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = sub.add_parser(
        "load", help="load files in parallel into per-rank graphs, matrices or vectors",
        description="Split the files' bytes over the ranks (or the row groups of Parquet and "
                    "Arrow IPC files), parse by pattern, send each record to its owner, and print "
                    "what every rank did.",
    )
    parser.add_argument("paths", nargs="+", help="files, directories, globs or fsspec URLs")
    parser.add_argument(
        "--pattern", default="fmap", choices=("linesplit", *PATTERNS),
        help="what a line holds: fmap 'src,dst[,weight]' owned by src, smap the same owned by "
             "dst, fsmap the same owned by a grid cell, fset 'src,dst|w,dst:w' (one edge per "
             "target), fvec 'id,f1,...,fk', linesplit raw lines (default: fmap)",
    )
    parser.add_argument("--kind", default=None, choices=(*KINDS, "matrix"),
                        help="what to build from edge patterns (default: digraph)")
    parser.add_argument("--nproc", type=int, default=None,
                        help="spawn this many local gloo ranks (default: torchrun's, or 1)")
    parser.add_argument("--delimiter", default=",", type=_delimiter,
                        help="field separator, one character; \\t for a tab (default: ,)")
    parser.add_argument("--ids", default="int", choices=("int", "str"),
                        help="int: ids are 64-bit integers; str: any text, hashed to 63-bit "
                             "integers (default: int)")
    parser.add_argument("--on-error", default="raise", choices=("raise", "skip"),
                        help="on a malformed line, stop naming its file and line (raise) or count "
                             "it and go on (skip) (default: raise)")
    parser.add_argument(
        "--columns", type=_column_names, default=None, metavar="NAMES",
        help="for Parquet and Arrow IPC inputs, the columns to read, comma-separated: "
             "src,dst[,weight] for edges, id,values (a list column) or id,f1,...,fk for fvec")
    parser.add_argument("--save", type=Path, default=None,
                        help="write each rank's partition to this folder as .npz")
    add_storage_option(parser)
    return parser


def run(args: argparse.Namespace) -> int:
    options = {key: getattr(args, key) for key in
               ("paths", "pattern", "kind", "delimiter", "ids", "on_error", "save", "columns")}
    options["storage_options"] = storage_options(args.storage_options)
    if args.save is not None and args.save.exists() and not args.save.is_dir():
        raise ValueError(f"--save {args.save} is a file: name a folder (it is made if need be)")
    _check_applicable(args)
    if args.nproc is not None:
        if "WORLD_SIZE" in os.environ:
            raise ValueError("--nproc cannot be used under torchrun, which starts the ranks "
                             "itself")
        check_nproc(args.nproc)
    if args.save is not None:  # made once every flag is known to be good
        make_folder("--save", args.save)
    options["kind"] = args.kind or "digraph"
    if args.nproc is None:
        with process_group_from_env():
            report = load_rank(options)
            if group_world()[1] == 0:
                _print_report(report)
        return 0
    _print_report(spawn_local(load_rank, args.nproc, options)[0])  # every rank has them all
    return 0


def _check_applicable(args: argparse.Namespace) -> None:
    """Refuse, before loading, an option that would have no effect with ``--pattern``."""
    if args.pattern == "linesplit" and args.columns is not None:
        raise ValueError("--columns reads Parquet or Arrow IPC columns into records; "
                         "--pattern linesplit reads raw text lines: drop one of them")
    if args.columns is not None and args.delimiter != ",":
        raise ValueError(f"--delimiter {args.delimiter!r} splits text lines; --columns reads "
                         "Parquet or Arrow IPC columns, which have none: drop one of them")
    if args.pattern in ("linesplit", "fvec") and args.kind is not None:
        builds = "reads raw text lines" if args.pattern == "linesplit" else "builds vectors"
        raise ValueError(f"--kind {args.kind} says what to build from edges; --pattern "
                         f"{args.pattern} {builds}: drop one of them")


def load_rank(options: dict) -> list[LoadStats]:
    """Load this rank's partition (saving it if asked); return every rank's stats."""
    with warnings_in_cli_words("shardwise load"):  # a spawned rank does not run main()
        return _load_rank(options)


def _load_rank(options: dict) -> list[LoadStats]:
    world_size, rank = group_world()
    console = Console(stderr=True)
    with Progress("[progress.description]{task.description}", BarColumn(), DownloadColumn(),
                  TransferSpeedColumn(), console=console, transient=True,
                  disable=rank != 0 or not console.is_terminal) as bar:
        task = bar.add_task(f"rank 0 of {world_size} reading", total=None)
        progress = lambda done, total: bar.update(task, completed=done, total=total)
        stats, arrays = _load(options, progress)
    if options["save"] is not None:  # (a rank that cannot save says so on every rank)
        # (the folder was made before the load: see run)
        path = options["save"] / f"rank-{rank:05d}-of-{world_size:05d}.npz"
        together(lambda: np.savez(path, **arrays))
    return gather_objects(stats)


def _load(options: dict, progress) -> tuple[LoadStats, dict[str, np.ndarray]]:
    parse = {key: options[key]
             for key in ("delimiter", "ids", "on_error", "storage_options", "columns")}
    pattern, kind = options["pattern"], options["kind"]
    if pattern == "linesplit":
        return _load_lines(options["paths"], options["storage_options"], options["on_error"])
    if pattern == "fvec":
        vectors = load_vectors(options["paths"], progress=progress, **parse)
        return vectors.stats, {"ids": vectors.ids, "values": vectors.values}
    if kind == "matrix":
        block = load_matrix(options["paths"], pattern, progress=progress, **parse)
        m = block.matrix
        return block.stats, {"data": m.data, "indices": m.indices, "indptr": m.indptr,
                             "shape": np.array(m.shape), "row_ids": block.row_ids, "col_ids": block.col_ids}
    graph = load_graph(options["paths"], pattern, kind, progress=progress, **parse)
    return graph.stats, {"row_ids": graph.row_ids, "indptr": graph.indptr, "dst": graph.dst,
                         "weight": graph.weight}


def _load_lines(paths: list[str], storage_options: dict[str, Any], on_error: str
                ) -> tuple[LoadStats, dict[str, np.ndarray]]:
    world_size, rank = group_world()
    started = time.perf_counter()
    the_plan = agreed_plan(paths, storage_options=storage_options)  # every rank, the same files
    columnar = next((s.name for s in the_plan.sources if columnar_format(s.name)), None)
    if columnar is not None:
        raise ValueError(f"--pattern linesplit reads text lines, but {columnar} is a columnar "
                         "file: load its rows with --columns and a record pattern instead")
    # Raised on every rank, as a record pattern's errors are: no rank is left waiting.
    lines, bad, bytes_read = read_together(lambda: _rank_lines(the_plan, rank, on_error),
                                           the_plan, rank)
    if bad:
        warnings.warn(f"rank {rank} skipped {len(bad)} line(s); the first: "
                      + "; ".join(str(line) for line in bad[:3]), stacklevel=2)
    seconds = {"read+parse": time.perf_counter() - started}
    stats = LoadStats(rank, world_size, bytes_read, len(lines) + len(bad), len(lines), len(lines),
                      len(bad), seconds, tuple(bad[:MAX_EXAMPLES]))
    return stats, packed_lines(lines)


def packed_lines(lines: list[str]) -> dict[str, np.ndarray]:
    r"""``lines`` as saved: their UTF-8 bytes one after another (``text``), and where each begins
    and ends (``offsets``). A NumPy string array would drop a line's trailing NUL characters and
    give every line the longest one's width.

    >>> saved = packed_lines(["ab", "", "c\0"])
    >>> [bytes(saved["text"][a:b]).decode() for a, b in zip(saved["offsets"], saved["offsets"][1:])]
    ['ab', '', 'c\x00']
    """
    encoded = [line.encode("utf-8") for line in lines]
    offsets = np.zeros(len(encoded) + 1, dtype=np.int64)
    np.cumsum([len(line) for line in encoded], out=offsets[1:])
    return {"text": np.frombuffer(b"".join(encoded), dtype=np.uint8), "offsets": offsets}


def _rank_lines(the_plan: Plan, rank: int, on_error: str) -> tuple[list[str], list[BadLine], int]:
    """This rank's lines, the lines that are not valid UTF-8 (with ``on_error="skip"``), and the
    bytes read."""
    lines: list[str] = []
    bad: list[BadLine] = []
    bytes_read = 0
    for chunk in iter_chunks(the_plan, rank, the_plan.world_size):
        bytes_read += len(chunk.data)
        chunk = without_bom(chunk)
        try:
            lines.extend(chunk_lines(chunk))
        except ValueError:  # a line is not valid UTF-8: the error names it
            if on_error == "raise":
                raise
            first = chunk.line_number()
            for index, raw in enumerate(split_lines(chunk.data)):
                try:
                    lines.append(raw.decode("utf-8"))
                except UnicodeDecodeError as error:
                    bad.append(BadLine(chunk.source.name, first + index,
                                       raw.decode("utf-8", "replace"),
                                       f"not valid UTF-8 ({error.reason}); re-encode the file "
                                       "as UTF-8"))
    return lines, bad, bytes_read


def _delimiter(text: str) -> str:
    r"""The field separator: ``\t``, which a shell passes as two characters, is a tab.

    >>> _delimiter("\t"), _delimiter("\\t"), _delimiter(";")
    ('\t', '\t', ';')
    """
    return "\t" if text in ("\\t", "\\\\t") else text


def _column_names(text: str) -> tuple[str, ...]:
    names = tuple(name.strip() for name in text.split(","))
    if not all(names):
        raise argparse.ArgumentTypeError(f"expected comma-separated column names, got {text!r}")
    return names


def _print_report(stats: list[LoadStats]) -> None:
    table = Table(title=f"shardwise load: {len(stats)} rank(s)")
    stages = list(dict.fromkeys(stage for s in stats for stage in s.seconds))
    columnar = any(s.row_groups for s in stats)  # rows of row groups, not lines of text
    units = ("row groups", "rows") if columnar else ("lines",)
    for column in ("rank", "bytes read", *units, "parsed", "owned", "skipped",
                   *(f"{stage} s" for stage in stages), "total s", "MB/s"):
        table.add_column(column, justify="right")
    for s in stats:
        counts = (f"{s.row_groups:,}", f"{s.lines:,}") if columnar else (f"{s.lines:,}",)
        table.add_row(str(s.rank), f"{s.bytes_read:,}", *counts, f"{s.records_read:,}",
                      f"{s.records_owned:,}", f"{s.skipped:,}",
                      *(f"{s.seconds.get(stage, 0.0):.2f}" for stage in stages),
                      f"{s.total_seconds:.2f}", f"{s.bytes_read / 1e6 / max(s.total_seconds, 1e-9):.1f}")
    console = Console()
    if not console.is_terminal:
        console = Console(width=200)  # a log file: never squeeze the columns
    wide = Measurement.get(console, console.options.update_width(1 << 20), table).maximum
    if wide > console.width:  # a narrow terminal: let it wrap the lines rather than elide numbers
        console = Console(width=wide)
    console.print(table)
    console.print(f"balance (max/mean): bytes {_balance([s.bytes_read for s in stats]):.3f}, "
                  f"records owned {_balance([s.records_owned for s in stats]):.3f}")
    for s in stats:
        for bad in s.examples[:3]:
            console.print(f"rank {s.rank} skipped {in_cli_words(str(bad))}", markup=False,
                          highlight=False)


def _balance(values: list[int]) -> float:
    mean = sum(values) / len(values)
    return max(values) / mean if mean else 1.0
