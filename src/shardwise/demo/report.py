"""The demo's report: what each rank loaded and trained on, the two accuracies, the resume check."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

from shardwise.demo.data import CLASS_SHARES


def print_report(report: dict[str, Any], console: Console) -> bool:
    """Print the tables; return whether every guarantee held (each checked, and said so)."""
    world = report["world"]
    console.print(f"[bold]shardwise demo[/bold]: {world} rank{'s' if world > 1 else ''}, "
                  f"{report['seconds']:.1f} s on every rank after start-up\n")
    _heading(console, "1. Files loaded in parallel",
             "each rank reads a share of the bytes, sends each vector to its owner")
    console.print(_load_table(report["load"]))
    balanced = _train_table(report["train"], console)
    _heading(console, "3. Exact evaluation",
             "each sample once, beside torch's padded DistributedSampler")
    console.print(_evaluation_table(report["evaluate"]))
    resumed = _resume_table(report["resume"], console)
    return balanced and resumed


def _heading(console: Console, title: str, explanation: str) -> None:
    console.print(f"[bold]{title}[/bold]: {explanation}")


def _load_table(load: list[dict[str, Any]]) -> Table:
    table = Table()
    for column in ("rank", "bytes read", "lines read", "vectors owned"):
        table.add_column(column, justify="right")
    for rank, figures in enumerate(load):
        table.add_row(str(rank), f"{figures['bytes']:,}", f"{figures['lines']:,}",
                      f"{figures['owned']:,}")
    table.add_row("all", f"{sum(f['bytes'] for f in load):,}", f"{sum(f['lines'] for f in load):,}",
                  f"{sum(f['owned'] for f in load):,}", style="bold")
    return table


def _train_table(train: list[list[dict[str, Any]]], console: Console) -> bool:
    _heading(console, "\n2. Class-balanced DDP training",
             "shardwise.DataLoader, ClassBalancedSampler, 4 per class a batch")
    table = Table()
    for column in ("epoch", "rank", "samples", "batches", "batches with every class",
                   "classes drawn", "loss"):
        table.add_column(column, justify="right")
    balanced = True
    for rank, epochs in enumerate(train):
        for figures in epochs:
            balanced &= figures["complete"] == figures["batches"]
            drawn = "/".join(f"{share * 100:.0f}" for share in _shares(figures["drawn"])) + "%"
            table.add_row(str(figures["epoch"]), str(rank), f"{figures['samples']:,}",
                          str(figures["batches"]), f"{figures['complete']} of {figures['batches']}",
                          drawn, f"{figures['loss']:.3f}")
    console.print(table)
    data = "/".join(f"{share * 100:.0f}" for share in CLASS_SHARES) + "%"
    mark = "[green]OK[/green]" if balanced else "[red]FAILED[/red]"
    console.print(f"{mark} every batch held every class, though the data holds them {data}\n")
    return balanced


def _shares(counts: list[int]) -> list[float]:
    total = sum(counts) or 1
    return [count / total for count in counts]


def _evaluation_table(evaluation: dict[str, Any]) -> Table:
    table = Table()
    for column in ("how", "samples counted", "accuracy"):
        table.add_column(column, justify="left" if column == "how" else "right")
    samples, seen = evaluation["samples"], evaluation["padded_seen"]
    table.add_row("shardwise gather_by_index (exact)", f"{samples:,}",
                  f"{evaluation['exact_right'] / samples:.4f}")
    table.add_row(f"torch DistributedSampler, summed ({seen - samples} repeats)", f"{seen:,}",
                  f"{evaluation['padded_right'] / seen:.4f}")
    return table


def _resume_table(resume: dict[str, Any], console: Console) -> bool:
    if "skipped" in resume:
        _heading(console, "\n4. Elastic resume", f"skipped: {resume['skipped']}")
        return True
    _heading(console, "\n4. Elastic resume",
             f"{resume['ranks_before']} ranks stop an epoch half-way; "
             f"{resume['ranks_after']} finish it from rank 0's saved loader state")
    table = Table()
    for column in ("rank", "samples before the checkpoint", "samples after the resume"):
        table.add_column(column, justify="right")
    for rank, counts in enumerate(resume["per_rank"]):
        after = f"{counts['after']:,}" if rank < resume["ranks_after"] else "(left the job)"
        table.add_row(str(rank), f"{counts['before']:,}", after)
    console.print(table)
    verdict = ("each exactly once, nothing repeated or lost" if resume["exact"]
               else f"{resume['missed']} missed and {resume['repeated']} repeated")
    mark = "[green]OK[/green]" if resume["exact"] else "[red]FAILED[/red]"
    console.print(f"{mark} the epoch's {resume['samples']:,} samples, both worlds together: "
                  f"{verdict}")
    return bool(resume["exact"])
