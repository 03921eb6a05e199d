"""``shardwise plan``: which sample each rank gets in each batch of each epoch.

The plan comes from the samplers a training job would build, and computes only what it shows:
counts come from the samplers' arithmetic, indices only for the batches on screen, so a plan
of 10**12 samples over 1024 ranks takes as long as one of 7 over 3.

    shardwise plan --no-shuffle --epochs 1
    shardwise plan --size 1000000000000 --world-size 1024 --permutation feistel

Given files (``shardwise plan data/ --world-size 4``), it shows how the ranks split them instead
(``plan_files.py``).
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Iterator
from dataclasses import asdict, dataclass

import numpy as np
from rich.console import Console
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from shardwise.cli import plan_files
from shardwise.cli.picture import render_html, render_svg
from shardwise.cli.shown import check_shown, head_count, not_shown, shown_ranks
from shardwise.cli.storage import add_storage_option
from shardwise.order import PERMUTATIONS
from shardwise.samplers import DistributedSampler
from shardwise.samplers.distributed import TORCH_ORDER_WARN_SIZE
from shardwise.samplers.passes import MAX_SIZE, SEED_MAX, SEED_MIN
from shardwise.split import LAYOUTS, REMAINDERS

DESCRIPTION = (
    "Show which samples each rank gets in each batch of each epoch; * marks a padding repeat. "
    "The defaults are the 7-sample, 3-rank example: batch size 2, two shuffled epochs, torch's "
    "padding. Large plans show the first and last batches of the first and last ranks, with "
    "every rank's count, the padding repeats and the dropped samples. Given files, it shows how "
    "--world-size ranks split them instead: the byte range of each rank in text files, its row "
    "groups in Parquet or Arrow IPC files."
)
MAX_EPOCHS = 1000  # every epoch asked for is computed and shown: more is no longer a plan to read
_BATCH_EDGE = 4  # a longer batch shows its first and last 4 samples
_MAX_LISTED = 20  # repeated and dropped samples listed by value
_WIDE = 1 << 20  # a piped table is as wide as it needs


@dataclass(frozen=True)
class RankEpoch:
    rank: int
    samples: int  # the rank's whole share of the epoch
    batch_numbers: list[int]  # which of its batches are shown
    batches: list[list[int | None]]  # None stands for the middle of a long batch, left out
    padding: list[list[bool | None]]


@dataclass(frozen=True)
class EpochPlan:
    epoch: int
    ranks: list[RankEpoch]  # the ranks shown
    ranks_not_shown: int
    padding: int  # positions filled by padding repeats, all ranks together
    # Samples that padding repeats and that no rank sees this epoch: all, sorted, when at most
    # _MAX_LISTED; else the first _MAX_LISTED in the order the pass repeats or drops them.
    repeated: list[int]
    repeated_count: int
    dropped: list[int]
    dropped_count: int
    lengths: list[int]  # the ranks' sample counts, which differ by at most one


# The options that shape a sampler's plan, and their defaults: a plan of files refuses them.
SAMPLER_ONLY = {"size": 7, "batch_size": 2, "epochs": 2, "no_shuffle": False, "seed": 0,
                "remainder": "pad", "layout": "strided", "permutation": "torch",
                "max_batches": None}


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = sub.add_parser(
        "plan", help="show which samples each rank gets per batch and epoch",
        description=DESCRIPTION,
    )
    parser.add_argument("paths", nargs="*", metavar="PATH",
                        help="files, directories, globs or fsspec URLs: plan how the ranks split "
                             "them (only --world-size, --format table|json, --max-ranks and "
                             "--storage-option apply)")
    parser.add_argument("--size", type=int, default=SAMPLER_ONLY["size"],
                        help="number of samples (default 7)")
    parser.add_argument("--world-size", type=int, default=3, help="number of ranks (default 3)")
    parser.add_argument("--batch-size", type=int, default=SAMPLER_ONLY["batch_size"],
                        help="per-rank batch (default 2)")
    parser.add_argument("--epochs", type=int, default=SAMPLER_ONLY["epochs"],
                        help=f"epochs to show, at most {MAX_EPOCHS:,} (default 2)")
    parser.add_argument("--no-shuffle", action="store_true", help="keep dataset order")
    parser.add_argument("--seed", type=int, default=SAMPLER_ONLY["seed"],
                        help="shuffle seed, the same on every rank (default 0)")
    parser.add_argument("--remainder", choices=REMAINDERS, default=SAMPLER_ONLY["remainder"],
                        help="when the ranks cannot share the samples evenly: pad by repeating "
                             "samples (torch's default), drop the tail, or leave the ranks uneven "
                             "(default: pad)")
    parser.add_argument("--layout", choices=LAYOUTS, default=SAMPLER_ONLY["layout"],
                        help="strided: rank r takes r, r+W, ...; block: one contiguous run per "
                             "rank (default: strided)")
    parser.add_argument("--permutation", choices=PERMUTATIONS,
                        default=SAMPLER_ONLY["permutation"],
                        help="torch: torch's exact order, 8 bytes a sample; feistel: O(1) memory, "
                             "for any size (default: torch)")
    parser.add_argument("--format", choices=("table", "json", "svg", "html"), default="table",
                        help="a table per epoch, JSON, or a picture: an SVG image or an HTML page "
                             "holding it (default: table)")
    parser.add_argument("--max-batches", type=int, default=SAMPLER_ONLY["max_batches"],
                        help="batches shown per rank, the last one always among them, at most "
                             "1,000 (default 12, 6 in a picture; fewer where the terminal is "
                             "narrow)")
    parser.add_argument("--max-ranks", type=int, default=8,
                        help="ranks shown: the first and the last ones, at most 1,000 "
                             "(default 8)")
    add_storage_option(parser)
    return parser


def run(args: argparse.Namespace) -> int:
    if args.paths:
        given = [f"--{dest.replace('_', '-')}" for dest, default in SAMPLER_ONLY.items()
                 if getattr(args, dest) != default]
        if given:
            raise ValueError(f"{', '.join(given)} shape a sampler's plan, not a plan of the files "
                             "given as PATH (which takes --world-size, --format table|json, "
                             "--max-ranks and --storage-option): drop them, or the paths")
        return plan_files.run(args)
    if args.storage_options:
        raise ValueError("--storage-option is for the files given as PATH: name some")
    if args.max_batches is None:
        args.max_batches = 6 if args.format in ("svg", "html") else 12
    _check(args)
    epochs = plan_epochs(args)
    if args.format == "json":
        print(json.dumps({"config": _config(args), "epochs": [asdict(e) for e in epochs]}))
        return 0
    if args.format in ("svg", "html"):
        render = render_svg if args.format == "svg" else render_html
        print(render(_summary(args), epochs), end="")
        return 0
    console = Console(highlight=False)
    if not console.is_terminal and "COLUMNS" not in os.environ:
        console = Console(highlight=False, width=_WIDE)  # piped: plain text, never squeezed
    _print_tables(args, epochs, console)
    return 0


def _check(args: argparse.Namespace) -> None:
    for name in ("world_size", "batch_size", "epochs"):
        if getattr(args, name) < 1:
            flag = "--" + name.replace("_", "-")
            raise ValueError(f"{flag} must be at least 1, got {getattr(args, name)}")
    check_shown("--max-batches", args.max_batches)
    check_shown("--max-ranks", args.max_ranks)
    if args.epochs > MAX_EPOCHS:
        raise ValueError(f"--epochs must be at most {MAX_EPOCHS:,}, as each epoch is computed "
                         f"and printed; got {args.epochs:,}")
    if not 0 <= args.size <= MAX_SIZE:
        raise ValueError(f"--size must be in [0, 2**63 - 1], got {args.size}")
    if args.world_size > MAX_SIZE:
        raise ValueError(f"--world-size must be in [1, 2**63 - 1], got {args.world_size}")
    if not SEED_MIN <= args.seed <= SEED_MAX:
        raise ValueError(f"--seed must be in [-2**63, 2**64 - 1], got {args.seed}")
    if not args.no_shuffle and args.permutation == "torch" and args.size >= TORCH_ORDER_WARN_SIZE:
        raise ValueError(
            f"--permutation torch would build a {args.size:,}-sample permutation (8 bytes a "
            f"sample: {args.size * 8 / 2**30:,.1f} GiB) for every rank shown and every epoch; "
            f"from {TORCH_ORDER_WARN_SIZE:,} samples on use --permutation feistel (O(1) memory)"
        )


def plan_epochs(args: argparse.Namespace) -> list[EpochPlan]:
    """The shown ranks' shown batches for each epoch, and counts for everything else."""
    shown = shown_ranks(args.world_size, args.max_ranks)
    samplers = [
        DistributedSampler(
            args.size, args.world_size, rank, shuffle=not args.no_shuffle, seed=args.seed,
            remainder=args.remainder, layout=args.layout, permutation=args.permutation,
        )
        for rank in shown
    ]
    epochs = []
    for epoch in range(args.epochs):
        for sampler in samplers:
            sampler.set_epoch(epoch)
        columns = _batch_columns(samplers, args.batch_size, args.max_batches)
        ranks = [_rank_epoch(sampler, args.batch_size, columns) for sampler in samplers]
        total = samplers[0].total_size
        padding, dropped = max(0, total - args.size), max(0, args.size - total)
        repeated = min(padding, args.size)  # distinct samples: padding wraps around the epoch
        epochs.append(EpochPlan(
            epoch, ranks, ranks_not_shown=args.world_size - len(shown), padding=padding,
            repeated=_listed(samplers[0].repeated(distinct=True, limit=_MAX_LISTED), repeated),
            repeated_count=repeated,
            dropped=_listed(samplers[0].dropped(limit=_MAX_LISTED), dropped),
            dropped_count=dropped,
            lengths=sorted({total // args.world_size, -(-total // args.world_size)}),
        ))
    return epochs


def _listed(first: np.ndarray, count: int) -> list[int]:
    """All ``count`` samples sorted when they fit the listing, else the first in the pass's order:
    the smallest of W - 1 shuffled samples could only be found by computing them all."""
    return sorted(first.tolist()) if count <= _MAX_LISTED else first.tolist()


def _batch_columns(samplers: list[DistributedSampler], batch_size: int, most: int) -> list[int]:
    """The batch numbers to show: the first ones, and each shown rank's last."""
    lasts = {-(-s.num_samples // batch_size) - 1 for s in samplers} - {-1}
    widest = max(lasts, default=-1) + 1
    return sorted(set(range(min(widest, max(0, most - len(lasts))))) | lasts)


def _rank_epoch(sampler: DistributedSampler, batch_size: int, columns: list[int]) -> RankEpoch:
    count = sampler.num_samples
    numbers = [b for b in columns if b * batch_size < count]
    batches, padding = [], []
    for b in numbers:
        start, stop = b * batch_size, min(count, (b + 1) * batch_size)
        indices, pads = [], []
        for begin, end in _shown_parts(start, stop):
            if indices:
                indices.append(None)
                pads.append(None)
            indices += sampler.indices(begin, end).tolist()
            pads += sampler.padding_mask(begin, end).tolist()
        batches.append(indices)
        padding.append(pads)
    return RankEpoch(sampler.rank, count, numbers, batches, padding)


def _shown_parts(start: int, stop: int) -> Iterator[tuple[int, int]]:
    """``[start, stop)`` whole, or its first and last ``_BATCH_EDGE`` positions."""
    if stop - start <= 2 * _BATCH_EDGE + 1:
        yield start, stop
    else:
        yield start, start + _BATCH_EDGE
        yield stop - _BATCH_EDGE, stop


def _config(args: argparse.Namespace) -> dict:
    names = ("size", "world_size", "batch_size", "epochs", "seed", "remainder", "layout",
             "permutation")
    return {"shuffle": not args.no_shuffle, **{name: getattr(args, name) for name in names}}


def _summary(args: argparse.Namespace) -> str:
    shuffled = "shuffled" if not args.no_shuffle else "not shuffled"
    return (f"{args.size:,} samples over {args.world_size:,} ranks, batch size "
            f"{args.batch_size:,}, {shuffled} ({args.permutation}, seed {args.seed}), layout "
            f"{args.layout}, remainder {args.remainder}.")


def _print_tables(args: argparse.Namespace, epochs: list[EpochPlan], console: Console) -> None:
    console.print(f"{_summary(args)}  [red]*[/red] marks a padding repeat.")
    for plan in epochs:
        console.print(_fitted_table(plan, console))
        if plan.ranks_not_shown:
            console.print(not_shown(plan.ranks, plan.ranks_not_shown))
        console.print(f"  repeated: {_listing(plan.repeated, plan.repeated_count)}   "
                      f"dropped: {_listing(plan.dropped, plan.dropped_count)}")
    last = epochs[-1]
    console.print(
        f"per-rank lengths {last.lengths}; each epoch {last.padding:,} padding repeats and "
        f"{last.dropped_count:,} dropped samples"
    )


def _fitted_table(plan: EpochPlan, console: Console) -> Table:
    """The epoch's table with as many of the first batches as the console's width allows."""
    columns = sorted({b for r in plan.ranks for b in r.batch_numbers})
    lasts = {r.batch_numbers[-1] for r in plan.ranks if r.batch_numbers}
    head = [b for b in columns if b not in lasts]
    unbounded = console.options.update_width(_WIDE)  # else the measure stops at the width
    for keep in range(len(head), -1, -1):
        table = _table(plan, head[:keep] + sorted(lasts))
        if Measurement.get(console, unbounded, table).maximum <= console.width:
            break
    return table


def _table(plan: EpochPlan, columns: list[int]) -> Table:
    table = Table(title=f"epoch {plan.epoch}", title_justify="left")
    table.add_column("rank", justify="right", overflow="fold")
    slots: list[int | None] = []  # a batch number, or None for a column of hidden batches
    for b, previous in zip(columns, [-1, *columns]):
        if b > previous + 1:
            table.add_column(f"+{b - previous - 1:,}\nbatches", overflow="fold")
            slots.append(None)
        table.add_column(f"batch {b}", overflow="fold")
        slots.append(b)
    table.add_column("samples", justify="right", overflow="fold")
    split = head_count(plan.ranks) if plan.ranks_not_shown else None
    for i, rank in enumerate(plan.ranks):
        if i == split:
            table.add_row("...", *[""] * (len(slots) + 1))
        cells = dict(zip(rank.batch_numbers, zip(rank.batches, rank.padding)))
        table.add_row(
            str(rank.rank),
            *[_batch_text(*cells[b]) if b in cells else "" for b in slots],
            f"{rank.samples:,}",
        )
    return table


def _batch_text(batch: list[int | None], pads: list[bool | None]) -> Text:
    text = Text()
    for i, (index, pad) in enumerate(zip(batch, pads)):
        if i:
            text.append(" ")
        if index is None:
            text.append("...")
        else:
            text.append(f"{index}*" if pad else str(index), style="bold red" if pad else None)
    return text


def _listing(values: list[int], count: int) -> str:
    if not count:
        return "none"
    head = ", ".join(map(str, values[:_MAX_LISTED]))
    return f"{count:,} ({head}{', ...' if count > _MAX_LISTED else ''})"
