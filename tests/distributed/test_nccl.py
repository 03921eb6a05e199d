"""The collectives over NCCL on every local GPU; skipped where there is none (CI has none)."""

import pytest
import torch
import torch.distributed as dist

from shardwise import DistributedSampler, check_consistent, coverage, gather_by_index, spawn_local
from shardwise.distributed.exchange import all_to_all_bytes

pytestmark = pytest.mark.skipif(
    not (torch.cuda.is_available() and dist.is_nccl_available()), reason="needs a GPU and NCCL"
)


def _on_gpus() -> dict:
    world, rank = dist.get_world_size(), dist.get_rank()
    sampler = DistributedSampler(1001, seed=3)  # padded: some indices on two ranks
    check_consistent(sampler)
    indices = torch.from_numpy(sampler.indices()).cuda()
    values = (indices * 10).to(torch.float16)  # a dtype NCCL moves as bytes
    gathered = gather_by_index(values, indices, 1001)
    received = all_to_all_bytes([bytes([rank, dst]) * (dst + 1) for dst in range(world)])
    return {
        "device": gathered.device.type,
        "exact": torch.equal(gathered.cpu(), (torch.arange(1001) * 10).to(torch.float16)),
        "coverage": coverage(indices, 1001),
        "received": [bytes(r) for r in received],
    }


def test_gather_coverage_and_exchange_over_nccl():
    world = torch.cuda.device_count()
    for rank, out in enumerate(spawn_local(_on_gpus, world, backend="nccl")):
        assert out["device"] == "cuda" and out["exact"]
        assert out["coverage"].missed == 0
        assert out["received"] == [bytes([src, rank]) * (rank + 1) for src in range(world)]
