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
from shardwise.samplers import DistributedSampler

__version__ = "0.2.0"  # the one place the version is written: pyproject.toml reads it from here

__all__ = [
    "__version__",
    "Coverage",
    "DataLoader",
    "DistributedSampler",
    "InconsistentRanksError",
    "LoaderStats",
    "check_consistent",
    "coverage",
    "gather_by_index",
    "spawn_local",
]
