"""ShuffleBuffer: a deterministic local shuffle that resumes exactly; save_split / load_split."""

from itertools import islice

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardwise import DistributedSampler, ShuffleBuffer, load_split, save_split, shard_iterable


@settings(max_examples=80, deadline=None)
@given(size=st.integers(0, 200), buffer=st.integers(1, 50), seed=st.integers(0, 1000))
def test_every_item_once_and_the_same_for_the_same_seed(size, buffer, seed):
    shuffled = list(ShuffleBuffer(range(size), buffer, seed))
    assert sorted(shuffled) == list(range(size))
    assert shuffled == list(ShuffleBuffer(range(size), buffer, seed))


def test_items_move_within_about_the_buffer_and_epochs_differ():
    buffer = ShuffleBuffer(range(1000), 64, seed=1)
    first = list(buffer)
    assert first != list(range(1000))
    assert all(item - position < 64 for position, item in enumerate(first))  # never read ahead
    buffer.set_epoch(1)
    assert list(buffer) != first


@pytest.mark.parametrize("upstream", ["sharded", "plain"])
def test_resume_continues_exactly(upstream):
    def make():
        source = (shard_iterable(shards=[range(70), range(70, 100)], rank=0, world_size=1)
                  if upstream == "sharded" else range(100))
        return ShuffleBuffer(source, 16, seed=3)

    buffer = make()
    iterator = iter(buffer)
    assert len(list(islice(iterator, 41))) == 41
    state = buffer.state_dict()
    rest = list(iterator)
    resumed = make()
    resumed.load_state_dict(state)
    assert list(resumed) == rest
    assert ("upstream" in state) == (upstream == "sharded")  # then nothing is read twice


def test_a_state_resumes_only_with_the_seed_and_buffer_it_was_saved_with():
    buffer = ShuffleBuffer(range(20), 4, seed=5)
    iterator = iter(buffer)
    next(iterator)
    state = buffer.state_dict()
    for other in (ShuffleBuffer(range(20), 4, seed=6), ShuffleBuffer(range(20), 8, seed=5)):
        with pytest.raises(ValueError, match="the state was saved with (seed=5|buffer_size=4)"):
            other.load_state_dict(state)
    with pytest.raises(ValueError, match=r"seed must be at most 18446744073709551615"):
        ShuffleBuffer(range(20), 4, seed=2**64)  # it would draw as seed 0


def test_save_and_load_split(tmp_path):
    paths = save_split(tmp_path, 103, 4, seed=5, epoch=2, remainder="uneven")
    shares = [load_split(tmp_path, rank) for rank in range(4)]
    assert isinstance(shares[0], np.memmap) and len(paths) == 4
    for rank, share in enumerate(shares):
        sampler = DistributedSampler(103, 4, rank, seed=5, remainder="uneven")
        sampler.set_epoch(2)
        assert share.tolist() == list(sampler)
    assert sorted(np.concatenate(shares).tolist()) == list(range(103))


def test_a_split_of_numpy_integers_is_saved_whole_or_not_at_all(tmp_path):
    save_split(tmp_path, 10, 2, seed=1)
    with pytest.raises(ValueError, match="remainder"):
        save_split(tmp_path, 12, 2, remainder="spread")  # refused before anything is written
    assert load_split(tmp_path, 0).tolist() == DistributedSampler(10, 2, 0, seed=1).indices().tolist()
    save_split(tmp_path, np.int64(12), 2, seed=np.int32(5), epoch=np.int64(1))
    sampler = DistributedSampler(12, 2, 1, seed=5)
    sampler.set_epoch(1)
    assert load_split(tmp_path, 1).tolist() == list(sampler)


def test_load_split_names_what_is_missing(tmp_path):
    with pytest.raises(FileNotFoundError, match="save the split with save_split first"):
        load_split(tmp_path, 0)
    save_split(tmp_path, 10, 2)
    with pytest.raises(ValueError, match="saved for 2 ranks; rank 2 has no share"):
        load_split(tmp_path, 2)
