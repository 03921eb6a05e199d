"""Run a function on N local processes in one process group (gloo by default) on 127.0.0.1.

Used by ``shardwise load --nproc``, by the examples when they are not under ``torchrun``,
and by the tests, so every distributed code path runs over a real process group.
"""

from __future__ import annotations

import os
import pickle
import queue as queue_module
import socket
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.distributed as torch_dist
import torch.multiprocessing as mp


class LaunchError(RuntimeError):
    """A spawned rank failed; the message carries its traceback or exit code."""


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

    >>> spawn_local(torch_dist.get_rank, 2)  # doctest: +SKIP
    [0, 1]
    """
    if nprocs < 1:
        raise ValueError(f"nprocs must be at least 1, got {nprocs}")
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = free_port()
    procs = [
        ctx.Process(
            target=_rank_main, args=(fn, rank, nprocs, port, backend, results, args), daemon=True
        )
        for rank in range(nprocs)
    ]
    for proc in procs:
        proc.start()
    outputs: dict[int, Any] = {}
    failures: list[str] = []
    try:
        while len(outputs) + len(failures) < nprocs:
            try:
                rank, ok, value = results.get(timeout=timeout)
            except queue_module.Empty:
                dead = [f"rank {r} exit code {p.exitcode}" for r, p in enumerate(procs)
                        if p.exitcode not in (None, 0)]
                raise LaunchError(
                    f"no result from {nprocs - len(outputs)} rank(s) within {timeout:.0f} s"
                    + (f" ({', '.join(dead)})" if dead else " (a collective may hang)")
                ) from None
            if ok:
                outputs[rank] = pickle.loads(value)
            else:
                failures.append(f"rank {rank} raised:\n{value}")
                break  # the other ranks may now block in a collective; stop them
    finally:
        for proc in procs:
            proc.join(timeout=0 if failures else 10)
            if proc.is_alive():
                proc.terminate()
                proc.join()
    if failures:
        raise LaunchError("\n".join(failures))
    return [outputs[rank] for rank in range(nprocs)]


def _rank_main(fn, rank, world_size, port, backend, results, args) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
        WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank),
    )
    try:
        if backend == "nccl":
            torch.cuda.set_device(rank)
        torch_dist.init_process_group(backend, rank=rank, world_size=world_size)
        # Plain pickle: a tensor travels by value, not through shared memory that would
        # vanish with this process before the parent reads it.
        results.put((rank, True, pickle.dumps(fn(*args))))
    except BaseException:  # noqa: BLE001 - every failure must reach the parent
        results.put((rank, False, traceback.format_exc()))
    finally:
        if torch_dist.is_initialized():
            torch_dist.destroy_process_group()


@contextmanager
def process_group_from_env(backend: str = "gloo") -> Iterator[None]:
    """Join the process group ``torchrun`` describes (``WORLD_SIZE``, ``RANK``, ...) if none is set up.

    Leaves an existing group alone; with ``WORLD_SIZE`` unset or 1 there is nothing to join.
    """
    joining = (not torch_dist.is_initialized()) and int(os.environ.get("WORLD_SIZE", "1")) > 1
    if joining:
        torch_dist.init_process_group(backend)
    try:
        yield
    finally:
        if joining:
            torch_dist.destroy_process_group()
