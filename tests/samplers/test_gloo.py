"""The sampler on a real 3-process gloo group: world discovery, disjointness, coverage."""

from collections import Counter

import torch.distributed as dist

from shardwise import DistributedSampler, spawn_local

CASES = [
    {"size": 1001, "remainder": "uneven"},
    {"size": 1001, "remainder": "uneven", "layout": "block", "permutation": "feistel"},
    {"size": 1001, "remainder": "pad"},
    {"size": 1001, "remainder": "drop", "layout": "block"},
    {"size": 2, "remainder": "pad"},
]


def each_rank_indices():
    """Runs on every rank: build samplers from the group alone, all-gather what they yield."""
    results = []
    for case in CASES:
        options = dict(case)
        sampler = DistributedSampler(options.pop("size"), seed=11, **options)
        sampler.set_epoch(4)
        mine = list(sampler)
        gathered = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, mine)
        results.append(((sampler.num_replicas, sampler.rank), gathered))
    return results


def test_three_gloo_ranks_share_every_epoch_correctly():
    per_rank = spawn_local(each_rank_indices, 3)
    for rank, results in enumerate(per_rank):
        for case, (world, gathered) in zip(CASES, results):
            assert world == (3, rank)
            assert gathered == per_rank[0][CASES.index(case)][1]  # every rank saw the same
            counts = Counter(i for share in gathered for i in share)
            size = case["size"]
            if case["remainder"] == "uneven":
                assert sorted(counts.elements()) == list(range(size))
            elif case["remainder"] == "drop":
                assert set(counts.values()) == {1} and len(counts) == size - size % 3
            else:
                assert set(counts) == set(range(size)) and len(set(map(len, gathered))) == 1
