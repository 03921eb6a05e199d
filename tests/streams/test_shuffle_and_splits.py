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


def test_save_and_load_split(tmp_path):
    paths = save_split(tmp_path, 103, 4, seed=5, epoch=2, remainder="uneven")
    shares = [load_split(tmp_path, rank) for rank in range(4)]
    assert isinstance(shares[0], np.memmap) and len(paths) == 4
    for rank, share in enumerate(shares):
        sampler = DistributedSampler(103, 4, rank, seed=5, remainder="uneven")
        sampler.set_epoch(2)
        assert share.tolist() == list(sampler)
    assert sorted(np.concatenate(shares).tolist()) == list(range(103))


def test_load_split_names_what_is_missing(tmp_path):
    with pytest.raises(FileNotFoundError, match="save the split with save_split first"):
        load_split(tmp_path, 0)
    save_split(tmp_path, 10, 2)
    with pytest.raises(ValueError, match="saved for 2 ranks; rank 2 has no share"):
        load_split(tmp_path, 2)
