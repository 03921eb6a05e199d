"""What every rank of ``shardwise demo`` does, in order; rank 0 gets every rank's figures back.

1. Load: the files are split over the ranks by bytes, parsed, and each vector sent to the rank
   that owns its id. The set is small, so the ranks then gather it whole for training.
2. Train: DistributedDataParallel through ``shardwise.DataLoader`` with a
   ``ClassBalancedSampler``: every batch holds every class, however rare.
3. Evaluate: exactly (each sample once, ``gather_by_index``) and as torch's padded
   ``DistributedSampler`` would (its repeats counted twice).
4. Resume elastically: an epoch over the training set stops half-way on all the ranks, its
   state is saved, and one rank fewer finishes it from the state: every sample exactly once.
"""

from __future__ import annotations

import copy
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.algorithms import Join
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DistributedSampler as TorchDistributedSampler
from torch.utils.data import TensorDataset

from shardwise import (
    ClassBalancedSampler,
    DataLoader,
    DistributedSampler,
    check_consistent,
    coverage,
    gather_by_index,
)
from shardwise.demo.data import CLASS_SHARES, write_dataset
from shardwise.distributed.world import gather_objects
from shardwise.files import load_vectors

FEATURES, CLASSES = 8, len(CLASS_SHARES)
BATCH = 4 * CLASSES  # a multiple of the classes: every class in every batch
# Per rank, 32 samples to train (two whole batches, so the resume stops after the first) and 8
# to evaluate; more than a million would no longer be a demo's small set, gathered on every rank.
FEWEST_SAMPLES_PER_RANK, MOST_SAMPLES = 40, 1_000_000


def check_samples(samples: int, world: int) -> None:
    """Refuse a ``--samples`` the demo cannot run on ``world`` ranks.

    >>> check_samples(3001, 3)
    >>> check_samples(10, 3)
    Traceback (most recent call last):
    ValueError: --samples must be in [120, 1,000,000] for 3 ranks (40 a rank), got 10
    """
    fewest = FEWEST_SAMPLES_PER_RANK * world
    if not fewest <= samples <= MOST_SAMPLES:
        raise ValueError(f"--samples must be in [{fewest:,}, {MOST_SAMPLES:,}] for {world:,} "
                         f"rank{'s' if world > 1 else ''} ({FEWEST_SAMPLES_PER_RANK} a rank), "
                         f"got {samples:,}")


def run_rank(options: dict[str, Any]) -> dict[str, Any] | None:
    """This rank's part of the demo; rank 0 returns everyone's figures, the others ``None``."""
    world, rank = dist.get_world_size(), dist.get_rank()
    torch.manual_seed(options["seed"])  # the same initial model on every rank
    folder = Path(options["workdir"])
    if int(os.environ.get("LOCAL_RANK", rank)) == 0:  # one copy per machine: the same bytes
        write_dataset(folder, options["samples"], FEATURES, seed=options["seed"])
    dist.barrier()
    started = time.perf_counter()
    report: dict[str, Any] = {"world": world}
    x, y, report["load"] = _load(folder)
    training = np.flatnonzero(np.arange(len(y)) % 5 != 0)  # 80% to train, 20% to evaluate
    evaluation = np.flatnonzero(np.arange(len(y)) % 5 == 0)
    model = torch.nn.Sequential(torch.nn.Linear(FEATURES, 32), torch.nn.ReLU(),
                                torch.nn.Linear(32, CLASSES))
    report["train"] = _train(model, x, y, training, options)
    report["evaluate"] = _evaluate(model, x, y, evaluation)
    report["resume"] = _resume_elastically(model, x, y, training)
    report["seconds"] = time.perf_counter() - started
    dist.barrier()  # every rank done before any leaves the process group
    return report if rank == 0 else None


def _load(folder: Path) -> tuple[torch.Tensor, torch.Tensor, list[dict[str, Any]]]:
    vectors = load_vectors(folder, features=FEATURES + 1)  # the label, then the features
    stats = vectors.stats
    mine = {"bytes": stats.bytes_read, "lines": stats.lines, "owned": len(vectors.ids)}
    parts = gather_objects((vectors.ids, vectors.values))  # small: every rank takes all of it
    ids = np.concatenate([p[0] for p in parts])
    values = np.concatenate([p[1] for p in parts])[np.argsort(ids)]
    x = torch.from_numpy(values[:, 1:]).float()
    y = torch.from_numpy(values[:, 0]).long()
    return x, y, gather_objects(mine)


def _train(model, x, y, training, options) -> list[dict[str, Any]]:
    """Class-balanced DDP training; each rank's samples and its batches' classes, per epoch."""
    ddp = DistributedDataParallel(model)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.05)
    data = TensorDataset(torch.from_numpy(training), x[training], y[training])
    present = len(torch.unique(y[training]))  # a small set may lack the rarest class
    sampler = ClassBalancedSampler(y[training], seed=options["seed"])
    loader = DataLoader(data, batch_size=BATCH, sampler=sampler, drop_last=True,
                        progress=options["progress"])
    figures = []
    for epoch in range(options["epochs"]):
        sampler.set_epoch(epoch)
        samples, batches, complete, drawn = 0, 0, 0, np.zeros(CLASSES, dtype=np.int64)
        for _, features, labels in loader:
            loss = _step(ddp, optimizer, features, labels)
            samples, batches = samples + len(labels), batches + 1
            complete += len(torch.unique(labels)) == present
            drawn += np.bincount(labels.numpy(), minlength=CLASSES)
        figures.append({"epoch": epoch, "samples": samples, "batches": batches,
                        "complete": complete, "drawn": drawn.tolist(), "loss": loss.item()})
    return gather_objects(figures)


def _evaluate(model, x, y, evaluation) -> dict[str, Any]:
    """Accuracy counted each sample once, and as torch's padded sampler counts it."""
    data = TensorDataset(torch.arange(len(evaluation)), x[evaluation], y[evaluation])
    model.eval()
    with torch.no_grad():
        exact = DistributedSampler(data, shuffle=False)
        check_consistent(exact)
        positions, right = [], []
        for position, features, labels in DataLoader(data, batch_size=64, sampler=exact):
            positions.append(position)
            right.append(model(features).argmax(1) == labels)
        everyone = gather_by_index(torch.cat(right), torch.cat(positions), len(data))
        padded = TorchDistributedSampler(data, shuffle=False)  # torch's: pads with repeats
        counted = torch.zeros(2)
        for _, features, labels in DataLoader(data, batch_size=64, sampler=padded):
            counted += torch.tensor([float((model(features).argmax(1) == labels).sum()),
                                     float(len(labels))])
        dist.all_reduce(counted)
    model.train()
    return {"samples": len(data), "exact_right": int(everyone.sum()),
            "padded_right": int(counted[0]), "padded_seen": int(counted[1])}


def _resume_elastically(model, x, y, training) -> dict[str, Any]:
    """Half an epoch on every rank, a saved state, the rest on one rank fewer: each sample once."""
    world, rank = dist.get_world_size(), dist.get_rank()
    data = TensorDataset(torch.from_numpy(np.arange(len(training))), x[training], y[training])
    if world < 2:
        return {"skipped": "one rank cannot lose a rank"}
    sampler = DistributedSampler(data, seed=1, remainder="uneven")
    loader = DataLoader(data, batch_size=BATCH, sampler=sampler)
    ddp = DistributedDataParallel(copy.deepcopy(model))
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.01)
    half = len(loader) // 2
    seen, state = [], None
    with Join([ddp]):
        for step, (position, features, labels) in enumerate(loader):
            _step(ddp, optimizer, features, labels)
            seen.append(position)
            if step + 1 == half:
                state = loader.state_dict()  # what was trained so far, not what was prefetched
                break
    # The checkpoint: rank 0's model and loader state, sent to every rank (as if from storage).
    checkpoint = [{"model": ddp.module.state_dict(), "loader": state}]
    dist.broadcast_object_list(checkpoint, src=0)
    before = torch.cat(seen)
    survivors = dist.new_group(list(range(world - 1)))  # the last rank leaves the job
    after = torch.empty(0, dtype=torch.long)
    if rank < world - 1:
        model = copy.deepcopy(model)
        model.load_state_dict(checkpoint[0]["model"])
        resumed = DistributedSampler(data, num_replicas=world - 1, rank=rank, seed=1,
                                     remainder="uneven")
        check_consistent(resumed, group=survivors)  # the new world's ranks agree
        loader = DataLoader(data, batch_size=BATCH, sampler=resumed, verify=False)
        loader.load_state_dict(checkpoint[0]["loader"])  # rank 0's state resumes every rank
        ddp = DistributedDataParallel(model, process_group=survivors)
        optimizer = torch.optim.SGD(ddp.parameters(), lr=0.01)
        rest = []
        with Join([ddp]):
            for position, features, labels in loader:
                _step(ddp, optimizer, features, labels)
                rest.append(position)
        after = torch.cat(rest) if rest else after
    dist.barrier()
    everything = coverage(torch.cat([before, after]), len(data))
    counts = gather_objects({"before": len(before), "after": len(after)})
    return {"ranks_before": world, "ranks_after": world - 1, "steps_before": half,
            "per_rank": counts, "missed": everything.missed, "repeated": everything.repeated,
            "samples": len(data), "exact": everything.exact}


def _step(model, optimizer, features, labels) -> torch.Tensor:
    loss = F.cross_entropy(model(features), labels)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return loss
