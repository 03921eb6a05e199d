"""torch's datapipes through shardwise.DataLoader: seeded and sharded as torch's loader does.

A ``shuffle().sharding_filter()`` pipe is the case that matters: every worker must shuffle with
the same seed and then keep only its own shard, or items come twice (or never).
"""

import pytest
import torch
from torch.utils.data import DataLoader as TorchLoader
from torch.utils.data.datapipes.iter import IterableWrapper

from shardwise import DataLoader
from shardwise.distributed.launch import spawn_local

pytestmark = pytest.mark.timeout(120)

ITEMS = list(range(60))


def shuffled_shards():
    return IterableWrapper(ITEMS).shuffle(buffer_size=7).sharding_filter()


def passes(loader_class, count=3, **options):
    """Items of ``count`` passes: two from the same global seed, then one from another."""
    loader = loader_class(shuffled_shards(), batch_size=None, **options)
    seen = []
    for seed in [123] * (count - 1) + [321]:
        torch.manual_seed(seed)
        seen.append([int(item) for item in loader])
    return seen


@pytest.mark.parametrize(("workers", "persistent"), [(0, False), (1, False), (2, False),
                                                     (2, True)])
def test_shuffled_sharded_pipe_passes_equal_torchs(workers, persistent):
    ours = passes(DataLoader, num_workers=workers, persistent_workers=persistent)
    assert ours == passes(TorchLoader, num_workers=workers, persistent_workers=persistent)
    assert [sorted(items) for items in ours] == [ITEMS] * 3  # every item once per pass
    assert ours[0] == ours[1] != ours[2]  # the seed decides the order


def test_thread_workers_read_the_pipe_once_as_no_workers_do():
    options = {"num_workers": 2, "worker_type": "thread"}
    assert passes(DataLoader, **options) == passes(TorchLoader, num_workers=0)
    assert passes(DataLoader, persistent_workers=True, **options) == passes(TorchLoader,
                                                                             num_workers=0)


def test_the_loaders_generator_seeds_the_shuffle():
    def items(seed):
        loader = DataLoader(shuffled_shards(), batch_size=None, num_workers=2,
                            generator=torch.Generator().manual_seed(seed))
        return [int(item) for item in loader]

    assert items(4) == items(4) != items(5)


def _rank_items(workers: int) -> tuple[list[int], list[int]]:
    torch.manual_seed(100 + torch.distributed.get_rank())  # ranks' own seeds differ
    ours = [int(item) for item in DataLoader(shuffled_shards(), batch_size=None,
                                             num_workers=workers)]
    torch.manual_seed(100 + torch.distributed.get_rank())
    theirs = [int(item) for item in TorchLoader(shuffled_shards(), batch_size=None,
                                                num_workers=workers)]
    return ours, theirs


@pytest.mark.parametrize("workers", [0, 2])
def test_ranks_share_the_seed_and_split_the_pipe(workers):
    results = spawn_local(_rank_items, 2, workers, timeout=90)
    for ours, theirs in results:
        assert ours == theirs
    assert sorted(results[0][0] + results[1][0]) == ITEMS  # rank 0's seed, each its own half
