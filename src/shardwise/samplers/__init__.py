"""Samplers: thin stateful shells over :mod:`shardwise.order` and :mod:`shardwise.split`."""

from shardwise.samplers.class_balanced import ClassBalancedSampler
from shardwise.samplers.distributed import DistributedSampler
from shardwise.samplers.weighted import WeightedDistributedSampler
from shardwise.samplers.wrapper import DistributedSamplerWrapper

__all__ = ["ClassBalancedSampler", "DistributedSampler", "DistributedSamplerWrapper",
           "WeightedDistributedSampler"]
