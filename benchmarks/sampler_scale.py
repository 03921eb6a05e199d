"""How the samplers scale: torch's DistributedSampler against shardwise's torch and feistel modes.

For each case, in a fresh process (so peak memory is its own): time from construction to the
first index, time per 10^6 indices through iteration and through ``indices()``, and the peak
memory the case added. One rank of W is measured; every rank does the same work.

    python benchmarks/sampler_scale.py            # the README's table (a few minutes)
    python benchmarks/sampler_scale.py --quick    # small sizes, seconds
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

from rich.console import Console
from rich.table import Table

MEASURED = 2_000_000  # indices timed per case when the rank's share is larger
TORCH_LIMIT = 10**8  # torch's sampler holds ~40 bytes a sample in Python ints: stop there


def build(impl: str, size: int, world: int):
    if impl == "torch DistributedSampler":
        from torch.utils.data import DistributedSampler

        return DistributedSampler(range(size), world, world - 1, seed=1)
    from shardwise import DistributedSampler

    return DistributedSampler(size, world, world - 1, seed=1, permutation=impl.split()[-1])


def measure(impl: str, size: int, world: int) -> dict:
    """One case, in this process; returns seconds and MiB."""
    import warnings

    warnings.simplefilter("ignore")  # the torch-mode scale warning is expected here
    build(impl, 8, 2)  # import and warm up outside the timings
    base_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.perf_counter()
    sampler = build(impl, size, world)
    sampler.set_epoch(0)
    iterator = iter(sampler)
    next(iterator, None)
    first = time.perf_counter() - start
    count = min(len(sampler), MEASURED) - 1
    start = time.perf_counter()
    for _ in zip(range(count), iterator):
        pass
    per_million_iter = (time.perf_counter() - start) / max(count, 1) * 1e6
    per_million_indices = None
    if hasattr(sampler, "indices"):
        whole = len(sampler) if len(sampler) <= 10**7 else MEASURED
        start = time.perf_counter()
        sampler.indices(0, whole)
        per_million_indices = (time.perf_counter() - start) / max(whole, 1) * 1e6
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {
        "impl": impl, "size": size, "world": world, "rank_len": len(sampler),
        "first_s": first, "iter_s_per_1e6": per_million_iter,
        "indices_s_per_1e6": per_million_indices, "peak_mib": (peak_kib - base_kib) / 1024,
    }


def cases(quick: bool) -> list[tuple[str, int, int]]:
    sizes = [10**4, 10**5] if quick else [10**6, 10**7, 10**8]
    huge = [10**6] if quick else [10**9, 10**12]
    out = []
    for world in (8, 1024):
        for size in sizes:
            if size <= TORCH_LIMIT:
                out.append(("torch DistributedSampler", size, world))
            out += [("shardwise torch", size, world), ("shardwise feistel", size, world)]
        out += [("shardwise feistel", size, world) for size in huge]
    return out


def run_isolated(impl: str, size: int, world: int) -> dict:
    output = subprocess.run(
        [sys.executable, __file__, "--case", impl, str(size), str(world)],
        capture_output=True, text=True, check=True,
    ).stdout
    return json.loads(output)


def print_table(rows: list[dict], console: Console) -> None:
    table = Table(title="one rank of W: shardwise vs torch.utils.data.DistributedSampler")
    for name in ("sampler", "N", "W", "first index", "per 1e6 (iter)", "per 1e6 (indices())",
                 "rank's epoch (iter)", "peak MiB", "vs torch: first", "vs torch: epoch"):
        table.add_column(name, justify="right")
    for r in rows:  # torch's sampler pays for the whole list before the first index
        r["epoch_s"] = r["first_s"] + r["iter_s_per_1e6"] * r["rank_len"] / 1e6
    reference = {(r["size"], r["world"]): r for r in rows if r["impl"].startswith("torch")}
    for r in rows:
        peer = reference.get((r["size"], r["world"]))
        ratios = [f"{peer[key] / r[key]:.1f}x" if peer and peer is not r else ""
                  for key in ("first_s", "epoch_s")]
        table.add_row(
            r["impl"], f"{r['size']:.0e}", str(r["world"]), _seconds(r["first_s"]),
            _seconds(r["iter_s_per_1e6"]), _seconds(r["indices_s_per_1e6"]),
            _seconds(r["epoch_s"]), f"{r['peak_mib']:.0f}", *ratios,
        )
    console.print(table)
    console.print("ratios > 1x: shardwise is faster than torch's sampler by that factor; "
                  "a rank's epoch = first index + its whole share through iteration")


def _seconds(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value * 1e3:.2f} ms" if value < 1 else f"{value:.2f} s"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, for a smoke run")
    parser.add_argument("--json", action="store_true", help="print rows as JSON lines")
    parser.add_argument("--case", nargs=3, metavar=("IMPL", "N", "W"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.case:
        impl, size, world = args.case
        print(json.dumps(measure(impl, int(size), int(world))))
        return
    console = Console(width=200)
    rows = []
    for impl, size, world in cases(args.quick):
        rows.append(run_isolated(impl, size, world))
        if args.json:
            print(json.dumps(rows[-1]), flush=True)
    print_table(rows, console)


if __name__ == "__main__":
    main()
