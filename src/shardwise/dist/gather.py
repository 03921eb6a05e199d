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

from shardwise.dist.consistency import agree, group_world

#: How many offending indices an error message lists.
SHOWN = 10


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
        values, indices, size = _check_inputs(values, indices, size, world, dst)
        problem = None
    except (TypeError, ValueError) as exc:
        problem = exc
    mine = {"problem": problem, "size": size, "dst": dst}
    if problem is None:
        mine.update(dtype=str(values.dtype), row_shape=tuple(values.shape[1:]), count=len(values))
    per_rank = agree(mine, ("size", "dst", "dtype", "row_shape"), group, caller="gather_by_index")
    counts = [fields["count"] for fields in per_rank]

    index_dtype = torch.int32 if size <= torch.iinfo(torch.int32).max else torch.int64
    device = collective_device(group)
    rows = _pack(values, indices.to(index_dtype), max(counts), device)
    blocks = _collect(rows, rank, world, group, dst)
    result, problem = None, None
    if blocks is not None:
        rows = torch.cat([block[:count] for block, count in zip(blocks, counts)])
        try:
            result = assemble(*_unpack(rows, index_dtype, values), size)
        except ValueError as exc:
            problem = exc
    if dst is not None and world > 1:  # only dst could check; it tells the others
        problems = [problem]
        torch_dist.broadcast_object_list(problems, src=_global_rank(group, dst), group=group)
        problem = problems[0]
    if problem is not None:
        raise problem
    return None if result is None else result.to(values.device)


def assemble(values: torch.Tensor, indices: torch.Tensor, size: int) -> torch.Tensor:
    """``values`` reordered so row ``i`` is the first row whose index is ``i``; all of ``range(size)``.

    This is the single-process core of :func:`gather_by_index`, given every rank's rows in
    rank order.

    >>> assemble(torch.tensor([5, 6, 7, 5]), torch.tensor([1, 0, 2, 1]), 3)
    tensor([6, 5, 7])
    """
    positions = torch.arange(len(indices), device=indices.device)
    first = torch.full((size,), len(indices), dtype=torch.int64, device=indices.device)
    first.scatter_reduce_(0, indices.long(), positions, reduce="amin")
    missing = torch.nonzero(first == len(indices)).flatten()
    if len(missing):
        shown = ", ".join(str(i) for i in missing[:SHOWN].tolist())
        raise ValueError(
            f"{len(missing)} of {size} indices have no result on any rank "
            f"(first {min(len(missing), SHOWN)}: {shown}); every index in range({size}) needs "
            "one, so do not drop samples (drop_last=True or remainder='drop') when evaluating"
        )
    return values[first]


def as_indices(indices: torch.Tensor | npt.ArrayLike, size: int) -> torch.Tensor:
    """``indices`` as a 1-D int64 CPU tensor, checked to lie in ``range(size)``.

    >>> as_indices(np.array([2, 0], dtype=np.int32), 3)
    tensor([2, 0])
    """
    if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or size < 0:
        raise ValueError(f"size must be a non-negative int (the dataset length), got {size!r}")
    array = indices.detach().cpu().numpy() if isinstance(indices, torch.Tensor) else np.asarray(indices)
    if array.size == 0:
        array = array.astype(np.int64).reshape(0)
    if array.ndim != 1:
        raise ValueError(f"indices must be 1-D (one dataset index per result), got shape "
                         f"{tuple(array.shape)}; flatten them in the same order as the values")
    if array.dtype.kind not in "iu":
        raise TypeError(f"indices must be integers, got dtype {array.dtype}; pass the sampler's "
                        "indices, not values derived from them")
    bad = np.flatnonzero((array < 0) | (array >= size))
    if len(bad):
        raise ValueError(f"indices[{bad[0]}]={array[bad[0]]} is outside range({size}) "
                         f"({len(bad)} such indices); is size the dataset length on every rank?")
    return torch.from_numpy(array.astype(np.int64))


def collective_device(group: Any = None) -> torch.device:
    """Where tensors for a collective on ``group`` must live: NCCL needs the current GPU.

    >>> collective_device()
    device(type='cpu')
    """
    if group_world(group)[0] > 1 and torch_dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _check_inputs(values, indices, size, world, dst) -> tuple[torch.Tensor, torch.Tensor, int]:
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
    indices = as_indices(indices, size)
    if len(indices) != len(values):
        raise ValueError(f"values has {len(values)} rows but indices has {len(indices)} entries; "
                         "pass one index per result row")
    if dst is not None and (isinstance(dst, bool) or not isinstance(dst, int)
                            or not 0 <= dst < world):
        raise ValueError(f"dst must be None or a rank in range({world}) of the group, got {dst!r}")
    return values.detach(), indices, int(size)


def _pack(values: torch.Tensor, indices: torch.Tensor, rows: int, device: torch.device):
    # Index and value bytes travel together as one uint8 row per result: one collective, and
    # any dtype (bool, int16, complex...) passes even where the backend lacks it.
    index_bytes = _as_bytes(indices.reshape(-1, 1))
    value_bytes = _as_bytes(values.reshape(len(values), math.prod(values.shape[1:])))
    packed = torch.zeros(rows, index_bytes.shape[1] + value_bytes.shape[1], dtype=torch.uint8,
                         device=device)
    packed[: len(values), : index_bytes.shape[1]] = index_bytes
    packed[: len(values), index_bytes.shape[1]:] = value_bytes
    return packed


def _unpack(rows: torch.Tensor, index_dtype: torch.dtype, like: torch.Tensor):
    width = index_dtype.itemsize
    indices = _from_bytes(rows[:, :width], index_dtype).reshape(-1)
    values = _from_bytes(rows[:, width:], like.dtype).reshape(len(rows), *like.shape[1:])
    return values, indices


def _from_bytes(columns: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    # A fresh copy: a slice of the rows may start at an offset the dtype cannot be viewed from.
    return columns.clone(memory_format=torch.contiguous_format).view(dtype)


def _as_bytes(matrix: torch.Tensor) -> torch.Tensor:
    return matrix.contiguous().view(torch.uint8)


def _collect(rows, rank, world, group, dst) -> list[torch.Tensor] | None:
    """Every rank's padded block of rows, on every rank or only on ``dst`` (None elsewhere)."""
    if world == 1:
        return [rows]
    blocks = [torch.empty_like(rows) for _ in range(world)] if dst in (None, rank) else None
    if dst is None:
        torch_dist.all_gather(blocks, rows, group=group)
    else:
        torch_dist.gather(rows, blocks, dst=_global_rank(group, dst), group=group)
    return blocks


def _global_rank(group: Any, group_rank: int) -> int:
    return group_rank if group is None else torch_dist.get_global_rank(group, group_rank)
