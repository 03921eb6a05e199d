"""What shardwise.DataLoader adds: thread workers, stats, progress, distributed=True, checks."""

import collections.abc
import threading
import time
import warnings

import numpy as np
import pytest
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader as TorchLoader
from torch.utils.data import Dataset, IterableDataset
from torch.utils.data import DistributedSampler as TorchDistributedSampler

from shardwise import DataLoader, DistributedSampler, InconsistentRanksError, spawn_local

pytestmark = pytest.mark.timeout(120)


class Rows(Dataset):
    def __len__(self) -> int:
        return 45

    def __getitem__(self, index: int) -> dict:
        return {"index": index, "row": torch.full((3,), float(index))}


class Counting(IterableDataset):
    def __iter__(self):
        yield from range(29)


def plain(batches) -> list:
    return [b.tolist() if isinstance(b, torch.Tensor) else b for b in batches]


def indices(batches) -> list[int]:
    return [i for batch in batches for i in batch["index"].tolist()]


@pytest.mark.parametrize("options", [{"batch_size": 4}, {"batch_size": 4, "shuffle": True},
                                     {"batch_size": 4, "drop_last": True}], ids=str)
def test_thread_workers_give_torchs_batches(options):
    torch.manual_seed(1)
    ours = indices(DataLoader(Rows(), num_workers=2, worker_type="thread", **options))
    torch.manual_seed(1)
    assert ours == indices(TorchLoader(Rows(), num_workers=2, **options))


@pytest.mark.parametrize("options", [{"batch_size": None}, {"batch_size": 4},
                                     {"batch_size": 4, "drop_last": True}], ids=str)
def test_thread_workers_read_a_stream_once_in_order(options):
    """Threads share the stream: each item once, in order, as with no workers at all."""
    threads = DataLoader(Counting(), num_workers=2, worker_type="thread", **options)
    assert plain(threads) == plain(TorchLoader(Counting(), num_workers=0, **options))


def test_thread_workers_refuse_a_multiprocessing_context():
    with pytest.raises(ValueError, match="worker_type='thread' runs threads"):
        DataLoader(Rows(), num_workers=2, worker_type="thread", multiprocessing_context="spawn")


def test_worker_type_is_checked():
    with pytest.raises(ValueError, match="unknown worker_type 'fiber'"):
        DataLoader(Rows(), worker_type="fiber")


@pytest.mark.parametrize("workers", [0, 2])
def test_stats_count_the_pass(workers):
    loader = DataLoader(Rows(), batch_size=10, num_workers=workers)
    assert loader.stats.batches == 0
    list(loader)
    stats = loader.stats
    assert (stats.batches, stats.samples) == (5, 45)
    assert stats.seconds > 0 and 0 <= stats.stall <= 1 and stats.samples_per_second > 0
    assert [w.batches for w in stats.workers] == ([3, 2] if workers else [])
    assert "5 batches, 45 samples" in str(stats)


@pytest.mark.parametrize(("workers", "worker_type"), [(0, "process"), (2, "process"),
                                                     (2, "thread")])
def test_stats_of_a_pass_that_ended_stop_counting_time(workers, worker_type):
    # Its seconds ran on after the pass: samples/s and the stall shrank each time they were read.
    loader = DataLoader(Rows(), batch_size=10, num_workers=workers, worker_type=worker_type)
    list(loader)
    ended = loader.stats
    time.sleep(0.3)
    assert loader.stats.seconds == ended.seconds and loader.stats.stall == ended.stall
    for _ in loader:
        break  # a pass dropped is over too
    left = loader.stats
    time.sleep(0.3)
    assert loader.stats.seconds == left.seconds and left.batches == 1


class SlowFirst(Rows):
    """Index 0 comes late: the other worker's batches arrive before the first is delivered."""

    def __getitem__(self, index: int) -> dict:
        if index == 0:
            time.sleep(0.5)
        if index == 23:
            raise ValueError("no row 23")
        return super().__getitem__(index)


@pytest.mark.parametrize("worker_type", ["process", "thread"])
def test_stats_count_what_was_delivered_by_each_worker(worker_type):
    # Counted as they arrived, worker 1's batches made ahead of worker 0's late first one were
    # in the per-worker counts (3 for 1 delivered); a batch whose loading raised was counted
    # as a batch, and its samples as delivered.
    loader = DataLoader(SlowFirst(), batch_size=4, num_workers=2, worker_type=worker_type)
    for _ in loader:
        break
    stats = loader.stats
    assert (stats.batches, stats.samples, sum(w.batches for w in stats.workers)) == (1, 4, 1)
    delivered = []
    batches = iter(loader)
    while True:
        try:
            delivered.append(next(batches))
        except ValueError:  # batch 5 (indices 20..23) failed; the pass goes on
            continue
        except StopIteration:
            break
    stats = loader.stats
    assert len(delivered) == stats.batches == 11 and stats.samples == 45 - 4
    assert sum(w.batches for w in stats.workers) == 11


def test_progress_shows_a_bar_and_a_summary(capsys):
    list(DataLoader(Rows(), batch_size=10, progress=True))
    assert "5 batches, 45 samples" in capsys.readouterr().err


def test_a_pass_left_early_takes_its_progress_bar_down():
    def new_threads() -> list[str]:  # (an earlier test's bar thread may still be ending)
        return [t.name for t in set(threading.enumerate()) - before if t.is_alive()]

    before = set(threading.enumerate())
    loader = DataLoader(Rows(), batch_size=10, progress=True)
    for _ in loader:
        break  # the bar's refresh thread stops with the pass
    for _ in loader:
        break
    for _ in range(50):  # (told to stop, rich's thread ends at its next refresh)
        if not new_threads():
            break
        time.sleep(0.1)
    assert new_threads() == []


def test_distributed_builds_the_sampler_in_one_line():
    loader = DataLoader(Rows(), batch_size=4, shuffle=True, drop_last=True, distributed=True,
                        seed=3)
    assert isinstance(loader.sampler, DistributedSampler)
    assert (loader.sampler.shuffle, loader.sampler.drop_last, loader.sampler.seed) == (
        True, True, 3)
    loader.set_epoch(2)
    reference = DistributedSampler(Rows(), shuffle=True, drop_last=True, seed=3)
    reference.set_epoch(2)
    assert indices(loader) == list(reference)[: len(loader) * 4]


def test_distributed_refuses_a_sampler_of_its_own():
    with pytest.raises(ValueError, match="pass a sampler or distributed=True, not both"):
        DataLoader(Rows(), sampler=[0, 1], distributed=True)


@pytest.mark.parametrize("seed", [5, -1, np.int64(3), 1.5, None])
def test_a_seed_without_distributed_is_refused_not_ignored(seed):
    # Only the sampler distributed=True builds reads the seed: this loader's RandomSampler would
    # draw another order each run.
    with pytest.raises(ValueError, match=r"seed=.* distributed=False: pass distributed=True, or "
                                         r"seed shuffle=True with generator="):
        DataLoader(Rows(), batch_size=4, shuffle=True, seed=seed)
    assert DataLoader(Rows(), shuffle=True, seed=np.int64(0)).seed == 0  # the default
    given = DistributedSampler(Rows(), num_replicas=1, rank=0, seed=5)
    assert DataLoader(Rows(), sampler=given, seed=5).sampler is given  # (as Lightning rebuilds)


def test_without_cuda_device_and_pinning_warn_and_stay_on_the_cpu():
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.warns(UserWarning, match="CUDA is not available"):
        loader = DataLoader(Rows(), batch_size=5, device="cuda")
    with pytest.warns(UserWarning, match="no accelerator is found"):
        batch = next(iter(DataLoader(Rows(), batch_size=5, pin_memory=True)))
    assert next(iter(loader))["row"].device.type == "cpu" and not batch["row"].is_pinned()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_batches_arrive_on_the_gpu_pinned_and_in_order():
    loader = DataLoader(Rows(), batch_size=5, num_workers=2, pin_memory=True, device="cuda")
    batches = list(loader)
    assert all(b["row"].is_cuda for b in batches)
    assert indices(batches) == list(range(45))


def _verify_on_every_rank(seeds: list[int]) -> str:
    sampler = DistributedSampler(Rows(), seed=seeds[dist.get_rank()])
    try:
        next(iter(DataLoader(Rows(), batch_size=4, sampler=sampler)))
    except InconsistentRanksError as error:
        return str(error)
    with warnings.catch_warnings():
        next(iter(DataLoader(Rows(), batch_size=4, sampler=sampler, verify=False)))
    return "agreed"


@pytest.mark.timeout(120)
def test_ranks_whose_samplers_differ_are_stopped_at_the_first_epoch():
    assert spawn_local(_verify_on_every_rank, 2, [0, 0], timeout=100) == ["agreed"] * 2
    for message in spawn_local(_verify_on_every_rank, 2, [0, 1], timeout=100):
        assert "seed=1" in message and "seed=0" in message


def _torch_sampler_on_every_rank(case: str) -> str:
    """One loader over torch's DistributedSampler, set up as ``case`` says on rank 1."""
    rank, odd = dist.get_rank(), case if dist.get_rank() == 1 else ""
    sampler = TorchDistributedSampler(Rows(), seed=1 if odd == "seed" else 0)
    sampler.set_epoch(0 if odd == "epoch" else 1)  # rank 1 forgot set_epoch
    batch_size = 8 if odd == "batch_size" else 4
    if case == "subgroup":  # two data-parallel groups of one rank, each reading all of it
        sampler = TorchDistributedSampler(Rows(), num_replicas=1, rank=0)
    if odd == "unsplit":  # rank 1 left the sampler out
        sampler = None
    try:
        first = next(iter(DataLoader(Rows(), batch_size=batch_size, sampler=sampler,
                                     verify=True)))
    except InconsistentRanksError as error:
        return str(error)
    return f"rank {rank} agreed: {first['index'].tolist()}"


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("case", "expected"), [
    ("seed", "rank 1 has seed=1 where rank 0 has seed=0"),
    ("epoch", "rank 1 has epoch=0 where rank 0 has epoch=1"),
    ("subgroup", "ranks 0, 1 have num_replicas=1 but the process group has 2 ranks"),
    ("unsplit", "rank 1 has sampler='SequentialSampler' where rank 0 has sampler=<missing>"),
    ("batch_size", ("loaders batch differently across ranks, or resume states saved at other "
                   "steps, so they take different numbers of steps (a collective in one step "
                   "would wait for a rank that has stopped): rank 1 has batch_size=8 where rank "
                   "0 has batch_size=4")),
])
def test_ranks_that_differ_over_torchs_distributed_sampler_are_stopped(case, expected):
    for message in spawn_local(_torch_sampler_on_every_rank, 2, case, timeout=100):
        assert expected in message


@pytest.mark.timeout(120)
def test_agreeing_ranks_over_torchs_sampler_are_not_refused():
    assert [m.split(":")[0] for m in spawn_local(_torch_sampler_on_every_rank, 2, "none",
                                                 timeout=100)] == ["rank 0 agreed",
                                                                   "rank 1 agreed"]


def _epoch_set_after_iter(kind: str) -> str:
    """Rank 1 sets another epoch between iter() and the first next() (no workers: the order is
    read there, and a trainer may set the epoch there, as Lightning does)."""
    sampler = (DistributedSampler(Rows(), seed=0) if kind == "shardwise"
               else TorchDistributedSampler(Rows(), seed=0))
    batches = iter(DataLoader(Rows(), batch_size=4, sampler=sampler, verify=True))
    sampler.set_epoch(dist.get_rank())
    try:
        return str(sum(len(batch["index"]) for batch in batches))
    except InconsistentRanksError as error:
        return str(error)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", ["shardwise", "torch"])
def test_an_epoch_set_after_iter_is_the_one_the_ranks_compare(kind):
    for message in spawn_local(_epoch_set_after_iter, 2, kind, timeout=100):
        assert "rank 1 has epoch=1 where rank 0 has epoch=0" in message


class SlowFirstOnRankZero(Rows):
    """Rank 0's first batch comes late: out of order, its next ones are delivered before it."""

    def __init__(self, rank: int) -> None:
        self.rank = rank

    def __getitem__(self, index: int) -> dict:
        if index == 0 and self.rank == 0:
            time.sleep(1.5)
        return super().__getitem__(index)


def _resumed_from(steps: list[int], kind: str, in_order: bool) -> str:
    """Each rank resumes its own state, saved after ``steps[rank]`` batches."""
    def make() -> DataLoader:
        rows = SlowFirstOnRankZero(dist.get_rank())
        sampler = (DistributedSampler(rows, shuffle=False) if kind == "shardwise"
                   else TorchDistributedSampler(rows, shuffle=False))
        return DataLoader(rows, batch_size=2, sampler=sampler, verify=True, num_workers=2,
                          in_order=in_order)

    loader = make()
    batches = iter(loader)
    for _ in range(steps[dist.get_rank()]):
        next(batches)
    state = loader.state_dict()
    del batches
    resumed = make()
    resumed.load_state_dict(state)
    try:
        return f"{steps[dist.get_rank()] + sum(1 for _ in resumed)} batches"
    except InconsistentRanksError as error:
        return str(error)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", ["shardwise", "torch"])
@pytest.mark.parametrize("in_order", [True, False])
def test_ranks_resumed_from_other_steps_are_stopped(kind, in_order):
    for message in spawn_local(_resumed_from, 2, [2, 5], kind, in_order, timeout=100):
        assert "differ" in message and ("fingerprint" in message if kind == "shardwise" and in_order
                                        else "resumed_after_batches=5" in message), message
    # Resumed at one step, out of order too (rank 0's sampler then stands before its first
    # batch, rank 1's after its third): every rank's epoch whole, 23 indices in batches of 2
    assert spawn_local(_resumed_from, 2, [3, 3], kind, in_order, timeout=100) == ["12 batches"] * 2


def _rank_zero_state_everywhere() -> tuple[int, list[str]]:
    """Every rank loads rank 0's state, saved out of order (one checkpoint for all, as Lightning
    keeps): the other ranks are warned, and not refused."""
    def make() -> DataLoader:
        rows = SlowFirstOnRankZero(dist.get_rank())
        return DataLoader(rows, batch_size=2, sampler=DistributedSampler(rows, shuffle=False),
                          num_workers=2, in_order=False)

    loader = make()
    batches = iter(loader)
    for _ in range(3):
        next(batches)
    state = [loader.state_dict()]
    del batches
    dist.broadcast_object_list(state, src=0)
    resumed = make()
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        resumed.load_state_dict(state[0])
    assert "ahead" in state[0]  # (rank 0 delivered a later batch before its slow first one)
    return sum(1 for _ in resumed), [str(warning.message)[:47] for warning in said]


@pytest.mark.timeout(120)
def test_one_out_of_order_state_loaded_by_every_rank_is_not_refused():
    (rank_zero, quiet), (rank_one, warned) = spawn_local(_rank_zero_state_everywhere, 2,
                                                         timeout=100)
    # Every rank takes as many steps (a rank with more would leave the others waiting in DDP).
    assert rank_zero == rank_one == 12 - 3 and quiet == []
    assert warned == ["the state was saved with in_order=False by rank"]


class StatefulRows(Rows):
    """Stateful (torchdata's protocol): each worker process keeps its own copy's state."""

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


def _resumed_on_other_workers(workers: list[int]) -> str:
    """Each rank resumes a state saved with 2 workers, on ``workers[rank]`` of them."""
    def make(num_workers: int) -> DataLoader:
        rows = StatefulRows()
        return DataLoader(rows, batch_size=2, sampler=DistributedSampler(rows),
                          num_workers=num_workers)

    loader = make(2)
    batches = iter(loader)
    next(batches)
    state = loader.state_dict()
    del batches
    resumed = make(workers[dist.get_rank()])
    resumed.load_state_dict(state)
    try:
        return f"{1 + sum(1 for _ in resumed)} batches"
    except ValueError as error:  # (a StateMismatchError)
        return f"{type(error).__name__}: {error}"


@pytest.mark.timeout(120)
def test_a_rank_that_cannot_resume_its_state_fails_every_rank():
    # Rank 1 refuses the state as its pass begins (at iter(), before the other rank's check):
    # the other rank, checking with workers at iter(), raises the same error rather than wait.
    for message in spawn_local(_resumed_on_other_workers, 2, [2, 0], timeout=100):
        assert message.startswith("StateMismatchError: rank 1: the state was saved with 2 "
                                  "worker processes"), message
    assert spawn_local(_resumed_on_other_workers, 2, [2, 2], timeout=100) == ["12 batches"] * 2


def _late_rank(patience: float) -> list[str]:
    from shardwise.loader import dataloader

    dataloader.CHECK_PATIENCE_SECONDS = patience
    if dist.get_rank() == 1:
        time.sleep(4 * patience)  # (as a rank that skipped the check would never come)
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        next(iter(DataLoader(Rows(), batch_size=4, sampler=DistributedSampler(Rows()))))
    return [str(warning.message) for warning in said]


@pytest.mark.timeout(120)
def test_a_rank_long_in_the_check_says_what_may_keep_the_others():
    waited, on_time = spawn_local(_late_rank, 2, 1.0, timeout=100)
    assert on_time == [] and len(waited) == 1, waited
    assert waited[0].startswith("rank 0 has waited 1 s for the other ranks") and \
        "verify=False" in waited[0]


def _one_rank_alone(sampler_for_one: bool) -> list[int]:
    sampler = (DistributedSampler(Rows(), num_replicas=1, rank=0, shuffle=False)
               if sampler_for_one else TorchDistributedSampler(Rows(), shuffle=False))
    taken = []
    if dist.get_rank() == 0:  # a look at a few batches, on one rank only
        taken = next(iter(DataLoader(Rows(), batch_size=4, sampler=sampler)))["index"].tolist()
    dist.barrier()
    return taken


@pytest.mark.timeout(120)
def test_by_default_torchs_sampler_is_left_alone_so_one_rank_may_iterate_alone():
    assert spawn_local(_one_rank_alone, 2, False, timeout=60) == [[0, 2, 4, 6], []]


@pytest.mark.timeout(120)
def test_a_sampler_for_one_replica_splits_nothing_so_one_rank_may_evaluate_alone():
    assert spawn_local(_one_rank_alone, 2, True, timeout=60) == [[0, 1, 2, 3], []]


def test_verify_is_none_true_or_false():
    with pytest.raises(TypeError, match="verify must be None, True or False, got 'yes'"):
        DataLoader(Rows(), verify="yes")


@pytest.mark.parametrize("worker_type", ["process", "thread"])
def test_a_new_pass_on_persistent_workers_ends_the_one_before(worker_type):
    # torch hands out one iterator and restarts it; here the earlier pass ends, its stages
    # stop, and it cannot take the new pass's batches from the workers.
    loader = DataLoader(Rows(), batch_size=5, num_workers=2, persistent_workers=True,
                        worker_type=worker_type)
    first = iter(loader)
    next(first)
    second = iter(loader)
    first.close()  # closing the pass before leaves the workers to the new one
    assert indices(second) == list(range(45))
    with pytest.raises(StopIteration):
        next(first)


class Wrapped(collections.abc.MutableMapping):
    """A mapping whose shallow copies share its storage (as many wrapper classes do)."""

    def __init__(self, **items) -> None:
        self.items_ = dict(items)

    def __getitem__(self, key):
        return self.items_[key]

    def __setitem__(self, key, value) -> None:
        self.items_[key] = value

    def __delitem__(self, key) -> None:
        del self.items_[key]

    def __iter__(self):
        return iter(self.items_)

    def __len__(self) -> int:
        return len(self.items_)


def test_what_the_gpu_stage_records_on_a_stream_it_only_reads():
    # A batch taken on another stream is walked for its tensors: walking must not rebuild it
    # (a rebuilt copy of this mapping would write over the batch the caller holds).
    from shardwise.loader.device import _tensors

    x, y = torch.ones(2), torch.zeros(3)
    batch = Wrapped(x=x, nested=[(y, "name")], none=None)
    assert [t is x or t is y for t in _tensors(batch)] == [True, True]
    assert batch["x"] is x and batch["nested"][0][0] is y
