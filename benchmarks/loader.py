"""shardwise.DataLoader against torch's DataLoader (and torchdata's StatefulDataLoader) on one machine.

Every loader runs in this process on the same data, with 0, 1 and 2 workers:

  (a) cheap rows: 64 float32 a sample, batch 256
  (b) the same rows from a dataset with ``__getitems__`` (one fancy index a batch)
  (c) a ~1 ms Python transform a sample, holding the GIL (batch 32)
  (c2) a ~1 ms NumPy transform a sample, releasing the GIL (batch 32)
  (d) time to the first batch of a fresh loader
  (e) the cost of ``state_dict()``, and of resuming mid-epoch, at N = 10^7

Each throughput is the median of ``--repeats`` passes (after one warm-up pass), in samples/s,
with its ratio to torch's loader with the same number of workers.

    python benchmarks/loader.py            # the README's table (a few minutes)
    python benchmarks/loader.py --quick    # fewer samples, one repeat
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from itertools import islice
from typing import Any

import numpy as np
import torch
from rich.console import Console
from rich.table import Table
from torch.utils.data import DataLoader as TorchLoader
from torch.utils.data import Dataset

from shardwise import DataLoader, DistributedSampler

try:
    from torchdata.stateful_dataloader import StatefulDataLoader
except ImportError:  # optional peer
    StatefulDataLoader = None


class Rows(Dataset):
    """``size`` rows of 64 float32, one row a sample."""

    def __init__(self, size: int) -> None:
        self.rows = torch.randn(size, 64)

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> torch.Tensor:
        return self.rows[index]


class BatchedRows(Rows):
    """The same rows, a whole batch in one fancy index."""

    def __getitems__(self, indices: list[int]) -> torch.Tensor:
        return self.rows[indices]


def as_is(batch: Any) -> Any:
    return batch


class Transformed(Dataset):
    """Samples that each cost ``work`` (a calibrated ~1 ms) to make."""

    def __init__(self, size: int, work: Callable[[int], Any]) -> None:
        self.size, self.work = size, work

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> Any:
        return self.work(index)


class PythonWork:
    """A pure-Python loop: holds the GIL for its whole ~1 ms."""

    def __init__(self, steps: int) -> None:
        self.steps = steps

    def __call__(self, index: int) -> float:
        total = 0
        for i in range(self.steps):
            total += i ^ index
        return float(total)


class NumpyWork:
    """Large NumPy array arithmetic: releases the GIL for nearly all of its ~1 ms."""

    def __init__(self, length: int) -> None:
        self.data = np.random.default_rng(0).random(length)

    def __call__(self, index: int) -> float:
        return float(np.sqrt(self.data * index + 1.0).sum())


def calibrated(make: Callable[[int], Callable[[int], Any]], start: int) -> Callable[[int], Any]:
    """``make(size)`` with the size that takes about 1 ms a call on this machine."""
    size = start
    for _ in range(6):
        work = make(size)
        for i in range(50):  # warm up: the allocator settles on reusing large arrays
            work(i)
        began = time.perf_counter()
        for i in range(50):
            work(i)
        took = (time.perf_counter() - began) / 50
        size = max(1, int(size * 1e-3 / took))
    return make(size)


LOADERS: dict[str, Callable[..., Any]] = {
    "torch": lambda data, **o: TorchLoader(data, **o),
    "torchdata": lambda data, **o: StatefulDataLoader(data, **o),
    "shardwise": lambda data, **o: DataLoader(data, **o),
    "shardwise threads": lambda data, **o: DataLoader(data, worker_type="thread", **o),
}


def loader_names(workers: int) -> list[str]:
    names = [n for n in LOADERS if n != "torchdata" or StatefulDataLoader is not None]
    return [n for n in names if workers or n != "shardwise threads"]


def throughput(name: str, data: Dataset, repeats: int, **options: Any) -> float:
    """Median samples/s of whole passes, after one warm-up pass (workers kept alive)."""
    persistent = options.get("num_workers", 0) > 0
    loader = LOADERS[name](data, persistent_workers=persistent, **options)
    rates = []
    for attempt in range(repeats + 1):
        began, samples = time.perf_counter(), 0
        for batch in loader:
            samples += len(batch)
        if attempt:
            rates.append(samples / (time.perf_counter() - began))
    del loader
    return statistics.median(rates)


def first_batch_seconds(name: str, data: Dataset, workers: int, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        began = time.perf_counter()
        loader = LOADERS[name](data, batch_size=256, num_workers=workers)
        next(iter(loader))
        times.append(time.perf_counter() - began)
        del loader
    return statistics.median(times)


def state_costs(size: int) -> list[tuple[str, float, float]]:
    """(loader, state_dict() seconds, resume-to-first-batch seconds) 100 batches into an epoch."""
    data = Transformed(size, float)
    rows = []

    def shardwise_loader():
        sampler = DistributedSampler(size, num_replicas=1, rank=0, permutation="feistel")
        return DataLoader(data, batch_size=256, sampler=sampler)

    makers = {"shardwise (DistributedSampler, feistel)": shardwise_loader,
              "shardwise (shuffle=True)": lambda: DataLoader(data, batch_size=256, shuffle=True)}
    if StatefulDataLoader is not None:
        makers["torchdata (shuffle=True)"] = lambda: StatefulDataLoader(data, batch_size=256,
                                                                        shuffle=True)
    for name, make in makers.items():
        loader = make()
        iterator = iter(loader)
        for _ in islice(iterator, 100):
            pass
        began = time.perf_counter()
        for _ in range(100):
            state = loader.state_dict()
        saving = (time.perf_counter() - began) / 100
        began = time.perf_counter()
        fresh = make()
        fresh.load_state_dict(state)
        next(iter(fresh))
        rows.append((name, saving, time.perf_counter() - began))
        del iterator, loader, fresh
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer samples and one repeat")
    parser.add_argument("--repeats", type=int, default=3, help="timed passes per case (median)")
    args = parser.parse_args()
    repeats = 1 if args.quick else args.repeats
    rows_size = 50_000 if args.quick else 200_000
    light = 256 if args.quick else 1024
    torch.manual_seed(0)
    cases = {
        "(a) rows": (Rows(rows_size), {"batch_size": 256}),
        "(b) rows, __getitems__": (BatchedRows(rows_size), {"batch_size": 256,
                                                             "collate_fn": as_is}),
        "(c) 1 ms Python": (Transformed(light, calibrated(PythonWork, 20_000)),
                            {"batch_size": 32}),
        "(c2) 1 ms NumPy": (Transformed(light, calibrated(NumpyWork, 50_000)),
                            {"batch_size": 32}),
    }
    console = Console()
    table = Table(title="samples/s (ratio to torch with as many workers)")
    table.add_column("case")
    table.add_column("workers", justify="right")
    names = loader_names(2)
    for name in names:
        table.add_column(name, justify="right")
    for case, (data, options) in cases.items():
        for workers in (0, 1, 2):
            rates = {name: throughput(name, data, repeats, num_workers=workers, **options)
                     for name in loader_names(workers)}
            cells = [f"{rates[n]:,.0f} ({rates[n] / rates['torch']:.2f}x)" if n in rates else ""
                     for n in names]
            table.add_row(case, str(workers), *cells)
            console.print(f"{case} with {workers} workers: "
                          + ", ".join(f"{n} {r:,.0f}/s" for n, r in rates.items()))
    first = {(name, workers): first_batch_seconds(name, cases["(a) rows"][0], workers, repeats + 2)
             for workers in (0, 1, 2) for name in loader_names(workers)}
    for workers in (0, 1, 2):
        table.add_row("(d) first batch, ms", str(workers), *[
            f"{first[(n, workers)] * 1e3:.1f}" if (n, workers) in first else "" for n in names])
    console.print(table)
    state = Table(title=f"(e) 100 batches into an epoch of {10**7:,} samples")
    for column in ("loader", "state_dict()", "resume to first batch"):
        state.add_column(column, justify="left" if column == "loader" else "right")
    for name, saving, resuming in state_costs(10**7):
        state.add_row(name, f"{saving * 1e6:.1f} µs", f"{resuming * 1e3:.1f} ms")
    console.print(state)


if __name__ == "__main__":
    main()
