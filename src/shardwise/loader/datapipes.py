"""torch's datapipes in the loader: seeded and sharded exactly as torch's DataLoader does it.

An ``IterDataPipe`` (a ``shuffle()``, a ``sharding_filter()``, ...) gets a *shared* seed each
pass, drawn from the loader's generator (and broadcast from rank 0 when a process group is up),
so every worker and rank shuffles alike and then each keeps its own shard: rank ``r``'s worker
``w`` of ``W`` keeps shard ``w * world_size + r`` of ``W * world_size``. With no workers, or with
thread workers (which read one shared stream, as no workers do), the pass keeps shard ``r`` of
``world_size``.

Example::

    >>> from torch.utils.data.datapipes.iter import IterableWrapper
    >>> from shardwise import DataLoader
    >>> pipe = IterableWrapper(range(8)).shuffle().sharding_filter()
    >>> seeded = torch.Generator().manual_seed(0)
    >>> loader = DataLoader(pipe, batch_size=None, num_workers=2, generator=seeded)
    >>> sorted(int(x) for x in loader)
    [0, 1, 2, 3, 4, 5, 6, 7]
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as torch_dist
from torch.utils.data import IterDataPipe, MapDataPipe
from torch.utils.data.dataloader import (
    _get_distributed_settings,
    _sharding_worker_init_fn,
    _share_dist_seed,
)
from torch.utils.data.graph_settings import apply_random_seed, apply_sharding


def is_datapipe(dataset: Any) -> bool:
    return isinstance(dataset, (IterDataPipe, MapDataPipe))


def draw_shared_seed(loader: Any) -> int | None:
    """A new shared seed for an ``IterDataPipe``, applied to the loader's copy; else ``None``.

    Drawn from ``loader.generator`` and, with a process group up, broadcast from rank 0 over a
    gloo group the loader makes once (every rank makes it on its first pass, as torch's does).
    """
    if not isinstance(loader.dataset, IterDataPipe):
        return None
    if torch_dist.is_available() and torch_dist.is_initialized() and loader._datapipe_group is None:
        loader._datapipe_group = torch_dist.new_group(backend="gloo")
    seed = _share_dist_seed(loader.generator, loader._datapipe_group)
    apply_shared_seed(loader.dataset, seed)
    return seed


def apply_shared_seed(dataset: Any, seed: int | None) -> None:
    """Seed every random datapipe in ``dataset``'s graph from ``seed`` (nothing when ``None``).

    ``seed`` comes from :func:`draw_shared_seed`, so it is ``None`` for anything but a datapipe.
    """
    if seed is not None:
        apply_random_seed(dataset, torch.Generator().manual_seed(seed))


def shard_for_rank(dataset: Any) -> None:
    """No worker processes: keep this rank's shard of a datapipe, as torch's loader does."""
    if is_datapipe(dataset):
        apply_sharding(dataset, *_get_distributed_settings())


def sharding_init_fn(dataset: Any, init_fn: Callable[[int], None] | None
                     ) -> Callable[[int], None] | None:
    """``init_fn`` run after the worker keeps its shard of a datapipe (``init_fn`` otherwise)."""
    if not is_datapipe(dataset):
        return init_fn
    return functools.partial(_sharding_worker_init_fn, init_fn, *_get_distributed_settings())
