"""Exact distributed evaluation on a 7-sample set over 3 ranks, batch size 2.

torch's DistributedSampler pads 7 samples to 9 so every rank runs 2 steps, and summing the
ranks' results then counts samples 0 and 1 twice. shardwise gives the single-process metric:
either put the per-sample results back in dataset order (``gather_by_index``, which also fixes
torch's own split), or weight the padding out (``padding_mask``).

    torchrun --nproc-per-node 3 examples/exact_eval.py
    python examples/exact_eval.py        # starts 3 local gloo processes itself
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
import torch.utils.data as tud

import shardwise

SAMPLES = torch.arange(1.0, 8.0)  # the samples are 1, 2, ..., 7
LABELS = torch.tensor([1, 1, 0, 1, 0, 1, 0])
BATCH = 2


class EvalSet(tud.Dataset):
    """``(index, sample, label)``: results can then be keyed by dataset index."""

    def __len__(self) -> int:
        return len(SAMPLES)

    def __getitem__(self, index: int):
        return index, SAMPLES[index], LABELS[index]


def model(samples: torch.Tensor) -> torch.Tensor:
    """A fixed one-weight classifier: class 1 below 4.5. Right on 5 of the 7 samples."""
    return (4.5 - samples > 0).long()


def correct(samples: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return (model(samples) == labels).long()


def summed(hits: torch.Tensor) -> tuple[int, int]:
    """(right, seen) over all ranks, the usual way: sum the ranks' counts."""
    totals = torch.tensor([int(hits.sum()), len(hits)])
    dist.all_reduce(totals)
    return int(totals[0]), int(totals[1])


def evaluate() -> str:
    """Run on every rank; returns the report (rank 0) or ``""``."""
    data = EvalSet()
    lines = [f"{len(data)} samples, {dist.get_world_size()} ranks, batch {BATCH}"]

    # torch's sampler: every rank 2 steps, 9 samples in all.
    sampler = tud.DistributedSampler(data, shuffle=False)
    indices, hits = [], []
    for index, samples, labels in tud.DataLoader(data, BATCH, sampler=sampler):
        indices.append(index)
        hits.append(correct(samples, labels))
    indices, hits = torch.cat(indices), torch.cat(hits)
    shares = [None] * dist.get_world_size()
    dist.all_gather_object(shares, indices.tolist())
    lines += [f"rank {rank} evaluates samples {share}" for rank, share in enumerate(shares)]
    lines.append("coverage of torch's split: " + str(shardwise.coverage(indices, len(data))))
    right, seen = summed(hits)
    lines.append(_row("torch DistributedSampler, summed", right, seen))

    # Fix 1: the same results, put back in dataset order, each sample once.
    exact = shardwise.gather_by_index(hits, indices, len(data))
    lines.append(_row("shardwise.gather_by_index", int(exact.sum()), len(exact)))

    # Fix 2: shardwise's padded split, the padding weighted out; still 2 steps on every rank.
    sampler = shardwise.DistributedSampler(data, shuffle=False, remainder="pad")
    shardwise.check_consistent(sampler)
    real = ~torch.from_numpy(sampler.padding_mask())
    hits = torch.cat([correct(samples, labels) for _, samples, labels
                      in tud.DataLoader(data, BATCH, sampler=sampler)])
    right, seen = summed(hits[real])
    lines.append(_row("shardwise padding_mask", right, seen))
    return "\n".join(lines) if dist.get_rank() == 0 else ""


def _row(method: str, right: int, seen: int) -> str:
    return f"{method + ':':36} accuracy {right}/{seen} = {right / seen:.4f} ({seen} samples seen)"


def main() -> None:
    if "RANK" in os.environ:  # under torchrun
        dist.init_process_group("gloo")
        try:
            report = evaluate()
        finally:
            dist.destroy_process_group()
        if report:
            print(report)
    else:
        print(shardwise.spawn_local(evaluate, 3, timeout=120)[0])


if __name__ == "__main__":
    main()
