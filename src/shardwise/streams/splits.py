"""Shuffle once, keep each rank's share on disk (DeepSpeed-Chat's paradigm).

``save_split`` computes every rank's indices for an epoch with :class:`shardwise.DistributedSampler`
and writes one ``.npy`` file per rank, with a small ``split.json`` that says how they were made.
``load_split`` memory-maps one rank's file: a later run, or a data pipeline that cannot afford
the shuffle, reads its share with no computation and almost no memory.

Where the ranks' shares would differ in length, the ``remainder`` decides, as in the sampler:
``"pad"`` repeats samples from the start of the order so every rank has as many (torch's way),
``"drop"`` cuts every rank to the shortest share (the last ``N mod W`` samples are left out),
``"uneven"`` keeps every sample exactly once and lets the counts differ by one.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from shardwise.checks import require_int
from shardwise.samplers.distributed import DistributedSampler

MANIFEST = "split.json"


def split_file(directory: Path, rank: int, world_size: int) -> Path:
    return directory / f"rank-{rank:05d}-of-{world_size:05d}.npy"


def save_split(
    directory: str | Path,
    size: int,
    world_size: int,
    *,
    seed: int = 0,
    epoch: int = 0,
    shuffle: bool = True,
    remainder: str = "pad",
    layout: str = "strided",
    permutation: str = "torch",
) -> list[Path]:
    """Write each of ``world_size`` ranks' indices of ``epoch`` to ``directory``; return the files.

    >>> import tempfile
    >>> folder = tempfile.mkdtemp()
    >>> [p.name for p in save_split(folder, 10, 2)]
    ['rank-00000-of-00002.npy', 'rank-00001-of-00002.npy']
    >>> load_split(folder, 1).shape
    (5,)
    """
    world_size = require_int("world_size", world_size, minimum=1)

    def rank_sampler(rank: int) -> DistributedSampler:
        sampler = DistributedSampler(size, world_size, rank, seed=seed, shuffle=shuffle,
                                     remainder=remainder, layout=layout, permutation=permutation)
        sampler.set_epoch(epoch)
        return sampler

    first = rank_sampler(0)  # every option checked before a file is written
    # As the sampler read them: plain ints (a NumPy integer given is written as one).
    manifest = {"size": first.size, "world_size": world_size, "epoch": first.epoch,
                "seed": first.seed, "shuffle": first.shuffle, "remainder": first.remainder,
                "layout": first.layout, "permutation": first.permutation}
    folder = Path(directory)
    folder.mkdir(parents=True, exist_ok=True)
    # An older split's manifest goes first and the new one comes last, whole: a split cut short
    # is never read as complete, nor new files by an old manifest.
    (folder / MANIFEST).unlink(missing_ok=True)
    paths = []
    for rank in range(world_size):  # one sampler at a time: each holds the epoch's order
        path = split_file(folder, rank, world_size)
        np.save(path, rank_sampler(rank).indices())
        paths.append(path)
    written = folder / f".{MANIFEST}.tmp"
    written.write_text(json.dumps(manifest, indent=1))
    os.replace(written, folder / MANIFEST)
    return paths


def load_split(directory: str | Path, rank: int) -> np.ndarray:
    """``rank``'s saved indices, memory-mapped (read-only int64); checks the split's manifest."""
    folder = Path(directory)
    manifest_path = folder / MANIFEST
    if not manifest_path.is_file():
        raise FileNotFoundError(f"{manifest_path} not found: save the split with save_split first")
    manifest = json.loads(manifest_path.read_text())
    world_size = manifest["world_size"]
    rank = require_int("rank", rank, minimum=0)
    if rank >= world_size:
        raise ValueError(f"the split in {folder} was saved for {world_size} ranks; rank {rank} "
                         "has no share (save it again for this world size)")
    return np.load(split_file(folder, rank, world_size), mmap_mode="r")
