"""Parallel file loading: many text files split over ranks by bytes, parsed, hashed to owners.

``plan`` cuts the bytes, ``read_lines`` / ``iter_chunks`` read a rank's share.
"""

from shardwise.files.plan import Plan, plan
from shardwise.files.read import Chunk, iter_chunks, read_bytes, read_lines

__all__ = ["Chunk", "Plan", "iter_chunks", "plan", "read_bytes", "read_lines"]
