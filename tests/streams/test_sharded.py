"""ShardedIterable over ranks x DataLoader workers: nothing duplicated, nothing lost, resumable."""

from collections import Counter
from itertools import islice

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader as TorchLoader

from shardwise import DataLoader, shard_iterable

pytestmark = pytest.mark.timeout(120)


def shards_of(lengths):
    """Shards as lists of (shard, item) pairs; every item unique."""
    return [[(s, i) for i in range(n)] for s, n in enumerate(lengths)]


def everything(lengths):
    return Counter(item for shard in shards_of(lengths) for item in shard)


@settings(max_examples=100, deadline=None)
@given(lengths=st.lists(st.integers(0, 12), max_size=9), world=st.integers(1, 4))
def test_shards_or_items_each_read_by_exactly_one_rank(lengths, world):
    seen = Counter()
    for rank in range(world):
        seen.update(shard_iterable(shards=shards_of(lengths), rank=rank, world_size=world))
    assert seen == everything(lengths)


@settings(max_examples=50, deadline=None)
@given(size=st.integers(0, 60), world=st.integers(1, 5))
def test_a_plain_stream_is_split_by_items(size, world):
    shares = [list(shard_iterable(range(size), rank=r, world_size=world)) for r in range(world)]
    assert sorted(i for share in shares for i in share) == list(range(size))


def test_enough_shards_are_read_whole_by_one_consumer():
    opened = []

    def opener(number):
        def open_shard():
            opened.append(number)
            return range(number * 10, number * 10 + 3)
        return open_shard

    stream = shard_iterable(shards=[opener(n) for n in range(6)], rank=1, world_size=3)
    assert list(stream) == [10, 11, 12, 40, 41, 42] and opened == [1, 4]


@pytest.mark.parametrize("loader", ["torch", "shardwise", "shardwise threads"])
@pytest.mark.parametrize("lengths", [[5, 0, 7, 3, 9, 2, 4, 6], [40]], ids=["shards", "items"])
def test_under_dataloader_workers_every_item_once(loader, lengths):
    seen = Counter()
    for rank in range(2):
        stream = shard_iterable(shards=shards_of(lengths), rank=rank, world_size=2)
        options = {"batch_size": None, "num_workers": 2}
        if loader == "torch":
            batches = TorchLoader(stream, **options)
        else:
            batches = DataLoader(stream, worker_type="thread" if "threads" in loader else "process",
                                 **options)
        seen.update((int(s), int(i)) for s, i in batches)
    assert seen == everything(lengths)


@pytest.mark.parametrize("lengths", [[5, 0, 7, 3], [30]], ids=["shards", "items"])
def test_state_resumes_mid_shard_without_reading_finished_shards(lengths):
    stream = shard_iterable(shards=shards_of(lengths), rank=0, world_size=1)
    iterator = iter(stream)
    head = list(islice(iterator, 8))
    state = stream.state_dict()
    rest = list(iterator)
    resumed = shard_iterable(shards=shards_of(lengths), rank=0, world_size=1)
    resumed.load_state_dict(state)
    assert list(resumed) == rest and head + rest == list(stream)


def test_stateful_dataloader_saves_each_workers_progress():
    torchdata = pytest.importorskip("torchdata.stateful_dataloader")
    lengths = [6, 4, 9, 3]

    def make():
        stream = shard_iterable(shards=shards_of(lengths), rank=0, world_size=1)
        return torchdata.StatefulDataLoader(stream, batch_size=None, num_workers=2)

    loader = make()
    iterator = iter(loader)
    head = [tuple(map(int, x)) for x in islice(iterator, 7)]
    state = loader.state_dict()
    resumed = make()
    resumed.load_state_dict(state)
    rest = [tuple(map(int, x)) for x in resumed]
    assert Counter(head + rest) == everything(lengths)


def test_a_state_from_another_world_size_is_refused():
    state = shard_iterable(range(5), rank=0, world_size=2).state_dict()
    with pytest.raises(ValueError, match="saved by 2 ranks"):
        shard_iterable(range(5), rank=0, world_size=3).load_state_dict(state)


def test_exactly_one_source_is_given():
    with pytest.raises(ValueError, match="either an iterable"):
        shard_iterable(range(3), shards=[range(3)], rank=0, world_size=1)
    with pytest.raises(TypeError, match="shards must be a list"):
        shard_iterable(shards="abc", rank=0, world_size=1)
    with pytest.raises(ValueError, match="world_size must be at least 1, got 0"):
        shard_iterable(range(3), rank=0, world_size=0)


def test_items_are_tensors_too():
    stream = shard_iterable([torch.tensor([i]) for i in range(6)], rank=1, world_size=2)
    assert [int(t) for t in stream] == [1, 3, 5]


class SelfSplitting(torch.utils.data.IterableDataset):
    """A stream that splits itself over DataLoader workers, as Hugging Face's and webdataset's do."""

    def __init__(self, items):
        self.items = items

    def __iter__(self):
        worker = torch.utils.data.get_worker_info()
        start, step = (0, 1) if worker is None else (worker.id, worker.num_workers)
        return iter(self.items[start::step])


@pytest.mark.parametrize("lengths", [[3, 4, 5, 6, 7], [20]], ids=["shards", "items"])
def test_shards_that_split_themselves_over_workers_are_still_read_whole(lengths):
    shards = [SelfSplitting(shard) for shard in shards_of(lengths)]
    stream = shard_iterable(shards=shards, rank=0, world_size=1)
    seen = Counter((int(s), int(i)) for s, i in TorchLoader(stream, batch_size=None, num_workers=2))
    assert seen == everything(lengths)


def _on_every_rank() -> list:
    stream = shard_iterable(shards=shards_of([3, 5, 2, 7, 1, 4]))  # world and rank from the group
    loader = DataLoader(stream, batch_size=None, num_workers=2)  # 3 ranks x 2 worker processes
    return [tuple(map(int, item)) for item in loader]


@pytest.mark.timeout(120)
def test_three_gloo_ranks_read_every_item_once():
    from shardwise import spawn_local

    seen = Counter(item for share in spawn_local(_on_every_rank, 3, timeout=100) for item in share)
    assert seen == everything([3, 5, 2, 7, 1, 4])


def _stopped(loader) -> str:
    """What stopped ``loader`` from loading on this rank, or ``"loaded"``."""
    from shardwise import InconsistentRanksError

    try:
        list(loader)
    except InconsistentRanksError as error:
        return str(error)
    return "loaded"


def _shards_in_rank_order() -> str:
    import torch.distributed as dist

    a, b, c, d = [0, 1], [2, 3], [4, 5], [6, 7]  # listed in another order on rank 1
    shards = [a, b, c, d] if dist.get_rank() == 0 else [b, a, d, c]
    return _stopped(DataLoader(shard_iterable(shards=shards), batch_size=2))


@pytest.mark.timeout(120)
def test_ranks_given_different_shard_lists_are_stopped():
    from shardwise import spawn_local

    said = spawn_local(_shards_in_rank_order, 2, timeout=100)
    assert all("rank 1 has fingerprint=" in message for message in said), said


def _workers_by_rank() -> str:
    import torch.distributed as dist

    workers = 2 if dist.get_rank() == 0 else 1  # (a node with fewer cores, say)
    return _stopped(DataLoader(shard_iterable(shards=shards_of([2] * 8)), num_workers=workers))


@pytest.mark.timeout(120)
def test_ranks_reading_a_stream_with_different_numbers_of_workers_are_stopped():
    """Each worker reads its own share: ranks with other counts would overlap and leave gaps."""
    from shardwise import spawn_local

    said = spawn_local(_workers_by_rank, 2, timeout=100)
    assert all("rank 1 has worker_processes=1 where rank 0 has worker_processes=2" in message
               for message in said), said


@pytest.mark.timeout(120)
@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("sizes", [[3, 4, 5, 6, 2, 7, 1, 5], [40]])  # whole shards; every C-th
def test_every_rank_resumes_from_rank_0s_loader_state_as_lightning_saves_it(workers, sizes):
    """Lightning saves rank 0's loader state for all ranks; ranks training together took as
    many batches each, so each goes on after as many items of its own share."""
    def loader(rank):
        stream = shard_iterable(shards=shards_of(sizes), rank=rank, world_size=2)
        return DataLoader(stream, batch_size=2, num_workers=workers)

    def items(batch):
        shards, places = batch
        return list(zip(shards.tolist(), places.tolist()))

    seen, states = Counter(), []
    for rank in (0, 1):
        training = loader(rank)
        iterator = iter(training)
        seen.update(item for _ in range(3) for item in items(next(iterator)))
        states.append(training.state_dict())
    for rank in (0, 1):
        resumed = loader(rank)
        resumed.load_state_dict(states[0])
        seen.update(item for batch in resumed for item in items(batch))
    assert seen == everything(sizes)  # each item once, on one rank


def test_each_rank_of_two_goes_on_exactly_from_rank_0s_stream_state():
    streams = [shard_iterable(shards=shards_of([3, 4, 5, 6]), rank=r, world_size=2)
               for r in (0, 1)]
    iterators = [iter(stream) for stream in streams]
    for iterator in iterators:  # in step: as many items each
        next(iterator)
    state = streams[0].state_dict()
    for rank, iterator in enumerate(iterators):
        resumed = shard_iterable(shards=shards_of([3, 4, 5, 6]), rank=rank, world_size=2)
        resumed.load_state_dict(state)
        assert list(resumed) == list(iterator)  # the same rank, or the other one, exactly


def test_shards_are_named_alike_on_every_rank_by_what_they_read(tmp_path):
    from shardwise.streams.files import line_shards

    (tmp_path / "a.txt").write_text("1\n")
    (tmp_path / "b.txt").write_text("22\n")
    files = shard_iterable(shards=line_shards(tmp_path), rank=0, world_size=1)
    assert files.fingerprint() == shard_iterable(shards=line_shards(tmp_path), rank=0,
                                                 world_size=1).fingerprint()
    assert files.fingerprint() != shard_iterable(shards=line_shards(tmp_path)[::-1], rank=0,
                                                 world_size=1).fingerprint()
    assert files.config() == {"dataset": "ShardedIterable", "shards": 2, "streamed": False,
                              "num_replicas": 1}


@pytest.mark.timeout(60)
def test_a_state_is_refused_by_another_number_of_workers_or_a_shorter_shard_list():
    stream = shard_iterable(shards=shards_of([3, 4, 5]), rank=0, world_size=1)
    items = iter(stream)
    next(items)
    state = stream.state_dict()  # one consumer: no workers
    resumed = shard_iterable(shards=shards_of([3, 4, 5]), rank=0, world_size=1)
    resumed.load_state_dict(state)
    with pytest.raises(ValueError, match="saved by 1 consumers .* this pass has 2"):
        list(TorchLoader(resumed, batch_size=None, num_workers=2))
    edited = shard_iterable(shards=shards_of([3, 4, 5]), rank=0, world_size=1)
    edited.load_state_dict({**state, "progress": {"0": [4, 0, 9]}})
    with pytest.raises(ValueError, match="consumer 0 read 4 shards, but it has 3"):
        list(edited)
    shorter = shard_iterable(shards=shards_of([3]), rank=0, world_size=1)
    with pytest.raises(ValueError, match="saved over another shard list .* another number"):
        shorter.load_state_dict(state)
    with pytest.raises(TypeError, match="is the dict state_dict\\(\\) gave, got list"):
        shorter.load_state_dict([state])
    with pytest.raises(TypeError, match="no 'progress'"):
        shorter.load_state_dict({key: v for key, v in state.items() if key != "progress"})
    with pytest.raises(TypeError, match="each \\[shard, offset, items read\\]"):
        shorter.load_state_dict({**state, "progress": {"0": [0, 1]}})  # one of version 1
    with pytest.raises(ValueError, match="another version of shardwise"):
        shorter.load_state_dict({**state, "version": 1})
    for progress in ({"a": [0, 1, 1]}, {"1": [0, 1, 1]}, {"²": [0, 1, 1]}):  # (one consumer)
        with pytest.raises(ValueError, match=r"by consumer number, below the number of "
                           r"consumers that saved it \(1\)"):
            edited.load_state_dict({**state, "progress": progress})


def test_paths_as_shards_are_refused_naming_the_helpers_that_read_files():
    from pathlib import Path

    for path in ("data/a.txt", Path("data/a.txt"), b"data/a.txt"):
        with pytest.raises(TypeError, match=r"shard 1 is a path \('data/a.txt'\), not its items: "
                                            r"pass shards=line_shards\(paths\)"):
            shard_iterable(shards=[[1, 2], path], rank=0, world_size=1)
    with pytest.raises(TypeError, match="shards must be a list of shards, got str"):
        shard_iterable(shards="data/a.txt", rank=0, world_size=1)
    with pytest.raises(TypeError, match=r"the stream is a path \('data/a.txt'\), not its items"):
        shard_iterable("data/a.txt", rank=0, world_size=1)


def test_shards_from_the_script_are_named_alike_in_spawned_ranks():
    def opener():
        return range(3)

    def spawned():
        return range(3)

    # A rank running the script calls it __main__; one spawned by multiprocessing, __mp_main__.
    opener.__module__, spawned.__module__, spawned.__qualname__ = ("__main__", "__mp_main__",
                                                                   opener.__qualname__)
    spawned.__code__ = opener.__code__
    fingerprints = [shard_iterable(shards=[shard], rank=0, world_size=1).fingerprint()
                    for shard in (opener, spawned)]
    assert fingerprints[0] == fingerprints[1]


def test_a_shard_that_refuses_its_length_is_named_by_its_type():
    from shardwise.streams.sharded import shard_identity

    class Unsized(torch.utils.data.IterableDataset):
        def __len__(self):
            raise TypeError("a stream has no length")

        def __iter__(self):
            return iter(range(3))

    assert shard_identity(Unsized()).endswith("Unsized")
    assert shard_identity(iter([1, 2])) == "builtins.list_iterator"

    class Unknowable(Unsized):
        def __len__(self):
            raise NotImplementedError

    assert shard_identity(Unknowable()).endswith("Unknowable")


class _Reader:
    def __init__(self, path: str) -> None:
        self.path = path

    def __call__(self) -> list[str]:
        return [self.path]


def _reader(path: str):
    return lambda: [path]


def test_shards_made_by_functions_are_told_apart_by_what_they_hold():
    from shardwise.streams.sharded import shard_identity

    shard_lists = [[lambda p=p: [p] for p in ("a", "b", "c")], [_reader(p) for p in ("a", "b")],
                   [_Reader("a"), _Reader("b")], [_Reader("a").__call__, _Reader("b").__call__]]
    for shards in shard_lists:
        names = [shard_identity(shard) for shard in shards]
        assert len(set(names)) == len(names), names
        assert names == [shard_identity(shard) for shard in shards]  # and the same each time
    # A number it holds is often the rank's own: ranks that list the same shards agree.
    assert len({shard_identity(_reader(rank)) for rank in range(3)}) == 1


@pytest.mark.timeout(120)
def test_another_ranks_state_whose_worker_had_read_its_whole_share_is_refused():
    # Rank 0's worker 1 ran out first; after that rank 0's workers took turns unlike rank 1's.
    def loader(rank):
        return DataLoader(shard_iterable(shards=shards_of([10, 2, 10, 10]), rank=rank,
                                         world_size=2), batch_size=2, num_workers=2)

    saved = loader(0)
    iterator = iter(saved)
    for _ in range(5):
        next(iterator)
    state = saved.state_dict()
    resumed = loader(1)
    resumed.load_state_dict(state)
    with pytest.raises(ValueError, match="whose consumer 1 had read its whole share"):
        list(resumed)


@pytest.mark.timeout(120)
def test_persistent_workers_resumed_from_an_ended_epoch_read_the_next_one_whole():
    def loader():
        return DataLoader(shard_iterable(shards=shards_of([5, 5, 5, 5]), rank=0, world_size=1),
                          batch_size=2, num_workers=2, persistent_workers=True)

    first = loader()
    epoch = [batch for batch in first]
    resumed = loader()
    resumed.load_state_dict(first.state_dict())
    assert [repr(batch) for batch in resumed] == [repr(batch) for batch in epoch]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("workers", [0, 1, 2])
def test_every_rank_reads_the_next_epoch_whole_from_rank_0s_state_saved_at_its_end(workers):
    """Lightning's checkpoint at an epoch's end: rank 0's state, in which its one consumer (or
    each worker) read its whole share, given to every rank. With one consumer a rank there are
    no turns to lose track of, so no rank refuses it (with no workers it was refused)."""
    def loader(rank):
        stream = shard_iterable(shards=shards_of([6] * 8), rank=rank, world_size=2)
        return DataLoader(stream, batch_size=3, num_workers=workers)

    saved = loader(0)
    for _ in saved:
        pass
    for rank in (0, 1):
        resumed = loader(rank)
        resumed.load_state_dict(saved.state_dict())
        whole = [batch[1].tolist() for batch in loader(rank)]
        assert [batch[1].tolist() for batch in resumed] == whole


def test_a_shard_that_holds_fewer_items_than_its_saved_place_is_named():
    held = {"first": list(range(5))}
    shards = [lambda: held["first"], [10, 11]]  # made by a function: its length is not known
    stream = shard_iterable(shards=shards, rank=0, world_size=1)
    items = iter(stream)
    assert [next(items) for _ in range(3)] == [0, 1, 2]
    state = stream.state_dict()
    held["first"] = [0]  # shorter since
    resumed = shard_iterable(shards=shards, rank=0, world_size=1)
    resumed.load_state_dict(state)
    with pytest.raises(ValueError, match=r"consumer 0 after item 3 of shard 0 \(.*\), which "
                       "holds fewer now"):
        list(resumed)


def test_the_shard_list_is_named_once_not_at_every_state():
    """A loader takes a state with every batch: naming 10^5 files each time cost ~0.1 s a
    batch. The shards are named once; a state over other files is still refused."""
    named = Counter()

    class Named(list):
        def identity(self):
            named[id(self)] += 1
            return f"file of {len(self)} lines"

    stream = shard_iterable(shards=[Named([1, 2]), Named([3])], rank=0, world_size=1)
    items = iter(stream)
    states = [(next(items), stream.state_dict())[1] for _ in range(3)]
    assert sorted(named.values()) == [1, 1]
    other = shard_iterable(shards=[Named([1, 2]), Named([3, 4])], rank=0, world_size=1)
    with pytest.raises(ValueError, match="saved over another shard list"):
        other.load_state_dict(states[0])
