"""A reader that goes away (``shardwise plan | head``) stops the command quietly, with the status
of a process killed by SIGPIPE (141), as Unix tools stop: no message, no traceback."""

from __future__ import annotations

import os
import select
import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager

from rich.console import Console

STATUS = 128 + signal.SIGPIPE  # what a shell reports for a process killed by SIGPIPE


@contextmanager
def quiet_when_the_reader_goes() -> Iterator[None]:
    """Exit with ``STATUS`` on a broken pipe, whether Python or rich meets it."""
    rich_own = Console.on_broken_pipe
    Console.on_broken_pipe = _broken_pipe  # rich would exit with status 1 itself
    try:
        yield
        sys.stdout.flush()  # here, not at exit, where the error could only be printed
    except BrokenPipeError:
        if not _reader_gone():
            raise  # another pipe (a rank's, a socket): an error to report
        # As Python's documentation advises: the flush at exit must not fail again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(STATUS)
    finally:
        Console.on_broken_pipe = rich_own


def _reader_gone() -> bool:
    """Whether standard output is a pipe whose reader has gone (the kernel flags its end)."""
    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
    except (OSError, ValueError):  # closed, or not a file at all: not a reader gone
        return False
    return any(events & select.POLLERR for _, events in poller.poll(0))


def _broken_pipe(console: Console) -> None:
    raise BrokenPipeError
