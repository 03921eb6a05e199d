"""WeightedDistributedSampler and DistributedSamplerWrapper: frequencies, disjointness, resume."""

from collections import Counter
from itertools import islice

import numpy as np
import pytest
import torch
import torch.distributed as dist
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats
from torch.utils.data import RandomSampler, WeightedRandomSampler

from shardwise import (
    DataLoader,
    DistributedSamplerWrapper,
    InconsistentRanksError,
    WeightedDistributedSampler,
    check_consistent,
    spawn_local,
)

CHI2_3_DOF_999 = 16.27  # the 99.9% point of the chi-square distribution with 3 degrees of freedom


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_draws_with_replacement_follow_the_weights(seed):
    weights = np.array([1.0, 2.0, 3.0, 0.0, 4.0])
    draws = Counter()
    for rank in range(3):
        draws.update(WeightedDistributedSampler(weights, 20_000, num_replicas=3, rank=rank,
                                                seed=seed))
    assert draws[3] == 0
    total = 60_000
    expected = weights[weights > 0] / weights.sum() * total
    observed = np.array([draws[i] for i in np.flatnonzero(weights)])
    assert ((observed - expected) ** 2 / expected).sum() < CHI2_3_DOF_999


def test_ranks_draw_different_streams_and_each_stream_is_reproducible():
    streams = [list(WeightedDistributedSampler(np.ones(1000), 200, num_replicas=4, rank=r))
               for r in range(4)]
    assert len({tuple(s) for s in streams}) == 4
    assert streams[2] == list(WeightedDistributedSampler(np.ones(1000), 200, num_replicas=4,
                                                         rank=2))


@settings(max_examples=60, deadline=None)
@given(size=st.integers(1, 60), world=st.integers(1, 4), seed=st.integers(0, 2**32), data=st.data())
def test_without_replacement_no_sample_is_drawn_twice_in_the_world(size, world, seed, data):
    weights = np.array(data.draw(st.lists(st.floats(0.1, 10), min_size=size, max_size=size)))
    per_rank = data.draw(st.integers(0, size // world))
    shares = [list(WeightedDistributedSampler(weights, per_rank, False, world, r, seed=seed))
              for r in range(world)]
    everything = [i for share in shares for i in share]
    assert len(everything) == len(set(everything)) == per_rank * world


def test_without_replacement_every_rank_draws_alike():
    # Rank r took places r, r + W, ... of the weighted permutation, whose earlier places are
    # heavier: rank 0 drew heavy samples more often (chi-square p about 1e-72 here, 1e-51 to
    # 1e-72 over other seeds; with each group of W places dealt at random, 0.16 to 0.80).
    weights = [1, 2, 3, 4, 0, 10, 0.5, 7, 0.01, 5]
    counts = np.zeros((3, 10), dtype=np.int64)
    for seed in range(1500):
        for rank in range(3):
            np.add.at(counts[rank], list(WeightedDistributedSampler(
                weights, 2, False, num_replicas=3, rank=rank, seed=seed)), 1)
    assert stats.chi2_contingency(counts[:, counts.sum(0) > 0]).pvalue > 1e-4


def test_without_replacement_heavy_samples_come_first():
    weights = np.array([1000.0] * 5 + [0.001] * 995)
    first = list(WeightedDistributedSampler(weights, 5, False, num_replicas=1, rank=0))
    assert sorted(first) == [0, 1, 2, 3, 4]


def test_beyond_torchs_limit_of_2_to_the_24_categories():
    weights = np.ones(2**24 + 1)
    weights[-1] = 1e6
    with pytest.raises(RuntimeError, match="2\\^24"):
        list(WeightedRandomSampler(weights, 10))
    draws = WeightedDistributedSampler(weights, 1000, num_replicas=2, rank=1).indices()
    assert draws.max() < len(weights) and (draws == len(weights) - 1).mean() > 0.01


@pytest.mark.parametrize("replacement", [True, False])
def test_resume_continues_exactly(replacement):
    weights = np.arange(1.0, 101.0)
    sampler = WeightedDistributedSampler(weights, 40, replacement, num_replicas=2, rank=1, seed=5)
    sampler.set_epoch(3)
    iterator = iter(sampler)
    list(islice(iterator, 17))
    state = sampler.state_dict()
    rest = list(iterator)
    resumed = WeightedDistributedSampler(weights, 40, replacement, num_replicas=2, rank=1, seed=5)
    resumed.load_state_dict(state)
    assert list(resumed) == rest
    other = WeightedDistributedSampler(weights[::-1].copy(), 40, replacement, num_replicas=2,
                                       rank=1, seed=5)
    with pytest.raises(ValueError, match="saved with weights_digest=.* build the sampler over "
                                         "the weights it was saved with"):
        other.load_state_dict(state)


@pytest.mark.parametrize("replacement", [True, False])
def test_every_seed_and_epoch_draws_its_own_stream(replacement):
    def stream(seed, epoch):
        sampler = WeightedDistributedSampler(np.ones(50), 20, replacement, num_replicas=1,
                                             rank=0, seed=seed)
        sampler.set_epoch(epoch)
        return list(sampler)

    # NumPy's seed sequences take 2**32 + 5 as the words 5, 1: as 5 and then the epoch 1
    assert stream(2**32 + 5, 0) != stream(5, 1)
    assert stream(0, 2**32) != stream(0, 0)


@pytest.mark.parametrize("weights,options,message", [
    ([], {}, "non-empty 1-D"), ([1.0, -1.0], {}, r"weights\[1\] = -1.0"),
    ([1.0, float("inf")], {}, "not a finite"), ([0.0, 0.0], {}, "all weights are zero"),
    ([1.0, 1.0], {"replacement": False, "num_samples": 2}, "only 2 samples have a positive weight"),
    ([1.0], {"num_samples": 2**62}, "num_samples must be at most 4611686018427387903"),  # (x2)
])
def test_bad_weights_are_named(weights, options, message):
    arguments = {"num_samples": 1, "num_replicas": 2, "rank": 0, **options}
    with pytest.raises(ValueError, match=message):
        WeightedDistributedSampler(weights, **arguments)


def test_weights_are_numbers_of_any_dtype_torch_takes():
    with pytest.raises(TypeError, match="weights must be numbers, got <U1 values"):
        WeightedDistributedSampler(["1", "3"], 1, num_replicas=1, rank=0)
    expected = list(WeightedDistributedSampler([1.0, 3.0], 8, num_replicas=1, rank=0))
    for weights in (torch.tensor([1.0, 3.0], dtype=torch.bfloat16), torch.tensor([1, 3]),
                    np.array([1.0, 3.0], dtype=np.float16), [1, 3]):
        assert list(WeightedDistributedSampler(weights, 8, num_replicas=1, rank=0)) == expected


def test_extreme_weights_draw_only_positive_weights_and_differences_are_seen():
    huge = WeightedDistributedSampler([1e308, 1e308, 0.0, 1e308], 3000, num_replicas=1, rank=0)
    counts = Counter(huge)  # the sum overflows a float
    assert set(counts) == {0, 1, 3} and min(counts.values()) > 800
    tiny = [list(WeightedDistributedSampler([0.0, 1.0, 1e-320], 1, replacement=False,
                                            num_replicas=2, rank=rank)) for rank in (0, 1)]
    assert sorted(tiny) == [[1], [2]]  # a subnormal weight still comes before a zero one
    weights = np.arange(1.0, 1001.0)
    swapped = weights.copy()
    swapped[[1, 950]] = swapped[[950, 1]]
    samplers = [WeightedDistributedSampler(each, 5, num_replicas=1, rank=0)
                for each in (weights, swapped)]
    assert samplers[0].fingerprint() != samplers[1].fingerprint()
    assert samplers[0].config()["weights_digest"] != samplers[1].config()["weights_digest"]


def test_wrapper_splits_any_samplers_epoch_with_every_index_once():
    def inner():
        return RandomSampler(range(23), generator=torch.Generator().manual_seed(4))

    shares = [list(DistributedSamplerWrapper(inner(), 3, r, remainder="uneven")) for r in range(3)]
    assert sorted(i for share in shares for i in share) == list(range(23))
    assert [len(s) for s in shares] == [8, 8, 7]


def test_wrapper_forwards_set_epoch_to_the_inner_sampler():
    class Epochs(torch.utils.data.Sampler):
        def __init__(self):
            self.epoch = 0

        def set_epoch(self, epoch):
            self.epoch = epoch

        def __len__(self):
            return 6

        def __iter__(self):
            return iter(np.roll(np.arange(6), self.epoch).tolist())

    wrapper = DistributedSamplerWrapper(Epochs(), 2, 0)
    wrapper.set_epoch(2)
    assert list(wrapper) == [4, 0, 2]
    assert list(wrapper) == [4, 0, 2]  # epoch 2 again, as torch's samplers after set_epoch
    wrapper.set_epoch(3)
    assert list(wrapper) == [3, 5, 1]


def test_wrapper_resumes_elastically():
    def inner():
        return RandomSampler(range(50), generator=torch.Generator().manual_seed(1))

    before = [DistributedSamplerWrapper(inner(), 4, r, remainder="uneven") for r in range(4)]
    trained = [i for s in before for i in islice(iter(s), 5)]
    state = before[0].state_dict(consumed=5)
    after = [DistributedSamplerWrapper(inner(), 3, r, remainder="uneven") for r in range(3)]
    for sampler in after:
        sampler.load_state_dict(state)
        trained += list(sampler)
    assert sorted(trained) == list(range(50))


def test_a_wrapped_order_that_does_not_follow_the_epoch_is_refused_on_resume():
    def inner():  # seeded once: epoch 1's order is its second draw, which a fresh one lacks
        return RandomSampler(range(20), generator=torch.Generator().manual_seed(0))

    wrapper = DistributedSamplerWrapper(inner(), 2, 0)
    list(wrapper)  # epoch 0
    wrapper.set_epoch(1)
    list(islice(iter(wrapper), 3))
    state = wrapper.state_dict()
    with pytest.raises(ValueError, match="yields another order for epoch 1 than it did when the "
                                         "state was saved .* give the RandomSampler a set_epoch"):
        DistributedSamplerWrapper(inner(), 2, 0).load_state_dict(state)


def _wrapped_on_every_rank(seeded: bool) -> str:
    generator = torch.Generator().manual_seed(0) if seeded else None
    if not seeded:
        torch.manual_seed(dist.get_rank())  # each rank's own random state: a different order
    wrapper = DistributedSamplerWrapper(RandomSampler(range(40), generator=generator))
    try:
        check_consistent(wrapper)
        next(iter(DataLoader(range(40), sampler=wrapper)))
    except InconsistentRanksError as error:
        return "differ: " + str(error)
    return "agree"


@pytest.mark.timeout(120)
def test_ranks_whose_inner_orders_differ_are_stopped():
    assert spawn_local(_wrapped_on_every_rank, 2, True, timeout=100) == ["agree", "agree"]
    for message in spawn_local(_wrapped_on_every_rank, 2, False, timeout=100):
        assert message.startswith("differ:") and "fingerprint" in message


def test_weights_from_an_iterator_are_read_and_unordered_containers_refused():
    # a generator was refused as "weights must be numbers, got object values"
    expected = list(WeightedDistributedSampler([1.0, 3.0], 8, num_replicas=1, rank=0))
    drawn = WeightedDistributedSampler((w for w in [1.0, 3.0]), 8, num_replicas=1, rank=0)
    assert list(drawn) == expected
    for weights in ({0: 1.0, 1: 3.0}, {1.0, 3.0}):
        with pytest.raises(TypeError, match=f"got a {type(weights).__name__}"):
            WeightedDistributedSampler(weights, 8, num_replicas=1, rank=0)


def test_complex_weights_are_refused_as_a_tensor_too():
    # a complex tensor was cast to float64, its imaginary part dropped with only torch's warning
    for weights in (torch.tensor([1 + 2j, 3 + 0j]), np.array([1 + 2j, 3 + 0j])):
        with pytest.raises(TypeError, match="weights must be numbers, got (torch.)?complex"):
            WeightedDistributedSampler(weights, 8, num_replicas=1, rank=0)
