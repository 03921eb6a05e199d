import json
import re
from collections import Counter
from itertools import islice

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from shardwise import DistributedSampler


def ranks(size, world, epoch=2, **options):
    samplers = [DistributedSampler(size, world, rank, seed=7, **options) for rank in range(world)]
    for sampler in samplers:
        sampler.set_epoch(epoch)
    return samplers


def consume(samplers, count):
    """Each rank takes ``count`` samples of its pass, as DDP's lock step gives."""
    return Counter(i for s in samplers for i in islice(iter(s), count))


def resume(state, size, world, epoch=2, **options):
    samplers = [DistributedSampler(size, world, rank, seed=7, **options) for rank in range(world)]
    for sampler in samplers:
        sampler.load_state_dict(json.loads(json.dumps(state)))  # states are plain data
        sampler.set_epoch(epoch)  # the usual loop: keeps the restored position
    return samplers


def check_epoch_totals(total, size, world, remainder):
    if remainder == "uneven":
        assert sorted(total.elements()) == list(range(size))
    elif remainder == "drop":
        assert set(total.values()) <= {1}
    else:
        assert set(total) == set(range(size))


@pytest.mark.parametrize("old,new", [(4, 3), (4, 6), (2, 1), (1, 8), (3, 3)])
@pytest.mark.parametrize("layout", ["strided", "block"])
@pytest.mark.parametrize("remainder", ["pad", "drop", "uneven"])
@pytest.mark.parametrize("permutation", ["torch", "feistel"])
def test_elastic_resume_finishes_the_epoch(old, new, layout, remainder, permutation):
    size = 103
    options = {"layout": layout, "remainder": remainder, "permutation": permutation}
    before = ranks(size, old, **options)
    used = consume(before, 9)
    after = resume(before[0].state_dict(), size, new, **options)
    lengths = [len(s) for s in after]
    rest = Counter(i for s in after for i in s)
    assert not set(used) & set(rest) or remainder == "pad"  # pad may repeat, nothing else may
    check_epoch_totals(used + rest, size, new, remainder)
    assert max(lengths) - min(lengths) <= (1 if remainder == "uneven" else 0)
    # The next epoch is an ordinary epoch on the new world size.
    for sampler in after:
        sampler.set_epoch(3)
    assert [list(s) for s in after] == [list(s) for s in ranks(size, new, epoch=3, **options)]


@pytest.mark.parametrize("layout", ["strided", "block"])
@pytest.mark.parametrize("remainder", ["pad", "drop", "uneven"])
@pytest.mark.parametrize("permutation", ["torch", "feistel"])
def test_same_world_resume_continues_each_ranks_own_sequence(layout, remainder, permutation):
    options = {"layout": layout, "remainder": remainder, "permutation": permutation}
    whole = [list(s) for s in ranks(50, 4, **options)]
    before = ranks(50, 4, **options)
    consume(before, 5)
    after = resume(before[2].state_dict(), 50, 4, **options)
    assert [list(s) for s in after] == [share[5:] for share in whole]


@settings(max_examples=150, deadline=None)
@given(
    size=st.integers(0, 90), old=st.integers(1, 9), new=st.integers(1, 9), middle=st.integers(1, 9),
    layout=st.sampled_from(["strided", "block"]),
    remainder=st.sampled_from(["pad", "drop", "uneven"]),
    permutation=st.sampled_from(["torch", "feistel"]), data=st.data(),
)
def test_two_elastic_resumes_in_one_epoch(size, old, new, middle, layout, remainder,
                                          permutation, data):
    options = {"layout": layout, "remainder": remainder, "permutation": permutation}
    first = ranks(size, old, **options)
    used = consume(first, data.draw(st.integers(0, min(len(s) for s in first))))
    second = resume(first[0].state_dict(), size, middle, **options)
    used += consume(second, data.draw(st.integers(0, min(len(s) for s in second))))
    third = resume(second[-1].state_dict(), size, new, **options)
    total = used + Counter(i for s in third for i in s)
    check_epoch_totals(total, size, new, remainder)
    if remainder != "pad":
        assert set(total.values()) <= {1}


def test_consumed_counts_what_training_used_not_what_was_prefetched():
    sampler = ranks(40, 2)[0]
    iterator = iter(sampler)
    prefetched = list(islice(iterator, 12))  # a DataLoader ran ahead...
    state = sampler.state_dict(consumed=8)  # ...but training used only 8
    assert state["consumed"] == 8 and sampler.state_dict()["consumed"] == 12
    assert list(resume(state, 40, 2)[0]) == prefetched[8:] + list(iterator)


def test_a_finished_epoch_resumes_as_an_empty_pass_then_the_next_epoch_set():
    before = ranks(20, 2)
    for sampler in before:
        list(sampler)
    after = resume(before[0].state_dict(), 20, 3)
    assert [list(s) for s in after] == [[], [], []]
    for sampler in after:
        sampler.set_epoch(3)
    assert [list(s) for s in after] == [list(s) for s in ranks(20, 3, epoch=3)]


def test_resume_at_a_trillion_samples_costs_no_replay():
    before = DistributedSampler(10**12, 1024, 5, permutation="feistel")
    state = before.state_dict(consumed=123_456_789)
    after = DistributedSampler(10**12, 1000, 999, permutation="feistel")
    after.load_state_dict(state)
    assert after.pass_length == -(-(10**12 - 123_456_789 * 1024) // 1000)  # pad rounds up
    assert len(after) == 10**12 // 1000  # the whole epoch's share, as torch counts it
    assert after.indices(0, 3).shape == (3,)


@pytest.mark.parametrize(
    "change,field,fix",
    [({"size": 41}, "size", "a dataset of 40 samples"), ({"seed": 8}, "seed", "seed=7"),
     ({"permutation": "feistel"}, "permutation", "shuffle=True, permutation='torch'"),
     ({"shuffle": False}, "permutation", "shuffle=True, permutation='torch'")],
)
def test_a_state_from_another_configuration_is_refused(change, field, fix):
    state = ranks(40, 2)[0].state_dict()
    options = {"size": 40, "seed": 7, **change}
    sampler = DistributedSampler(options.pop("size"), 2, 0, **options)
    with pytest.raises(ValueError, match=f"saved with {field}=.*this sampler has {field}=.*"
                                         f"build the sampler with {re.escape(fix)} to resume"):
        sampler.load_state_dict(state)


def test_a_state_saved_without_shuffling_says_so_when_refused():
    state = DistributedSampler(40, 2, 0, shuffle=False).state_dict()
    with pytest.raises(ValueError, match="permutation='identity'.*with shuffle=False to resume"):
        DistributedSampler(40, 2, 0).load_state_dict(state)


def test_malformed_states_are_refused():
    sampler = ranks(40, 2)[0]
    state = sampler.state_dict()
    with pytest.raises(ValueError, match="missing consumed"):
        sampler.load_state_dict({k: v for k, v in state.items() if k != "consumed"})
    with pytest.raises(ValueError, match="consumed=99 but no rank had more than 20"):
        sampler.load_state_dict({**state, "consumed": 99})
    with pytest.raises(ValueError, match="consumed=21 but this rank's pass has only 20"):
        sampler.state_dict(consumed=21)


def global_steps(samplers, global_batch):
    """Each global step's samples, as lock-step DDP training with a global batch sees them."""
    per_rank = global_batch // len(samplers)
    shares = [list(s) for s in samplers]
    count = max(len(share) for share in shares)
    return [sorted(i for share in shares for i in share[k * per_rank : (k + 1) * per_rank])
            for k in range(-(-count // per_rank))]


@settings(max_examples=150, deadline=None)
@given(
    size=st.integers(0, 400), global_batch=st.sampled_from([12, 24, 36]), data=st.data(),
    remainder=st.sampled_from(["pad", "drop", "uneven"]),
    permutation=st.sampled_from(["torch", "feistel"]),
)
def test_a_global_step_holds_the_same_samples_on_any_world_size(
    size, global_batch, data, remainder, permutation
):
    """Strided layout, a constant global batch divisible by W: the run does not depend on W."""
    divisors = [w for w in range(1, global_batch + 1) if global_batch % w == 0]
    old, new = data.draw(st.sampled_from(divisors)), data.draw(st.sampled_from(divisors))
    options = {"remainder": remainder, "permutation": permutation}
    full = size // global_batch  # steps whose global batch is all real samples
    reference = global_steps(ranks(size, old, **options), global_batch)[:full]
    assert global_steps(ranks(size, new, **options), global_batch)[:full] == reference
    if remainder == "uneven":  # the last, partial step too: the same samples, nothing added
        assert global_steps(ranks(size, new, **options), global_batch) == global_steps(
            ranks(size, old, **options), global_batch)
    # Train k steps on `old` ranks, then resume the epoch on `new` ranks.
    k = data.draw(st.integers(0, full))
    before = ranks(size, old, **options)
    consume(before, k * global_batch // old)
    after = resume(before[0].state_dict(), size, new, **options)
    assert global_steps(after, global_batch)[: full - k] == reference[k:]


@settings(max_examples=300, deadline=None)
@given(size=st.integers(0, 30), before=st.integers(1, 5), after=st.integers(1, 5),
       layout=st.sampled_from(["strided", "block"]), steps=st.integers(0, 30))
@example(size=5, before=4, after=1, layout="block", steps=1)  # a repeat ahead of its sample
def test_an_evaluation_masked_by_padding_counts_each_sample_once_across_an_elastic_resume(
        size, before, after, layout, steps):
    first = ranks(size, before, remainder="pad", layout=layout)
    steps = min(steps, len(first[0]))
    counted = Counter()
    for sampler in first:  # each rank evaluates `steps` samples, its repeats masked out
        counted.update(sampler.indices()[:steps][~sampler.padding_mask()[:steps]].tolist())
    state = first[0].state_dict(consumed=steps)
    for rank in range(after):
        sampler = DistributedSampler(size, after, rank, seed=7, remainder="pad", layout=layout)
        sampler.load_state_dict(state)
        sampler.set_epoch(2)  # the saved epoch's rest
        counted.update(sampler.indices()[~sampler.padding_mask()].tolist())
    assert sorted(counted.elements()) == list(range(size))


def test_a_rank_whose_share_ran_out_stays_in_the_epoch_the_others_finish():
    """41 samples over 3 ranks, uneven (14, 14, 13): after 13 steps the short rank's pass is
    empty but the epoch is not over, so it must not start the next one beside the others."""
    first = DistributedSampler(41, 3, 0, remainder="uneven", seed=1)
    state = first.state_dict(consumed=13)
    resumed = [DistributedSampler(41, 3, rank, remainder="uneven", seed=1) for rank in range(3)]
    for sampler in resumed:
        sampler.load_state_dict(state)
    assert [sampler.epoch for sampler in resumed] == [0, 0, 0]
    assert [len(list(sampler)) for sampler in resumed] == [1, 1, 0]
    ended = first.state_dict(consumed=14)  # now it is over: every rank goes on to epoch 1
    for sampler in resumed:
        sampler.load_state_dict(ended)
    assert [sampler.epoch for sampler in resumed] == [1, 1, 1]


def test_a_state_saved_again_before_a_pass_keeps_its_meaning():
    """A job stopped again before its first step saves the state it was given: an ended epoch
    stays ended (the next epoch, or set_epoch's empty rest), not the next epoch's start."""
    first = DistributedSampler(6, 1, 0, seed=3)
    list(first)
    ended = first.state_dict()
    again = DistributedSampler(6, 1, 0, seed=3)
    again.load_state_dict(ended)
    resaved = again.state_dict()
    assert resaved == ended
    last = DistributedSampler(6, 1, 0, seed=3)
    last.load_state_dict(resaved)
    last.set_epoch(0)
    assert list(last) == []


def test_a_shorter_ranks_whole_share_says_where_the_longer_ranks_stand_given_its_batching():
    # 7 samples over 4 ranks: shares 2, 2, 2, 1. Rank 3 used its one sample at step 1.
    short = DistributedSampler(7, 4, 3, remainder="uneven")
    assert short.state_dict(consumed=1)["consumed"] == 2  # by default: a pass's end
    assert short.state_dict(consumed=1, batch_size=1)["consumed"] == 1  # they had one step left
    assert short.state_dict(consumed=1, batch_size=2)["consumed"] == 2  # one batch held all
    assert short.state_dict(consumed=1, batch_size=2, drop_last=True)["consumed"] == 0
    with pytest.raises(ValueError, match="batch_size"):
        short.state_dict(consumed=1, batch_size=0)
