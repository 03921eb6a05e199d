"""``shardwise plan``: which sample each rank gets in each batch of each epoch.

The defaults reproduce seed 001's example: 7 samples, 3 ranks, batch size 2, two shuffled
epochs, torch's padding. Padding repeats are marked ``*`` (and red on a terminal).
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict, dataclass

import numpy as np
from rich.console import Console
from rich.table import Table
from rich.text import Text

from shardwise.order import PERMUTATIONS
from shardwise.samplers import DistributedSampler
from shardwise.split import LAYOUTS, REMAINDERS

_MAX_BATCH_COLUMNS = 12
_MAX_LISTED = 20


@dataclass(frozen=True)
class RankEpoch:
    rank: int
    batches: list[list[int]]
    padding: list[list[bool]]


@dataclass(frozen=True)
class EpochPlan:
    epoch: int
    ranks: list[RankEpoch]
    padding: int  # positions filled by padding repeats, all ranks together
    repeated: list[int]  # samples that padding made appear more than once
    dropped: list[int]  # samples no rank sees this epoch


def plan_epochs(args: argparse.Namespace) -> list[EpochPlan]:
    """Every rank's batches for each epoch, from the same samplers a training job would build."""
    samplers = [
        DistributedSampler(
            args.size, args.world_size, rank, shuffle=not args.no_shuffle, seed=args.seed,
            remainder=args.remainder, layout=args.layout, permutation=args.permutation,
        )
        for rank in range(args.world_size)
    ]
    epochs = []
    for epoch in range(args.epochs):
        ranks, padded, seen = [], [], []
        for sampler in samplers:
            sampler.set_epoch(epoch)
            indices, mask = sampler.indices(), sampler.padding_mask()
            seen.append(indices)
            padded.append(indices[mask])
            cuts = range(0, len(indices), args.batch_size)
            ranks.append(RankEpoch(
                sampler.rank,
                [indices[c : c + args.batch_size].tolist() for c in cuts],
                [mask[c : c + args.batch_size].tolist() for c in cuts],
            ))
        all_seen = np.concatenate(seen) if seen else np.empty(0, np.int64)
        epochs.append(EpochPlan(
            epoch, ranks,
            padding=sum(len(p) for p in padded),
            repeated=np.unique(np.concatenate(padded)).tolist(),
            dropped=np.setdiff1d(np.arange(args.size), all_seen).tolist(),
        ))
    return epochs


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "plan", help="show which samples each rank gets per batch and epoch",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--size", type=int, default=7, help="number of samples (default 7)")
    parser.add_argument("--world-size", type=int, default=3, help="number of ranks (default 3)")
    parser.add_argument("--batch-size", type=int, default=2, help="per-rank batch (default 2)")
    parser.add_argument("--epochs", type=int, default=2, help="epochs to show (default 2)")
    parser.add_argument("--no-shuffle", action="store_true", help="keep dataset order")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--remainder", choices=REMAINDERS, default="pad")
    parser.add_argument("--layout", choices=LAYOUTS, default="strided")
    parser.add_argument("--permutation", choices=PERMUTATIONS, default="torch")
    parser.add_argument("--format", choices=("table", "json"), default="table")


def run(args: argparse.Namespace) -> int:
    for name in ("world_size", "batch_size", "epochs"):
        if getattr(args, name) < 1:
            flag = "--" + name.replace("_", "-")
            raise ValueError(f"{flag} must be at least 1, got {getattr(args, name)}")
    epochs = plan_epochs(args)
    if args.format == "json":
        print(json.dumps({"config": _config(args), "epochs": [asdict(e) for e in epochs]}))
    else:
        console = Console(highlight=False)
        if not console.is_terminal:  # piped: plain text, as wide as the table needs
            console = Console(highlight=False, width=1000)
        _print_tables(args, epochs, console)
    return 0


def _config(args: argparse.Namespace) -> dict:
    names = ("size", "world_size", "batch_size", "epochs", "seed", "remainder", "layout",
             "permutation")
    return {"shuffle": not args.no_shuffle, **{name: getattr(args, name) for name in names}}


def _print_tables(args: argparse.Namespace, epochs: list[EpochPlan], console: Console) -> None:
    shuffled = "shuffled" if not args.no_shuffle else "not shuffled"
    console.print(
        f"{args.size} samples over {args.world_size} ranks, batch size {args.batch_size}, "
        f"{shuffled} ({args.permutation}, seed {args.seed}), layout {args.layout}, "
        f"remainder {args.remainder}.  [red]*[/red] marks a padding repeat."
    )
    for plan in epochs:
        widest = max((len(r.batches) for r in plan.ranks), default=0)
        shown = min(widest, _MAX_BATCH_COLUMNS)
        table = Table(title=f"epoch {plan.epoch}", title_justify="left")
        table.add_column("rank", justify="right")
        for b in range(shown):
            table.add_column(f"batch {b}", no_wrap=True)
        if widest > shown:
            table.add_column(f"+{widest - shown} batches", no_wrap=True)
        table.add_column("samples", justify="right")
        for rank in plan.ranks:
            cells = [_batch_text(batch, pads) for batch, pads in
                     zip(rank.batches[:shown], rank.padding[:shown])]
            cells += [""] * (shown - len(cells)) + ([""] if widest > shown else [])
            table.add_row(str(rank.rank), *cells, str(sum(map(len, rank.batches))))
        console.print(table)
        console.print(f"  repeated: {_listing(plan.repeated)}   dropped: {_listing(plan.dropped)}")
    last = epochs[-1]
    lengths = sorted({sum(map(len, rank.batches)) for rank in last.ranks})
    console.print(
        f"per-rank lengths {lengths}; each epoch {last.padding} padding repeats and "
        f"{len(last.dropped)} dropped samples"
    )


def _batch_text(batch: list[int], pads: list[bool]) -> Text:
    text = Text()
    for i, (index, pad) in enumerate(zip(batch, pads)):
        if i:
            text.append(" ")
        text.append(f"{index}*" if pad else str(index), style="bold red" if pad else None)
    return text


def _listing(values: list[int]) -> str:
    if not values:
        return "none"
    head = ", ".join(map(str, values[:_MAX_LISTED]))
    return f"{len(values)} ({head}{', ...' if len(values) > _MAX_LISTED else ''})"
