"""Threads within one rank: how many, and an in-order map over chunks.

``pyarrow.csv`` parses without holding the GIL, so a rank that parses several chunks at once on
threads uses several cores. Ranks on one machine share its cores: each takes the cores this
process may run on (``os.sched_getaffinity``) divided by ``LOCAL_WORLD_SIZE`` (set by torchrun
and by ``spawn_local``), at least one, so the machine is not oversubscribed.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

from shardwise.checks import require_int

In = TypeVar("In")
Out = TypeVar("Out")


def rank_threads() -> int:
    """The threads one rank works with: its machine's cores shared among the local ranks.

    >>> 1 <= rank_threads() <= (os.cpu_count() or 1)
    True
    """
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    local = os.environ.get("LOCAL_WORLD_SIZE") or "1"
    try:
        local_ranks = int(local)
    except ValueError:
        raise ValueError(f"LOCAL_WORLD_SIZE={local!r} is not a number of ranks on this machine "
                         "(torchrun sets it): unset it or set it to one") from None
    return max(1, (cores or 1) // max(local_ranks, 1))


def ordered_map(fn: Callable[[In], Out], items: Iterable[In], threads: int) -> Iterator[Out]:
    """``map(fn, items)`` on ``threads`` threads: results in the items' order, each item taken
    from ``items`` (in this thread) only when a thread is about to be free for it, so at most
    ``threads + 1`` items are held at once. An exception is raised where its item's result would
    have been, one from taking an item after the results of the items before it; the items
    after it are then cancelled or waited for.

    >>> list(ordered_map(lambda x: x * x, range(5), threads=2))
    [0, 1, 4, 9, 16]
    """
    threads = require_int("threads", threads, minimum=1)
    if threads == 1:
        yield from map(fn, items)
        return
    pool = ThreadPoolExecutor(threads, thread_name_prefix="shardwise-parse")
    pending: deque[Future[Out]] = deque()
    taken, failed = iter(items), None
    try:
        while True:
            try:
                item = next(taken)
            except StopIteration:
                break
            except Exception as error:  # noqa: BLE001 - (its file gone, say): raised after
                failed = error  # the items before it answer
                break
            pending.append(pool.submit(fn, item))
            if len(pending) > threads:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()
        if failed is not None:
            raise failed
    finally:
        pool.shutdown(wait=True, cancel_futures=True)

