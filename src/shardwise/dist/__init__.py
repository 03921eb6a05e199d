"""The only package that talks to ``torch.distributed``: rank discovery and collectives."""

from shardwise.dist.consistency import InconsistentRanksError, check_consistent
from shardwise.dist.coverage import Coverage, coverage
from shardwise.dist.gather import gather_by_index
from shardwise.dist.world import resolve_world

__all__ = [
    "Coverage",
    "InconsistentRanksError",
    "check_consistent",
    "coverage",
    "gather_by_index",
    "resolve_world",
]
