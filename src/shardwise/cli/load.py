"""`shardwise load` (being written)."""

import argparse


def add_parser(sub: argparse._SubParsersAction) -> None:
    sub.add_parser("load", help="(being written)")


def run(args: argparse.Namespace) -> int:
    raise NotImplementedError("shardwise load is being written")
