"""The only package that talks to ``torch.distributed``: rank discovery and collectives."""

from shardwise.distributed.consistency import InconsistentRanksError, check_consistent
from shardwise.distributed.coverage import Coverage, coverage
from shardwise.distributed.gather import gather_by_index
from shardwise.distributed.world import resolve_world

__all__ = [
    "Coverage",
    "InconsistentRanksError",
    "check_consistent",
    "coverage",
    "gather_by_index",
    "resolve_world",
]
