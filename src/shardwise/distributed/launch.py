"""Run a function on N local processes in one process group (gloo by default) on 127.0.0.1.

Used by ``shardwise load --nproc``, by the examples when they are not under ``torchrun``,
and by the tests, so every distributed code path runs over a real process group.

The parent watches each rank through its own pipe and its process sentinel, so it learns at
once that a rank returned, raised, exited or was killed; on a failure it stops every rank and
raises. A rank that raises waits to be stopped instead of exiting: its peers' collectives then
do not fail with "connection closed" errors that would bury the real one.
"""

from __future__ import annotations

import ctypes
import gc
import os
import pickle
import re
import signal
import socket
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Any

import torch
import torch.distributed as torch_dist
import torch.multiprocessing as mp

from shardwise.distributed.world import resolve_world

# After the first failure, how long the other ranks may take to report theirs (so that the
# lowest rank's error wins) before they are stopped.
_GRACE_S = 1.0
# How long ranks that all returned may take to exit (destroying their process group) before
# they are stopped.
_EXIT_S = 10.0
_NAMES_A_RANK = re.compile(r"\branks? \d+\b")  # "rank 1: ..." or "ranks 0, 1: ..."
_PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>


class LaunchError(RuntimeError):
    """A rank exited or was killed, raised something that cannot be raised here, or timed out."""


class RemoteTraceback(Exception):
    """A rank's traceback: the ``__cause__`` of its error here, as in concurrent.futures."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text

    def __str__(self) -> str:
        return f'\n"""\n{self.text}"""'


class _PortTaken(RuntimeError):
    """Rank 0 could not listen on the port ``free_port`` found free: another process took it in
    between (spawn_local then starts the ranks again, on another port)."""


PORT_TRIES = 3  # ports a spawn_local tries, each found free, before it gives up


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def spawn_local(
    fn: Callable[..., Any], nprocs: int, *args: Any, timeout: float = 300.0, backend: str = "gloo"
) -> list[Any]:
    """Call ``fn(*args)`` on ``nprocs`` processes sharing a process group; return each rank's result.

    ``backend="nccl"`` gives rank ``r`` the GPU ``r`` as its current device.

    ``fn`` must be importable (a module-level function) and its result picklable. Inside ``fn``
    ``torch.distributed`` is initialised, and ``RANK`` / ``WORLD_SIZE`` are set as torchrun sets them.

    Failures surface within about a second, and every rank is stopped before this returns or
    raises (Ctrl-C included; on Linux the ranks also die with this process):

    - a rank raises: that exception is raised here, of its own type when it unpickles, its
      message prefixed ``rank N:`` unless it names a rank already, the rank's traceback as its
      ``__cause__``; when several ranks raise, the lowest rank's;
    - a rank exits or is killed: :class:`LaunchError`, such as
      "rank 1 was killed by SIGKILL (signal 9)";
    - no result within ``timeout`` seconds: :class:`LaunchError` naming the ranks that hang.

    The ranks meet at a port found free on 127.0.0.1; one that another process takes before
    rank 0 listens on it is traded for another (``PORT_TRIES`` in all).

    >>> spawn_local(torch_dist.get_rank, 2)  # doctest: +SKIP
    [0, 1]
    """
    if nprocs < 1:
        raise ValueError(f"nprocs must be at least 1, got {nprocs}")
    if backend == "nccl" and torch.cuda.device_count() < nprocs:
        raise ValueError(f"backend='nccl' gives each rank a GPU of its own, but this machine has "
                         f"{torch.cuda.device_count()} for {nprocs} ranks: use backend='gloo'")
    for attempt in range(1, PORT_TRIES + 1):
        try:
            return _spawn(fn, nprocs, args, timeout, backend, free_port())
        except _PortTaken:
            if attempt == PORT_TRIES:
                raise


def _spawn(fn: Callable[..., Any], nprocs: int, args: tuple, timeout: float, backend: str,
           port: int) -> list[Any]:
    """``spawn_local``, its ranks meeting at ``port``."""
    ctx = mp.get_context("spawn")
    ranks: list[_Rank] = []
    finished = False
    try:
        for rank in range(nprocs):
            conn, child_conn = ctx.Pipe()
            # Not daemonic, so a rank can start DataLoader workers of its own; every rank is
            # stopped in the `finally` below, and on Linux dies with this process regardless.
            process = ctx.Process(
                target=_rank_main,
                args=(fn, rank, nprocs, port, backend, child_conn, os.getpid(), args),
            )
            with _sigint_ignored():  # the rank starts deaf to Ctrl-C, which is the parent's
                process.start()
            child_conn.close()  # the parent keeps only its own end, so a rank's exit reads as EOF
            ranks.append(_Rank(rank, process, conn))
        results = _collect(ranks, timeout)
        finished = True
        return results
    finally:
        _stop(ranks, patience=_EXIT_S if finished else 0.0)


@dataclass
class _Rank:
    """One spawned rank as the parent sees it, and what became of it."""

    rank: int
    process: Any  # a multiprocessing Process
    conn: Connection
    result: Any = None
    returned: bool = False
    error: BaseException | None = None
    died: bool = False
    eof: bool = False  # the rank closed its end of the pipe: only its exit can follow

    @property
    def settled(self) -> bool:
        return self.returned or self.error is not None

    def waitables(self) -> list[Any]:
        return [self.process.sentinel] + ([] if self.eof else [self.conn])

    def update(self) -> None:
        """Take in the rank's report if it sent one, else its exit if it exited.

        A rank writes its whole report before it exits, so the pipe is read first.
        """
        if not self.eof and self.conn.poll():
            try:
                kind, *report = pickle.loads(self.conn.recv_bytes())
            except EOFError:
                self.eof = True
            else:
                if kind == "returned":
                    self.result, self.returned = pickle.loads(report[0]), True
                else:
                    self.error = _rank_error(self.rank, *report)
                return
        if self.process.exitcode is not None:
            self.error, self.died = _death(self.rank, self.process.exitcode), True


def _collect(ranks: list[_Rank], timeout: float) -> list[Any]:
    """Every rank's result in rank order, or raise the failure that matters most."""
    deadline = time.monotonic() + timeout
    give_up = deadline
    while not all(r.settled for r in ranks):
        left = give_up - time.monotonic()
        if left <= 0:
            break
        open_ranks = [r for r in ranks if not r.settled]
        ready = set(wait([w for r in open_ranks for w in r.waitables()], timeout=left))
        for r in open_ranks:
            if ready.intersection(r.waitables()):
                r.update()
        if any(r.error is not None for r in ranks):
            give_up = min(give_up, time.monotonic() + _GRACE_S)
    failed = [r for r in ranks if r.error is not None]
    if failed:
        # A rank that died comes first: its peers' errors are often just the broken connection.
        first = min(failed, key=lambda r: (not r.died, r.rank))
        raise first.error  # type: ignore[misc]
    hanging = [r.rank for r in ranks if not r.settled]
    if hanging:
        raise LaunchError(
            f"no result from rank(s) {', '.join(map(str, hanging))} within {timeout:g} s "
            "(a collective may hang; pass a larger timeout if the work needs longer)"
        )
    return [r.result for r in ranks]


def _stop(ranks: list[_Rank], patience: float) -> None:
    """Give the ranks ``patience`` seconds to exit, then terminate, then kill, what is left."""
    deadline = time.monotonic() + patience
    for r in ranks:
        r.process.join(max(0.0, deadline - time.monotonic()))
    for r in ranks:
        if r.process.is_alive():
            r.process.terminate()
    for r in ranks:
        r.process.join(5.0)
        if r.process.is_alive():
            r.process.kill()
            r.process.join()
        r.conn.close()


def _death(rank: int, exitcode: int) -> LaunchError:
    if exitcode >= 0:
        return LaunchError(f"rank {rank} exited with code {exitcode} before returning a result")
    number = -exitcode
    try:
        name = signal.Signals(number).name
    except ValueError:
        name = "an unknown signal"
    hint = ": out of memory?" if number == signal.SIGKILL else ""
    return LaunchError(f"rank {rank} was killed by {name} (signal {number}){hint}")


def _rank_error(
    rank: int, pickled: bytes | None, type_name: str, message: str, remote_traceback: str
) -> BaseException:
    """The exception a rank raised, rebuilt here: named after the rank, its traceback as cause."""
    error: BaseException | None = None
    if pickled is not None:
        try:
            error = pickle.loads(pickled)
        except Exception:  # noqa: BLE001 - e.g. a constructor that wants other arguments
            error = None
    if not isinstance(error, Exception):  # unpicklable, or SystemExit that must not end us
        error = LaunchError(f"rank {rank} raised {type_name}: {message}")
    elif str(error) != message:  # its constructor rewrote the message it was given back
        error.args = (message,)
    if not _NAMES_A_RANK.search(str(error)) and error.args and isinstance(error.args[0], str):
        error.args = (f"rank {rank}: {error.args[0]}", *error.args[1:])
    error.__cause__ = RemoteTraceback(remote_traceback)
    return error


@contextmanager
def _sigint_ignored() -> Iterator[None]:
    """Ignore SIGINT while a rank is started: the rank inherits that across exec (a signal mask
    it would not: multiprocessing clears it), so a Ctrl-C that reaches it while it imports torch,
    before ``_rank_main`` takes over, prints no traceback of its own. The parent misses a Ctrl-C
    only in the moment a process takes to start."""
    previous = signal.getsignal(signal.SIGINT)
    if previous is None or threading.current_thread() is not threading.main_thread():
        yield  # a handler not set from Python, or a thread that may not set one: leave it be
        return
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _rank_main(fn, rank, world_size, port, backend, conn, parent_pid, args) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's: it stops every rank
    _die_with_parent(parent_pid)
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
        WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world_size),
    )
    try:
        if backend == "nccl":
            torch.cuda.set_device(rank)
        try:
            torch_dist.init_process_group(backend, rank=rank, world_size=world_size)
        except torch_dist.DistNetworkError as error:
            if "EADDRINUSE" in str(error):
                raise _PortTaken(str(error)) from None
            raise
        # Plain pickle: a tensor travels by value, not through shared memory that would
        # vanish with this process before the parent reads it.
        report: tuple = ("returned", pickle.dumps(fn(*args)))
    except BaseException as error:  # noqa: BLE001 - every failure must reach the parent
        report = ("raised", _pickled(error), type(error).__qualname__, str(error),
                  traceback.format_exc())
    conn.send_bytes(pickle.dumps(report))
    if report[0] == "raised":
        sys.stdout.flush()  # this rank ends by a signal, which would lose buffered output
        sys.stderr.flush()
        try:
            conn.recv()  # wait to be stopped: exiting now would fail the peers' collectives
        except EOFError:
            pass  # the parent is gone
    elif torch_dist.is_initialized():
        _leave_group()


def _pickled(error: BaseException) -> bytes | None:
    try:
        return pickle.dumps(error)
    except Exception:  # noqa: BLE001 - the parent then raises a LaunchError with its text
        return None


def _die_with_parent(parent_pid: int) -> None:
    """On Linux, have the kernel kill this rank when the parent dies, even by SIGKILL."""
    if not sys.platform.startswith("linux"):
        return
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(1)


@contextmanager
def process_group_from_env(backend: str = "gloo", *, alone: bool = False) -> Iterator[None]:
    """Join the process group ``torchrun`` describes (``WORLD_SIZE``, ``RANK``, ...) if none is set up.

    Leaves an existing group alone. With ``WORLD_SIZE`` unset or 1 there is nothing to join,
    unless ``alone``: then this process joins a group of one, for code that calls collectives.
    """
    world = resolve_world()[0]
    joining = (not torch_dist.is_initialized()) and (world > 1 or alone)
    if joining:
        if world > 1 or {"MASTER_ADDR", "MASTER_PORT"} <= os.environ.keys():
            torch_dist.init_process_group(backend)
        else:  # no rendezvous to meet at: a group of one needs only a port of its own
            torch_dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{free_port()}",
                                          rank=0, world_size=1)
    try:
        yield
    finally:
        if joining:
            _leave_group()


def _leave_group() -> None:
    """Destroy the default process group, after collecting what still uses it.

    A DistributedDataParallel model in a reference cycle outlives its function until the next
    garbage collection; if that comes after the group is gone (at exit), the interpreter can
    abort ("terminate called without an active exception").
    """
    gc.collect()
    torch_dist.destroy_process_group()
