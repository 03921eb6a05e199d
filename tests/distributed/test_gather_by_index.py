"""gather_by_index: every dataset index exactly once, in order, whatever split made the shares."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.distributed as torch_dist
import torch.utils.data as tud
from hypothesis import given, settings
from hypothesis import strategies as st

from shardwise.distributed.coverage import coverage
from shardwise.distributed.gather import MATCH_ADVICE, assemble, gather_by_index
from shardwise.distributed.launch import spawn_local
from shardwise.samplers.distributed import DistributedSampler


def result_of(indices: np.ndarray) -> torch.Tensor:
    """A per-sample "result" that names its sample: row i is (i, -i / 2)."""
    indices = torch.as_tensor(np.asarray(indices, dtype=np.int64))
    return torch.stack([indices.double(), -indices.double() / 2], dim=1)


def everyone(size: int) -> torch.Tensor:
    return result_of(np.arange(size))


# -- one process: the assembly logic on simulated splits ----------------------------------------


@settings(max_examples=150, deadline=None)
@given(
    size=st.integers(0, 60), world=st.integers(1, 6), seed=st.integers(0, 2**31 - 1),
    remainder=st.sampled_from(["pad", "uneven"]), layout=st.sampled_from(["strided", "block"]),
    shuffle=st.booleans(),
)
def test_any_split_that_misses_nothing_assembles_to_dataset_order(
    size, world, seed, remainder, layout, shuffle
):
    shares = [DistributedSampler(size, world, rank, shuffle, seed, remainder=remainder,
                                 layout=layout).indices() for rank in range(world)]
    indices = np.concatenate(shares)
    got = gather_by_index(result_of(indices), indices, size)  # one process sees every share
    assert torch.equal(got, everyone(size))


@settings(max_examples=100, deadline=None)
@given(size=st.integers(1, 40), world=st.integers(1, 5), seed=st.integers(0, 1000))
def test_torch_padded_split_assembles_to_dataset_order(size, world, seed):
    shares = [list(tud.DistributedSampler(range(size), world, rank, seed=seed))
              for rank in range(world)]
    indices = np.concatenate(shares)
    assert len(indices) >= size  # padded
    assert torch.equal(assemble(result_of(indices), torch.as_tensor(indices), size),
                       everyone(size))


@settings(max_examples=100, deadline=None)
@given(data=st.data(), size=st.integers(1, 50))
def test_missing_indices_are_counted_and_listed(data, size):
    indices = data.draw(st.lists(st.integers(0, size - 1), max_size=2 * size))
    missing = sorted(set(range(size)) - set(indices))
    if not missing:
        return
    with pytest.raises(ValueError) as caught:
        gather_by_index(result_of(indices), indices, size)
    shown = ", ".join(map(str, missing[:10]))
    assert f"{len(missing)} of {size} indices have no result" in str(caught.value)
    assert f": {shown})" in str(caught.value)


def test_first_occurrence_wins_for_repeats():
    got = gather_by_index(torch.tensor([1, 2, 3, 9]), np.array([2, 0, 1, 2]), 3)
    assert got.tolist() == [2, 3, 1]


@pytest.mark.parametrize("dtype", [torch.bool, torch.int16, torch.float16, torch.bfloat16,
                                   torch.complex64, torch.uint8, torch.int64, torch.float64])
def test_every_dtype_and_row_shape_round_trips(dtype):
    full = (torch.arange(5 * 6).reshape(5, 2, 3) % 7).to(dtype)
    order = [4, 1, 3, 0, 2, 4]
    got = gather_by_index(full[order], order, 5)
    assert got.dtype == dtype and torch.equal(got, full)


def test_numpy_values_give_a_tensor():
    got = gather_by_index(np.array([0.5, 1.5]), np.array([1, 0], dtype=np.uint32), 2)
    assert torch.equal(got, torch.tensor([1.5, 0.5], dtype=torch.float64))


@pytest.mark.parametrize(
    ("values", "indices", "size", "error", "message"),
    [
        ([1.0, 2.0], [0, 1], 2, TypeError, "got list"),
        (np.array(["a", "b"]), [0, 1], 2, TypeError, "dtype <U1"),
        (torch.tensor(1.0), [0], 1, ValueError, "got a 0-d tensor"),
        (torch.zeros(2), [0.0, 1.0], 2, TypeError, "got dtype float64"),
        (torch.zeros(2), [True, False], 2, TypeError, "got dtype bool"),
        (torch.zeros(2), [[0, 1]], 2, ValueError, r"got shape \(1, 2\)"),
        (torch.zeros(3), [0, 1, 7], 5, ValueError, r"indices\[2\]=7 is outside range\(5\)"),
        (torch.zeros(2), torch.tensor([-1, 0]), 5, ValueError, r"indices\[0\]=-1 is outside"),
        (torch.zeros(3), [0, 1], 2, ValueError, "values has 3 rows but indices has 2"),
        (torch.zeros(1), [0], -3, ValueError, "got -3"),
        (torch.zeros(1), [0], True, TypeError, "must be an int, got True"),
        (torch.zeros(1), [0], 1.0, TypeError, "must be an int, got 1.0"),
    ],
)
def test_bad_input_is_named_in_the_error(values, indices, size, error, message):
    with pytest.raises(error, match=message):
        gather_by_index(values, indices, size)


def test_dst_must_be_a_rank_of_the_group():
    with pytest.raises(ValueError, match=r"range\(1\) of the group, got 1"):
        gather_by_index(torch.zeros(1), [0], 1, dst=1)
    with pytest.raises(TypeError, match="dst must be an int, got 0.0"):
        gather_by_index(torch.zeros(1), [0], 1, dst=0.0)
    assert gather_by_index(torch.ones(1), [0], 1, dst=np.int64(0)).tolist() == [1.0]


# -- real gloo groups --------------------------------------------------------------------------


def _attempt(fn, *args, **kwargs):
    """``fn``'s result, or its error as ``(type name, message)`` so every rank reports."""
    try:
        return fn(*args, **kwargs)
    except Exception as exc:  # noqa: BLE001 - the test compares errors across ranks
        return type(exc).__name__, str(exc)


def _numpy(tensor: torch.Tensor | None) -> np.ndarray | None:
    # Ranks return NumPy: a tensor's shared memory may vanish with its process.
    return None if tensor is None else tensor.numpy()


def _gather_checks() -> dict:
    world, rank = torch_dist.get_world_size(), torch_dist.get_rank()
    out = {}
    # torch's own padded split, shuffled: 7 samples, 3 ranks (seed 001), and a larger one.
    for size in (7, 1000):
        mine = list(tud.DistributedSampler(range(size), world, rank, seed=5))
        out[f"torch{size}"] = gather_by_index(result_of(mine), torch.tensor(mine), size).numpy()
    # Ranks with different counts, one of them empty: size 2 over 3 ranks, uneven.
    mine = DistributedSampler(2, world, rank, remainder="uneven").indices()
    out["uneven"] = gather_by_index(result_of(mine), mine, 2).numpy()
    # Only rank 1 gets the result.
    mine = DistributedSampler(10, world, rank, seed=3).indices()
    out["dst"] = _numpy(gather_by_index(result_of(mine).float(), mine, 10, dst=1))
    # Random splits of random sizes, some with rows of several values.
    rng = np.random.default_rng(17)
    out["random"] = []
    for _ in range(20):
        size, seed = int(rng.integers(0, 200)), int(rng.integers(0, 10**6))
        remainder, layout = rng.choice(["pad", "uneven"]), rng.choice(["strided", "block"])
        mine = DistributedSampler(size, world, rank, seed=seed, remainder=remainder,
                                  layout=layout).indices()
        got = gather_by_index(result_of(mine), mine, size)
        out["random"].append(bool(torch.equal(got, everyone(size))))
    # A subgroup of global ranks 1 and 2; dst is a rank of the group (global rank 2).
    pair = torch_dist.new_group([1, 2])
    if rank > 0:
        mine = DistributedSampler(5, 2, rank - 1, seed=4).indices()
        out["group"] = _numpy(gather_by_index(result_of(mine), mine, 5, group=pair, dst=1))
    else:  # not in the group: told so, not left with another group's answer
        out["outside"] = _attempt(gather_by_index, torch.zeros(1), [0], 1, group=pair)
    # Errors reach every rank: a dropped tail, a bad index on one rank, disagreeing sizes.
    mine = DistributedSampler(7, world, rank, shuffle=False, remainder="drop").indices()
    out["drop"] = _attempt(gather_by_index, result_of(mine), mine, 7)
    out["drop_dst"] = _attempt(gather_by_index, result_of(mine), mine, 7, dst=2)
    bad = [0, 7] if rank == 2 else [rank]
    out["bad"] = _attempt(gather_by_index, result_of(np.zeros(len(bad))), bad, 7)
    out["sizes"] = _attempt(gather_by_index, torch.zeros(1), [0], 8 if rank == 2 else 7)
    dtype = torch.int32 if rank else torch.int64
    out["dtypes"] = _attempt(gather_by_index, torch.zeros(1, dtype=dtype), [rank], 3)
    # A tensor only one rank cannot send (sparse), and a failure on dst other than a missing
    # index (no memory for 2**40 results): every rank hears of it, none waits.
    values = torch.ones(1).to_sparse() if rank == 1 else torch.ones(1)
    out["sparse"] = _attempt(gather_by_index, values, [rank], 3)
    out["memory"] = _attempt(gather_by_index, torch.ones(1), [rank], 2**40, dst=0)
    return out


def test_gather_over_three_gloo_ranks():
    per_rank = spawn_local(_gather_checks, 3, timeout=120)
    for rank, out in enumerate(per_rank):
        assert np.array_equal(out["torch7"], everyone(7))
        assert np.array_equal(out["torch1000"], everyone(1000))
        assert np.array_equal(out["uneven"], everyone(2))
        assert all(out["random"])
        if rank == 1:
            assert np.array_equal(out["dst"], everyone(10).float())
        else:
            assert out["dst"] is None
        if rank == 2:
            assert np.array_equal(out["group"], everyone(5))
        else:
            assert out.get("group") is None
        if rank == 0:
            assert out["outside"] == ("ValueError", ("this process (global rank 0) is not a member "
                                      "of the group given: call this only on the group's ranks"))
        for key in ("drop", "drop_dst"):
            assert out[key] == ("ValueError", ("1 of 7 indices have no result on any rank "
                                "(first 1: 6); every index in range(7) needs one, so do not "
                                "drop samples (drop_last=True or remainder='drop') when "
                                "evaluating")), key
        assert out["bad"][0] == "ValueError"
        assert out["bad"][1].startswith("rank 2: indices[1]=7 is outside range(7)")
        assert out["sizes"] == ("InconsistentRanksError",
                                ("gather_by_index needs the same size, dst, dtype, row_shape on "
                                "every rank: rank 2 has size=8 where ranks 0, 1 have size=7. "
                                + MATCH_ADVICE))
        assert out["dtypes"][1].endswith(
            "rank 0 has dtype='torch.int64' where ranks 1, 2 have dtype='torch.int32'. "
            + MATCH_ADVICE)
        assert out["sparse"] == ("TypeError", ("rank 1: values must be a dense tensor, got a "
                                 "torch.sparse_coo one; pass values.to_dense() (or "
                                 "values.dequantize()) instead"))
        assert out["memory"][0] == "MemoryError", out["memory"]


def test_lazy_views_and_tensors_without_plain_bytes():
    values = torch.tensor([1 + 2j, 3 + 4j])
    assert gather_by_index(values.conj(), [1, 0], 2).tolist() == [3 - 4j, 1 - 2j]
    assert gather_by_index(torch._neg_view(torch.ones(2)), [0, 1], 2).tolist() == [-1.0, -1.0]
    quantized = torch.quantize_per_tensor(torch.tensor([1.0, 2.0]), 0.1, 0, torch.quint8)
    for bad, kind in ((quantized, "quantized"), (torch.ones(2).to_sparse(), "sparse"),
                      (torch.ones(2, device="meta"), "meta")):
        with pytest.raises(TypeError, match=kind):
            gather_by_index(bad, [0, 1], 2)


class _UnreadableIndices:
    """Indices whose conversion fails with neither TypeError nor ValueError."""

    def __array__(self, *args, **kwargs):
        raise RuntimeError("the index file is gone")


def _one_rank_cannot_read_its_indices() -> dict:
    rank = torch_dist.get_rank()
    meta = torch.tensor([rank], device="meta") if rank == 2 else [rank]
    unreadable = _UnreadableIndices() if rank == 1 else [rank]
    out = {"meta": _attempt(gather_by_index, torch.ones(1), meta, 3),
           "unreadable": _attempt(gather_by_index, torch.ones(1), unreadable, 3),
           "coverage": _attempt(coverage, meta, 3)}
    out["after"] = gather_by_index(torch.ones(1), [rank], 3).tolist()  # the ranks stay in step
    return out


@pytest.mark.timeout(120)
def test_any_input_error_on_one_rank_is_raised_on_every_rank():
    per_rank = spawn_local(_one_rank_cannot_read_its_indices, 3, timeout=90)
    assert all(out == per_rank[0] for out in per_rank), per_rank
    out = per_rank[0]
    assert out["meta"] == ("TypeError", "rank 2: indices is a meta tensor (a shape without "
                           "data): pass the real indices")
    assert out["coverage"] == out["meta"]
    assert out["unreadable"] == ("RuntimeError", "rank 1: the index file is gone")
    assert out["after"] == [1.0, 1.0, 1.0]


def _a_rank_without_results() -> tuple:
    rank = torch_dist.get_rank()
    mine = [rank] if rank < 2 else []  # 2 samples, 3 ranks: rank 2 has none
    values = result_of(mine) if mine else torch.empty(0)  # a guess at an empty result
    return _attempt(gather_by_index, values, mine, 2)


@pytest.mark.timeout(120)
def test_ranks_whose_values_differ_in_dtype_or_row_shape_are_told_how_to_match():
    per_rank = spawn_local(_a_rank_without_results, 3, timeout=90)
    assert all(out == per_rank[0] for out in per_rank)
    kind, message = per_rank[0]
    assert kind == "InconsistentRanksError"
    assert ("rank 2 has dtype='torch.float32' where ranks 0, 1 have dtype='torch.float64'; "
            "rank 2 has row_shape=() where ranks 0, 1 have row_shape=(2,)") in message
    assert message.endswith(
        ". Pass size=len(dataset), the same dst, and values of one dtype and row shape on "
        "every rank; a rank without results passes torch.empty((0, *row_shape), dtype=dtype)")
