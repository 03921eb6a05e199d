"""Where this process stands in the job (its rank, the number of ranks, the device collectives
need) and the one small collective every module uses to compare notes."""

from __future__ import annotations

import os
from typing import Any

import torch
import torch.distributed as torch_dist

from shardwise.checks import require_int


def resolve_world(num_replicas: int | None = None, rank: int | None = None, *,
                  name: str = "num_replicas") -> tuple[int, int]:
    """Return ``(num_replicas, rank)``, filling what is ``None`` from the job.

    The initialised default process group wins; else ``WORLD_SIZE`` / ``RANK`` from the
    environment (as ``torchrun`` sets them: both, or neither for more than one rank); else a
    single process (1, 0). ``name``: what the caller calls the number of ranks, for its errors
    (samplers say ``num_replicas``, as torch's).

    >>> resolve_world(4, 2)
    (4, 2)
    >>> resolve_world(0, 0, name="world_size")
    Traceback (most recent call last):
    ...
    ValueError: world_size must be at least 1, got 0
    """
    told = num_replicas is not None, rank is not None
    if num_replicas is None:
        num_replicas = _discover("WORLD_SIZE", torch_dist.get_world_size, default=1, minimum=1)
    if rank is None:
        rank = _discover("RANK", torch_dist.get_rank, default=0, minimum=0)
    num_replicas = require_int(name, num_replicas, minimum=1, maximum=2**63 - 1)
    if not (torch_dist.is_available() and torch_dist.is_initialized()):
        _require_both(num_replicas, rank, told, name)
    rank = require_int("rank", rank)
    if not 0 <= rank < num_replicas:  # torch's DistributedSampler's words, for drop-in use
        raise ValueError(
            f"Invalid rank {rank}, rank should be in the interval [0, {num_replicas - 1}]"
        )
    return num_replicas, rank


def _require_both(num_replicas: int, rank: int, told: tuple[bool, bool], name: str) -> None:
    """Refuse a world of many ranks that does not say which one this is (nor the reverse):
    every process would take the default, rank 0's share (or a world of one). ``told``: whether
    the caller gave the number of ranks, and the rank."""
    world_set, rank_set = told[0] or "WORLD_SIZE" in os.environ, told[1] or "RANK" in os.environ
    if world_set and not rank_set and num_replicas > 1:
        given = (f"{name}={num_replicas} was given" if told[0] else
                 f"environment variable WORLD_SIZE={num_replicas} is set")
        raise ValueError(f"{given} but no rank (no RANK in the environment, no process group), so "
                         "every process would take rank 0's share: pass rank too, set RANK "
                         "(torchrun sets both), or call torch.distributed.init_process_group first")
    if not any(told) and rank_set and not world_set and rank > 0:
        raise ValueError(f"environment variable RANK={rank} is set but WORLD_SIZE is not: set "
                         "WORLD_SIZE too (torchrun sets both), call "
                         "torch.distributed.init_process_group first, or pass num_replicas and "
                         "rank")


def _discover(env_name: str, from_group, default: int, minimum: int) -> int:
    if torch_dist.is_available() and torch_dist.is_initialized():
        return int(from_group())
    text = os.environ.get(env_name)
    if text is None:
        return default
    try:
        value = int(text)
    except ValueError:
        value = minimum - 1
    if value < minimum:
        raise ValueError(f"environment variable {env_name}={text!r} is not an integer of at least "
                         f"{minimum}, as torchrun sets it: unset it to run alone")
    return value


def group_world(group: Any = None) -> tuple[int, int]:
    """``(world_size, rank)`` of this process in ``group``; ``(1, 0)`` when not distributed.

    >>> group_world()
    (1, 0)
    """
    if torch_dist.is_available() and torch_dist.is_initialized():
        rank = torch_dist.get_rank(group)
        if rank < 0:  # torch's answer for a process outside the group
            raise ValueError(f"this process (global rank {torch_dist.get_rank()}) is not a "
                             "member of the group given: call this only on the group's ranks")
        return torch_dist.get_world_size(group), rank
    if group is not None:
        raise ValueError(f"got group={group!r} but torch.distributed is not initialized; "
                         "call torch.distributed.init_process_group first")
    return 1, 0


def gather_objects(obj: Any, group: Any = None) -> list[Any]:
    """Every rank's ``obj`` (picklable), in rank order, on every rank.

    >>> gather_objects({"seed": 0})
    [{'seed': 0}]
    """
    world, _ = group_world(group)
    if world == 1:
        return [obj]
    objects: list[Any] = [None] * world
    torch_dist.all_gather_object(objects, obj, group=group)
    return objects


def collective_device(group: Any = None) -> torch.device:
    """Where tensors for a collective on ``group`` must live: NCCL needs the current GPU.

    >>> collective_device()
    device(type='cpu')
    """
    if group_world(group)[0] > 1 and torch_dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")
