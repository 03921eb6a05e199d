import warnings
from collections import Counter

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader
from torch.utils.data import DistributedSampler as TorchSampler

import shardwise
import shardwise.samplers.distributed as distributed_module
from shardwise import DistributedSampler
from shardwise.order import FeistelOrder

configs = st.fixed_dictionaries({
    "size": st.integers(0, 120),
    "world": st.integers(1, 16),
    "seed": st.integers(0, 2**31),
    "epoch": st.integers(0, 1000),
    "layout": st.sampled_from(["strided", "block"]),
    "remainder": st.sampled_from(["pad", "drop", "uneven"]),
    "permutation": st.sampled_from(["torch", "feistel"]),
    "shuffle": st.booleans(),
})


def all_ranks(cfg, **overrides):
    options = {**cfg, **overrides}
    samplers = [
        DistributedSampler(
            options["size"], options["world"], rank, shuffle=options["shuffle"],
            seed=options["seed"], remainder=options["remainder"], layout=options["layout"],
            permutation=options["permutation"],
        )
        for rank in range(options["world"])
    ]
    for sampler in samplers:
        sampler.set_epoch(options["epoch"])
    return samplers


@settings(max_examples=400, deadline=None)
@given(
    size=st.integers(0, 300), world=st.integers(1, 20), data=st.data(),
    shuffle=st.booleans(), seed=st.integers(0, 2**40), epoch=st.integers(0, 50),
    drop_last=st.booleans(),
)
def test_defaults_match_torch_bit_for_bit(size, world, data, shuffle, seed, epoch, drop_last):
    rank = data.draw(st.integers(0, world - 1))
    theirs = TorchSampler(range(size), world, rank, shuffle=shuffle, seed=seed, drop_last=drop_last)
    ours = DistributedSampler(range(size), world, rank, shuffle=shuffle, seed=seed,
                              drop_last=drop_last)
    theirs.set_epoch(epoch)
    ours.set_epoch(epoch)
    assert list(ours) == list(theirs)
    assert len(ours) == len(theirs)
    assert (ours.num_samples, ours.total_size) == (theirs.num_samples, theirs.total_size)


@settings(max_examples=300, deadline=None)
@given(configs)
def test_invariants_of_every_configuration(cfg):
    per_rank = [list(s) for s in all_ranks(cfg)]
    again = [list(s) for s in all_ranks(cfg)]
    assert per_rank == again  # the same configuration gives the same order, every time
    counts = Counter(i for share in per_rank for i in share)
    lengths = [len(share) for share in per_rank]
    size, world = cfg["size"], cfg["world"]
    assert set(counts) <= set(range(size))
    if cfg["remainder"] == "uneven":
        assert sorted(counts.elements()) == list(range(size))
        assert max(lengths) - min(lengths) <= 1
    elif cfg["remainder"] == "drop":
        assert set(counts.values()) <= {1} and len(set(lengths)) == 1
        assert size - len(counts) <= world - 1
    else:
        assert set(counts) == set(range(size)) and len(set(lengths)) == 1
        assert sum(lengths) - size <= world - 1


@settings(max_examples=200, deadline=None)
@given(configs, st.data())
def test_indices_slices_and_padding_mask_agree_with_iteration(cfg, data):
    sampler = all_ranks(cfg)[data.draw(st.integers(0, cfg["world"] - 1))]
    whole = list(sampler)
    start = data.draw(st.integers(0, len(whole)))
    stop = data.draw(st.integers(start, len(whole)))
    assert sampler.indices(start, stop).tolist() == whole[start:stop]
    assert sampler.indices().dtype == np.int64
    mask = sampler.padding_mask()
    assert len(mask) == len(whole)
    if cfg["remainder"] != "pad":
        assert not mask.any()
    else:  # dropping the masked positions of every rank leaves each sample exactly once
        kept = Counter(i for s in all_ranks(cfg) for i, pad in zip(s, s.padding_mask()) if not pad)
        assert sorted(kept.elements()) == list(range(cfg["size"]))


@settings(max_examples=200, deadline=None)
@given(configs, st.integers(0, 50))
def test_repeated_and_dropped_with_a_limit_are_the_first_of_the_whole_lists(cfg, limit):
    sampler = all_ranks(cfg)[0]
    for distinct in (False, True):
        whole = sampler.repeated(distinct=distinct).tolist()
        assert sampler.repeated(distinct=distinct, limit=limit).tolist() == whole[:limit]
    assert sampler.dropped(limit=limit).tolist() == sampler.dropped().tolist()[:limit]


def test_a_limit_lists_repeats_and_drops_of_a_trillion_ranks_through_the_permutation():
    size, world = 10**12 + 1, 10**12
    over = [DistributedSampler(size, world, rank, seed=3, permutation="feistel")
            for rank in range(4)]
    # Rank r > 0 holds positions r and r + world, which wraps around to position r - 1.
    assert over[0].repeated(limit=3).tolist() == [s.indices(1, 2)[0] for s in over[1:]]
    assert [s.padding_mask().tolist() for s in over] == [[False, False]] + [[False, True]] * 3
    under = DistributedSampler(2 * world - 1, world, 0, seed=3, remainder="drop",
                               permutation="feistel")
    tail = FeistelOrder(2 * world - 1, seed=3, epoch=0).take(np.arange(world, world + 2))
    assert under.dropped(limit=2).tolist() == tail.tolist()


def test_padding_mask_marks_torchs_repeats():
    masks = [DistributedSampler(7, 3, r, shuffle=False).padding_mask().tolist() for r in range(3)]
    assert masks == [[False, False, False], [False, False, True], [False, False, True]]


def test_epochs_advance_by_themselves_unless_set():
    sampler = DistributedSampler(50, 2, 0, seed=3)
    passes = [list(sampler) for _ in range(3)]
    expected = []
    for epoch in range(3):
        reference = DistributedSampler(50, 2, 0, seed=3)
        reference.set_epoch(epoch)
        expected.append(list(reference))
    assert passes == expected and len({tuple(p) for p in passes}) == 3
    sampler.set_epoch(1)
    assert list(sampler) == expected[1]
    sampler.set_epoch(1)  # torch's habit of setting the epoch before every pass
    assert list(sampler) == expected[1]


def test_a_pass_after_set_epoch_uses_exactly_that_epoch():
    sampler = DistributedSampler(50, 2, 0, seed=3)
    list(sampler)
    sampler.set_epoch(0)
    first = list(sampler)
    assert sampler.epoch == 0
    assert list(sampler) == first and sampler.epoch == 0  # as torch's: set_epoch's epoch again


def test_works_as_a_dataloader_sampler():
    data = torch.arange(100, 200)
    sampler = DistributedSampler(data, num_replicas=4, rank=1, seed=9)
    batches = list(DataLoader(data, batch_size=8, sampler=sampler))
    expected = [100 + i for i in sampler.indices()]
    assert torch.cat(batches).tolist() == expected
    assert len(DataLoader(data, batch_size=8, sampler=sampler)) == 4


def test_world_comes_from_the_environment(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "5")
    monkeypatch.setenv("RANK", "3")
    sampler = DistributedSampler(20)
    assert (sampler.num_replicas, sampler.rank) == (5, 3)
    monkeypatch.delenv("WORLD_SIZE")
    monkeypatch.delenv("RANK")
    assert (DistributedSampler(20).num_replicas, DistributedSampler(20).rank) == (1, 0)


@pytest.mark.parametrize(("env", "message"), [
    ({"WORLD_SIZE": "2"}, "WORLD_SIZE=2 is set but no rank \\(no RANK in the environment, no "
                          "process group\\), so every process would take rank 0's share"),
    ({"RANK": "1"}, "RANK=1 is set but WORLD_SIZE is not: set WORLD_SIZE too"),
])
def test_half_a_world_in_the_environment_is_refused(monkeypatch, env, message):
    # Each process launched with WORLD_SIZE alone took rank 0's share: half the data, repeated.
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.delenv("RANK", raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match=message):
        DistributedSampler(20)
    with pytest.raises(ValueError, match=message):
        shardwise.DataLoader(torch.arange(20), distributed=True)
    assert DistributedSampler(20, num_replicas=2, rank=1).rank == 1  # given: taken as given
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv("RANK", "0")
    assert (DistributedSampler(20).num_replicas, DistributedSampler(20).rank) == (1, 0)


@pytest.mark.parametrize(
    "kwargs,error,message",
    [
        ({"dataset": -1}, ValueError, "at least 0, got -1"),
        ({"dataset": object()}, TypeError, "int or have __len__"),
        ({"dataset": 3.5}, TypeError, "__len__"),
        ({"rank": 4}, ValueError, r"Invalid rank 4, rank should be in the interval \[0, 3\]"),
        ({"rank": -1}, ValueError, "Invalid rank -1"),
        ({"num_replicas": 0, "rank": 0}, ValueError, "at least 1, got 0"),
        ({"layout": "interleaved"}, ValueError, r"unknown layout 'interleaved'.*'strided', 'block'"),
        ({"remainder": "wrap"}, ValueError, r"unknown remainder 'wrap'.*'pad', 'drop', 'uneven'"),
        ({"permutation": "numpy"}, ValueError, r"unknown permutation 'numpy'.*'torch', 'feistel'"),
        ({"seed": 1.5}, TypeError, r"seed must be an int, got 1.5"),
        ({"seed": "0"}, TypeError, r"seed must be an int, got '0'"),
        ({"drop_last": True, "remainder": "pad"}, ValueError, "drop_last=True means"),
        ({"shuffle": "yes"}, TypeError, "shuffle must be a bool"),
    ],
)
def test_bad_input_is_named(kwargs, error, message):
    arguments = {"dataset": 10, "num_replicas": 4, "rank": 0, **kwargs}
    with pytest.raises(error, match=message):
        DistributedSampler(**arguments)


def test_drop_last_agrees_with_an_explicit_drop():
    a = DistributedSampler(10, 3, 1, drop_last=True, remainder="drop")
    assert a.remainder == "drop" and list(a) == list(DistributedSampler(10, 3, 1, drop_last=True))


def test_torch_order_warns_once_at_scale(monkeypatch):
    monkeypatch.setattr(distributed_module, "_warned_torch_scale", False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        DistributedSampler(2**25, 8, 0)
        DistributedSampler(2**25, 8, 1)
        DistributedSampler(2**25, 8, 0, permutation="feistel")
    assert len(caught) == 1 and "permutation='feistel'" in str(caught[0].message)


def test_billions_of_samples_in_constant_memory():
    sampler = DistributedSampler(10**12, 1024, 1023, permutation="feistel", seed=1)
    first = sampler.indices(0, 1000)
    assert len(sampler) == 976_562_500
    assert first.min() >= 0 and first.max() < 10**12 and len(np.unique(first)) == 1000
    assert next(iter(sampler)) == first[0]
    assert sampler.indices(len(sampler) - 3).shape == (3,)


def test_config_and_fingerprint_tell_configurations_apart():
    base = DistributedSampler(100, 4, 0, seed=1)
    assert base.config() == {
        "size": 100, "seed": 1, "epoch": 0, "shuffle": True, "layout": "strided",
        "remainder": "pad", "permutation": "torch", "num_replicas": 4,
    }
    same = DistributedSampler(100, 4, 3, seed=1)
    assert base.fingerprint() == same.fingerprint()
    for other in (DistributedSampler(100, 4, 0, seed=2), DistributedSampler(101, 4, 0, seed=1),
                  DistributedSampler(100, 4, 0, seed=1, permutation="feistel")):
        assert other.fingerprint() != base.fingerprint()
    huge = [DistributedSampler(2**63 - 1, 8, 0, seed=seed, permutation="feistel") for seed in (0, 1)]
    assert huge[0].fingerprint() != huge[1].fingerprint()


def test_uneven_ranks_each_resumed_from_their_own_state_at_the_end_agree():
    # Shares of 21 and 20: in step, each took 20; the short rank's state says every rank
    # finished, the long rank's that it has one left. Both are right, and the ranks agree.
    resumed = []
    for rank in (0, 1):
        sampler = DistributedSampler(41, 2, rank, seed=1, remainder="uneven")
        state = sampler.state_dict(consumed=20)
        again = DistributedSampler(41, 2, rank, seed=1, remainder="uneven")
        again.load_state_dict(state)
        again.set_epoch(0)
        resumed.append(again)
    assert [len(list(sampler)) for sampler in resumed] == [1, 0]
    assert resumed[0].config() == resumed[1].config()
    assert resumed[0].fingerprint() == resumed[1].fingerprint()
    ahead = DistributedSampler(41, 2, 0, seed=1, remainder="uneven")
    ahead.load_state_dict(DistributedSampler(41, 2, 0, seed=1, remainder="uneven")
                          .state_dict(consumed=10))
    ahead.set_epoch(0)
    assert ahead.fingerprint() != resumed[0].fingerprint()  # ranks far apart still disagree


def test_a_number_of_replicas_without_a_rank_is_refused_as_torch_refuses_it(monkeypatch):
    # Every process took rank 0's share, silently, where torch's sampler raises (no group).
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.delenv("RANK", raising=False)
    with pytest.raises(ValueError, match="process group"):  # (torch's words)
        TorchSampler(range(20), num_replicas=2)
    with pytest.raises(ValueError, match=r"num_replicas=2 was given but no rank .*pass rank too"):
        DistributedSampler(20, num_replicas=2)
    with pytest.raises(ValueError, match=r"world_size=3 was given but no rank"):
        shardwise.shard_iterable(range(9), world_size=3)
    assert DistributedSampler(20, num_replicas=1).rank == 0
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "4")
    assert DistributedSampler(20, num_replicas=2).rank == 1  # (the rank, from the environment)
