"""Each pass is a snapshot: fixed when made, counted only once it is asked for an index; once
set_epoch is called, passes keep its epoch, as torch's do."""

import copy
import pickle
from itertools import islice

import pytest
from torch.utils.data import DistributedSampler as TorchSampler

from shardwise import DistributedSampler


def torch_epoch(size, world, rank, epoch, **options):
    reference = TorchSampler(range(size), world, rank, **options)
    reference.set_epoch(epoch)
    return list(reference)


def test_set_epoch_during_a_pass_leaves_that_pass_alone():
    size = 200_000
    sampler = DistributedSampler(size, 2, 0, seed=1)
    iterator = iter(sampler)
    first_half = list(islice(iterator, size // 4))
    sampler.set_epoch(7)
    rest = list(iterator)
    assert first_half + rest == torch_epoch(size, 2, 0, 0, seed=1)
    assert len(set(first_half + rest)) == size // 2
    assert list(sampler) == torch_epoch(size, 2, 0, 7, seed=1)  # the next pass takes epoch 7


def test_a_second_iterator_does_not_disturb_the_first():
    sampler = DistributedSampler(1000, 3, 2, seed=4)
    first = iter(sampler)
    head = list(islice(first, 100))
    second = list(sampler)  # a new pass while the first is live: the next epoch
    assert head + list(first) == torch_epoch(1000, 3, 2, 0, seed=4)
    assert second == torch_epoch(1000, 3, 2, 1, seed=4)


def test_load_state_dict_during_a_pass_leaves_that_pass_alone():
    sampler = DistributedSampler(500, 2, 1, seed=2)
    other = DistributedSampler(500, 2, 1, seed=2)
    other.set_epoch(3)
    list(islice(iter(other), 40))
    iterator = iter(sampler)
    head = list(islice(iterator, 10))
    sampler.load_state_dict(other.state_dict())
    assert head + list(iterator) == torch_epoch(500, 2, 1, 0, seed=2)
    assert list(sampler) == torch_epoch(500, 2, 1, 3, seed=2)[40:]


def test_iterators_never_asked_for_an_index_do_not_count():
    sampler = DistributedSampler(90, 3, 1, seed=5)
    for _ in range(4):
        iter(sampler)  # made and dropped, as torch's DataLoader does with its first
    assert list(sampler) == torch_epoch(90, 3, 1, 0, seed=5)
    for _ in range(3):
        iter(sampler)
    assert list(sampler) == torch_epoch(90, 3, 1, 1, seed=5)


def test_two_iterators_made_before_either_begins_take_the_same_epoch():
    sampler = DistributedSampler(60, 2, 0, seed=9)
    a, b = iter(sampler), iter(sampler)
    assert list(a) == list(b) == torch_epoch(60, 2, 0, 0, seed=9)
    assert sampler.epoch == 0


def test_an_empty_pass_counts_once_asked():
    sampler = DistributedSampler(1, 2, 1, remainder="uneven")  # rank 1 has nothing
    assert len(sampler) == 0
    assert list(sampler) == [] and sampler.epoch == 0
    assert list(sampler) == [] and sampler.epoch == 1


def test_state_dict_follows_the_pass_that_began_last():
    sampler = DistributedSampler(100, 2, 0, seed=3)
    stale = iter(sampler)
    next(stale)
    sampler.set_epoch(4)
    fresh = iter(sampler)
    list(islice(fresh, 7))
    next(stale)  # the stale pass goes on with epoch 0 but no longer moves the sampler
    state = sampler.state_dict()
    assert (state["epoch"], state["consumed"]) == (4, 7)


def test_torchs_attributes_behave_as_torchs():
    sampler = DistributedSampler(dataset=list(range(11)), num_replicas=4, rank=3, seed=6)
    reference = TorchSampler(dataset=list(range(11)), num_replicas=4, rank=3, seed=6)
    assert isinstance(sampler, TorchSampler)
    for name in ("num_samples", "total_size", "epoch", "seed", "shuffle", "drop_last",
                 "num_replicas", "rank"):
        assert getattr(sampler, name) == getattr(reference, name), name
    sampler.epoch = 2  # as torch's set_epoch does
    reference.epoch = 2
    assert list(sampler) == list(reference)


def test_a_copy_keeps_the_position_but_not_the_live_pass():
    sampler = DistributedSampler(50, 2, 0, seed=8)
    sampler.load_state_dict({**sampler.state_dict(), "consumed": 5})
    iterator = iter(sampler)
    next(iterator)
    for clone in (copy.deepcopy(sampler), pickle.loads(pickle.dumps(sampler))):
        assert clone.state_dict(consumed=0) == sampler.state_dict(consumed=0)
    assert len(list(iterator)) == 19


@pytest.mark.parametrize("permutation", ["torch", "feistel"])
def test_every_epoch_restarts_after_set_epoch_even_mid_pass(permutation):
    sampler = DistributedSampler(40, 2, 1, seed=0, permutation=permutation)
    sampler.set_epoch(2)
    whole = list(sampler)
    iterator = iter(sampler)
    next(iterator)
    sampler.set_epoch(2)  # a pass of epoch 2 is live: the next one is epoch 2 whole
    assert list(sampler) == whole


def test_once_set_epoch_is_called_passes_keep_its_epoch_as_torchs_do():
    sampler = DistributedSampler(40, 2, 1, seed=3)
    assert [list(sampler) for _ in range(2)] == [torch_epoch(40, 2, 1, e, seed=3) for e in (0, 1)]
    sampler.set_epoch(5)
    left = iter(sampler)
    next(left)  # a pass left after one index, as torchdata's loader leaves one on a resume
    assert [list(sampler) for _ in range(2)] == [torch_epoch(40, 2, 1, 5, seed=3)] * 2
    assert sampler.epoch == 5


def test_set_epoch_with_the_saved_epoch_before_an_ended_state_gives_its_empty_rest():
    saving = DistributedSampler(30, 3, 0, seed=4)
    saving.set_epoch(2)
    list(saving)
    state = saving.state_dict()  # saved as epoch 2 ended
    for set_first in (False, True):
        sampler = DistributedSampler(30, 3, 0, seed=4)
        if set_first:  # torchdata's loader loads a sampler's state after the caller's set_epoch
            sampler.set_epoch(2)
            sampler.load_state_dict(state)
        else:
            sampler.load_state_dict(state)
            sampler.set_epoch(2)
        assert list(sampler) == [], set_first
        sampler.set_epoch(3)
        assert list(sampler) == torch_epoch(30, 3, 0, 3, seed=4)


def test_set_epoch_with_the_epoch_of_a_live_pass_leaves_it_counting():
    sampler = DistributedSampler(40, 2, 1, seed=3)
    iterator = iter(sampler)  # Lightning makes the pass, then calls set_epoch
    taken = list(islice(iterator, 6))
    sampler.set_epoch(0)
    assert sampler.state_dict()["consumed"] == 6  # not cut loose: a checkpoint sees the pass
    assert taken + list(iterator) == torch_epoch(40, 2, 1, 0, seed=3)
    assert list(sampler) == torch_epoch(40, 2, 1, 0, seed=3)  # the next pass: epoch 0 whole


def test_set_epoch_after_a_resumed_pass_ran_out_describes_the_whole_epoch():
    saved = DistributedSampler(20, 2, 0, seed=1)
    list(islice(iter(saved), 3))
    sampler = DistributedSampler(20, 2, 0, seed=1)
    sampler.load_state_dict(saved.state_dict())
    sampler.set_epoch(0)
    assert len(list(sampler)) == 7  # the rest of epoch 0
    sampler.set_epoch(0)  # epoch 0 again, whole, and said so before the pass begins
    assert sampler.pass_length == 10 == len(sampler.indices())
    assert list(sampler) == torch_epoch(20, 2, 0, 0, seed=1)


def test_placement_changes_when_set_epoch_begins_an_epoch_anew_and_only_then():
    sampler = DistributedSampler(40, 2, 1, seed=3)
    start = sampler.placement
    iterator = iter(sampler)
    list(islice(iterator, 6))
    sampler.set_epoch(0)  # the epoch a live pass stands in: it goes on counting
    assert sampler.placement == start
    sampler.set_epoch(1)
    sampler.set_epoch(0)  # left and set again: epoch 0 begins whole, in another placement
    assert sampler.placement[0] == 0 and sampler.placement != start
    assert sampler.state_dict()["consumed"] == 0
