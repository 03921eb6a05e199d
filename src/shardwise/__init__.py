"""shardwise: every rank its own disjoint, deterministic, resumable share of the data."""

from shardwise.dist import (
    Coverage,
    InconsistentRanksError,
    check_consistent,
    coverage,
    gather_by_index,
)
from shardwise.dist.launch import spawn_local
from shardwise.samplers import DistributedSampler

__all__ = [
    "Coverage",
    "DistributedSampler",
    "InconsistentRanksError",
    "check_consistent",
    "coverage",
    "gather_by_index",
    "spawn_local",
]
