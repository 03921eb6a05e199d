"""Feeding a GPU: shardwise's ``device="cuda"`` against torch's pinned loader and ``.cuda()``.

A training step of a few milliseconds on the GPU (matrix products that read the batch, then
``loss.item()`` as a step that logs does) is fed image batches (3x128x128 float32, batch 64,
12.6 MB) from worker processes, by:

  torch       DataLoader(pin_memory=True), then ``batch.cuda(non_blocking=True)`` in the loop
  shardwise   DataLoader(pin_memory=True, device="cuda"): the next batch is copied on a side
              stream while this step runs

It prints steps/s, the ratio to torch, and the data stall: the share of the wall time that the
same steps on a batch already on the GPU would not have taken.

    python benchmarks/gpu.py                 # needs a CUDA GPU
    python benchmarks/gpu.py --workers 2 4
"""

from __future__ import annotations

import argparse
import itertools
import time
from collections.abc import Callable, Iterable
from typing import Any

import torch
from rich.console import Console
from rich.table import Table
from torch.utils.data import DataLoader as TorchLoader
from torch.utils.data import Dataset

from shardwise import DataLoader


class Images(Dataset):
    """``size`` images of 3x128x128 float32, each a view of one shared tensor."""

    def __init__(self, size: int) -> None:
        self.images = torch.rand(size, 3, 128, 128)

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, index: int) -> torch.Tensor:
        return self.images[index]


def make_step(device: torch.device, products: int) -> Callable[[torch.Tensor], float]:
    """A step of ``products`` 4096x4096 bf16 products whose input depends on the batch."""
    weight = torch.randn(4096, 4096, device=device, dtype=torch.bfloat16)

    def step(batch: torch.Tensor) -> float:
        x = weight * batch.mean().to(torch.bfloat16)
        for _ in range(products):
            x = torch.tanh(x @ weight)
        return x.float().mean().item()  # the host waits for the step, as a logging step does

    return step


def timed(batches: Iterable[torch.Tensor], step: Callable[[torch.Tensor], float],
          to_device: Callable[[torch.Tensor], torch.Tensor], steps: int) -> float:
    """Seconds for ``steps`` steps after a warm-up of 5."""
    iterator = iter(batches)
    for _ in range(5):
        step(to_device(next(iterator)))
    torch.cuda.synchronize()
    began = time.perf_counter()
    for _ in range(steps):
        step(to_device(next(iterator)))
    torch.cuda.synchronize()
    return time.perf_counter() - began


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workers", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--products", type=int, nargs="+", default=[0, 16],
                        help="4096^2 products per step (0: the loader alone)")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("benchmarks/gpu.py needs a CUDA GPU")
    device = torch.device("cuda")
    data = Images(2048)
    table = Table(title=f"Feeding {torch.cuda.get_device_name()}: 12.6 MB batches, "
                        f"{args.steps} steps")
    for column in ("step", "workers", "loader", "steps/s", "vs torch", "data stall"):
        table.add_column(column, justify="right" if column not in ("step", "loader") else "left")
    for products in args.products:
        step = make_step(device, products)
        resident = data.images[:64].to(device)
        compute = timed(itertools.repeat(resident), step, lambda b: b, args.steps)
        label = f"{products} products ({compute / args.steps * 1e3:.2f} ms)"
        for workers in args.workers:
            options: dict[str, Any] = {"batch_size": 64, "shuffle": True, "num_workers": workers,
                                       "pin_memory": True, "persistent_workers": True}
            runs = {
                "torch, .cuda(non_blocking)": timed(
                    _forever(TorchLoader(data, **options)), step,
                    lambda b: b.cuda(non_blocking=True), args.steps),
                'shardwise, device="cuda"': timed(
                    _forever(DataLoader(data, device="cuda", **options)), step, lambda b: b,
                    args.steps),
            }
            base = runs["torch, .cuda(non_blocking)"]
            for name, seconds in runs.items():
                table.add_row(label, str(workers), name, f"{args.steps / seconds:,.1f}",
                              f"{base / seconds:.2f}x", f"{max(0.0, 1 - compute / seconds):.0%}")
    Console(width=110).print(table)


def _forever(loader: Iterable[torch.Tensor]) -> Iterable[torch.Tensor]:
    while True:
        yield from loader


if __name__ == "__main__":
    main()
