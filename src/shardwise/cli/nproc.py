"""``--nproc N``: local gloo ranks started by ``shardwise load`` and ``shardwise demo``, bounded
so that a typo cannot start a million Python processes."""

from __future__ import annotations

import os

RANKS_PER_CORE = 4  # a rank mostly waits on its peers and files; more only thrash the machine
FEWEST_ALLOWED = 8  # even a small machine may run a few ranks to try a job out


def most_local_ranks() -> int:
    """The most local ranks ``--nproc`` may start on this machine."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(FEWEST_ALLOWED, RANKS_PER_CORE * (cores or 1))


def check_nproc(nproc: int) -> None:
    """Refuse an ``--nproc`` below 1, or above what this machine runs well.

    >>> check_nproc(2)
    >>> check_nproc(0)
    Traceback (most recent call last):
    ValueError: --nproc must be at least 1, got 0
    """
    if nproc < 1:
        raise ValueError(f"--nproc must be at least 1, got {nproc}")
    most = most_local_ranks()
    if nproc > most:
        raise ValueError(
            f"--nproc {nproc:,} would start more local processes than this machine runs well: "
            f"at most {most} ({RANKS_PER_CORE} per CPU core, at least {FEWEST_ALLOWED}); for "
            "more ranks, run under torchrun across machines")
