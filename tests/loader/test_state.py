"""The loader's state counts batches delivered, and resumes at exactly the next one."""

import json
import multiprocessing
import random
import time
from collections import Counter
from itertools import islice

import numpy as np
import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st
from torch.utils.data import (
    BatchSampler,
    Dataset,
    IterableDataset,
    RandomSampler,
    Sampler,
    SequentialSampler,
    get_worker_info,
)
from torch.utils.data import DataLoader as TorchLoader
from torch.utils.data import DistributedSampler as TorchDistributed

from shardwise import DataLoader, DistributedSampler, WeightedDistributedSampler
from shardwise.loader.position import StateMismatchError, stateful

pytestmark = pytest.mark.timeout(120)


class Indexed(Dataset):
    def __init__(self, size: int = 50) -> None:
        self.size = size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> int:
        return index


class Stream(IterableDataset):
    def __iter__(self):
        worker = get_worker_info()
        wid, count = (0, 1) if worker is None else (worker.id, worker.num_workers)
        yield from range(wid, 41, count)


def values(batches) -> list:
    return [b.tolist() for b in batches]


def interrupted(make_loader, stop_after: int, *, epoch_setup=lambda loader: None):
    """Deliver ``stop_after`` batches, save, then resume in a fresh loader: both halves."""
    loader = make_loader()
    epoch_setup(loader)
    iterator = iter(loader)
    head = values(islice(iterator, stop_after))
    state = loader.state_dict()
    whole = head + values(iterator)  # the uninterrupted pass, for reference
    fresh = make_loader()
    fresh.load_state_dict(state)
    epoch_setup(fresh)
    return whole, head, values(fresh), fresh


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("stop_after", [0, 3, 13])
def test_a_shardwise_sampler_resumes_at_the_next_batch(workers, stop_after):
    def make():
        sampler = DistributedSampler(Indexed(), num_replicas=1, rank=0, seed=4)
        return DataLoader(Indexed(), batch_size=4, sampler=sampler, num_workers=workers)

    whole, head, rest, fresh = interrupted(make, stop_after, epoch_setup=lambda l: l.set_epoch(2))
    assert head + rest == whole and len(whole) == 13
    assert len(fresh) == 13  # the epoch's length, as trainers that count steps expect


def test_epochs_that_advance_by_themselves_resume_too():
    def make():
        return DataLoader(Indexed(), batch_size=4, num_workers=2,
                          sampler=DistributedSampler(Indexed(), num_replicas=1, rank=0))

    loader = make()
    values(loader)  # epoch 0, with no set_epoch: the next pass is epoch 1
    iterator = iter(loader)
    head = values(islice(iterator, 2))
    state = loader.state_dict()
    assert state["sampler"]["epoch"] == 1 and state["batches"] == 2
    whole = head + values(iterator)
    fresh = make()
    fresh.load_state_dict(state)
    assert values(fresh) == whole[2:]


def test_the_state_counts_delivered_batches_not_prefetched_ones():
    sampler = DistributedSampler(Indexed(), num_replicas=1, rank=0)
    loader = DataLoader(Indexed(), batch_size=2, sampler=sampler, num_workers=2,
                        prefetch_factor=4)
    iterator = iter(loader)
    next(iterator)
    state = loader.state_dict()
    assert state["batches"] == 1 and state["sampler"]["consumed"] == 2
    assert sampler.state_dict()["consumed"] == 2 * 9  # the workers hold 8 more batches
    del iterator


@pytest.mark.parametrize("remainder", ["uneven", "pad"])
def test_any_ranks_loader_state_resumes_every_rank_of_another_world_size(remainder):
    size, trained = 103, Counter()

    def loaders(world):
        return [DataLoader(Indexed(size), batch_size=4, num_workers=1, sampler=DistributedSampler(
            size, world, rank, seed=1, remainder=remainder)) for rank in range(world)]

    before = loaders(3)
    iterators = [iter(loader) for loader in before]
    for iterator in iterators:  # lock step: every rank trains 5 batches
        trained.update(i for batch in islice(iterator, 5) for i in batch.tolist())
    state = before[1].state_dict()
    for loader in loaders(2):
        loader.load_state_dict(state)
        trained.update(i for batch in loader for i in batch.tolist())
    if remainder == "uneven":
        assert sorted(trained.elements()) == list(range(size))
    else:
        assert set(trained) == set(range(size))


@settings(max_examples=150, deadline=None)
@given(size=st.integers(0, 40), world=st.integers(1, 5), new_world=st.integers(1, 5),
       batch_size=st.integers(1, 6), drop_last=st.booleans(), stop=st.integers(0, 40),
       saver=st.integers(0, 4))
@example(size=3, world=4, new_world=2, batch_size=1, drop_last=False, stop=0, saver=3)  # empty
@example(size=7, world=4, new_world=2, batch_size=1, drop_last=False, stop=1, saver=3)
@example(size=100, world=3, new_world=2, batch_size=11, drop_last=False, stop=3, saver=1)
@example(size=17, world=4, new_world=3, batch_size=2, drop_last=True, stop=2, saver=3)
def test_every_ranks_uneven_state_at_every_step_resumes_any_world_exactly(
        size, world, new_world, batch_size, drop_last, stop, saver):
    # In lock step a shorter rank may finish its share a step before the longer ranks (or,
    # with an empty share, before they begin): its state says where they stand, not that the
    # epoch ended.
    def loaders(count):
        return [DataLoader(Indexed(size), batch_size=batch_size, drop_last=drop_last,
                           sampler=DistributedSampler(size, count, rank, seed=3,
                                                      remainder="uneven"))
                for rank in range(count)]

    steps = max(len(loader) for loader in loaders(world))
    stop, saver = min(stop, max(0, steps - 1)), saver % world  # a checkpoint within the epoch
    before, trained = loaders(world), Counter()
    for loader in before:
        iterator = iter(loader)
        trained.update(i for batch in islice(iterator, stop) for i in batch.tolist())
    state = before[saver].state_dict()
    for loader in loaders(new_world):
        loader.load_state_dict(state)
        trained.update(i for batch in loader for i in batch.tolist())
    assert max(trained.values(), default=1) == 1  # nothing twice
    if not drop_last:
        assert sorted(trained) == list(range(size))  # nothing lost


def uneven_loader(world: int, rank: int, state: dict | None = None) -> DataLoader:
    """Batches of 4 of rank ``rank`` of ``world`` over 103 samples, split unevenly."""
    made = DataLoader(Indexed(103), batch_size=4, sampler=DistributedSampler(
        103, world, rank, seed=1, remainder="uneven"))
    if state is not None:
        made.load_state_dict(state)
    return made


def uneven_state_after_five_batches(world: int) -> dict:
    """Rank 0's loader state of ``world`` ranks, 5 batches into the epoch."""
    saving = uneven_loader(world, 0)
    list(islice(saving, 5))
    return saving.state_dict()


def test_a_resumed_pass_on_more_ranks_counts_its_steps_and_ends_at_its_own_end():
    """3 ranks train 5 batches, 4 finish the epoch; a state after each of their batches resumes
    the rest of that rank's pass exactly, and len() counts the steps of the epoch across the
    resume (5 + 3: more than a 4-rank epoch's 7), as a trainer counting steps needs."""
    loader = uneven_loader
    state = uneven_state_after_five_batches(3)
    for rank in range(4):
        resumed = loader(4, rank, state)
        assert (len(resumed), len(loader(4, rank))) == (5 + 3, 7)
        rest = values(resumed)
        assert len(rest) == 3 and sum(map(len, rest)) == 11 - (rank == 3)  # 103 - 60 over 4
        next_epoch = loader(4, rank)
        next_epoch.sampler.set_epoch(1)
        for step in range(1, len(rest) + 1):  # a checkpoint after each batch of the rest
            again = loader(4, rank, state)
            list(islice(iter(again), step))
            # on the last batch: the next epoch, whole
            expected = rest[step:] if step < len(rest) else values(next_epoch)
            assert values(loader(4, rank, again.state_dict())) == expected


def test_a_resumed_pass_on_fewer_ranks_says_a_fresh_epochs_length_and_ends_at_its_own_end():
    """4 ranks train 5 batches, 2 finish the epoch: the resumed pass has fewer steps (5 + 3)
    than a 2-rank epoch (13), and len() is the larger, since Lightning keeps the length it
    reads after the load for every later epoch."""
    loader = uneven_loader
    state = uneven_state_after_five_batches(4)
    for rank in range(2):
        resumed = loader(2, rank, state)
        assert len(resumed) == len(loader(2, rank)) == 13
        assert len(values(resumed)) == 3  # the rest: 23 samples over 2 ranks
        assert len(resumed) == 13 == len(values(resumed))  # the next epoch, whole


def test_a_batch_sampler_of_its_own_over_a_shardwise_sampler_resumes_at_every_step():
    class Pairs(BatchSampler):  # batches of 2 whatever batch_size says, as a token budget may
        def __iter__(self):
            batch = []
            for index in self.sampler:
                batch.append(index)
                if len(batch) == 2:
                    yield batch
                    batch = []

        def __len__(self):
            return len(self.sampler) // 2

    def loader(state=None, world=2, rank=0):
        made = DataLoader(Indexed(24), batch_sampler=Pairs(
            DistributedSampler(24, world, rank, seed=1), batch_size=4, drop_last=False))
        if state is not None:
            made.load_state_dict(state)
        return made

    whole = values(loader())
    first = loader()
    list(islice(first, 2))
    state = first.state_dict()
    for step in range(len(whole) - 2):  # a state at each step of the resumed pass
        again = loader(state)
        assert len(again) == len(whole)
        list(islice(iter(again), step))
        assert values(loader(again.state_dict())) == whole[2 + step:]
    for rank in range(4):  # on more ranks: more steps (2 + 2) than the new world's epoch (3)
        rest = values(loader(state, 4, rank))
        again = loader(state, 4, rank)
        list(islice(iter(again), 1))
        assert values(loader(again.state_dict(), 4, rank)) == rest[1:] and len(rest) == 2


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("seeded", [False, True])
def test_torch_samplers_resume_by_replaying_their_draws(workers, seeded):
    def make():
        generator = torch.Generator().manual_seed(3) if seeded else None
        return DataLoader(Indexed(), batch_size=4, shuffle=True, num_workers=workers,
                          generator=generator)

    torch.manual_seed(0)
    loader = make()
    iterator = iter(loader)
    head = values(islice(iterator, 5))
    state = loader.state_dict()
    whole = head + values(iterator)
    later = values(loader)  # the next epoch
    torch.manual_seed(12345)  # the resumed job's own randomness is different...
    fresh = make()
    fresh.load_state_dict(state)
    assert values(fresh) == whole[5:]
    assert values(fresh) == later  # ...yet its next epoch draws what the saved job's drew


def test_persistent_workers_resume_in_a_later_epoch():
    def make():
        return DataLoader(Indexed(), batch_size=4, shuffle=True, num_workers=2,
                          persistent_workers=True, generator=torch.Generator().manual_seed(8))

    loader = make()
    first = values(loader)
    iterator = iter(loader)  # epoch 2: the workers are reused, no new base seed is drawn
    head = values(islice(iterator, 4))
    state = loader.state_dict()
    whole = head + values(iterator)
    fresh = make()
    fresh.load_state_dict(state)
    assert values(fresh) == whole[4:] and whole != first


@pytest.mark.parametrize("workers", [0, 2])
def test_iterable_datasets_resume_by_loading_again_and_dropping(workers):
    whole, head, rest, _ = interrupted(
        lambda: DataLoader(Stream(), batch_size=3, num_workers=workers), 4)
    assert head + rest == whole


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("seen_end", [True, False])
def test_a_finished_epoch_resumes_with_the_next_epoch_or_its_empty_rest_by_set_epoch(workers,
                                                                                    seen_end):
    """As the loader would go on (Lightning: iter() first, set_epoch after), or, for a loop that
    asks for the saved epoch again, its empty rest."""
    def make():
        return DataLoader(Indexed(), batch_size=8, num_workers=workers, sampler=DistributedSampler(
            Indexed(), num_replicas=1, rank=0, seed=2))

    loader = make()
    iterator = iter(loader)
    values(iterator if seen_end else islice(iterator, 7))  # all 7 batches
    state = loader.state_dict()
    following = values(loader)  # epoch 1, as the pass after a finished one
    fresh = make()
    fresh.load_state_dict(state)
    assert len(fresh) == 7
    resumed = iter(fresh)
    fresh.set_epoch(1)  # too late for the pass made: it is epoch 1 already
    assert values(resumed) == following
    again = make()
    again.load_state_dict(state)
    again.set_epoch(0)
    assert len(again) == 7 and values(again) == []
    again.set_epoch(1)
    assert values(again) == following


class Seeds(Dataset):
    def __len__(self) -> int:
        return 8

    def __getitem__(self, index: int) -> int:
        return torch.initial_seed()  # the worker's seed: a new one each epoch


def test_the_epoch_after_an_ended_state_draws_new_worker_seeds_and_keeps_drop_lasts_epochs():
    def make(dataset, **options):
        sampler = DistributedSampler(dataset, num_replicas=1, rank=0, shuffle=False)
        return DataLoader(dataset, sampler=sampler, num_workers=2, **options)

    torch.manual_seed(0)
    loader = make(Seeds(), batch_size=2)
    saved_epoch = values(loader)
    fresh = make(Seeds(), batch_size=2)
    fresh.load_state_dict(loader.state_dict())
    assert values(fresh) != saved_epoch  # not the saved epoch's seeds again
    # drop_last leaves samples undelivered: the epoch ended all the same
    loader = make(Indexed(10), batch_size=4, drop_last=True)
    iterator = iter(loader)
    values(islice(iterator, len(loader)))
    state = loader.state_dict()
    following = values(loader)
    fresh = make(Indexed(10), batch_size=4, drop_last=True)
    fresh.load_state_dict(state)
    resumed = iter(fresh)
    fresh.set_epoch(1)  # Lightning's order: the pass, then set_epoch
    assert values(resumed) == following and len(following) == 2


def test_state_is_plain_small_and_round_trips_before_iterating():
    sampler = DistributedSampler(10**7, num_replicas=8, rank=3, permutation="feistel")
    loader = DataLoader(Indexed(10**7), batch_size=256, sampler=sampler)
    iterator = iter(loader)
    for _ in range(3):
        next(iterator)
    state = loader.state_dict()
    assert len(repr(state)) < 1000  # O(1): no indices in it
    fresh = DataLoader(Indexed(10**7), batch_size=256,
                       sampler=DistributedSampler(10**7, 8, 3, permutation="feistel"))
    fresh.load_state_dict(state)
    assert fresh.state_dict() == state
    assert next(iter(fresh)).tolist() == next(iterator).tolist()


def test_a_state_from_another_kind_of_loader_is_refused():
    state = DataLoader(Indexed(), batch_size=2, shuffle=True).state_dict()
    sampler = DistributedSampler(Indexed(), num_replicas=1, rank=0)
    with pytest.raises(ValueError, match="resumes by 'replay' but this loader resumes by 'sampler'"):
        DataLoader(Indexed(), batch_size=2, sampler=sampler).load_state_dict(state)


def test_torchdata_sees_a_stateful_loader():
    stateful = pytest.importorskip("torchdata.stateful_dataloader.stateful")
    assert isinstance(DataLoader(Indexed()), stateful.Stateful)


@pytest.mark.parametrize("workers", [0, 2])
def test_dataset_states_sit_where_torchdatas_loader_puts_them(workers):
    loader = DataLoader(Countdown(), batch_size=3, num_workers=workers)
    iterator = iter(loader)
    for _ in range(4):  # each stream part-way through
        next(iterator)
    state = loader.state_dict()
    if workers:
        snapshots = state["_snapshot"]["_worker_snapshots"]
        assert sorted(snapshots) == ["worker_0", "worker_1"]
        streams = [snapshots["worker_0"], snapshots["worker_1"]]
    else:
        streams = [state]
    for stream in streams:  # the dataset is its own iterator: kept once, as the iterator
        assert stream["dataset_state"] is None
        assert stream["fetcher_state"]["dataset_iter_state"]["at"] > 0
        assert stream["fetcher_state"]["fetcher_ended"] is False
    fresh = DataLoader(Countdown(), batch_size=3, num_workers=workers)
    fresh.load_state_dict(state)
    assert [b.tolist() for b in fresh] == [b.tolist() for b in iterator]


class CountsIters(IterableDataset):
    def __init__(self) -> None:
        self.iters = 0

    def __iter__(self):
        self.iters += 1
        return iter(range(6))

    def state_dict(self) -> dict:
        return {"iters": self.iters}

    def load_state_dict(self, state: dict) -> None:
        self.iters = state["iters"]


@pytest.mark.parametrize("workers", [0, 2])
def test_a_state_taken_as_a_pass_begins_holds_each_streams_state_after_its_iter(workers):
    def iters(state):
        streams = (state["_snapshot"]["_worker_snapshots"].values() if workers else [state])
        return [stream["dataset_state"]["iters"] for stream in streams]

    loader = DataLoader(CountsIters(), batch_size=2, num_workers=workers)
    iterator = iter(loader)
    state = loader.state_dict()
    assert iters(state) == [1] * max(1, workers)
    fresh = DataLoader(CountsIters(), batch_size=2, num_workers=workers)
    fresh.load_state_dict(state)
    resumed = iter(fresh)
    # Put back (1), then the one iterator that goes on from there (2), not a second one.
    assert iters(fresh.state_dict()) == [2] * max(1, workers)
    assert [b.tolist() for b in resumed] == [b.tolist() for b in iterator]


def test_a_state_from_another_version_says_so():
    state = {**DataLoader(Indexed()).state_dict(), "version": 1}
    with pytest.raises(ValueError, match="another version of shardwise .* version 1; this one"):
        DataLoader(Indexed()).load_state_dict(state)


@pytest.mark.parametrize("every", [1, 3, 0, None])  # 0 and None: on request only, to torchdata
def test_code_written_for_torchdatas_loader_runs_and_resumes_exactly_at_any_step(every):
    def make():
        return DataLoader(Indexed(), batch_size=4, shuffle=True, snapshot_every_n_steps=every)

    torch.manual_seed(5)
    loader = make()
    iterator = iter(loader)
    head = values(islice(iterator, 2))  # between two of torchdata's snapshots, for every=3
    state = loader.state_dict()
    rest = values(iterator)
    fresh = make()
    fresh.load_state_dict(state)
    assert values(fresh) == rest and len(head) == 2
    with pytest.raises(ValueError, match="snapshot_every_n_steps must be at least 0, got -1"):
        DataLoader(Indexed(), snapshot_every_n_steps=-1)


def test_a_resume_puts_every_global_generator_where_it_stood_when_saved():
    loader = DataLoader(Indexed(), batch_size=4, shuffle=True)
    iterator = iter(loader)
    next(iterator)
    state = json.loads(json.dumps(loader.state_dict()))
    following = torch.rand(2).tolist(), np.random.rand(), random.random()  # the saved job's next
    torch.manual_seed(1)  # a new job, seeded as it starts
    random.seed(1)
    np.random.seed(1)
    fresh = DataLoader(Indexed(), batch_size=4, shuffle=True)
    fresh.load_state_dict(state)
    iter(fresh)
    assert (torch.rand(2).tolist(), np.random.rand(), random.random()) == following


class ShuffledBy(Sampler):
    """A sampler of one's own that shuffles with NumPy's or Python's global generator."""

    def __init__(self, library: str) -> None:
        self.library = library

    def __len__(self) -> int:
        return 20

    def __iter__(self):
        if self.library == "numpy":
            return iter(np.random.permutation(20).tolist())
        return iter(random.sample(range(20), 20))


@pytest.mark.parametrize("library", ["numpy", "python"])
def test_a_sampler_shuffling_with_numpys_or_pythons_generator_resumes_exactly(library):
    def make():
        return DataLoader(torch.arange(20), batch_size=4, sampler=ShuffledBy(library))

    np.random.seed(0)
    random.seed(0)
    loader = make()
    values(loader)  # epoch 0
    iterator = iter(loader)  # epoch 1, stopped after 2 batches
    head = values(islice(iterator, 2))
    state = json.loads(json.dumps(loader.state_dict()))
    whole = head + values(iterator)
    np.random.seed(0)  # the new job, seeded as the first one started
    random.seed(0)
    resumed = make()
    resumed.load_state_dict(state)
    assert head + values(resumed) == whole


class DrawingAsItGoes(Sampler):
    """A sampler that draws from torch's global generator for every index, as it is asked."""

    def __len__(self) -> int:
        return 16

    def __iter__(self):
        for _ in range(16):
            yield int(torch.randint(1000, ()))


@pytest.mark.parametrize("workers", [0, 2])
def test_a_sampler_drawing_from_the_global_generator_as_it_goes_resumes_exactly(workers):
    """What the saved pass had drawn (delivered, and sent ahead to workers) is drawn again
    before the global generator goes back to where it stood as the state was saved."""
    def make():
        return DataLoader(list(range(1000)), batch_size=2, sampler=DrawingAsItGoes(),
                          num_workers=workers)

    torch.manual_seed(0)
    loader = make()
    iterator = iter(loader)
    values(islice(iterator, 3))
    state = json.loads(json.dumps(loader.state_dict()))
    rest = values(iterator)
    torch.manual_seed(123)  # a new job
    resumed = make()
    resumed.load_state_dict(state)
    assert values(resumed) == rest and len(rest) == 5


@pytest.mark.parametrize("workers", [0, 2])
def test_epochs_after_a_resume_draw_as_the_saved_job_though_training_drew_from_the_global_rng(
        workers):
    def make():
        return DataLoader(torch.arange(32), batch_size=4, shuffle=True, num_workers=workers)

    def train(batches) -> list:  # each step draws from the global generator, as dropout does
        seen = []
        for batch in batches:
            torch.nn.functional.dropout(torch.ones(8), 0.5)
            seen.append(batch.tolist())
        return seen

    torch.manual_seed(0)
    loader = make()
    uninterrupted = [train(loader) for _ in range(3)]
    torch.manual_seed(0)
    loader = make()
    train(loader)
    iterator = iter(loader)
    head = train(islice(iterator, 3))
    state = json.loads(json.dumps(loader.state_dict()))
    del iterator
    torch.manual_seed(0)
    resumed = make()
    resumed.load_state_dict(state)
    assert [head + train(resumed), train(resumed)] == uninterrupted[1:]


class Noisy(Dataset):
    """Each item carries a draw from the global torch RNG (a random augmentation)."""

    def __len__(self) -> int:
        return 24

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.stack([torch.tensor(index), torch.randint(1000, ())])


def batches(loader) -> list:
    return [b.tolist() for b in loader]


class NoisyStream(IterableDataset):
    """A stream whose items each carry a draw from the global torch RNG."""

    def __iter__(self):
        return (torch.stack([torch.tensor(i), torch.randint(1000, ())]) for i in range(12))


@pytest.mark.parametrize("dataset, shuffle", [(Noisy(), True), (NoisyStream(), False)])
@pytest.mark.parametrize("workers", [0, 2])
def test_a_state_taken_again_before_a_resumed_pass_delivers_resumes_as_the_first(dataset, shuffle,
                                                                               workers):
    """The resumed pass replays the saved one's draws first: until then, the global generators
    it is to give back are the saved ones, not where the replay stands."""
    def make():
        return DataLoader(dataset, batch_size=2, shuffle=shuffle, num_workers=workers)

    def resumed(state) -> tuple[list, list]:  # the rest of the pass, and a step's draws
        torch.manual_seed(7)
        loader = make()
        loader.load_state_dict(state)
        iterator = iter(loader)
        first = next(iterator).tolist()
        step = torch.rand(2).tolist()
        return [first, *values(iterator)], step

    torch.manual_seed(0)
    loader = make()
    iterator = iter(loader)
    for _ in range(3):
        next(iterator)
        torch.rand(1)  # a training step's draw
    state = json.loads(json.dumps(loader.state_dict()))
    del iterator
    torch.manual_seed(7)
    again = make()
    again.load_state_dict(state)
    iterator = iter(again)
    state_again = again.state_dict()
    del iterator
    assert resumed(state_again) == resumed(state)


@pytest.mark.parametrize("dataset, shuffle", [(Indexed(), True), (Stream(), False)])
@pytest.mark.parametrize("workers, persistent", [(0, False), (2, False), (2, True)])
def test_a_state_saved_after_an_epoch_resumes_with_the_next_epoch_whole(dataset, shuffle, workers,
                                                                       persistent):
    # Persistent workers draw no new seed for their next epoch: neither does its resume.
    def make():
        return DataLoader(dataset, batch_size=4, shuffle=shuffle, num_workers=workers,
                          persistent_workers=persistent,
                          generator=torch.Generator().manual_seed(5))

    loader = make()
    batches(loader)
    state = loader.state_dict()
    json.dumps(state)  # plain numbers and lists: json writes it as torch.save does
    second, third = batches(loader), batches(loader)
    fresh = make()
    fresh.load_state_dict(json.loads(json.dumps(state)))
    assert batches(fresh) == second and batches(fresh) == third


@pytest.mark.parametrize("workers, persistent", [(0, False), (2, False), (2, True)])
def test_a_state_taken_on_an_epochs_last_batch_resumes_its_empty_rest_or_the_next_epoch_by_its_epoch(
        workers, persistent):
    """A checkpoint on an epoch's last step (the pass's end not yet seen) loses no epoch and
    repeats none: a loop that goes on with the saved epoch gets its empty rest, then the next
    (as torchdata's loader resumes it); a trainer that sets the next epoch after iter(), as
    Lightning does, gets the next epoch at once."""
    def make():
        return DataLoader(Indexed(), batch_size=5, shuffle=True, num_workers=workers,
                          persistent_workers=persistent,
                          generator=torch.Generator().manual_seed(5))

    loader = make()
    loader.set_epoch(0)  # what a trainer does (the default sampler keeps it, as torch's order)
    iterator = iter(loader)
    assert len(values(islice(iterator, 10))) == 10  # all of them, the end not yet asked for
    state = loader.state_dict()
    second = batches(loader)
    assert len(second) == 10
    loop = make()
    loop.load_state_dict(state)
    assert loop.state_dict() == state
    loop.set_epoch(0)
    assert batches(loop) == [] and len(loop) == 10
    assert batches(loop) == second
    trainer = make()
    trainer.load_state_dict(json.loads(json.dumps(state)))
    resumed = iter(trainer)
    trainer.set_epoch(1)  # Lightning's order: the pass, then set_epoch
    assert batches(resumed) == second


@pytest.mark.parametrize("workers", [0, 2])
def test_the_epoch_after_a_state_on_the_last_batch_draws_as_the_uninterrupted_runs(workers):
    # torch's RandomSampler with a generator draws once more as it ends: a state taken before
    # its end was seen holds the generator as the next epoch would have found it.
    def make(kind=DataLoader):
        return kind(Indexed(12), batch_size=3, shuffle=True, num_workers=workers,
                    generator=torch.Generator().manual_seed(5))

    torchs = make(TorchLoader)
    expected = [values(torchs) for _ in range(2)][1]
    loader = make()
    iterator = iter(loader)
    list(islice(iterator, len(loader)))  # the last batch, its end not yet asked for
    resumed = make()
    resumed.load_state_dict(loader.state_dict())
    assert values(resumed) == []  # the saved epoch's empty rest (see the test below)
    assert values(resumed) == expected
    assert [b.tolist() for b in iterator] == [] and values(loader) == expected  # the saver too


class SlowToEnd(RandomSampler):
    """torch's ``RandomSampler`` order, which draws once more as it ends, a while after its
    last index: a pinning thread meets the end later than the caller takes the last batch."""

    def __iter__(self):
        yield from torch.randperm(len(self.data_source), generator=self.generator).tolist()
        time.sleep(0.3)
        torch.randperm(len(self.data_source), generator=self.generator)  # the draw as it ends


def test_a_state_on_the_last_batch_through_a_pinning_thread_waits_for_its_end(monkeypatch):
    import shardwise.loader.iterator as iterator_module

    monkeypatch.setattr(iterator_module, "pin_batch", lambda batch: batch)  # (no GPU here)

    def make(kind=DataLoader):
        made = kind(Indexed(12), batch_size=3, sampler=SlowToEnd(
            Indexed(12), generator=torch.Generator().manual_seed(5)))
        made._pinning = kind is DataLoader  # the pinning thread, pinning itself left out
        return made

    torchs = make(TorchLoader)
    expected = [values(torchs) for _ in range(2)][1]
    loader = make()
    iterator = iter(loader)
    list(islice(iterator, len(loader)))  # the last batch: the thread has yet to meet the end
    resumed = make()
    resumed.load_state_dict(loader.state_dict())
    assert values(resumed) == expected  # (a sampler with no set_epoch: the next epoch whole)


def test_a_state_on_an_epochs_last_batch_without_set_epoch_resumes_as_torchdatas_loader():
    """The default samplers' epoch, never set, stays the saved one: the empty rest, then the
    next epoch; the state after the empty rest is the next epoch's start. A sampler that has
    no epoch at all (torch's own) resumes with the next epoch whole."""
    def make(sampler=None):
        return DataLoader(Indexed(), batch_size=4, shuffle=sampler is None, sampler=sampler,
                          generator=torch.Generator().manual_seed(3))

    def on_the_last_batch(loader) -> tuple[dict, list]:
        """The state on the epoch's last batch, and the next epoch's batches."""
        values(islice(iter(loader), len(loader)))
        return loader.state_dict(), batches(loader)

    state, second = on_the_last_batch(make())
    fresh = make()
    fresh.load_state_dict(state)
    assert batches(fresh) == []
    assert "end_unseen" not in fresh.state_dict()
    again = make()
    again.load_state_dict(fresh.state_dict())
    assert batches(again) == second == batches(fresh)

    def torchs():
        return make(RandomSampler(Indexed(), generator=torch.Generator().manual_seed(4)))

    state, second = on_the_last_batch(torchs())
    fresh = torchs()
    fresh.load_state_dict(state)
    assert batches(fresh) == second and len(second) == len(fresh)


def test_the_default_samplers_are_torchs_and_keep_the_epoch_they_are_told():
    for shuffle, kind in ((True, RandomSampler),
                          (False, SequentialSampler)):
        ours = DataLoader(Indexed(), batch_size=4, shuffle=shuffle,
                          generator=torch.Generator().manual_seed(1))
        theirs = TorchLoader(Indexed(), batch_size=4, shuffle=shuffle,
                             generator=torch.Generator().manual_seed(1))
        assert isinstance(ours.sampler, kind) and ours.batch_sampler.sampler is ours.sampler
        ours.set_epoch(3)
        assert ours.sampler.epoch == 3
        assert batches(ours) == batches(theirs) and batches(ours) == batches(theirs)
    with pytest.raises(TypeError, match="epoch must be an int, got 1.5"):
        ours.set_epoch(1.5)
    assert not hasattr(DataLoader(Stream()).sampler, "set_epoch")  # a stream's is torch's


def test_a_state_resumed_in_another_epoch_begins_it_whole():
    def make():
        return DataLoader(Indexed(), batch_size=5, sampler=DistributedSampler(
            Indexed(), num_replicas=1, rank=0, seed=2))

    loader = make()
    iterator = iter(loader)
    values(islice(iterator, 3))
    fresh = make()
    fresh.load_state_dict(loader.state_dict())
    fresh.set_epoch(1)  # a trainer that starts the next epoch, not the saved one's rest
    reference = make()
    reference.set_epoch(1)
    assert len(fresh) == 10 and values(fresh) == values(reference)


@pytest.mark.parametrize("persistent", [False, True])
def test_a_state_taken_before_the_first_pass_seeds_the_workers_as_the_pass_would(persistent):
    def make():
        return DataLoader(Noisy(), batch_size=4, num_workers=2, persistent_workers=persistent)

    torch.manual_seed(7)
    state = make().state_dict()
    expected = batches(make())  # the same global RNG state as the saved loader's
    torch.manual_seed(99)
    fresh = make()
    fresh.load_state_dict(state)
    assert batches(fresh) == expected


def test_a_state_loads_into_a_loader_with_live_persistent_workers_as_into_a_fresh_one():
    def make():
        return DataLoader(Noisy(), batch_size=4, num_workers=2, persistent_workers=True)

    loader = make()
    iterator = iter(loader)
    next(iterator), next(iterator)
    state = loader.state_dict()
    del iterator
    batches(loader)  # the workers live on into another epoch, their draws moving on
    fresh = make()
    fresh.load_state_dict(state)
    loader.load_state_dict(state)
    assert batches(loader) == batches(fresh)


class StatefulNoisy(Noisy):
    """A Stateful dataset whose state is the RNG its draws come from (torchdata's protocol)."""

    def state_dict(self) -> dict:
        return {"rng": torch.get_rng_state().tolist()}

    def load_state_dict(self, state: dict) -> None:
        torch.set_rng_state(torch.tensor(state["rng"], dtype=torch.uint8))


class Countdown(IterableDataset):
    """Its own iterator, Stateful: ``__iter__`` starts over, the state holds the position."""

    def __init__(self) -> None:
        self.at = 0

    def __iter__(self):
        self.at = 0
        return self

    def __next__(self) -> int:
        if self.at >= 20:
            raise StopIteration
        self.at += 1
        return self.at - 1

    def state_dict(self) -> dict:
        return {"at": self.at}

    def load_state_dict(self, state: dict) -> None:
        self.at = state["at"]


@pytest.mark.parametrize("stop_after", [0, 1, 4])
def test_a_stateful_dataset_in_the_loaders_process_resumes_by_its_own_state(stop_after):
    torch.manual_seed(3)
    whole, head, rest, _ = interrupted(
        lambda: DataLoader(StatefulNoisy(), batch_size=4, shuffle=True), stop_after)
    assert head + rest == whole  # the same indices and the same draws for them
    dataset = Countdown()  # one object, exhausted by the uninterrupted pass before the resume
    whole, head, rest, _ = interrupted(lambda: DataLoader(dataset, batch_size=3), stop_after)
    assert head + rest == whole


class Wandering(Countdown):
    """A stream that starts anywhere (as a shuffled shard list might): only its own state can put
    a resume back where it was; loading it again from the start would not."""

    def __iter__(self):
        self.at = random.SystemRandom().randrange(1000)
        self.end = self.at + 20
        return self

    def __next__(self) -> int:
        if self.at >= self.end:
            raise StopIteration
        self.at += 1
        return self.at - 1

    def state_dict(self) -> dict:
        return {"at": self.at, "end": self.end}

    def load_state_dict(self, state: dict) -> None:
        self.at, self.end = state["at"], state["end"]


def json_interrupted(make_loader, stop_after: int):
    """``interrupted``, with the state written to JSON and read back on the way."""
    loader = make_loader()
    iterator = iter(loader)
    head = values(islice(iterator, stop_after))
    state = json.loads(json.dumps(loader.state_dict()))
    whole = head + values(iterator)
    fresh = make_loader()
    fresh.load_state_dict(state)
    return whole, head + values(fresh)


@pytest.mark.parametrize("stop_after", [2, 3])
@pytest.mark.parametrize("persistent", [False, True])
def test_a_stateful_dataset_in_worker_processes_resumes_each_copy_by_its_own_state(
        stop_after, persistent):
    # Each worker's draws go on from its dataset's state, not from the worker's fresh seed; the
    # batch after the resume goes to the worker whose turn it was. (Both workers have delivered
    # a batch: one that has not starts afresh, seeded as before, which a stream that starts
    # from true entropy would not repeat.)
    def noisy():
        return DataLoader(StatefulNoisy(), batch_size=2, shuffle=True, num_workers=2,
                          persistent_workers=persistent)

    torch.manual_seed(3)
    whole, resumed = json_interrupted(noisy, stop_after)
    assert resumed == whole
    for dataset in (Wandering(), Countdown()):
        whole, resumed = json_interrupted(
            lambda dataset=dataset: DataLoader(dataset, batch_size=3, num_workers=2,
                                               persistent_workers=persistent), stop_after)
        assert resumed == whole


@pytest.mark.parametrize("threads", [0, 2])
@pytest.mark.parametrize("persistent", [False, True])
def test_a_stateful_stream_in_the_loaders_process_resumes_without_loading_again(threads,
                                                                                  persistent):
    dataset = Wandering()
    whole, resumed = json_interrupted(
        lambda: DataLoader(dataset, batch_size=3, num_workers=threads, worker_type="thread",
                           persistent_workers=persistent and threads > 0), 2)
    assert resumed == whole


@pytest.mark.parametrize("stop_after", [3, None])
def test_persistent_workers_carry_their_datasets_state_into_a_resumed_epoch(stop_after):
    # Saved within the second epoch, or after it: the workers' datasets stand where that epoch's
    # draws left them, and a resume goes on from there.
    def make():
        return DataLoader(StatefulNoisy(), batch_size=2, num_workers=2, persistent_workers=True)

    torch.manual_seed(3)
    loader = make()
    batches(loader)
    iterator = iter(loader)
    list(islice(iterator, stop_after))  # None: to the epoch's end
    state = json.loads(json.dumps(loader.state_dict()))
    rest = values(iterator)
    later = batches(loader)
    fresh = make()
    fresh.load_state_dict(state)
    if stop_after is None:
        assert batches(fresh) == later
    else:
        assert values(fresh) == rest and batches(fresh) == later


@pytest.mark.parametrize("taken", [0, 1, 3])
def test_persistent_workers_left_early_carry_what_they_fetched_ahead_into_the_next_epoch(taken):
    # The first epoch is left after one batch, while each worker had fetched more: the next
    # epoch's state holds where each worker's dataset really stands, not where delivery left it.
    def make():
        return DataLoader(StatefulNoisy(), batch_size=2, num_workers=2, persistent_workers=True)

    torch.manual_seed(3)
    loader = make()
    next(iter(loader))
    iterator = iter(loader)
    list(islice(iterator, taken))
    state = json.loads(json.dumps(loader.state_dict()))
    rest = values(iterator)
    fresh = make()
    fresh.load_state_dict(state)
    assert values(fresh) == rest


class Position:
    """An iterator that is Stateful itself (its dataset is not): where it stands in its items."""

    def __init__(self, items: list[int]) -> None:
        self.items, self.at = items, 0

    def __iter__(self):
        return self

    def __next__(self) -> int:
        if self.at >= len(self.items):
            raise StopIteration
        self.at += 1
        return self.items[self.at - 1]

    def state_dict(self) -> dict:
        return {"at": self.at}

    def load_state_dict(self, state: dict) -> None:
        self.at = state["at"]


class WorkerShares(IterableDataset):
    """Four items a worker, read through a Stateful iterator made anew each pass."""

    def __iter__(self):
        worker = get_worker_info().id
        return Position(list(range(100 * worker, 100 * worker + 4)))


@pytest.mark.parametrize("taken", [1, 2, 4])
def test_a_later_epochs_state_taken_before_every_worker_delivered_resumes_them_all(taken):
    # In the second epoch the workers that have not delivered yet still hold the states they
    # ended the first with: a resume must start their streams anew, not go on from those ends.
    def make():
        return DataLoader(WorkerShares(), batch_size=None, num_workers=3, persistent_workers=True)

    loader = make()
    epoch = sorted(loader)
    iterator = iter(loader)
    head = list(islice(iterator, taken))
    state = json.loads(json.dumps(loader.state_dict()))
    fresh = make()
    fresh.load_state_dict(state)
    assert sorted(head + list(fresh)) == epoch and len(epoch) == 12


class FaultyCountdown(Countdown):
    """Item 7 of each copy of the stream is corrupt: it raises, and the stream goes on after it."""

    def __next__(self) -> int:
        if self.at == 7:
            self.at += 1
            raise ValueError("item 7 is corrupt")
        return super().__next__()


class FaultyNoisy(StatefulNoisy):
    """Index 7 draws its noise, then fails."""

    def __getitem__(self, index: int) -> torch.Tensor:
        item = super().__getitem__(index)
        if index == 7:
            raise ValueError("item 7 is corrupt")
        return item


def outcomes(iterator) -> list:
    """Each batch's values, or the error in its place, going on after errors as torch allows."""
    seen = []
    while True:
        try:
            seen.append(next(iterator).tolist())
        except StopIteration:
            return seen
        except ValueError as error:
            seen.append(str(error).splitlines()[-1])


@pytest.mark.parametrize("dataset, workers, worker_type", [
    (FaultyCountdown, 0, "process"), (FaultyCountdown, 2, "process"),
    (FaultyCountdown, 2, "thread"), (FaultyNoisy, 0, "process"), (FaultyNoisy, 2, "process")])
def test_a_state_saved_just_after_a_failed_batch_resumes_past_it(dataset, workers, worker_type):
    # The failed batch moved its dataset on (its draws, its stream's position): a resume does not
    # read it again, and goes on with the dataset where the uninterrupted pass had it. (Threads
    # drawing from one global generator at once have no such order: no noise with threads.)
    def make():
        return DataLoader(dataset(), batch_size=3, num_workers=workers, worker_type=worker_type)

    torch.manual_seed(3)
    loader = make()
    iterator = iter(loader)
    with pytest.raises(ValueError, match="item 7 is corrupt"):
        while True:
            next(iterator)
    state = json.loads(json.dumps(loader.state_dict()))
    rest = outcomes(iterator)
    fresh = make()
    fresh.load_state_dict(state)
    assert outcomes(iter(fresh)) == rest


@pytest.mark.parametrize("dataset, saved, workers, match", [
    (Stream, 2, 0, ("as 2 worker processes, each reading its own share, but this loader has one "
                   "stream .* num_workers=2")),
    (StatefulNoisy, 2, 3, ("with 2 worker processes, each with its own copy of the Stateful "
                          "dataset's state, but this loader has 3 worker processes.* num_workers=2")),
    (StatefulNoisy, 0, 2, ("with one stream .* but this loader has 2 worker processes.* "
                          r"num_workers=0 \(or thread workers\)")),
])
@pytest.mark.parametrize("delivered", [0, 1])
def test_a_state_with_worker_streams_resumes_only_on_as_many_worker_processes(
        dataset, saved, workers, match, delivered):
    # A stream's shares, or a Stateful dataset's states, are each worker's own: refused as the
    # pass begins, as torchdata refuses it (an AssertionError too), whether or not the saved pass
    # had delivered anything; the state stays loaded for a loader mended in place.
    loader = DataLoader(dataset(), batch_size=2, num_workers=saved)
    iterator = iter(loader)
    for _ in range(delivered):
        next(iterator)
    state = loader.state_dict()
    del iterator
    resumed = DataLoader(dataset(), batch_size=2, num_workers=workers)
    resumed.load_state_dict(state)
    with pytest.raises(StateMismatchError, match=match) as error:
        iter(resumed)
    assert isinstance(error.value, ValueError) and isinstance(error.value, AssertionError)
    resumed.num_workers, resumed.prefetch_factor = saved, 2 if saved else None  # (as torch's)
    fresh = DataLoader(dataset(), batch_size=2, num_workers=saved)
    fresh.load_state_dict(state)
    assert [b.tolist() for b in resumed] == [b.tolist() for b in fresh]


@pytest.mark.parametrize("saved, workers", [(2, 0), (1, 2), (2, 3), (0, 2)])
@pytest.mark.parametrize("delivered", [0, 3])
def test_a_state_of_a_map_dataset_without_a_state_of_its_own_resumes_on_any_workers(
        saved, workers, delivered):
    def make(num_workers: int) -> DataLoader:
        return DataLoader(list(range(20)), batch_size=2, shuffle=True, num_workers=num_workers,
                          generator=torch.Generator().manual_seed(0))

    loader = make(saved)
    iterator = iter(loader)
    taken = [next(iterator).tolist() for _ in range(delivered)]
    state = loader.state_dict()
    rest = [b.tolist() for b in iterator]
    resumed = make(workers)
    resumed.load_state_dict(state)
    assert [b.tolist() for b in resumed] == rest and len(taken + rest) == 10


class Shares(IterableDataset):
    """Each worker yields its own share (of uneven sizes); its state says how far it got, and
    resets as the share ends, so that a later load starts the next epoch (torchdata's idiom)."""

    def __init__(self, sizes=(5, 12)) -> None:
        self.sizes, self.at, self.resume = sizes, 0, None

    def __iter__(self):
        info = get_worker_info()
        wid = 0 if info is None else info.id
        self.at, self.resume = self.resume or 0, None
        start = sum(self.sizes[:wid])
        for value in range(start + self.at, start + self.sizes[wid]):
            self.at += 1
            yield value
        self.at = 0

    def state_dict(self) -> dict:
        return {"at": self.at}

    def load_state_dict(self, state: dict) -> None:
        self.resume = state["at"]


@pytest.mark.parametrize("persistent", [False, True])
@pytest.mark.parametrize("stop_after", [2, 12, None])
def test_a_workers_stream_that_ended_stays_ended_and_its_reset_carries_on(persistent, stop_after):
    # Worker 0's share ends after 5 items, before 12 are delivered: a resume must not read it
    # again though its state says "start over"; after the epoch, that reset is the next one's.
    def make():
        return DataLoader(Shares(), batch_size=None, num_workers=2,
                          persistent_workers=persistent)

    loader = make()
    iterator = iter(loader)
    head = [int(x) for x in islice(iterator, stop_after)]
    state = json.loads(json.dumps(loader.state_dict()))
    rest = [int(x) for x in iterator]
    later = [int(x) for x in loader]
    fresh = make()
    fresh.load_state_dict(state)
    resumed = [int(x) for x in fresh]
    assert sorted(head + rest) == list(range(17)) and sorted(later) == list(range(17))
    assert resumed == (later if stop_after is None else rest)


def test_a_state_is_a_snapshot_not_a_view_of_the_pass():
    loader = DataLoader(Shares(), batch_size=None, num_workers=2)
    iterator = iter(loader)
    next(iterator), next(iterator)
    state = loader.state_dict()
    saved = json.dumps(state)
    list(iterator)
    assert json.dumps(state) == saved


class SetUpByIter(IterableDataset):
    """Its own iterator, whose state exists only once ``__iter__`` has set it up."""

    def __iter__(self):
        info = get_worker_info()
        wid, count = (0, 1) if info is None else (info.id, info.num_workers)
        self.share = {"position": wid * 20 // count, "end": (wid + 1) * 20 // count}
        return self

    def __next__(self) -> int:
        if self.share["position"] >= self.share["end"]:
            raise StopIteration
        self.share["position"] += 1
        return self.share["position"] - 1

    def state_dict(self) -> dict:
        return {"position": self.share["position"]}

    def load_state_dict(self, state: dict) -> None:
        self.share["position"] = state["position"]  # fails before __iter__ set it up


@pytest.mark.parametrize("workers", [0, 2])
def test_a_dataset_that_is_its_own_iterator_is_put_back_only_after_its_iter(workers):
    whole, resumed = json_interrupted(
        lambda: DataLoader(SetUpByIter(), batch_size=3, num_workers=workers), 3)
    assert resumed == whole


class SlowFirst(Dataset):
    """Index 0 takes a while: with in_order=False the batches after it overtake it."""

    def __len__(self) -> int:
        return 12

    def __getitem__(self, index: int) -> int:
        if index == 0:
            time.sleep(0.5)
        return index


@pytest.mark.parametrize("sampler", [False, True])
def test_in_order_false_resumes_a_map_dataset_exactly(sampler, recwarn):
    # Saved while batch 0 is still loading: the resume loads it, and none of the later batches
    # delivered already.
    def make():
        chosen = DistributedSampler(SlowFirst(), num_replicas=1, rank=0, shuffle=False) \
            if sampler else None
        return DataLoader(SlowFirst(), batch_size=None, sampler=chosen, num_workers=2,
                          in_order=False)

    loader = make()
    iterator = iter(loader)
    head = [int(x) for x in islice(iterator, 4)]
    state = json.loads(json.dumps(loader.state_dict()))
    del iterator
    fresh = make()
    fresh.load_state_dict(state)
    rest = [int(x) for x in fresh]
    assert 0 not in head and 0 in rest and len(fresh) == 12
    assert sorted(head + rest) == list(range(12))
    assert not [w for w in recwarn if "in_order" in str(w.message)]


def test_an_out_of_order_state_with_batches_ahead_resumes_only_on_their_batch_size():
    # A shardwise sampler's place resumes on any batch size; the batches delivered ahead of
    # the slow first one are known by their places among batches of 2.
    def make(batch_size: int) -> DataLoader:
        return DataLoader(SlowFirst(), batch_size=batch_size, num_workers=2, in_order=False,
                          sampler=DistributedSampler(SlowFirst(), 1, 0, shuffle=False))

    loader = make(2)
    iterator = iter(loader)
    head = [x for batch in islice(iterator, 2) for x in batch.tolist()]
    state = loader.state_dict()
    del iterator
    assert state["ahead"] and 0 not in head
    refused = make(4)
    refused.load_state_dict(state)
    with pytest.raises(StateMismatchError, match="batch_size=2, but this one has batch_size=4.*"
                                                 "in_order=False delivered ahead"):
        iter(refused)
    same = make(2)
    same.load_state_dict(state)
    assert sorted(head + [x for batch in same for x in batch.tolist()]) == list(range(12))
    refused.set_epoch(1)  # the next epoch begins whole: no place is passed over
    assert sorted(x for batch in refused for x in batch.tolist()) == list(range(12))


class Eager(IterableDataset):
    """The state is the dataset's; ``__iter__`` reads it at once (its iterator is no generator)."""

    def __init__(self) -> None:
        self.position = 0

    def __iter__(self):
        return EagerIterator(self)

    def state_dict(self) -> dict:
        return {"position": self.position}

    def load_state_dict(self, state: dict) -> None:
        self.position = state["position"]


class EagerIterator:
    def __init__(self, dataset: Eager) -> None:
        self.dataset, self.at = dataset, dataset.position

    def __iter__(self):
        return self

    def __next__(self) -> int:
        if self.at >= 20:
            self.dataset.position = 0
            raise StopIteration
        self.at += 1
        self.dataset.position = self.at
        return self.at - 1


@pytest.mark.parametrize("threads", [0, 2])
def test_a_datasets_state_is_put_back_before_its_iterator_is_made(threads):
    whole, resumed = json_interrupted(
        lambda: DataLoader(Eager(), batch_size=3, num_workers=threads, worker_type="thread"), 2)
    assert resumed == whole


def test_in_order_false_on_another_rank_warns_that_its_order_was_its_own():
    def make(rank):
        sampler = DistributedSampler(SlowFirst(), num_replicas=2, rank=rank, shuffle=False)
        return DataLoader(SlowFirst(), batch_size=None, sampler=sampler, num_workers=2,
                          in_order=False)

    loader = make(0)
    iterator = iter(loader)
    head = [int(x) for x in islice(iterator, 3)]
    state = loader.state_dict()
    del iterator
    assert state["ahead"]  # batch 0 is still loading: later ones came first
    same = make(0)
    same.load_state_dict(state)
    assert sorted(head + [int(x) for x in same]) == list(range(0, 12, 2))
    with pytest.warns(UserWarning, match="by rank 0 of 2; this is rank 1 of 2.* its own state"):
        make(1).load_state_dict(state)


@pytest.mark.parametrize("workers, stop_after", [(0, 3), (2, 5), (2, 6)])
def test_a_short_last_batch_ends_its_stream_for_a_resume_too(workers, stop_after):
    # Worker 0's share (5 items in batches of 2) ends with a short batch, after which its
    # dataset has reset itself: a resume must not read that share again.
    whole, resumed = json_interrupted(
        lambda: DataLoader(Shares(), batch_size=2, num_workers=workers), stop_after)
    assert resumed == whole


class SkippingBatches(BatchSampler):
    """As accelerate's SkipBatchSampler: a BatchSampler subclass without a ``sampler``."""

    def __init__(self, batches: BatchSampler, skip: int) -> None:
        self.batches, self.skip = batches, skip

    def __iter__(self):
        return islice(iter(self.batches), self.skip, None)

    def __len__(self) -> int:
        return len(self.batches) - self.skip


@pytest.mark.parametrize("workers", [0, 2])
def test_a_batch_sampler_without_a_sampler_resumes_as_it_loads(workers):
    def make():
        return DataLoader(range(16), batch_sampler=SkippingBatches(
            BatchSampler(RandomSampler(range(16)), 3, False), 1), num_workers=workers)

    torch.manual_seed(5)
    loader = make()
    iterator = iter(loader)
    taken = [next(iterator).tolist() for _ in range(2)]
    state = json.loads(json.dumps(loader.state_dict()))
    rest = [b.tolist() for b in iterator]
    resumed = make()
    resumed.load_state_dict(state)
    assert [b.tolist() for b in resumed] == rest
    torch.manual_seed(5)
    assert taken + rest == [b.tolist() for b in TorchLoader(range(16), batch_sampler=SkippingBatches(
        BatchSampler(RandomSampler(range(16)), 3, False), 1), num_workers=workers)]


def test_a_state_saved_with_random_states_as_lists_still_resumes():
    loader = DataLoader(range(20), batch_size=3, shuffle=True)
    iterator = iter(loader)
    next(iterator)
    state = loader.state_dict()
    rest = [b.tolist() for b in iterator]
    # As states were saved before: torch's generators only, as lists of byte values
    state["randomness"] = {name: list(bytes.fromhex(hex_state))
                           for name, hex_state in state["randomness"].items()
                           if name not in ("numpy", "python")}
    del state["randomness_now"]
    resumed = DataLoader(range(20), batch_size=3, shuffle=True)
    resumed.load_state_dict(state)
    assert [b.tolist() for b in resumed] == rest


def test_a_class_is_not_a_stateful_dataset():
    # accelerate's loader unpickles through a loader whose dataset is a class
    assert not stateful(StatefulNoisy) and stateful(StatefulNoisy())


@pytest.mark.parametrize("workers", [0, 2])
def test_a_resumed_streams_state_after_more_batches_is_the_uninterrupted_ones(workers):
    """As torchdata's tests compare them: nothing in the state tells a resumed pass apart."""
    def make():
        return DataLoader(Countdown(), batch_size=2, num_workers=workers,
                          persistent_workers=bool(workers))

    loader = make()
    iterator = iter(loader)
    values(islice(iterator, 3))
    state = loader.state_dict()
    values(islice(iterator, 2))
    expected = loader.state_dict()
    fresh = make()
    fresh.load_state_dict(state)
    values(islice(iter(fresh), 2))
    assert fresh.state_dict() == expected


@pytest.mark.parametrize(("saved", "resumed", "match"), [
    ({"batch_size": 4, "shuffle": True}, {"batch_size": 8, "shuffle": True}, "batch_size=4"),
    ({"batch_size": 4, "shuffle": True}, {"batch_size": 4}, "sampler='RandomSampler'"),
    ({"batch_size": 4, "drop_last": True}, {"batch_size": 4}, "drop_last=True"),
    ({"batch_size": 4}, {"batch_size": 4, "dataset": Indexed(60)}, "samples=50"),
    ({"batch_size": 4, "sampler": TorchDistributed(Indexed(), num_replicas=3, rank=0)},
     {"batch_size": 4, "sampler": TorchDistributed(Indexed(), num_replicas=2, rank=0)},
     "num_replicas=3.*resume on 3 ranks, or use shardwise.DistributedSampler"),
    ({"batch_size": 4, "dataset": Stream()}, {"batch_size": 8, "dataset": Stream()},
     "batch_size=4"),
    ({"batch_sampler": BatchSampler(RandomSampler(range(50)), 4, False)},
     {"batch_sampler": BatchSampler(RandomSampler(range(50)), 8, False)}, "batch_size=4"),
    ({"batch_sampler": BatchSampler(RandomSampler(range(50)), 4, False)},
     {"batch_sampler": BatchSampler(SequentialSampler(range(50)), 4, False)},
     "sampler='RandomSampler'"),
], ids=["batch_size", "shuffle", "drop_last", "dataset", "world", "stream", "batch_sampler",
        "its_sampler"])
def test_a_count_of_batches_made_otherwise_is_refused_by_name(saved, resumed, match):
    # Without a shardwise sampler, a resume passes over as many batches as were delivered:
    # counted in other batches, that would repeat or skip samples.
    def build(options):
        options = dict(options)
        return DataLoader(options.pop("dataset", Indexed()), **options)

    loader = build(saved)
    iterator = iter(loader)
    next(iterator)
    state = json.loads(json.dumps(loader.state_dict()))
    other = build(resumed)
    other.load_state_dict(state)
    with pytest.raises(StateMismatchError, match=match):  # as its pass begins (see below)
        iter(other)
    passing_over_none = build(resumed)
    passing_over_none.load_state_dict(build(saved).state_dict())
    assert values(passing_over_none)  # a whole pass, as the resumed loader makes it


def test_a_count_of_batches_is_checked_against_the_loader_as_its_pass_begins():
    # A dataset whose length is set for the epoch after the state is loaded; the same batches
    # through a batch sampler given as the loader made it from batch_size.
    saving = DataLoader(Indexed(10), batch_size=2)
    list(islice(saving, 2))
    state = saving.state_dict()
    dataset = Indexed(20)
    resumed = DataLoader(dataset, batch_sampler=BatchSampler(SequentialSampler(dataset), 2,
                                                             False))
    resumed.load_state_dict(state)
    dataset.size = 10
    assert values(resumed) == [[4, 5], [6, 7], [8, 9]]


def test_a_stateful_stream_put_back_by_its_own_state_resumes_on_another_batch_size():
    saving = DataLoader(Countdown(), batch_size=2)
    list(islice(saving, 2))
    resumed = DataLoader(Countdown(), batch_size=4)
    resumed.load_state_dict(saving.state_dict())
    assert values(resumed) == [[4, 5, 6, 7], [8, 9, 10, 11], [12, 13, 14, 15], [16, 17, 18, 19]]


def rank_0_of_2() -> DataLoader:
    """Batches of 4 of rank 0's half of 40 samples."""
    return DataLoader(Indexed(40), batch_size=4, sampler=DistributedSampler(40, 2, 0, seed=0))


def saved_after_two_batches() -> tuple[DataLoader, DataLoader]:
    """``rank_0_of_2()`` after 2 batches, and another with its state loaded."""
    saving = rank_0_of_2()
    list(islice(saving, 2))
    resumed = rank_0_of_2()
    resumed.load_state_dict(saving.state_dict())
    return saving, resumed


def test_a_loaded_state_whose_sampler_moved_to_another_epoch_saves_that_epochs_start():
    loader = rank_0_of_2
    saving, resumed = saved_after_two_batches()
    assert resumed.state_dict() == saving.state_dict()  # as loaded, while its epoch stands
    resumed.sampler.set_epoch(1)  # the job moves on: the rest of epoch 0 is dropped
    again = loader()
    again.load_state_dict(resumed.state_dict())
    epoch_1 = loader()
    epoch_1.sampler.set_epoch(1)
    assert values(again) == values(epoch_1)


def test_an_epoch_left_and_set_again_after_a_load_begins_whole():
    loader = rank_0_of_2
    _, resumed = saved_after_two_batches()
    resumed.set_epoch(1)
    resumed.set_epoch(0)  # back: the sampler dropped the rest of epoch 0 and begins it whole
    whole = values(loader())
    assert len(resumed) == len(whole)
    again = loader()
    again.load_state_dict(resumed.state_dict())
    assert values(again) == whole
    assert values(resumed) == whole


def test_a_pass_whose_epoch_was_left_and_set_again_saves_that_epochs_start():
    loader = rank_0_of_2
    saving = loader()
    list(islice(saving, 2))
    saving.set_epoch(1)
    saving.set_epoch(0)
    state = saving.state_dict()
    assert state["batches"] == 0
    resumed = loader()
    resumed.load_state_dict(state)
    assert values(resumed) == values(saving) == values(loader())


@pytest.mark.parametrize("workers,worker_type", [(0, "process"), (2, "thread"), (2, "process")])
def test_a_streams_state_saved_after_its_pass_ended_resumes_with_the_next_pass_whole(
        workers, worker_type):
    from shardwise import shard_iterable

    def loader():
        stream = shard_iterable(shards=[range(6), range(6, 12)], rank=0, world_size=1)
        return DataLoader(stream, batch_size=2, num_workers=workers, worker_type=worker_type)

    saving = loader()
    epoch = values(saving)
    resumed = loader()
    resumed.load_state_dict(saving.state_dict())  # a checkpoint after the loop, as most write
    assert values(resumed) == epoch == values(saving)


@pytest.mark.parametrize("workers", [0, 2])
def test_a_resume_reads_torchs_distributed_sampler_in_the_epoch_set_after_iter(workers):
    """Resuming a checkpoint, Lightning makes the pass, then sets the epoch: a resumed pass
    reads the sampler's order at the first next() (as torch's loader does with no workers)."""
    def loader():
        return DataLoader(Indexed(22), batch_size=2, num_workers=workers,
                          sampler=TorchDistributed(Indexed(22), num_replicas=2, rank=0, seed=0))

    saving = loader()
    saving.sampler.set_epoch(1)
    iterator = iter(saving)
    values(islice(iterator, 2))
    state = saving.state_dict()
    rest = values(iterator)
    resumed = loader()
    resumed.load_state_dict(state)
    iterator = iter(resumed)
    resumed.sampler.set_epoch(1)
    assert values(iterator) == rest
    mismatched = DataLoader(Indexed(22), batch_size=3, sampler=TorchDistributed(
        Indexed(22), num_replicas=2, rank=0, seed=0))
    mismatched.load_state_dict(state)
    with pytest.raises(StateMismatchError, match="batch_size"):
        iter(mismatched)  # refused as the pass is made, all the same


def test_a_resumed_pass_not_yet_begun_is_retired_by_the_next_on_persistent_workers():
    def loader():
        return DataLoader(Indexed(40), batch_size=2, num_workers=2, persistent_workers=True,
                          sampler=TorchDistributed(Indexed(40), num_replicas=2, rank=0, seed=0))

    saving = loader()
    iterator = iter(saving)
    values(islice(iterator, 2))
    state = saving.state_dict()
    rest = values(iterator)
    del iterator
    saving._iterator = None  # its workers stop
    resumed = loader()
    resumed.load_state_dict(state)
    first, second = iter(resumed), iter(resumed)  # (the first waits for its first next())
    assert values(first) == [] and values(second) == rest  # as on torch's persistent workers
    assert len(multiprocessing.active_children()) == 2  # one pool, the second pass's
    del first, second
    resumed._iterator = None  # how Lightning stops them
    assert multiprocessing.active_children() == []


@pytest.mark.parametrize("weighted", [False, True])
def test_a_state_before_the_first_batch_of_an_epoch_the_workers_drew_whole_is_its_start(
        weighted):
    def loader():  # 2 batches: the workers draw them both (and the sampler's end) at iter()
        sampler = (WeightedDistributedSampler([1.0] * 8, 8, num_replicas=1, rank=0) if weighted
                   else DistributedSampler(8, 1, 0, seed=3))
        return DataLoader(Indexed(8), batch_size=4, num_workers=2, sampler=sampler)

    saving = loader()
    iterator = iter(saving)
    state = saving.state_dict()
    assert state["sampler"]["epoch"] == saving.sampler.epoch == 0
    resumed = loader()
    resumed.load_state_dict(state)
    assert values(resumed) == values(iterator)


class SlowAt(Indexed):
    """Sample ``slow`` takes a second: later batches are ready before it."""

    def __init__(self, size: int, slow: int) -> None:
        super().__init__(size)
        self.slow = slow

    def __getitem__(self, index: int) -> int:
        if index == self.slow:
            time.sleep(1.0)
        return index


def test_an_out_of_order_state_while_the_first_batch_loads_resumes_the_rest_of_its_epoch():
    first = int(DistributedSampler(8, 1, 0, seed=3).indices()[0])

    def loader():
        return DataLoader(SlowAt(8, first), batch_size=1, num_workers=2, in_order=False,
                          sampler=DistributedSampler(8, 1, 0, seed=3))

    saving = loader()
    iterator = iter(saving)
    head = values(islice(iterator, 5))
    state = saving.state_dict()  # the workers drew the whole epoch; its first batch is loading
    assert [first] not in head and state["sampler"]["epoch"] == saving.sampler.epoch == 0
    resumed = loader()
    resumed.load_state_dict(state)
    assert sorted(values(resumed)) == sorted(values(iterator))


@pytest.mark.parametrize("workers", [0, 2])
def test_a_state_as_the_next_automatic_epoch_begins_resumes_that_epoch(workers):
    def loader():  # set_epoch never called: each pass takes the next epoch by itself
        return DataLoader(Indexed(20), batch_size=4, num_workers=workers,
                          sampler=DistributedSampler(20, 1, 0, seed=2))

    saving = loader()
    values(saving)  # epoch 0, whole
    iterator = iter(saving)  # epoch 1, nothing delivered yet
    state = saving.state_dict()
    resumed = loader()
    resumed.load_state_dict(state)
    assert values(resumed) == values(iterator)
