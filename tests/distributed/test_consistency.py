"""check_consistent: every rank names the misconfigured rank before it reads overlapping data."""

from __future__ import annotations

import pytest
import torch.distributed as torch_dist
from hypothesis import given
from hypothesis import strategies as st

from shardwise.distributed.consistency import (
    InconsistentRanksError,
    agree,
    check_consistent,
    disagreements,
)
from shardwise.distributed.launch import spawn_local
from shardwise.samplers.distributed import DistributedSampler


def test_the_minority_is_named_against_the_majority():
    per_rank = [{"seed": 0, "size": 7}, {"seed": 0, "size": 7}, {"seed": 1, "size": 8},
                {"seed": 5, "size": 7}]
    assert disagreements(per_rank) == [
        "rank 2 has seed=1 where ranks 0, 1 have seed=0",
        "rank 3 has seed=5 where ranks 0, 1 have seed=0",
        "rank 2 has size=8 where ranks 0, 1, 3 have size=7",
    ]


def test_ties_go_to_the_lowest_rank_and_missing_fields_show():
    assert disagreements([{"layout": "block"}, {"layout": "strided"}]) == [
        "rank 1 has layout='strided' where rank 0 has layout='block'"]
    assert disagreements([{"a": [1]}, {}]) == ["rank 1 has a=<missing> where rank 0 has a=[1]"]


@given(st.lists(st.fixed_dictionaries({"seed": st.integers(0, 2), "layout": st.sampled_from(
    ["strided", "block"])}), min_size=1, max_size=8))
def test_there_is_a_sentence_exactly_when_ranks_differ(per_rank):
    # "rank 2 has seed=1 where ..." names the field just before "=".
    named = [s.split(" where ")[0].rsplit(" ", 1)[1].split("=")[0] for s in disagreements(per_rank)]
    for field in ("seed", "layout"):
        values = {fields[field] for fields in per_rank}
        assert named.count(field) == len(values) - 1  # one per value other than the usual one


def test_one_process_agrees_with_itself_but_not_with_a_bigger_world():
    check_consistent(DistributedSampler(7, 1, 0))
    with pytest.raises(InconsistentRanksError,
                       match=r"rank 0 has num_replicas=3 but the process group has 1 rank\."):
        check_consistent(DistributedSampler(7, 3, 0))


def test_agree_raises_a_rank_problem_first():
    with pytest.raises(TypeError, match="^rank 0: bad dtype$"):
        agree({"problem": TypeError("bad dtype"), "size": 1}, ["size"], caller="x")


def _sampler(process_rank: int, **change) -> DistributedSampler:
    """The same sampler on every rank, at epoch 2, but for the ``change``d options."""
    options = dict(size=23, num_replicas=3, rank=process_rank, seed=0) | change
    sampler = DistributedSampler(options.pop("size"), **options)
    sampler.set_epoch(2)
    return sampler


def _outcome(sampler: DistributedSampler) -> str:
    try:
        check_consistent(sampler)
        return "ok"
    except InconsistentRanksError as exc:
        return str(exc)


def _consistency_checks() -> dict:
    rank = torch_dist.get_rank()
    out = {"same": _outcome(_sampler(rank))}
    out["seed"] = _outcome(_sampler(rank, seed=1 if rank == 2 else 0))
    out["size"] = _outcome(_sampler(rank, size=24 if rank == 0 else 23))
    forgot_epoch = _sampler(rank)
    if rank == 1:
        forgot_epoch.set_epoch(1)
    out["epoch"] = _outcome(forgot_epoch)
    out["world"] = _outcome(_sampler(rank, num_replicas=2, rank=min(rank, 1)))
    out["rank"] = _outcome(_sampler(rank, rank=0 if rank == 1 else rank))
    return out


def test_every_rank_names_the_rank_that_differs():
    per_rank = spawn_local(_consistency_checks, 3, timeout=120)
    assert all(out == per_rank[0] for out in per_rank)  # every rank raises the same error
    out = per_rank[0]
    assert out["same"] == "ok"
    assert "rank 2 has seed=1 where ranks 0, 1 have seed=0" in out["seed"]
    assert "rank 0 has size=24 where ranks 1, 2 have size=23" in out["size"]
    assert "rank 1 has epoch=1 where ranks 0, 2 have epoch=2" in out["epoch"]
    assert "rank 1 has fingerprint=0x" in out["epoch"]  # another epoch, another order
    assert "ranks 0, 1, 2 have num_replicas=2 but the process group has 3 ranks" in out["world"]
    assert "rank 2's sampler has rank=1" in out["world"]
    assert "rank 1's sampler has rank=0" in out["rank"]
    assert out["seed"].startswith("samplers differ across ranks")
