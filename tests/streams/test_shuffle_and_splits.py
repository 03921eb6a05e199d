"""ShuffleBuffer: a deterministic local shuffle that resumes exactly; save_split / load_split."""

from itertools import islice

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardwise import (
    DataLoader,
    DistributedSampler,
    ShuffleBuffer,
    load_split,
    save_split,
    shard_iterable,
)


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


def _sharded_buffer(rank: int = 0, world_size: int = 1) -> ShuffleBuffer:
    shards = [range(start, start + 6) for start in range(0, 60, 6)]
    return ShuffleBuffer(shard_iterable(shards=shards, rank=rank, world_size=world_size), 4,
                         seed=2)


def test_a_pass_is_set_up_by_iter_so_a_state_before_its_first_item_is_its_own():
    buffer = _sharded_buffer()
    first = list(buffer)
    iterator = iter(buffer)  # the next pass, nothing read yet
    state = buffer.state_dict()
    assert state["yielded"] == 0 and state["buffer"] == []
    resumed = _sharded_buffer()
    resumed.load_state_dict(state)
    assert list(resumed) == list(iterator) == first


def test_a_state_saved_as_its_pass_ended_gives_its_empty_rest_then_whole_passes():
    buffer = _sharded_buffer()
    first = list(buffer)
    resumed = _sharded_buffer()
    resumed.load_state_dict(buffer.state_dict())
    assert resumed.state_dict() == buffer.state_dict()  # as loaded, until a pass begins
    rest = iter(resumed)  # a loader puts the state back, then makes the next pass's iterator
    assert list(resumed) == first and list(rest) == []


@pytest.mark.parametrize("workers", [0, 2])
def test_another_ranks_state_resumes_each_rank_on_its_own_stream(workers):
    """Lightning gives every rank rank 0's loader state: each rank's buffer reads its own
    stream again, drawing as before, and goes on after as many items as rank 0 had yielded."""
    def loader(rank):
        return DataLoader(_sharded_buffer(rank, 2), batch_size=3, num_workers=workers)

    saving = loader(0)
    iterator = iter(saving)
    delivered = [next(iterator) for _ in range(3)]
    state = saving.state_dict()
    for rank in (0, 1):
        whole = [batch.tolist() for batch in loader(rank)]
        resumed = loader(rank)
        resumed.load_state_dict(state)
        assert [batch.tolist() for batch in resumed] == whole[len(delivered):]


def test_consumers_draw_unlike_each_other_and_a_state_needs_as_many():
    def places(rank):  # where each item the buffer gives stood in the rank's own stream
        buffer = _sharded_buffer(rank, 2)
        read = list(buffer.iterable)
        return [read.index(item) for item in buffer]

    assert places(0) != places(1)
    buffer = _sharded_buffer(0, 2)
    next(iter(buffer))
    other = _sharded_buffer(0, 1)
    other.load_state_dict(buffer.state_dict())
    with pytest.raises(ValueError, match="read by 2 consumers .* but this pass has 1"):
        iter(other)
    with pytest.raises(TypeError, match="a ShuffleBuffer state is the dict state_dict"):
        other.load_state_dict(None)


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


def test_a_state_still_to_be_passed_over_is_the_loaded_one_until_it_is():
    saving = ShuffleBuffer(range(30), 4, seed=1)  # no upstream state: read again, passed over
    iterator = iter(saving)
    head = list(islice(iterator, 7))
    state = saving.state_dict()
    resumed = ShuffleBuffer(range(30), 4, seed=1)
    resumed.load_state_dict(state)
    rest = iter(resumed)
    assert resumed.state_dict() == state  # nothing passed over yet: still the loaded state
    rest = list(rest)
    assert rest == list(iterator)
    assert sorted(head + rest) == list(range(30))


@pytest.mark.parametrize("on", ["its end", "its last item"])
def test_a_state_saved_as_its_pass_ended_keeps_the_epoch_set_epoch_chose(on):
    def buffer():
        return _sharded_buffer()

    uninterrupted = buffer()
    iterator = iter(uninterrupted)
    assert len(list(islice(iterator, 60))) == 60
    if on == "its end":
        assert list(iterator) == []
    state = uninterrupted.state_dict()  # (a checkpoint on the last step sees no end)
    uninterrupted.set_epoch(1)
    expected = list(uninterrupted)
    resumed = buffer()
    resumed.set_epoch(1)  # a loop's next epoch, before a loader puts the state back
    resumed.load_state_dict(state)
    assert list(resumed) == [] and list(resumed) == expected


def test_a_refused_state_stays_loaded_and_an_older_versions_is_named():
    buffer = _sharded_buffer(0, 2)
    next(iter(buffer))
    other = _sharded_buffer(0, 1)
    other.load_state_dict(buffer.state_dict())
    for _ in range(2):
        with pytest.raises(ValueError, match="read by 2 consumers"):
            iter(other)
    with pytest.raises(ValueError, match="another version of shardwise .* version 1; this one"):
        other.load_state_dict({**buffer.state_dict(), "version": 1})
    with pytest.raises(ValueError, match="the state has no 'rng': pass what state_dict"):
        other.load_state_dict({key: value for key, value in buffer.state_dict().items()
                               if key != "rng"})


@pytest.mark.timeout(120)
@pytest.mark.parametrize("workers,persistent", [(0, False), (2, False), (2, True)])
def test_torchdatas_loader_resumes_a_buffer_at_every_step_of_a_second_epoch(workers, persistent):
    stateful = pytest.importorskip("torchdata.stateful_dataloader")

    def loader():
        return stateful.StatefulDataLoader(_sharded_buffer(), batch_size=4, num_workers=workers,
                                           persistent_workers=persistent)

    reference = loader()
    epochs = [[batch.tolist() for batch in reference] for _ in range(2)]
    for stop in range(len(epochs[1]) + 1):
        saving = loader()
        list(saving)  # the first epoch, whole
        iterator = iter(saving)
        delivered = [next(iterator).tolist() for _ in range(stop)]
        resumed = loader()
        resumed.load_state_dict(saving.state_dict())
        rest = [batch.tolist() for batch in resumed]
        assert delivered + rest == epochs[1], stop
    assert sorted(item for batch in epochs[1] for item in batch) == list(range(60))  # each once


@pytest.mark.timeout(120)
@pytest.mark.parametrize("loader", ["shardwise", "torchdata"])
def test_another_ranks_state_whose_worker_had_found_its_end_is_refused(loader):
    """Rank 0's worker 1 ran out, and its worker 0 took its turns where rank 1's worker 1 took
    them: rank 0's counts do not place rank 1, so the state is refused (as a ShardedIterable
    refuses it) rather than rank 1 losing its worker 1's rest."""
    make = DataLoader
    if loader == "torchdata":
        make = pytest.importorskip("torchdata.stateful_dataloader").StatefulDataLoader

    def on(rank):
        sizes = {0: 9, 9: 3, 12: 9, 21: 9}  # rank 0's worker 1 has one batch
        shards = [range(start, start + size) for start, size in sizes.items()]
        stream = ShuffleBuffer(shard_iterable(shards=shards, rank=rank, world_size=2), 2, seed=1)
        return make(stream, batch_size=3, num_workers=2)

    def resumed_on_rank_1(batches):
        saving = on(0)
        iterator = iter(saving)
        for _ in range(batches):
            next(iterator)
        resumed = on(1)
        resumed.load_state_dict(saving.state_dict())
        return [item for batch in resumed for item in batch.tolist()]

    whole = [item for batch in on(1) for item in batch.tolist()]
    assert sorted(resumed_on_rank_1(3)) == sorted(whole[9:])  # before: each rank in step
    with pytest.raises(ValueError,
                       match=r"another rank's, whose consumer 1 of 4 had found its stream's end"):
        resumed_on_rank_1(4)  # worker 1's end was found before the 4th batch


@pytest.mark.parametrize("buffered", [False, True])
def test_another_ranks_state_past_this_ranks_whole_stream_is_refused(buffered):
    """Rank 0 read 6 items; rank 1's share holds 4: a buffer given rank 0's state is refused,
    as the stream under it is, rather than yielding nothing (its 4 items never trained)."""
    def on(rank):
        stream = shard_iterable(shards=[range(8), range(8, 12)], rank=rank, world_size=2)
        return ShuffleBuffer(stream, 2, seed=1) if buffered else stream

    saving = on(0)
    items = iter(saving)
    for _ in range(6):
        next(items)
    resumed = on(1)
    resumed.load_state_dict(saving.state_dict())
    with pytest.raises(ValueError, match="before the 6 that the"):
        list(resumed)
