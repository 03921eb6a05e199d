"""What exactness costs: gather_by_index against a plain all_gather of the same values.

Each of 3 local gloo ranks holds its share (torch's padded split) of 10^6 float32 results. The
plain ``all_gather`` moves just those values and leaves them in rank order, repeats included;
``gather_by_index`` also moves the indices, agrees on the shapes, and puts every sample once in
dataset order, on every rank (or, with ``dst``, on one). Times are the slowest rank's, median
over the repeats.

    python benchmarks/gather.py
    python benchmarks/gather.py --size 100000 --world 2 --repeats 5
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.distributed as dist
import torch.utils.data as tud

from shardwise.distributed.gather import gather_by_index
from shardwise.distributed.launch import spawn_local


def slowest(fn, repeats: int) -> list[float]:
    """Seconds per call of ``fn``, each the slowest rank's."""
    fn()  # warm up the connections and allocator
    times = []
    for _ in range(repeats):
        dist.barrier()
        start = time.perf_counter()
        fn()
        elapsed = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
        times.append(float(elapsed))
    return times


def measure(size: int, repeats: int) -> dict:
    world, rank = dist.get_world_size(), dist.get_rank()
    indices = torch.tensor(list(tud.DistributedSampler(range(size), world, rank, seed=0)))
    values = indices.float() / size  # a result that depends on the sample
    blocks = [torch.empty_like(values) for _ in range(world)]
    result = gather_by_index(values, indices, size)
    assert torch.equal(result, torch.arange(size) / size)  # timing a correct gather
    return {
        "per_rank": len(values),
        "all_gather": slowest(lambda: dist.all_gather(blocks, values), repeats),
        "gather_by_index": slowest(lambda: gather_by_index(values, indices, size), repeats),
        "dst": slowest(lambda: gather_by_index(values, indices, size, dst=0), repeats),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=10**6, help="results in all (default 10^6)")
    parser.add_argument("--world", type=int, default=3, help="local gloo ranks (default 3)")
    parser.add_argument("--repeats", type=int, default=11, help="timed calls (default 11)")
    args = parser.parse_args()
    out = spawn_local(measure, args.world, args.size, args.repeats)[0]
    plain = statistics.median(out["all_gather"])
    exact = statistics.median(out["gather_by_index"])
    to_one = statistics.median(out["dst"])
    print(f"{args.size:,} float32 results over {args.world} gloo ranks "
          f"({out['per_rank']:,} per rank), median of {args.repeats}:")
    print(f"  plain all_gather of the values: {plain * 1e3:8.2f} ms")
    print(f"  gather_by_index:                {exact * 1e3:8.2f} ms")
    print(f"  ratio:                          {exact / plain:8.2f}x")
    print(f"  gather_by_index(dst=0):         {to_one * 1e3:8.2f} ms  (only rank 0 assembles)")


if __name__ == "__main__":
    main()
