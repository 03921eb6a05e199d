"""The sampler under torch's DataLoader, as people use it.

With workers, batch_size None or an int, persistent workers or not, every epoch must be exactly
torch's sampler's epoch, and a resume must continue where training stopped.
"""

from collections import Counter
from itertools import islice

import pytest
import torch
from torch.utils.data import DataLoader
from torch.utils.data import DistributedSampler as TorchSampler

from shardwise import DistributedSampler

pytestmark = pytest.mark.timeout(120)

SIZE, WORLD, RANK, SEED = 41, 3, 1, 5
LOADER_OPTIONS = [
    {"num_workers": 0, "batch_size": None},
    {"num_workers": 0, "batch_size": 4},
    {"num_workers": 2, "batch_size": None},
    {"num_workers": 2, "batch_size": 4},
    {"num_workers": 2, "batch_size": None, "persistent_workers": True},
    {"num_workers": 2, "batch_size": 4, "persistent_workers": True},
]


def torch_epoch(epoch, size=SIZE, world=WORLD, rank=RANK, **options):
    reference = TorchSampler(range(size), world, rank, seed=SEED, **options)
    reference.set_epoch(epoch)
    return list(reference)


def flat(batches):
    return [int(i) for batch in batches for i in (batch if batch.dim() else [batch])]


@pytest.mark.parametrize("options", LOADER_OPTIONS, ids=str)
def test_torch_dataloader_gives_torchs_epochs(options):
    data = torch.arange(SIZE)
    sampler = DistributedSampler(data, WORLD, RANK, seed=SEED)
    loader = DataLoader(data, sampler=sampler, **options)  # one loader for every epoch
    for epoch in (3, 0, 5):
        sampler.set_epoch(epoch)
        assert flat(loader) == torch_epoch(epoch)


@pytest.mark.parametrize("options", LOADER_OPTIONS, ids=str)
def test_without_set_epoch_each_pass_is_the_next_epoch(options):
    data = torch.arange(SIZE)
    sampler = DistributedSampler(data, WORLD, RANK, seed=SEED)
    loader = DataLoader(data, sampler=sampler, **options)
    assert [flat(loader) for _ in range(3)] == [torch_epoch(e) for e in range(3)]


@pytest.mark.parametrize("remainder", ["pad", "uneven"])
@pytest.mark.parametrize("new_world", [WORLD, 2])
def test_resume_recipe_with_workers_trains_every_index_once(remainder, new_world):
    """The documented recipe: count the samples of the batches trained, prefetch or not."""
    size, batch, steps = 100, 4, 5
    data = torch.arange(size)

    def loaders(world):
        samplers = [DistributedSampler(data, world, r, seed=SEED, remainder=remainder)
                    for r in range(world)]
        return samplers, [DataLoader(data, batch_size=batch, sampler=s, num_workers=2,
                                     prefetch_factor=3) for s in samplers]

    samplers, before = loaders(WORLD)
    trained, consumed = Counter(), 0
    for rank, loader in enumerate(before):
        for step_batch in islice(loader, steps):  # the workers have run ahead by now
            trained.update(step_batch.tolist())
            if rank == 0:
                consumed += len(step_batch)
    assert samplers[0].state_dict()["consumed"] > consumed  # the sampler handed out more
    state = samplers[0].state_dict(consumed=consumed)
    samplers, after = loaders(new_world)
    for sampler, loader in zip(samplers, after):
        sampler.load_state_dict(state)
        sampler.set_epoch(0)
        trained.update(i for b in loader for i in b.tolist())
    if remainder == "uneven":
        assert sorted(trained.elements()) == list(range(size))
    else:
        assert set(trained) == set(range(size)) and sum(trained.values()) - size < new_world


@pytest.mark.parametrize("rank", range(WORLD))
def test_uneven_state_at_the_end_of_a_pass_resumes_nothing(rank):
    """Any rank's state after the pass, a short rank's too, leaves nothing to repeat."""
    samplers = [DistributedSampler(SIZE, WORLD, r, remainder="uneven") for r in range(WORLD)]
    lengths = [len(list(s)) for s in samplers]
    assert len(set(lengths)) == 2  # 41 over 3 ranks: 14, 14, 13
    for state in (samplers[rank].state_dict(), samplers[rank].state_dict(lengths[rank])):
        for world in (WORLD, 2):
            resumed = [DistributedSampler(SIZE, world, r, remainder="uneven") for r in range(world)]
            for sampler in resumed:
                sampler.load_state_dict(state)
                sampler.set_epoch(0)  # the saved epoch's rest (without it: the next epoch, whole)
            assert [list(s) for s in resumed] == [[]] * world
