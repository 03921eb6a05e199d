"""The sampler under torchdata's StatefulDataLoader: its epochs, and its mid-epoch resume."""

from itertools import islice

import pytest
import torch

from shardwise import DistributedSampler
from tests.samplers.test_real_loaders import (
    LOADER_OPTIONS,
    RANK,
    SEED,
    SIZE,
    WORLD,
    flat,
    torch_epoch,
)

pytestmark = pytest.mark.timeout(120)

torchdata = pytest.importorskip("torchdata.stateful_dataloader")


@pytest.mark.parametrize("options", LOADER_OPTIONS[:4], ids=str)
def test_stateful_dataloader_resumes_mid_epoch(options):
    data = torch.arange(SIZE)
    sampler = DistributedSampler(data, WORLD, RANK, seed=SEED)
    loader = torchdata.StatefulDataLoader(data, sampler=sampler, **options)
    sampler.set_epoch(2)
    seen, saved, cut = [], None, 0
    for step, batch in enumerate(loader):
        seen.extend(flat([batch]))
        if step == 2:
            saved, cut = loader.state_dict(), len(seen)
    assert seen == torch_epoch(2)

    sampler = DistributedSampler(data, WORLD, RANK, seed=SEED)
    loader = torchdata.StatefulDataLoader(data, sampler=sampler, **options)
    loader.load_state_dict(saved)
    sampler.set_epoch(2)
    assert flat(loader) == seen[cut:]  # the restored position survives the loader's iter() calls
    sampler.set_epoch(3)
    assert flat(loader) == torch_epoch(3)


@pytest.mark.parametrize("options", LOADER_OPTIONS[:4], ids=str)
def test_stateful_dataloader_epochs_without_set_epoch(options):
    data = torch.arange(SIZE)
    sampler = DistributedSampler(data, WORLD, RANK, seed=SEED)
    loader = torchdata.StatefulDataLoader(data, sampler=sampler, **options)
    assert [flat(loader) for _ in range(3)] == [torch_epoch(e) for e in range(3)]


def _sampler_and_loader(options, state=None):
    """A shardwise sampler under torchdata's loader, the loader given ``state`` if any."""
    data = torch.arange(SIZE)
    sampler = DistributedSampler(data, WORLD, RANK, seed=SEED)
    loader = torchdata.StatefulDataLoader(data, sampler=sampler, **options)
    if state is not None:
        loader.load_state_dict(state)
    return sampler, loader


def _epoch_0_then_state(options, at_last_batch):
    """A loader over epoch 0 and its state taken at the last batch, or after the epoch ended."""
    sampler, loader = _sampler_and_loader(options)
    sampler.set_epoch(0)
    batches = len(loader)
    for step, _ in enumerate(loader):
        if at_last_batch and step == batches - 1:
            break
    return _sampler_and_loader(options, loader.state_dict())


@pytest.mark.parametrize("options", LOADER_OPTIONS[:4], ids=str)
def test_a_state_taken_at_the_last_batch_resumes_as_torchdatas_own_sampler_does(options):
    sampler, loader = _epoch_0_then_state(options, at_last_batch=True)
    epochs = []
    for epoch in range(3):  # the state loads inside iter(), after set_epoch(0)
        sampler.set_epoch(epoch)
        epochs.append(flat(loader))
    assert epochs == [[], torch_epoch(1), torch_epoch(2)]  # epoch 1 once, not twice


@pytest.mark.parametrize("options", LOADER_OPTIONS[:4], ids=str)
@pytest.mark.parametrize("first", [0, 1])
def test_a_state_taken_after_the_epoch_ended_resumes_with_the_epoch_set(options, first):
    sampler, loader = _epoch_0_then_state(options, at_last_batch=False)
    epochs = []
    for epoch in range(first, 3):  # the loader prefetches from a pass it then drops
        sampler.set_epoch(epoch)
        epochs.append(flat(loader))
    assert epochs == [[], torch_epoch(1), torch_epoch(2)][first:]


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("first", [0, 1])
def test_an_epoch_whose_last_batch_was_dropped_is_not_trained_again(workers, first):
    """A share of 14 in batches of 4, drop_last: torchdata's last snapshot says 12 used, and
    resuming the pass that ended draws the 2 left and drops them before the epoch set begins."""
    options = {"num_workers": workers, "batch_size": 4, "drop_last": True}
    sampler, loader = _epoch_0_then_state(options, at_last_batch=False)
    epochs = []
    for epoch in range(first, 3):
        sampler.set_epoch(epoch)
        epochs.append(flat(loader))
    assert epochs == [[], torch_epoch(1)[:12], torch_epoch(2)[:12]][first:]


@pytest.mark.parametrize("options", LOADER_OPTIONS[:4], ids=str)
def test_a_checkpoint_between_iter_and_set_epoch_sees_the_pass(options):
    """Lightning's order: iter(loader), then set_epoch; a checkpoint on the epoch's last step."""
    sampler, loader = _sampler_and_loader(options)
    batches = iter(loader)
    sampler.set_epoch(0)
    trained = flat(next(batches) for _ in range(len(loader)))
    sampler, loader = _sampler_and_loader(options, loader.state_dict())
    batches = iter(loader)
    sampler.set_epoch(1)
    assert (trained, flat(batches)) == (torch_epoch(0), torch_epoch(1))


@pytest.mark.parametrize("options", LOADER_OPTIONS[:4], ids=str)
def test_len_stays_the_epochs_through_a_resume_as_trainers_read_it_once(options):
    sampler, loader = _sampler_and_loader(options)
    whole = len(loader)
    sampler.set_epoch(0)
    batches = iter(loader)
    head = flat(next(batches) for _ in range(2))
    sampler, loader = _sampler_and_loader(options, loader.state_dict())
    sampler.set_epoch(0)
    rest = flat(loader)
    steps = len(loader)  # Lightning reads it once, and takes at most that many in later epochs
    sampler.set_epoch(1)
    assert (head + rest, steps) == (torch_epoch(0), whole)
    assert flat(islice(loader, steps)) == torch_epoch(1)  # not cut to the resumed pass's count
