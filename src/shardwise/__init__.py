"""shardwise: every rank its own disjoint, deterministic, resumable share of the data."""

from shardwise.dist.launch import spawn_local
from shardwise.samplers import DistributedSampler

__all__ = ["DistributedSampler", "spawn_local"]
