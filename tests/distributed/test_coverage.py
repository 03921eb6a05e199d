"""coverage: how all ranks' indices together covered the dataset (missed, repeated)."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch.distributed as torch_dist
import torch.utils.data as tud
from hypothesis import given
from hypothesis import strategies as st

from shardwise.distributed.consistency import InconsistentRanksError
from shardwise.distributed.coverage import Coverage, coverage
from shardwise.distributed.launch import spawn_local
from shardwise.samplers.distributed import DistributedSampler


@given(st.integers(0, 40).flatmap(
    lambda size: st.tuples(st.just(size), st.lists(st.integers(0, max(size - 1, 0)),
                                                   max_size=3 * size))))
def test_counts_match_a_plain_counter(case):
    size, indices = case
    got = coverage(np.array(indices, dtype=np.int64), size)
    seen = Counter(indices)
    missed = [i for i in range(size) if seen[i] == 0]
    repeated = [i for i in range(size) if seen[i] > 1]
    assert got == Coverage(size, len(indices), len(missed), len(repeated),
                           tuple(missed[:10]), tuple(repeated[:10]))
    assert got.exact == (sorted(indices) == list(range(size)))


def test_summary_line_lists_the_first_few():
    assert str(Coverage.from_counts([1] * 4)) == (
        "4 indices delivered for 4 samples: 0 missed, 0 repeated")
    assert str(Coverage.from_counts([0] * 12 + [3])) == (
        "3 indices delivered for 13 samples: 12 missed (0, 1, 2, 3, 4, 5, 6, 7, 8, 9, ...), "
        "1 repeated (12)")


def test_coverage_is_frozen():
    with pytest.raises(AttributeError):
        Coverage.from_counts([1]).missed = 3  # type: ignore[misc]


@pytest.mark.parametrize(("indices", "size", "message"), [
    ([0, 5], 5, r"indices\[1\]=5 is outside range\(5\)"),
    ([0.5], 5, "got dtype float64"),
    ([0], -1, "got -1"),
])
def test_bad_input_is_named(indices, size, message):
    with pytest.raises((TypeError, ValueError), match=message):
        coverage(indices, size)


def _coverage_checks() -> dict:
    world, rank = torch_dist.get_world_size(), torch_dist.get_rank()
    out = {
        "torch": coverage(list(tud.DistributedSampler(range(7), world, rank, shuffle=False)), 7),
        "uneven": coverage(DistributedSampler(10, world, rank, remainder="uneven").indices(), 10),
        "drop": coverage(DistributedSampler(7, world, rank, shuffle=False,
                                            remainder="drop").indices(), 7),
    }
    pair = torch_dist.new_group([0, 2])
    if rank != 1:  # ranks 0 and 2 split 5 samples between them; rank 1 is not in the group
        out["group"] = coverage(DistributedSampler(5, 2, rank // 2).indices(), 5, group=pair)
    try:
        coverage([rank], 4 if rank == 1 else 3)
    except InconsistentRanksError as exc:
        out["sizes"] = str(exc)
    return out


def test_coverage_over_three_gloo_ranks():
    for rank, out in enumerate(spawn_local(_coverage_checks, 3, timeout=120)):
        # Seed 001's split: torch pads 7 samples to 9 by repeating samples 0 and 1.
        assert out["torch"] == Coverage(7, 9, 0, 2, (), (0, 1))
        assert out["uneven"].exact and out["uneven"].delivered == 10
        assert out["drop"] == Coverage(7, 6, 1, 0, (6,), ())
        if rank != 1:  # 5 samples padded to 6 over the pair: one repeat
            group = out["group"]
            assert (group.size, group.delivered, group.missed, group.repeated) == (5, 6, 0, 1)
        assert out["sizes"] == ("coverage needs the same size on every rank: rank 1 has size=4 "
                                "where ranks 0, 2 have size=3")
