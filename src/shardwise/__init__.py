"""shardwise: every rank its own disjoint, deterministic, resumable share of the data."""

from shardwise.dist.launch import spawn_local

__all__ = ["spawn_local"]
