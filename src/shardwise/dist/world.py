"""Where this process stands in the job: its rank and the number of ranks."""

from __future__ import annotations

import os

import torch.distributed as torch_dist

from shardwise.checks import require_int


def resolve_world(num_replicas: int | None = None, rank: int | None = None) -> tuple[int, int]:
    """Return ``(num_replicas, rank)``, filling what is ``None`` from the job.

    The initialised default process group wins; else ``WORLD_SIZE`` / ``RANK`` from the
    environment (as ``torchrun`` sets them); else a single process (1, 0).

    >>> resolve_world(4, 2)
    (4, 2)
    """
    if num_replicas is None:
        num_replicas = _discover("WORLD_SIZE", torch_dist.get_world_size, default=1)
    if rank is None:
        rank = _discover("RANK", torch_dist.get_rank, default=0)
    num_replicas = require_int("num_replicas", num_replicas, minimum=1)
    rank = require_int("rank", rank)
    if not 0 <= rank < num_replicas:
        raise ValueError(
            f"rank must be in [0, {num_replicas}) for num_replicas={num_replicas}, got {rank}"
        )
    return num_replicas, rank


def _discover(env_name: str, from_group, default: int) -> int:
    if torch_dist.is_available() and torch_dist.is_initialized():
        return int(from_group())
    value = os.environ.get(env_name)
    if value is None:
        return default
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"environment variable {env_name}={value!r} is not an integer") from None
