"""Benchmark reading text objects from an S3 server: shardwise.files at 1 and 2 ranks against s3fs.

    .venv/bin/python benchmarks/remote.py               # ~128 MB edge list in 6 objects
    .venv/bin/python benchmarks/remote.py --size-mb 32  # a quick run

moto's S3 server runs on 127.0.0.1 in a process of its own (so it does not share a GIL with a
reader), holding an edge list (``src,dst,weight`` lines) in objects of uneven sizes. The peer
reads every object whole with s3fs (``fs.cat_file``, one GET per object), in one process and in
two (every other object each: what the server and the machine can serve to two readers);
shardwise reads the same bytes with ``iter_chunks`` (plan, then line-aligned range requests of
``--block-mb``, one chunk ahead) at 1 and 2 ranks. Every reader runs in spawned processes whose
client is made before the clock starts. Figures are MB of object bytes per second, medians of
``--repeats`` runs; a shardwise rank's time runs from planning to its last byte.
"""

from __future__ import annotations

import argparse
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

from shardwise.distributed.launch import spawn_local
from shardwise.files import iter_chunks, plan

BUCKET = "shardwise-bench"
# moto accepts any credentials; these only make botocore sign its requests as it would.
CREDENTIALS = {"key": "bench-key", "secret": "bench-secret"}
SHARES = np.array([0.30, 0.22, 0.18, 0.14, 0.10, 0.06])  # uneven objects, as in files.py
BYTES_PER_LINE = 33  # about, for ids below 2**40 and 4-decimal weights


@contextmanager
def moto_server() -> Iterator[str]:
    """moto's S3 server in its own process on a free port of 127.0.0.1; yields its URL."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p",
                               str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("moto's server did not start: is moto[server] "
                                       "installed (pip install -e '.[s3]')?") from None
                time.sleep(0.1)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.terminate()
        server.wait()


def options(endpoint: str) -> dict[str, Any]:
    # No listings cache: the untimed warm-up's listing must not serve the timed one.
    return {**CREDENTIALS, "client_kwargs": {"endpoint_url": endpoint},
            "use_listings_cache": False}


def upload(endpoint: str, size_mb: int) -> list[str]:
    """The edge list written as objects of the bench bucket; their keys."""
    import s3fs

    fs = s3fs.S3FileSystem(**options(endpoint), skip_instance_cache=True)
    fs.mkdir(BUCKET)
    rng = np.random.default_rng(2024)
    keys = []
    for number, share in enumerate(SHARES):
        lines = int(size_mb * 1e6 * share / BYTES_PER_LINE)
        table = np.column_stack([rng.integers(0, 2**40, lines), rng.integers(0, 2**40, lines),
                                 rng.integers(0, 10_000, lines)])
        text = "".join(f"{a},{b},{w / 10_000}\n" for a, b, w in table.tolist()).encode()
        key = f"{BUCKET}/edges/part-{number}.csv"
        fs.pipe_file(key, text)
        keys.append(key)
    return keys


def s3fs_process(endpoint: str, keys: list[str]) -> tuple[int, float]:
    """One of N processes reading every N-th object whole with s3fs: (bytes, seconds)."""
    import s3fs
    import torch.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size()
    fs = s3fs.S3FileSystem(**options(endpoint))
    fs.ls(BUCKET)  # untimed: the client is made, as the ranks' plan makes theirs
    started = time.perf_counter()
    done = sum(len(fs.cat_file(key)) for key in keys[rank::world])
    return done, time.perf_counter() - started


def shardwise_rank(url: str, storage_options: dict[str, Any], block_bytes: int
                   ) -> tuple[int, float]:
    """One rank's share of the objects read (plan, then range requests): (bytes, seconds)."""
    plan(url, 1, storage_options=storage_options)  # untimed: the client is made
    started = time.perf_counter()
    chunks = iter_chunks(url, storage_options=storage_options, block_bytes=block_bytes)
    done = sum(len(chunk.data) for chunk in chunks)
    return done, time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=int, default=128, help="total size of the objects")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each reader")
    parser.add_argument("--block-mb", type=int, default=16,
                        help="shardwise's chunk (range request) size in MiB (default 16)")
    args = parser.parse_args()
    console = Console(width=120)  # the table whole, also in a log
    readers = {"s3fs cat_file": (1, 2), "shardwise iter_chunks": (1, 2)}
    rates: dict[tuple[str, int], list[tuple[float, float]]] = {
        (name, n): [] for name, counts in readers.items() for n in counts}
    with moto_server() as endpoint:
        with console.status(f"uploading {args.size_mb} MB of edges"):
            keys = upload(endpoint, args.size_mb)
        url, total = f"s3://{BUCKET}/edges/", None
        for _ in range(args.repeats):  # interleaved, so a busy spell hits every reader alike
            for name, nproc in rates:
                with console.status(f"{name}, {nproc} process(es)"):
                    if name.startswith("s3fs"):
                        runs = spawn_local(s3fs_process, nproc, endpoint, keys, timeout=600)
                    else:
                        runs = spawn_local(shardwise_rank, nproc, url, options(endpoint),
                                           args.block_mb * 2**20, timeout=600)
                read = sum(done for done, _ in runs)
                assert total in (None, read), "the readers read other bytes"
                total = read
                rates[name, nproc].append((statistics.mean(d / 1e6 / s for d, s in runs),
                                           read / 1e6 / max(s for _, s in runs)))
    per_process = {key: statistics.median(rate for rate, _ in runs) for key, runs in rates.items()}
    overall = {key: statistics.median(rate for _, rate in runs) for key, runs in rates.items()}
    peer = per_process["s3fs cat_file", 1]
    table = Table(title=f"{total / 1e6:,.0f} MB in {len(keys)} objects on moto's S3 server, "
                        f"{args.block_mb} MiB chunks, median of {args.repeats} runs")
    for column in ("reader", "processes", "MB/s per process", "MB/s all", "per process vs s3fs"):
        table.add_column(column, justify="left" if column == "reader" else "right")
    for name, nproc in rates:
        table.add_row(name, str(nproc), f"{per_process[name, nproc]:,.0f}",
                      f"{overall[name, nproc]:,.0f}", f"{per_process[name, nproc] / peer:.2f}x")
    console.print(table)
    ours = "shardwise iter_chunks"
    console.print(f"1 rank vs 1 s3fs process: {per_process[ours, 1] / peer:.2f}x (target 0.90x); "
                  f"2 ranks vs 1, all bytes: {overall[ours, 2] / overall[ours, 1]:.2f}x (target "
                  f"1.60x); 2 s3fs processes vs 1: "
                  f"{overall['s3fs cat_file', 2] / overall['s3fs cat_file', 1]:.2f}x")


if __name__ == "__main__":
    main()
