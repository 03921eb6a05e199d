"""What a job of 10^10 samples over 4,096 ranks costs each rank, measured or extrapolated.

shardwise's Feistel sampler is measured at the full size: one rank of 4,096 builds its sampler,
takes its first index, iterates its whole share, saves its state and resumes from it, in a fresh
process so peak memory is its own. torch's DistributedSampler cannot run at 10^10 (its
permutation alone is 80 GB a rank), so it is measured at 10^6 and 10^7 and extrapolated linearly,
which is how its cost grows (``randperm(N).tolist()`` on every rank, every epoch).

    python benchmarks/scale.py            # the table in docs/scale.md (about a minute)
"""

from __future__ import annotations

import json
import pickle
import resource
import subprocess
import sys
import time

from rich.console import Console
from rich.table import Table

SIZE, WORLD = 10**10, 4096
TORCH_SIZES = (10**6, 10**7)


def measure_shardwise() -> dict:
    """One rank of WORLD over SIZE samples, in this process."""
    from shardwise import DataLoader, DistributedSampler

    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    began = time.perf_counter()
    sampler = DistributedSampler(SIZE, WORLD, WORLD - 1, seed=1, permutation="feistel")
    sampler.set_epoch(3)
    iterator = iter(sampler)
    next(iterator)
    first = time.perf_counter() - began
    began = time.perf_counter()
    count = 1 + sum(1 for _ in iterator)
    epoch = time.perf_counter() - began
    state = sampler.state_dict(consumed=count // 2)
    loader = DataLoader(range(SIZE), batch_size=256, sampler=DistributedSampler(
        SIZE, WORLD, WORLD - 1, seed=1, permutation="feistel"))
    began = time.perf_counter()
    resumed = DistributedSampler(SIZE, WORLD // 2, 7, seed=1, permutation="feistel")
    resumed.load_state_dict(state)  # elastic: half the ranks take over
    next(iter(resumed))
    resume = time.perf_counter() - began
    peak = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) / 1024
    return {"first": first, "epoch": epoch, "count": count, "resume": resume, "peak_mib": peak,
            "state_bytes": len(json.dumps(state)),
            "checkpoint_bytes": len(pickle.dumps(loader.state_dict()))}


def measure_torch(size: int) -> dict:
    """One rank of WORLD over ``size`` samples with torch's sampler, in this process."""
    from torch.utils.data import DistributedSampler

    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    began = time.perf_counter()
    sampler = DistributedSampler(range(size), WORLD, WORLD - 1, seed=1)
    sampler.set_epoch(3)
    iterator = iter(sampler)
    next(iterator)
    first = time.perf_counter() - began
    for _ in iterator:
        pass
    peak = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) / 1024
    return {"first": first, "peak_mib": peak}


def in_fresh_process(name: str, *args: int) -> dict:
    code = f"import json, sys; sys.path.insert(0, 'benchmarks'); import scale; " \
           f"print(json.dumps(scale.{name}(*{args!r})))"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(run.stdout.strip().splitlines()[-1])


def main() -> None:
    ours = in_fresh_process("measure_shardwise")
    theirs = {size: in_fresh_process("measure_torch", size) for size in TORCH_SIZES}
    small, large = TORCH_SIZES
    growth = SIZE / large
    torch_first = theirs[large]["first"] * growth
    torch_mib = theirs[large]["peak_mib"] * growth
    table = Table(title=f"one rank of {WORLD:,} over {SIZE:,} samples")
    for column in ("per rank", "torch DistributedSampler (extrapolated)",
                   "shardwise feistel (measured)"):
        table.add_column(column, justify="left" if column == "per rank" else "right")
    table.add_row("memory (peak, sampler)", f"{torch_mib / 1024:,.0f} GiB",
                  f"{ours['peak_mib']:,.0f} MiB")
    table.add_row("time to the first index", f"{torch_first:,.0f} s",
                  f"{ours['first'] * 1e3:,.1f} ms")
    table.add_row(f"the rank's epoch ({ours['count']:,} indices)", f">= {torch_first:,.0f} s",
                  f"{ours['epoch']:,.2f} s")
    table.add_row("resume mid-epoch (on half the ranks)", "no resume",
                  f"{ours['resume'] * 1e3:,.1f} ms")
    table.add_row("sampler state", "none", f"{ours['state_bytes']:,} bytes (JSON)")
    table.add_row("loader checkpoint", "none", f"{ours['checkpoint_bytes']:,} bytes (pickled)")
    table.add_row("collective calls a sampler makes per epoch", "0", "0")
    table.add_row("collective calls shardwise.DataLoader makes per epoch", "",
                  "1 all_gather_object of ~200 bytes (the ranks' check; verify=False: 0)")
    Console().print(table)
    Console().print(f"torch measured: first index {theirs[small]['first']:.2f} s and "
                    f"{theirs[small]['peak_mib']:,.0f} MiB at {small:,}; "
                    f"{theirs[large]['first']:.2f} s and {theirs[large]['peak_mib']:,.0f} MiB at "
                    f"{large:,} (x{growth:,.0f} to reach {SIZE:,})")


if __name__ == "__main__":
    main()
