"""The ``shardwise`` command: one sub-command per module in this package."""

from __future__ import annotations

import argparse
import gc
from collections.abc import Sequence

from shardwise import __version__
from shardwise.cli import demo, load, plan
from shardwise.cli.pipe import quiet_when_the_reader_goes
from shardwise.cli.wording import in_cli_words, warnings_in_cli_words
from shardwise.distributed.launch import LaunchError

COMMANDS = {"demo": demo, "plan": plan, "load": load}


def build_parser() -> argparse.ArgumentParser:
    """The ``shardwise`` parser with every sub-command.

    >>> build_parser().parse_args(["plan", "--size", "10"]).size
    10
    """
    parser = argparse.ArgumentParser(
        prog="shardwise", description="Deterministic distributed data loading for PyTorch."
    )
    parser.add_argument("--version", action="version", version=f"shardwise {__version__}")
    sub = parser.add_subparsers(
        dest="command", metavar="COMMAND", help="see shardwise COMMAND --help for its flags"
    )
    for module in COMMANDS.values():
        module.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``shardwise`` with ``argv``; an error is one line on stderr and ``SystemExit``.

    Bad input exits with code 2, a rank that died or hung with 1, Ctrl-C with 130, and a reader
    that went away (``| head``) with 141, quietly, as a process killed by SIGPIPE.
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    prog = f"shardwise {args.command}"
    try:
        with warnings_in_cli_words(prog), quiet_when_the_reader_goes():
            return int(COMMANDS[args.command].run(args) or 0)
    except (ValueError, TypeError, OSError) as error:
        failure = 2, f"{prog}: error: {in_cli_words(str(error))}\n"
    except LaunchError as error:  # a rank died or hung: not the input's fault
        failure = 1, f"{prog}: error: {in_cli_words(str(error))}\n"
    except KeyboardInterrupt:
        failure = 130, f"{prog}: interrupted\n"
    # Exit once the handler is left and what the error's frames held is collected: a pyarrow
    # reader freed as the interpreter shuts down can abort it (apache/arrow#34314).
    gc.collect()
    parser.exit(*failure)
