"""Class-balanced and weighted sampling at scale, against torch's WeightedRandomSampler.

- ClassBalancedSampler over 10^7 labels (10 classes, imbalanced), one rank of 8: construction,
  first index, the rank's whole epoch, and a resume 10^6 samples in.
- ClassBalancedSampler over 10^6 labels of 10,000 classes (a long tail), one rank of 8, against
  torch's usual recipe for balance: a WeightedRandomSampler weighting each sample by one over its
  class's size, drawing as many indices.
- WeightedDistributedSampler with 10^6 weights against torch's WeightedRandomSampler drawing as
  many samples (one rank of one, so both draw the same number), and with 2^24 + 1 weights, where
  torch's sampler refuses to run.

    python benchmarks/balance.py
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from rich.console import Console
from rich.table import Table
from torch.utils.data import WeightedRandomSampler

from shardwise import ClassBalancedSampler, WeightedDistributedSampler


def timed(work: Callable[[], Any]) -> tuple[float, Any]:
    began = time.perf_counter()
    result = work()
    return time.perf_counter() - began, result


def whole_epoch(sampler: Any) -> int:
    return sum(1 for _ in sampler)


def class_balanced_rows(size: int) -> list[tuple[str, str]]:
    shares = np.array([0.5, 0.2, 0.1, 0.08, 0.05, 0.03, 0.02, 0.01, 0.005, 0.005])
    labels = np.random.default_rng(0).choice(10, size=size, p=shares)
    build, sampler = timed(lambda: ClassBalancedSampler(labels, num_replicas=8, rank=3))
    first, _ = timed(lambda: next(iter(sampler)))
    sampler.set_epoch(1)
    epoch, count = timed(lambda: whole_epoch(sampler))
    state = sampler.state_dict(consumed=10**6)
    resume, _ = timed(lambda: (sampler.load_state_dict(state), next(iter(sampler))))
    return [("build (labels to classes and members)", f"{build:.2f} s"),
            ("first index", f"{first * 1e3:.2f} ms"),
            (f"the rank's epoch ({count:,} indices)", f"{epoch:.2f} s"),
            ("resume 10^6 in, to the next index", f"{resume * 1e3:.2f} ms")]


def many_classes_rows(size: int, classes: int) -> list[tuple[str, str, str]]:
    tail = 1 / np.arange(1, classes + 1)
    labels = np.random.default_rng(2).choice(classes, size=size, p=tail / tail.sum())
    sampler = ClassBalancedSampler(labels, num_replicas=8, rank=3)
    ours, count = timed(lambda: whole_epoch(sampler))
    inverse = 1 / np.bincount(labels, minlength=classes)[labels]
    theirs, _ = timed(lambda: whole_epoch(WeightedRandomSampler(torch.from_numpy(inverse), count)))
    return [("torch WeightedRandomSampler, 1 / class size", f"{theirs:.2f} s", ""),
            (f"shardwise ClassBalancedSampler ({count:,} indices)", f"{ours:.2f} s",
             f"{theirs / ours:.1f}x")]


def weighted_rows(size: int, draws: int) -> list[tuple[str, str, str]]:
    weights = np.random.default_rng(1).random(size)
    ours, _ = timed(lambda: whole_epoch(WeightedDistributedSampler(weights, draws, num_replicas=1,
                                                                   rank=0)))
    rows = [("shardwise WeightedDistributedSampler", f"{ours:.2f} s", "")]
    try:
        theirs, _ = timed(lambda: whole_epoch(WeightedRandomSampler(torch.from_numpy(weights),
                                                                    draws)))
        rows.insert(0, ("torch WeightedRandomSampler", f"{theirs:.2f} s", ""))
        rows[-1] = (rows[-1][0], rows[-1][1], f"{theirs / ours:.1f}x")
    except RuntimeError as error:
        rows.insert(0, ("torch WeightedRandomSampler", f"fails: {error}", ""))
    return rows


def main() -> None:
    console = Console()
    table = Table(title="ClassBalancedSampler, 10^7 labels, 10 classes, rank 3 of 8")
    table.add_column("what")
    table.add_column("time", justify="right")
    for row in class_balanced_rows(10**7):
        table.add_row(*row)
    console.print(table)
    table = Table(title="10^6 labels, 10,000 classes, one rank's epoch of 8")
    for column in ("sampler", "time", "vs torch"):
        table.add_column(column, justify="left" if column == "sampler" else "right")
    for row in many_classes_rows(10**6, 10_000):
        table.add_row(*row)
    console.print(table)
    for size in (10**6, 2**24 + 1):
        table = Table(title=f"{size:,} weights, {10**6:,} draws with replacement")
        for column in ("sampler", "time", "vs torch"):
            table.add_column(column, justify="left" if column == "sampler" else "right")
        for row in weighted_rows(size, 10**6):
            table.add_row(*row)
        console.print(table)


if __name__ == "__main__":
    main()
