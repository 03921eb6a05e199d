"""shardwise: every rank its own disjoint, deterministic, resumable share of the data."""

from shardwise.distributed import (
    Coverage,
    InconsistentRanksError,
    check_consistent,
    coverage,
    gather_by_index,
)
from shardwise.distributed.launch import spawn_local
from shardwise.loader import DataLoader, LoaderStats
from shardwise.samplers import (
    ClassBalancedSampler,
    DistributedSampler,
    DistributedSamplerWrapper,
    WeightedDistributedSampler,
)
from shardwise.streams import ShardedIterable, ShuffleBuffer, load_split, save_split, shard_iterable

__version__ = "0.2.0"  # the one place the version is written: pyproject.toml reads it from here

__all__ = [
    "ClassBalancedSampler",
    "Coverage",
    "DataLoader",
    "DistributedSampler",
    "DistributedSamplerWrapper",
    "InconsistentRanksError",
    "LoaderStats",
    "ShardedIterable",
    "ShuffleBuffer",
    "WeightedDistributedSampler",
    "__version__",
    "check_consistent",
    "coverage",
    "gather_by_index",
    "load_split",
    "save_split",
    "shard_iterable",
    "spawn_local",
]
