"""Everything that comes in is checked, and the arithmetic holds to the top of the int64 range."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardwise import DistributedSampler

TOP = 2**63 - 1


@pytest.mark.parametrize(
    "kwargs,error,message",
    [
        ({"dataset": 2**63}, ValueError, "dataset size must be at most 9223372036854775807"),
        ({"seed": 2**64}, ValueError, "seed must be at most 18446744073709551615"),
        ({"seed": -(2**63) - 1}, ValueError, "seed must be at least -9223372036854775808"),
        ({"remainder": ""}, ValueError, "unknown remainder ''"),
        ({"remainder": 0}, ValueError, "unknown remainder 0"),
        ({"remainder": False}, ValueError, "unknown remainder False"),
        ({"shuffle": "False"}, TypeError, "shuffle must be a bool, got 'False'"),
        ({"drop_last": 2}, TypeError, "drop_last must be a bool, got 2"),
        ({"num_replicas": np.int64(0), "rank": 0}, ValueError, "at least 1, got 0"),
        ({"num_replicas": 2**64, "rank": 5}, ValueError, "num_replicas must be at most 9223372036854775807"),
        ({"rank": np.int32(4)}, ValueError, "Invalid rank 4"),
    ],
)
def test_bad_arguments_are_named(kwargs, error, message):
    arguments = {"dataset": 10, "num_replicas": 4, "rank": 0, **kwargs}
    with pytest.raises(error, match=message):
        DistributedSampler(**arguments)


def test_numpy_integers_are_ints_everywhere():
    sampler = DistributedSampler(np.int64(10), np.int64(4), np.int32(1), seed=np.uint64(3),
                                 shuffle=np.bool_(True), drop_last=0)
    sampler.set_epoch(np.int64(2))
    reference = DistributedSampler(10, 4, 1, seed=3)
    reference.set_epoch(2)
    assert list(sampler) == list(reference)
    assert sampler.state_dict(consumed=np.int64(1)) == reference.state_dict(consumed=1)
    assert sampler.indices(np.int64(1), np.int64(2)).tolist() == reference.indices(1, 2).tolist()


def test_none_flags_are_false_as_torchs_sampler_takes_them():
    from torch.utils.data import DistributedSampler as TorchSampler

    for flag in ("shuffle", "drop_last"):
        sampler = DistributedSampler(11, 2, 1, **{flag: None})
        assert getattr(sampler, flag) is False
        assert list(sampler) == list(TorchSampler(range(11), 2, 1, **{flag: None}))


def test_seeds_at_both_ends_of_torchs_range():
    for seed in (-(2**63), 2**64 - 1):
        assert len(list(DistributedSampler(30, 2, 0, seed=seed))) == 15
    sampler = DistributedSampler(30, 2, 0, seed=2**64 - 1)
    with pytest.raises(ValueError, match="epoch 1 with seed 18446744073709551615 gives"):
        sampler.set_epoch(1)
    list(sampler)
    with pytest.raises(ValueError, match="outside"):  # the automatic next epoch is checked too
        iter(sampler)


def good_state():
    sampler = DistributedSampler(40, 2, 0, seed=7)
    sampler.set_epoch(3)
    return sampler.state_dict(consumed=4)


@pytest.mark.parametrize(
    "change,error,message",
    [
        ({"segments": [[0, 20], [10, 40]]}, ValueError, r"segments\[1\] = \[10, 40\] must be"),
        ({"segments": [[20, 40], [0, 10]]}, ValueError, r"segments\[1\] = \[0, 10\]"),
        ({"segments": [[0, 41]]}, ValueError, r"segments\[0\] = \[0, 41\] must be .*\[0, 40\)"),
        ({"segments": [[-1, 5]]}, ValueError, r"segments\[0\] = \[-1, 5\]"),
        ({"segments": [[5, 5]]}, ValueError, r"segments\[0\] = \[5, 5\] must be non-empty"),
        ({"segments": [[0, "9"]]}, TypeError, r"segments\[0\] must be an int, got '9'"),
        ({"segments": [[0, 1, 2]]}, TypeError, r"segments\[0\] must be a \[begin, end\] pair"),
        ({"segments": "0-40"}, TypeError, "segments must be a list"),
        ({"consumed": -1}, ValueError, "saved consumed must be at least 0, got -1"),
        ({"consumed": 21}, ValueError, "consumed=21 but no rank had more than 20"),
        ({"consumed": 2.0}, TypeError, "saved consumed must be an int"),
        ({"num_replicas": 0}, ValueError, "saved num_replicas must be at least 1"),
        ({"epoch": "3"}, TypeError, "epoch must be an int"),
        ({"epoch": 2**64}, ValueError, "outside"),
        ({"layout": "zigzag"}, ValueError, "unknown saved layout 'zigzag'"),
        ({"remainder": None}, ValueError, "unknown saved remainder None"),
        ({"version": 1}, ValueError, "version 1 is not 2: it was saved by another version"),
        ({"size": 41}, ValueError, "saved with size=41"),
        ({"size": 40.0}, ValueError, "saved with size=40.0"),
        ({"seed": 7.0}, ValueError, "saved with seed=7.0"),
        ({"version": True}, ValueError, "version True is not 2"),
    ],
)
def test_every_field_of_a_state_is_checked(change, error, message):
    sampler = DistributedSampler(40, 2, 0, seed=7)
    before = sampler.state_dict()
    with pytest.raises(error, match=message):
        sampler.load_state_dict({**good_state(), **change})
    assert sampler.state_dict() == before  # a refused state changes nothing


def test_a_state_must_be_a_mapping():
    with pytest.raises(TypeError, match="a sampler state is a dict, got list"):
        DistributedSampler(40, 2, 0).load_state_dict([1, 2])


def test_segments_outside_the_dataset_cannot_reach_the_feistel_walk():
    sampler = DistributedSampler(100, 1, 0, permutation="feistel")
    state = {**sampler.state_dict(), "segments": [[90, 200]]}
    with pytest.raises(ValueError, match=r"inside \[0, 100\)"):
        sampler.load_state_dict(state)


def reference_positions(size, world, rank, layout, start, stop):
    """Rank ``rank``'s padded positions ``start:stop``, wrapped, in exact Python ints."""
    per_rank = -(-size // world)
    unwrapped = [i * world + rank if layout == "strided" else rank * per_rank + i
                 for i in range(start, stop)]
    return [q % size for q in unwrapped], [q >= size for q in unwrapped]


@settings(max_examples=200, deadline=None)
@given(size=st.integers(TOP - 2**20, TOP), world=st.integers(1, 4096), data=st.data(),
       layout=st.sampled_from(["strided", "block"]))
def test_padding_is_exact_up_to_the_largest_size(size, world, data, layout):
    rank = data.draw(st.integers(0, world - 1))
    sampler = DistributedSampler(size, world, rank, shuffle=False, layout=layout)
    count = len(sampler)
    assert count == -(-size // world)
    start = data.draw(st.integers(max(0, count - 5), count))
    indices, mask = sampler.indices(start), sampler.padding_mask(start)
    expected, padded = reference_positions(size, world, rank, layout, start, count)
    assert indices.tolist() == expected and mask.tolist() == padded
    assert indices.dtype == np.int64 and (indices >= 0).all()
    shuffled = DistributedSampler(size, world, rank, layout=layout, permutation="feistel")
    assert shuffled.padding_mask(start).tolist() == padded
    values = shuffled.indices(start)
    assert ((values >= 0) & (values < size)).all()


def test_remainder_drop_says_drop_last_as_torchs_attribute_does():
    assert DistributedSampler(10, 4, 0, remainder="drop").drop_last is True
    assert DistributedSampler(10, 4, 0, remainder="uneven").drop_last is False
