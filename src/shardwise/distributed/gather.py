"""Put per-sample results from every rank back into dataset order, each sample exactly once.

A sampler that pads (torch's ``DistributedSampler``, or shardwise's ``remainder="pad"``) hands a
few samples to two ranks, so naively concatenating results counts them twice. Keyed by dataset
index, the duplicates are recognisable and dropped, and a sample that no rank saw is an error
rather than a silently smaller denominator.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import numpy.typing as npt
import torch
import torch.distributed as torch_dist

from shardwise.checks import require_int
from shardwise.distributed.consistency import agree
from shardwise.distributed.world import collective_device, group_world

#: How many offending indices an error message lists.
SHOWN = 10
#: How to fix ranks whose size, dst, dtype or row shape differ.
MATCH_ADVICE = ("Pass size=len(dataset), the same dst, and values of one dtype and row shape on "
                "every rank; a rank without results passes torch.empty((0, *row_shape), "
                "dtype=dtype)")


def gather_by_index(
    values: torch.Tensor | np.ndarray,
    indices: torch.Tensor | npt.ArrayLike,
    size: int,
    group: Any = None,
    dst: int | None = None,
) -> torch.Tensor | None:
    """Results of shape ``[size, ...]`` in dataset order, gathered from every rank of ``group``.

    ``values[i]`` is this rank's result for dataset index ``indices[i]``; ranks may hold different
    numbers of results. An index seen on several ranks (padding) is kept once; an index seen on
    none raises ``ValueError`` on every rank. With ``dst`` (a rank of ``group``) only that rank
    gets the tensor and the others get ``None``. The result is on ``values``' device.

    >>> gather_by_index(torch.tensor([10., 30., 20., 10.]), [0, 2, 1, 0], size=3)
    tensor([10., 20., 30.])
    """
    world, rank = group_world(group)
    try:
        values, indices, size, dst = _check_inputs(values, indices, size, world, dst)
        problem = None
    except Exception as exc:  # noqa: BLE001 - whatever it is, every rank raises it (agree, below):
        problem = exc  # a rank raising alone would leave the others out of step in a collective
    mine = {"problem": problem, "size": size, "dst": dst}
    if problem is None:
        mine.update(dtype=str(values.dtype), row_shape=tuple(values.shape[1:]), count=len(values))
    per_rank = agree(mine, ("size", "dst", "dtype", "row_shape"), group, caller="gather_by_index",
                     advice=MATCH_ADVICE)
    counts = [fields["count"] for fields in per_rank]

    index_dtype = torch.int32 if size <= torch.iinfo(torch.int32).max else torch.int64
    device, most = collective_device(group), max(counts)
    row_bytes = math.prod(values.shape[1:]) * values.element_size()
    # Values travel as raw bytes, so any dtype passes, even one the backend lacks (gloo has no
    # int16); every rank's buffer is padded to the largest rank's, as the collectives need.
    value_blocks = _collect(_padded(_bytes_of(values), most * row_bytes, device),
                            world, rank, group, dst)
    index_blocks = _collect(_padded(indices.to(index_dtype), most, device),
                            world, rank, group, dst)
    result, problem = None, None
    if value_blocks is not None:
        got_values = _received(value_blocks, counts, row_bytes).view(values.dtype)
        got_indices = _received(index_blocks, counts, 1)
        try:
            result = assemble(got_values.reshape(len(got_indices), *values.shape[1:]),
                              got_indices, size)
        except Exception as exc:  # noqa: BLE001 - whatever it is (MemoryError too), every rank
            problem = exc  # raises it: with dst the others would wait for dst's answer forever
    if dst is not None and world > 1:  # only dst could check; it tells the others
        problems = [problem]
        torch_dist.broadcast_object_list(problems, src=_global_rank(group, dst), group=group)
        problem = problems[0]
    if problem is not None:
        raise problem
    return None if result is None else result.to(values.device)


def assemble(values: torch.Tensor, indices: torch.Tensor, size: int) -> torch.Tensor:
    """Row ``i`` of the result is the first row of ``values`` whose index is ``i``, for all ``i``.

    This is the single-process core of :func:`gather_by_index`, given every rank's rows in
    rank order.

    >>> assemble(torch.tensor([5, 6, 7, 5]), torch.tensor([1, 0, 2, 1]), 3)
    tensor([6, 5, 7])
    """
    indices = indices.cpu().numpy().astype(np.int64, copy=False)  # NumPy indexes int64 fastest
    counts = np.bincount(indices, minlength=size)
    missing = np.flatnonzero(counts == 0)
    if len(missing):
        shown = ", ".join(map(str, missing[:SHOWN].tolist()))
        raise ValueError(
            f"{len(missing)} of {size} indices have no result on any rank "
            f"(first {min(len(missing), SHOWN)}: {shown}); every index in range({size}) needs "
            "one, so do not drop samples (drop_last=True or remainder='drop') when evaluating"
        )
    row_shape, row_bytes = values.shape[1:], math.prod(values.shape[1:]) * values.element_size()
    if row_bytes == 0:
        return values.new_empty((size, *row_shape))
    # Each row as one NumPy item of raw bytes: any dtype (bfloat16 too) moves in one scatter.
    rows = values.detach().cpu().contiguous().view(torch.uint8).numpy()
    rows = rows.reshape(len(indices), row_bytes).view(np.dtype((np.void, row_bytes)))[:, 0]
    result = np.empty(size, dtype=rows.dtype)
    result[indices] = rows
    # A repeated index got one of its rows above, which one unspecified: make it the first.
    repeats = np.flatnonzero((counts > 1)[indices])
    repeated, first = np.unique(indices[repeats], return_index=True)
    result[repeated] = rows[repeats[first]]
    as_bytes = torch.from_numpy(result.view(np.uint8))
    return as_bytes.view(values.dtype).reshape(size, *row_shape).to(values.device)


def as_indices(indices: torch.Tensor | npt.ArrayLike, size: int) -> torch.Tensor:
    """``indices`` as a 1-D int64 CPU tensor, checked to lie in ``range(size)``.

    >>> as_indices(np.array([2, 0], dtype=np.int32), 3)
    tensor([2, 0])
    """
    size = require_int("size (the dataset length)", size, minimum=0)
    if isinstance(indices, torch.Tensor):
        if indices.device.type == "meta":
            raise TypeError("indices is a meta tensor (a shape without data): pass the real "
                            "indices")
        indices = indices.detach().cpu().numpy()
    array = np.asarray(indices)
    if array.size == 0:
        array = array.astype(np.int64).reshape(0)  # [] makes float64
    if array.ndim != 1:
        raise ValueError(f"indices must be 1-D (one dataset index per result), got shape "
                         f"{tuple(array.shape)}; flatten them in the same order as the values")
    if array.dtype.kind not in "iu":
        raise TypeError(f"indices must be integers, got dtype {array.dtype}; pass the sampler's "
                        "indices, not values derived from them")
    if len(array) and (array.min() < 0 or array.max() >= size):  # no temporaries when fine
        bad = np.flatnonzero((array < 0) | (array >= size))
        raise ValueError(f"indices[{bad[0]}]={array[bad[0]]} is outside range({size}) "
                         f"({len(bad)} such indices); is size the dataset length on every rank?")
    return torch.from_numpy(array.astype(np.int64, copy=False))


def _check_inputs(
    values, indices, size, world, dst
) -> tuple[torch.Tensor, torch.Tensor, int, int | None]:
    if isinstance(values, np.ndarray):
        if values.dtype.kind not in "biufc":
            raise TypeError(f"values must be numeric, got a NumPy array of dtype {values.dtype}")
        values = torch.from_numpy(np.ascontiguousarray(values))
    if not isinstance(values, torch.Tensor):
        raise TypeError(f"values must be a torch.Tensor or np.ndarray of shape [n, ...], got "
                        f"{type(values).__name__}")
    if values.ndim == 0:
        raise ValueError("values must have shape [n, ...] (one row per index), got a 0-d tensor; "
                         "use values.reshape(1) for a single result")
    if values.layout != torch.strided or values.is_quantized or values.is_nested:
        kind = "quantized" if values.is_quantized else "nested" if values.is_nested else str(
            values.layout)
        raise TypeError(f"values must be a dense tensor, got a {kind} one; pass "
                        "values.to_dense() (or values.dequantize()) instead")
    if values.device.type == "meta":
        raise TypeError("values is a meta tensor (a shape without data): pass the real results")
    values = values.resolve_conj().resolve_neg()  # lazy views: their bytes are not their values
    indices = as_indices(indices, size)
    if len(indices) != len(values):
        raise ValueError(f"values has {len(values)} rows but indices has {len(indices)} entries; "
                         "pass one index per result row")
    if dst is not None:
        dst = require_int("dst", dst)
        if not 0 <= dst < world:
            raise ValueError(f"dst must be None or a rank in range({world}) of the group, got {dst}")
    return values.detach(), indices, int(size), dst


def _bytes_of(values: torch.Tensor) -> torch.Tensor:
    return values.contiguous().reshape(-1).view(torch.uint8)


def _padded(flat: torch.Tensor, length: int, device: torch.device) -> torch.Tensor:
    if len(flat) == length:
        return flat.to(device)
    padded = torch.zeros(length, dtype=flat.dtype, device=device)
    padded[: len(flat)] = flat
    return padded


def _received(blocks: torch.Tensor, counts: list[int], width: int) -> torch.Tensor:
    """The real part of each rank's padded block (a row of ``blocks``), in rank order."""
    if min(counts) == max(counts):  # nothing padded: no copy
        return blocks.reshape(-1)
    return torch.cat([block[: count * width] for block, count in zip(blocks, counts)])


def _collect(sent, world, rank, group, dst) -> torch.Tensor | None:
    """Every rank's ``sent`` as the rows of one tensor, on every rank or only on ``dst``."""
    if world == 1:
        return sent.reshape(1, len(sent))
    if dst not in (None, rank):
        torch_dist.gather(sent, None, dst=_global_rank(group, dst), group=group)
        return None
    # One buffer, received into row views: the rows are already concatenated in rank order.
    blocks = sent.new_empty((world, len(sent)))
    if dst is None:
        torch_dist.all_gather(list(blocks.unbind()), sent, group=group)
    else:
        torch_dist.gather(sent, list(blocks.unbind()), dst=_global_rank(group, dst), group=group)
    return blocks


def _global_rank(group: Any, group_rank: int) -> int:
    return group_rank if group is None else torch_dist.get_global_rank(group, group_rank)
