"""torch's own DistributedSampler tests, run against shardwise's sampler.

Rewritten from torch's test suite (test_dataloader.py and the distributed DDP tests): what torch
promises of its sampler, shardwise's must keep, so replacing the import is all a user does.
"""

import math

import pytest
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader

from shardwise import DistributedSampler, spawn_local


def test_invalid_rank_raises_torchs_error():
    dataset = torch.IntTensor(range(10))
    with pytest.raises(ValueError, match="Invalid rank"):
        DistributedSampler(dataset, 3, 3)
    with pytest.raises(ValueError, match="Invalid rank"):
        DistributedSampler(dataset, 3, -1)


def test_no_duplicates_with_a_loader_that_drops_its_last_batch():
    processes, size = 4, 9
    data = torch.IntTensor(range(size))
    scanned = torch.cat([
        batch
        for rank in range(processes)
        for batch in DataLoader(data, batch_size=size // processes, drop_last=True,
                                sampler=DistributedSampler(data, processes, rank))
    ])
    assert scanned.size() == scanned.unique().size()


@pytest.mark.parametrize("num_samples", [1, 5, 12])
def test_length_agrees_with_iteration_and_loaders(num_samples):
    sampler = DistributedSampler(torch.arange(num_samples * 3), 3, 1)
    assert len(sampler) == num_samples == sum(1 for _ in sampler)
    for batch_size in (1, 6):
        loader = DataLoader(torch.arange(num_samples * 3), batch_size=batch_size, sampler=sampler)
        assert len(loader) == math.ceil(num_samples / batch_size)


def _padding_checks() -> list[tuple[int, int, int]]:
    """torch's padding test, run on every rank: world and rank come from the process group."""
    world = dist.get_world_size()
    size = 100 + world + 1
    dataset = [torch.ones(1) * i for i in range(size)]
    tiny = [torch.ones(1) * i for i in range(max(world // 2 - 1, 1))]
    found = []
    for sampler, expected in (
        (DistributedSampler(dataset=dataset, drop_last=True), math.ceil((size - world) / world)),
        (DistributedSampler(dataset=dataset), math.ceil(size / world)),
        (DistributedSampler(dataset=tiny), math.ceil(len(tiny) / world)),
    ):
        assert sampler.num_samples == expected
        assert sampler.total_size == sampler.num_samples * world
        assert len(list(iter(sampler))) == sampler.num_samples
        counts = [torch.zeros(1, dtype=torch.long) for _ in range(world)]
        dist.all_gather(counts, torch.tensor([sampler.num_samples]))
        found.append(tuple(int(c) for c in counts))
    return found


@pytest.mark.timeout(120)
def test_padding_gives_every_rank_as_many_samples_over_gloo():
    for per_rank in spawn_local(_padding_checks, 3, timeout=100):
        assert all(len(set(counts)) == 1 for counts in per_rank)


def unrepeated(base: type) -> type:
    """Lightning's ``UnrepeatedDistributedSampler``, written for torch's class, on ``base``."""

    class Unrepeated(base):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.num_samples = len(range(self.rank, len(self.dataset), self.num_replicas))
            self.total_size = len(self.dataset)

        def __iter__(self):
            if self.shuffle:
                generator = torch.Generator()
                generator.manual_seed(self.seed + self.epoch)
                indices = torch.randperm(len(self.dataset), generator=generator).tolist()
            else:
                indices = list(range(len(self.dataset)))
            assert len(indices) == self.total_size
            indices = indices[self.rank:self.total_size:self.num_replicas]
            assert len(indices) == self.num_samples
            return iter(indices)

    return Unrepeated


@pytest.mark.parametrize("shuffle", [False, True])
def test_a_subclass_written_for_torchs_class_may_assign_its_sizes(shuffle):
    for rank in range(3):
        ours = unrepeated(DistributedSampler)(range(10), 3, rank, shuffle=shuffle, seed=4)
        torchs = unrepeated(torch.utils.data.DistributedSampler)(range(10), 3, rank,
                                                                 shuffle=shuffle, seed=4)
        ours.set_epoch(2)
        torchs.set_epoch(2)
        assert (len(ours), ours.num_samples, ours.total_size) == (len(torchs), 4 - (rank > 0), 10)
        assert list(DataLoader(range(10), sampler=ours)) == list(DataLoader(range(10), sampler=torchs))


def test_a_subclass_that_assigns_num_samples_but_keeps_the_pass_is_refused():
    class Shortened(DistributedSampler):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.num_samples = 2  # torch's __iter__ would fail its assertion

    sampler = Shortened(range(10), 3, 1)
    assert len(sampler) == 2
    with pytest.raises(ValueError, match="num_samples was set to 2 but rank 1's pass holds 4"):
        list(DataLoader(range(10), sampler=sampler))
    sampler.num_samples = 4  # the true share: kept
    assert list(sampler) == list(DistributedSampler(range(10), 3, 1))
