"""``shardwise.DataLoader``: torch's loader, argument for argument, resumable and faster."""

from shardwise.loader.dataloader import DataLoader
from shardwise.loader.stats import LoaderStats, WorkerStats

__all__ = ["DataLoader", "LoaderStats", "WorkerStats"]
