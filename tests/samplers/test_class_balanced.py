"""ClassBalancedSampler: every round every class once; ranks disjoint; repeats only to oversample."""

from collections import Counter
from itertools import islice

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from shardwise import ClassBalancedSampler, DataLoader, check_consistent

class_sizes = st.lists(st.integers(1, 40), min_size=1, max_size=6)


def make_labels(sizes, seed=0):
    labels = np.repeat(np.arange(len(sizes)), sizes)
    return np.random.default_rng(seed).permutation(labels)


@settings(max_examples=120, deadline=None)
@given(sizes=class_sizes, world=st.integers(1, 5), seed=st.integers(0, 2**32),
       epoch=st.integers(0, 20), extra=st.integers(-5, 40))
def test_rounds_hold_every_class_once_and_ranks_are_disjoint(sizes, world, seed, epoch, extra):
    labels = make_labels(sizes, seed)
    classes = len(sizes)
    num_samples = max(0, -(-len(labels) // world) + extra)
    streams = []
    for rank in range(world):
        sampler = ClassBalancedSampler(labels, world, rank, seed=seed, num_samples=num_samples)
        sampler.set_epoch(epoch)
        stream = list(sampler)
        assert len(stream) == num_samples and stream == list(sampler.indices())
        for start in range(0, len(stream) - classes + 1, classes):  # each whole round
            assert sorted(labels[stream[start:start + classes]].tolist()) == list(range(classes))
        streams.append(stream)
    for klass, size in enumerate(sizes):
        drawn = [[i for i in s if labels[i] == klass] for s in streams]
        if size >= world:  # split disjointly: no sample on two ranks
            owners = Counter(i for per_rank in drawn for i in set(per_rank))
            assert set(owners.values()) <= {1}
            for per_rank in drawn:  # on one rank, a sample repeats only once the share ran out
                share = -(-size // world)
                counts = Counter(per_rank)
                if len(per_rank) <= share - 1:
                    assert set(counts.values()) <= {1}


def test_the_worked_example_and_determinism():
    labels = ["cat"] * 6 + ["dog"] * 3 + ["eel"]
    sampler = ClassBalancedSampler(labels, num_replicas=1, rank=0, seed=7)
    first, again = list(sampler), list(ClassBalancedSampler(labels, 1, 0, seed=7))
    assert first == again and len(first) == 10
    assert list(sampler) != first  # the next epoch: new pools, new round orders
    sampler.set_epoch(0)
    assert list(sampler) == first


@pytest.mark.parametrize("labels", [
    [2, 0, 1, 1], np.array([2, 0, 1, 1]), torch.tensor([2, 0, 1, 1]), ["b", "a", "c", "c"],
    np.array(["b", "a", "c", "c"], dtype=object),  # (pandas' .values of strings)
    torch.tensor([2, 0, 1, 1], dtype=torch.bfloat16), [2**63 + 1, 2**63, 0, 0],  # (not floats)
], ids=["list", "numpy", "tensor", "str", "objects", "bfloat16", "past int64"])
def test_labels_in_any_form(labels):
    sampler = ClassBalancedSampler(labels, num_replicas=1, rank=0, num_samples=6)
    assert len(list(sampler)) == 6 and len(sampler.classes) == 3


def test_a_class_smaller_than_the_world_still_works():
    labels = [0] * 30 + [1]  # one sample of class 1, four ranks
    streams = [list(ClassBalancedSampler(labels, 4, r)) for r in range(4)]
    assert all(s.count(30) == len(s) // 2 for s in streams)  # every rank draws it each round


def test_ranks_draw_a_class_smaller_than_the_world_independently():
    # Each rank drew such a class in the pool's order, shared by all: in round 0 every rank
    # drew the same sample for all 900 seeds (chi-square p = 0 against the 9 equal pairs).
    labels = [0] * 40 + [1] * 3  # class 1: samples 40, 41 and 42; four ranks
    pairs = Counter()
    for seed in range(900):
        firsts = [next(int(i) for i in ClassBalancedSampler(labels, 4, rank, seed=seed)
                       .stream(0, np.arange(2)) if i >= 40) for rank in (0, 1)]
        pairs[tuple(firsts)] += 1
    counts = [pairs[(a, b)] for a in range(40, 43) for b in range(40, 43)]
    assert stats.chisquare(counts).pvalue > 1e-4


def test_a_batch_size_that_is_a_multiple_of_the_classes_gives_every_class_every_batch():
    labels = make_labels([50, 20, 5])
    data = torch.tensor(labels)
    loader = DataLoader(data, batch_size=6, sampler=ClassBalancedSampler(labels, 1, 0))
    assert all(set(batch.tolist()) == {0, 1, 2} for batch in loader)


def test_resume_continues_the_stream_exactly():
    labels = make_labels([30, 9, 4])
    sampler = ClassBalancedSampler(labels, 2, 1, seed=3)
    sampler.set_epoch(2)
    iterator = iter(sampler)
    head = list(islice(iterator, 13))
    state = sampler.state_dict()
    rest = list(iterator)
    resumed = ClassBalancedSampler(labels, 2, 1, seed=3)
    resumed.load_state_dict(state)
    resumed.set_epoch(2)
    assert list(resumed) == rest and len(head) + len(rest) == 22


@pytest.mark.parametrize("change,field", [({"num_replicas": 3, "rank": 0}, "num_replicas"),
                                          ({"seed": 4}, "seed"),
                                          ({"labels": make_labels([5, 10])}, "labels_digest")])
def test_a_state_from_another_configuration_is_refused(change, field):
    labels = make_labels([10, 5])
    state = ClassBalancedSampler(labels, 2, 1, seed=3).state_dict()
    options = {"labels": labels, "num_replicas": 2, "rank": 1, "seed": 3, **change}
    with pytest.raises(ValueError, match=f"saved with {field}="):
        ClassBalancedSampler(**options).load_state_dict(state)
    without_epoch = {key: value for key, value in state.items() if key != "epoch"}
    with pytest.raises(ValueError, match="not a shardwise sampler state: missing epoch"):
        ClassBalancedSampler(labels, 2, 1, seed=3).load_state_dict(without_epoch)


@pytest.mark.parametrize("labels,error,message", [
    ([], ValueError, "non-empty 1-D"), ([[0, 1]], ValueError, "non-empty 1-D"),
    ([0.0, float("nan")], ValueError, "NaN"), ([1, "a", None], TypeError, "one type"),
    ([1, "1", 2, 2], TypeError, "one type"),  # NumPy would make "1" of 1: one class
    (["a", b"a"], TypeError, "one type, got bytes and str"),  # and "a" of b"a"
    ([-1, 2**63], ValueError, "integers that no 64-bit type holds together"),  # floats of both
])
def test_bad_labels_are_named(labels, error, message):
    with pytest.raises(error, match=message):
        ClassBalancedSampler(labels, 1, 0)


def test_a_stream_longer_than_len_can_say_is_refused():
    with pytest.raises(ValueError, match="num_samples must be at most 9223372036854775807"):
        ClassBalancedSampler([0, 1], 1, 0, num_samples=2**63)


def test_check_consistent_sees_its_configuration():
    sampler = ClassBalancedSampler(make_labels([4, 4]), num_replicas=1, rank=0)
    check_consistent(sampler)
    assert sampler.config()["classes"] == 2
    other = ClassBalancedSampler(make_labels([4, 4], seed=1), num_replicas=1, rank=0)
    assert other.fingerprint() != sampler.fingerprint()  # different labels, same sizes
    assert other.config()["labels_digest"] != sampler.config()["labels_digest"]  # named so
    labels = make_labels([500, 500])
    swapped = labels.copy()
    first_1, first_0 = np.flatnonzero(labels == 1)[0], np.flatnonzero(labels == 0)[-1]
    swapped[[first_1, first_0]] = swapped[[first_0, first_1]]  # two labels trade places
    assert (ClassBalancedSampler(labels, 1, 0).fingerprint()
            != ClassBalancedSampler(swapped, 1, 0).fingerprint())


def _balanced_on_every_rank() -> list[int]:
    sampler = ClassBalancedSampler(make_labels([40, 30, 20, 3]), seed=9)  # world from the group
    sampler.set_epoch(1)
    return list(sampler)


@pytest.mark.timeout(120)
def test_three_gloo_ranks_draw_disjoint_balanced_streams():
    from shardwise import spawn_local

    labels = make_labels([40, 30, 20, 3])
    streams = spawn_local(_balanced_on_every_rank, 3, timeout=100)
    for stream in streams:
        assert len(stream) == 31 and all(sorted(labels[stream[k:k + 4]].tolist()) == [0, 1, 2, 3]
                                          for k in range(0, 28, 4))
    big = [{i for i in s if labels[i] != 3} for s in streams]  # classes split over 3 ranks
    assert not (big[0] & big[1]) and not (big[1] & big[2]) and not (big[0] & big[2])


def test_memory_does_not_grow_with_chunk_times_classes():
    import tracemalloc

    sampler = ClassBalancedSampler(np.arange(100_000) % 10_000, num_replicas=1, rank=0)
    tracemalloc.start()
    try:
        assert len(sampler.indices(0, 70_000)) == 70_000  # 10,000 classes: 7 rounds a chunk
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 64 * 2**20, peak  # (a chunk x classes matrix of keys was 5 GiB)


def test_labels_in_a_container_whose_iteration_is_not_the_samples_are_refused():
    # list() of a one-column DataFrame is its column names, of a dict its keys: one class
    # 'y' of one sample, or the keys as labels, silently
    pd = pytest.importorskip("pandas")
    with pytest.raises(ValueError, match=r"non-empty 1-D .* got shape \(3, 1\)"):
        ClassBalancedSampler(pd.DataFrame({"y": [1, 2, 1]}), 1, 0)
    for labels in ({5: 0, 6: 1}, {0, 1}, frozenset({"a", "b"})):
        with pytest.raises(TypeError, match=f"got a {type(labels).__name__}"):
            ClassBalancedSampler(labels, 1, 0)
    series = pd.Series(["b", "a", "b"], index=[7, 8, 9])
    assert ClassBalancedSampler(series, 1, 0).class_sizes.tolist() == [1, 2]


def test_labels_as_a_list_of_scalar_tensors_of_any_dtype():
    # [y for _, y in dataset] gives 0-d tensors: ints were read, floats refused as "Tensor"
    for dtype in (torch.int64, torch.float32):
        labels = [torch.tensor(value, dtype=dtype) for value in (1, 0, 1, 2)]
        sampler = ClassBalancedSampler(labels, 1, 0)
        assert sampler.class_sizes.tolist() == [1, 2, 1]
    floats = [np.array(0.5), np.array(1.5), np.array(0.5)]  # (0-d arrays alike)
    assert ClassBalancedSampler(floats, 1, 0).class_sizes.tolist() == [2, 1]


def test_a_state_of_another_sampler_class_is_named_so():
    # a DistributedSampler's state was refused as "saved by another version of shardwise"
    from shardwise import DistributedSampler, WeightedDistributedSampler

    labels = make_labels([10, 5])
    distributed = DistributedSampler(15, 2, 1)
    weighted = WeightedDistributedSampler(np.ones(15), 5, num_replicas=2, rank=1)
    balanced = ClassBalancedSampler(labels, 2, 1)
    for saver, loader, saved_by in [
            (distributed, balanced, "DistributedSampler"),
            (distributed, weighted, "DistributedSampler"),
            (balanced, weighted, "ClassBalancedSampler"),
            (weighted, distributed, "WeightedDistributedSampler"),
            (balanced, distributed, "ClassBalancedSampler")]:
        with pytest.raises(ValueError, match=f"saved by a {saved_by}.*not a "
                                             f"{type(loader).__name__}") as error:
            loader.load_state_dict(saver.state_dict())
        assert "another version" not in str(error.value)


@pytest.mark.parametrize("change,field,world", [({"seed": 4}, "seed", False),
                                                ({"num_samples": 9}, "num_samples", False),
                                                ({"num_replicas": 3, "rank": 0}, "num_replicas",
                                                 True)])
def test_a_refused_state_names_world_size_only_when_it_differs(change, field, world):
    # every mismatch was told "... (start the next epoch with set_epoch on another world size)"
    from shardwise import WeightedDistributedSampler

    labels = make_labels([10, 5])
    options = {"num_replicas": 2, "rank": 1, "seed": 3}
    builds = [lambda **o: ClassBalancedSampler(labels, **{"num_samples": 8, **o}),
              lambda **o: WeightedDistributedSampler(np.ones(15), **{"num_samples": 8, **o})]
    for build in builds:
        state = build(**options).state_dict()
        with pytest.raises(ValueError, match=f"saved with {field}=") as error:
            build(**{**options, **change}).load_state_dict(state)
        assert ("world size" in str(error.value)) == world, str(error.value)
