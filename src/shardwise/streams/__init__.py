"""Data that is read as a stream: split over ranks and workers, shuffled locally, or split once.

Files as shards (``line_shards``, ``row_group_shards``) are in :mod:`shardwise.streams.files`,
which needs pyarrow and fsspec; ``import shardwise`` does not load them.
"""

from shardwise.streams.sharded import ShardedIterable, shard_iterable
from shardwise.streams.shuffle import ShuffleBuffer
from shardwise.streams.splits import load_split, save_split

__all__ = ["ShardedIterable", "ShuffleBuffer", "load_split", "save_split", "shard_iterable"]
