"""Benchmark shardwise.files against single-process peers on a generated edge list.

    .venv/bin/python benchmarks/files.py              # ~1 GB in 8 files of uneven sizes
    .venv/bin/python benchmarks/files.py --size-mb 64 # a quick run

The data (``src,dst,weight`` lines; ids up to 2**40) goes to bench-data/ (gitignored) and is
reused when already there. Every figure is MB of input text per second. Peers run in this
process over the same files, each called as a user would for a header-less edge list (column
names given, types inferred): pandas.read_csv (C engine), pyarrow.csv single-threaded
(``use_threads=False``, as each shardwise rank runs), and a plain per-line Python split (timed
on the first file only, which is enough to measure its rate). shardwise knows its pattern's
column types and passes them to pyarrow, with quoting off.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
from rich.console import Console
from rich.table import Table

from shardwise.distributed.launch import spawn_local
from shardwise.files import load_graph

# Eight files whose sizes differ by up to 15x, so a per-file split could not balance them.
SHARES = np.array([0.30, 0.20, 0.15, 0.12, 0.09, 0.07, 0.05, 0.02])
BYTES_PER_LINE = 33  # about, for ids below 2**40 and 4-decimal weights


def generate(folder: Path, size_mb: int) -> list[Path]:
    """The benchmark files, written once per size (``src,dst,weight`` with no header)."""
    folder = folder / f"edges-{size_mb}mb"
    folder.mkdir(parents=True, exist_ok=True)
    paths = [folder / f"part-{i}.csv" for i in range(len(SHARES))]
    if all(p.exists() for p in paths):
        return paths
    rng = np.random.default_rng(2024)
    for path, share in zip(paths, SHARES):
        lines = int(size_mb * 1e6 * share / BYTES_PER_LINE)
        with pacsv.CSVWriter(str(path) + ".tmp", pa.schema([("src", pa.int64()), ("dst", pa.int64()),
                                                            ("weight", pa.float64())]),
                             write_options=pacsv.WriteOptions(include_header=False)) as writer:
            for start in range(0, lines, 2_000_000):
                n = min(2_000_000, lines - start)
                writer.write_table(pa.table({
                    "src": rng.integers(0, 2**40, n), "dst": rng.integers(0, 2**40, n),
                    "weight": rng.integers(0, 10_000, n) / 10_000,
                }))
        Path(str(path) + ".tmp").rename(path)
    return paths


def peer_pandas(paths: list[Path]) -> float:
    import pandas as pd

    started = time.perf_counter()
    for path in paths:
        pd.read_csv(path, header=None, names=["src", "dst", "weight"], engine="c")
    return time.perf_counter() - started


def peer_pyarrow(paths: list[Path]) -> float:
    started = time.perf_counter()
    for path in paths:
        pacsv.read_csv(path, read_options=pacsv.ReadOptions(column_names=["src", "dst", "weight"],
                                                             use_threads=False))
    return time.perf_counter() - started


def peer_python(path: Path) -> float:
    started = time.perf_counter()
    src, dst, weight = [], [], []
    with open(path) as f:
        for line in f:
            a, b, w = line.split(",")
            src.append(int(a))
            dst.append(int(b))
            weight.append(float(w))
    np.array(src), np.array(dst), np.array(weight)
    return time.perf_counter() - started


def shardwise_rank(paths: list[str]) -> dict:
    """One rank's load (plan + read + parse, exchange, graph build), timed by stage."""
    graph = load_graph(paths, "fmap")
    return {"bytes": graph.stats.bytes_read, **graph.stats.seconds,
            "total": graph.stats.total_seconds, "edges": graph.num_edges}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=int, default=1024, help="total size of the edge list")
    parser.add_argument("--data", type=Path, default=Path(__file__).resolve().parents[1] / "bench-data")
    args = parser.parse_args()
    console = Console()
    with console.status(f"generating {args.size_mb} MB of edges"):
        paths = generate(args.data, args.size_mb)
    total_mb = sum(p.stat().st_size for p in paths) / 1e6
    with console.status("peers"):
        peers = {
            "pandas.read_csv (C engine)": total_mb / peer_pandas(paths),
            "pyarrow.csv (1 thread)": total_mb / peer_pyarrow(paths),
            "per-line Python split": paths[0].stat().st_size / 1e6 / peer_python(paths[0]),
        }
    runs = {}
    for nproc in (1, 2):
        with console.status(f"shardwise at {nproc} rank(s)"):
            runs[nproc] = spawn_local(shardwise_rank, nproc, [str(p) for p in paths], timeout=1800)
    arrow = peers["pyarrow.csv (1 thread)"]
    python = peers["per-line Python split"]
    table = Table(title=f"shardwise.files on {total_mb:,.0f} MB in {len(paths)} files "
                        f"({sum(r['edges'] for r in runs[1]):,} edges)")
    for column in ("what", "MB/s per rank", "vs pyarrow", "vs per-line Python"):
        table.add_column(column, justify="left" if column == "what" else "right")
    for name, rate in peers.items():
        table.add_row(name, f"{rate:,.0f}", f"{rate / arrow:.2f}x", f"{rate / python:.1f}x")
    for nproc, ranks in runs.items():
        for stage in ("read+parse", "exchange", "build"):
            rate = float(np.mean([r["bytes"] / 1e6 / max(r[stage], 1e-9) for r in ranks]))
            if nproc == 1 and stage == "exchange":
                continue  # one rank owns everything: nothing to exchange
            parse = stage == "read+parse"
            table.add_row(f"shardwise {nproc} rank(s): {'plan+read+parse' if parse else stage}",
                          f"{rate:,.0f}", f"{rate / arrow:.2f}x" if parse else "",
                          f"{rate / python:.1f}x" if parse else "")
    wall = {nproc: max(r["total"] for r in ranks) for nproc, ranks in runs.items()}
    for nproc in runs:
        table.add_row(f"shardwise {nproc} rank(s): end to end, all ranks",
                      f"{total_mb / wall[nproc]:,.0f} total", "", "")
    if not console.is_terminal:
        console = Console(width=120)  # a log file: never squeeze the columns
    console.print(table)
    balance = max(r["bytes"] for r in runs[2]) / np.mean([r["bytes"] for r in runs[2]])
    console.print(f"2 ranks vs 1, end to end: {wall[1] / wall[2]:.2f}x; bytes per rank max/mean at 2 ranks: {balance:.3f}")


if __name__ == "__main__":
    main()
