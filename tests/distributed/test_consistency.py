"""check_consistent: every rank names the misconfigured rank before it reads overlapping data."""

from __future__ import annotations

import pytest
import torch.distributed as torch_dist
from hypothesis import given
from hypothesis import strategies as st
from torch.utils.data import DistributedSampler as TorchDistributedSampler
from torch.utils.data import RandomSampler

from shardwise.distributed.consistency import (
    InconsistentRanksError,
    agree,
    check_consistent,
    disagreements,
    raise_first_problem,
    together,
)
from shardwise.distributed.launch import spawn_local
from shardwise.distributed.world import gather_objects
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
    options = {"size": 23, "num_replicas": 3, "rank": process_rank, "seed": 0} | change
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
    torchs = TorchDistributedSampler(range(23 if rank else 24), seed=0)
    out["torch"] = _outcome(torchs)
    try:  # a sampler only one rank cannot compare: every rank raises, none waits
        check_consistent(RandomSampler(range(3)) if rank == 1 else _sampler(rank))
    except TypeError as exc:
        out["unsupported"] = str(exc)
    failing = _sampler(rank)
    if rank == 2:
        failing.fingerprint = lambda: 1 // 0
    try:  # one rank's sampler fails to describe itself: every rank raises
        check_consistent(failing)
    except ZeroDivisionError as exc:
        out["failed"] = str(exc)
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
    assert out["unsupported"].startswith("rank 1: check_consistent compares shardwise's samplers")
    assert out["failed"] == "rank 2: integer division or modulo by zero"
    assert "rank 2's sampler has rank=1" in out["world"]
    assert "rank 1's sampler has rank=0" in out["rank"]
    assert out["seed"].startswith("samplers differ across ranks")
    assert "rank 0 has size=24 where ranks 1, 2 have size=23" in out["torch"]


def test_other_samplers_are_refused_by_name():
    with pytest.raises(TypeError, match="not RandomSampler"):
        check_consistent(RandomSampler(range(3)))


class _NeedsTwoArguments(ValueError):
    def __init__(self, what: str, why: str) -> None:
        super().__init__(f"{what}: {why}")


def test_a_raised_problem_keeps_its_type_and_attributes_and_names_its_rank():
    from shardwise.files import BadLine, ParseError

    bad = BadLine("data/b.txt", 3, "1,x", "id 'x' is not an integer")
    with pytest.raises(ParseError, match=r"^rank 1: data/b\.txt:3: id 'x'") as caught:
        raise_first_problem([None, ParseError(bad), None])
    assert caught.value.bad == bad
    missing = FileNotFoundError(2, "No such file or directory", "data/c.txt")
    with pytest.raises(FileNotFoundError, match=r"^rank 0: \[Errno 2\] .*'data/c.txt'$"):
        raise_first_problem([missing])


def test_types_that_cannot_be_rebuilt_become_their_builtin_base_and_keep_their_name():
    with pytest.raises(ValueError, match=r"^rank 2: _NeedsTwoArguments: size: too big$") as caught:
        raise_first_problem([None, None, _NeedsTwoArguments("size", "too big")])
    assert type(caught.value) is ValueError
    decode = UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte")
    with pytest.raises(UnicodeError, match="^rank 0: UnicodeDecodeError: 'utf-8' codec can't"):
        raise_first_problem([decode])


def test_ranks_with_the_same_problem_are_named_together_and_the_first_rank_is_raised():
    problems = [None, KeyError("x"), ValueError("bad size"), ValueError("bad size")]
    named = r"^rank 1: KeyError: 'x'; ranks 2, 3: ValueError: bad size$"
    with pytest.raises(LookupError, match=named):
        raise_first_problem(problems)
    raise_first_problem([None, None])  # nothing to raise


def test_the_local_exception_becomes_the_cause():
    local = OSError("disk on fire")
    with pytest.raises(OSError) as caught:
        raise_first_problem([local], cause=local)
    assert caught.value.__cause__ is local and caught.value is not local


def _failing_together(failing_rank: int) -> tuple[str, str, bool]:
    """Rank ``failing_rank`` fails inside ``together``; every rank reports what it raised."""
    def step() -> int:
        if torch_dist.get_rank() == failing_rank:
            raise _NeedsTwoArguments("rank", "broke")  # no pickling by default: it still travels
        return torch_dist.get_rank()

    try:
        together(step)
    except ValueError as exc:
        gathered = gather_objects(torch_dist.get_rank())  # the group is still usable afterwards
        return type(exc).__name__, str(exc), gathered == [0, 1, 2]
    return "ok", "", False


@pytest.mark.timeout(120)
def test_together_raises_one_rank_failure_on_every_rank():
    per_rank = spawn_local(_failing_together, 3, 1, timeout=60)
    assert per_rank == [("ValueError", "rank 1: _NeedsTwoArguments: rank: broke", True)] * 3
    assert together(lambda: "alone") == "alone"


def _bad_batching_on_one_rank() -> dict:
    rank = torch_dist.get_rank()
    sampler = _sampler(rank)
    out = {}
    for name, batching in (("int", 8 if rank == 2 else {"batch_size": 8}),
                           ("unpicklable", {"batch_size": 8, "collate": (lambda b: b) if rank == 1
                                            else None})):
        try:
            check_consistent(sampler, batching=batching)
            out[name] = "ok"
        except Exception as exc:  # noqa: BLE001 - the test compares errors across ranks
            out[name] = f"{type(exc).__name__}: {exc}"
    check_consistent(sampler, batching={"batch_size": 8})  # the ranks are still in step
    return out


@pytest.mark.timeout(120)
def test_one_rank_with_unusable_batching_fails_every_rank_instead_of_leaving_them_waiting():
    per_rank = spawn_local(_bad_batching_on_one_rank, 3, timeout=90)
    assert all(out == per_rank[0] for out in per_rank), per_rank
    out = per_rank[0]
    assert out["int"] == ("TypeError: rank 2: batching must be None or a mapping such as "
                          "{'batch_size': 32, 'drop_last': False}, got 8 (int)")
    assert out["unpicklable"].startswith(
        "TypeError: rank 1: check_consistent sends this rank's settings to the others, but they "
        "cannot be pickled (")
