"""`shardwise plan` (being written)."""

import argparse


def add_parser(sub: argparse._SubParsersAction) -> None:
    sub.add_parser("plan", help="(being written)")


def run(args: argparse.Namespace) -> int:
    raise NotImplementedError("shardwise plan is being written")
