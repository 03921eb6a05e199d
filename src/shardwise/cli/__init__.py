"""The ``shardwise`` command: one sub-command per module in this package."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from shardwise.cli import load, plan

COMMANDS = {"plan": plan, "load": load}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="shardwise", description="Deterministic distributed data loading for PyTorch."
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, module in COMMANDS.items():
        module.add_parser(sub)
    args = parser.parse_args(argv)
    try:
        return int(COMMANDS[args.command].run(args) or 0)
    except (ValueError, TypeError, FileNotFoundError) as error:
        parser.exit(2, f"shardwise {args.command}: error: {error}\n")

