"""Data that is read as a stream: split over ranks and workers, shuffled locally, or split once."""

from shardwise.streams.sharded import ShardedIterable, shard_iterable
from shardwise.streams.shuffle import ShuffleBuffer
from shardwise.streams.splits import load_split, save_split

__all__ = ["ShardedIterable", "ShuffleBuffer", "load_split", "save_split", "shard_iterable"]
