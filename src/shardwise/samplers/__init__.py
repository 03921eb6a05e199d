"""Samplers: thin stateful shells over :mod:`shardwise.order` and :mod:`shardwise.split`."""

from shardwise.samplers.distributed import DistributedSampler

__all__ = ["DistributedSampler"]
