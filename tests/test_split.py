from collections import Counter

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from shardwise.split import (
    consumed_intervals,
    rank_count,
    rank_positions,
    remaining_intervals,
    split_total,
)

lengths = st.integers(0, 300)
worlds = st.integers(1, 40)
layouts = st.sampled_from(["strided", "block"])
remainders = st.sampled_from(["pad", "drop", "uneven"])


def shares(length, world, layout, remainder):
    return [rank_positions(length, world, r, layout, remainder) for r in range(world)]


@given(lengths, worlds, layouts, remainders)
def test_every_rank_share_obeys_its_remainder_policy(length, world, layout, remainder):
    per_rank = shares(length, world, layout, remainder)
    counts = [len(s) for s in per_rank]
    wrapped = Counter(int(q) % max(length, 1) for s in per_rank for q in s)
    assert sum(counts) == split_total(length, world, remainder)
    assert counts == [rank_count(length, world, r, remainder) for r in range(world)]
    if remainder == "uneven":
        assert sorted(wrapped.elements()) == list(range(length))
        assert max(counts) - min(counts) <= 1
    elif remainder == "drop":
        assert set(wrapped.values()) <= {1} and len(set(counts)) == 1
        assert length - len(wrapped) <= world - 1
    else:
        assert set(wrapped) == set(range(length)) and len(set(counts)) == 1
        assert sum(counts) - length <= world - 1


@given(lengths, worlds, remainders)
def test_block_layout_gives_contiguous_runs_in_rank_order(length, world, remainder):
    per_rank = shares(length, world, "block", remainder)
    flat = np.concatenate(per_rank)
    assert np.array_equal(flat, np.arange(len(flat)))


@given(lengths, worlds, layouts, remainders, st.data())
def test_a_slice_computes_the_same_positions(length, world, layout, remainder, data):
    rank = data.draw(st.integers(0, world - 1))
    whole = rank_positions(length, world, rank, layout, remainder)
    start = data.draw(st.integers(-5, len(whole) + 5))
    stop = data.draw(st.one_of(st.none(), st.integers(-5, len(whole) + 5)))
    part = rank_positions(length, world, rank, layout, remainder, start, stop)
    assert part.tolist() == whole[start:stop].tolist()


@given(lengths, worlds, layouts, remainders, st.data())
def test_remaining_is_exactly_what_no_rank_consumed(length, world, layout, remainder, data):
    most = rank_count(length, world, 0, remainder)
    consumed = data.draw(st.integers(0, most))
    used = {  # a padding repeat (at length or beyond) uses nothing: its sample may be ahead
        int(q)
        for r in range(world)
        for q in rank_positions(length, world, r, layout, remainder, 0, consumed)
        if q < length
    }
    covered = [p for b, e in consumed_intervals(length, world, layout, remainder, consumed)
               for p in range(b, e)]
    left = [p for b, e in remaining_intervals(length, world, layout, remainder, consumed)
            for p in range(b, e)]
    assert covered == sorted(used)
    assert left == [p for p in range(length) if p not in used]


def test_worked_examples():
    # torch: 7 samples over 3 ranks pads to 9 by repeating positions 0 and 1.
    assert [rank_positions(7, 3, r, "strided", "pad").tolist() for r in range(3)] == [
        [0, 3, 6], [1, 4, 7], [2, 5, 8]]
    assert [rank_positions(7, 3, r, "block", "drop").tolist() for r in range(3)] == [
        [0, 1], [2, 3], [4, 5]]
    # Fewer samples than ranks: every rank still gets one, wrapping as often as needed.
    assert [rank_positions(2, 5, r, "strided", "pad").tolist() for r in range(5)] == [
        [0], [1], [2], [3], [4]]
