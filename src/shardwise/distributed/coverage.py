"""After an epoch: did the ranks together see every sample exactly once?

Each rank counts its own indices, and one ``all_reduce`` sums the counts, so no rank ever holds
another rank's indices; the cost is one integer per dataset sample.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import torch
import torch.distributed as torch_dist

from shardwise.distributed.consistency import agree
from shardwise.distributed.gather import SHOWN, as_indices
from shardwise.distributed.world import collective_device, group_world


@dataclass(frozen=True)
class Coverage:
    """How an epoch's indices, over all ranks, covered ``range(size)``.

    ``missed`` indices came from no rank, ``repeated`` ones more than once (padding), and
    ``delivered`` counts every index every rank passed, repeats included.
    """

    size: int
    delivered: int
    missed: int
    repeated: int
    first_missed: tuple[int, ...]
    first_repeated: tuple[int, ...]

    @property
    def exact(self) -> bool:
        """Every index exactly once."""
        return self.missed == 0 and self.repeated == 0

    @classmethod
    def from_counts(cls, counts: npt.ArrayLike) -> Coverage:
        """From how many times each index was seen (``counts[i]`` for index ``i``).

        >>> Coverage.from_counts([2, 1, 0])
        Coverage(size=3, delivered=3, missed=1, repeated=1, first_missed=(2,), first_repeated=(0,))
        """
        counts = np.asarray(counts)
        missed, repeated = np.flatnonzero(counts == 0), np.flatnonzero(counts > 1)
        return cls(
            size=len(counts), delivered=int(counts.sum()), missed=len(missed),
            repeated=len(repeated), first_missed=tuple(missed[:SHOWN].tolist()),
            first_repeated=tuple(repeated[:SHOWN].tolist()),
        )

    def __str__(self) -> str:
        text = f"{self.delivered} indices delivered for {self.size} samples: "
        text += f"{self.missed} missed{_first(self.first_missed, self.missed)}, "
        return text + f"{self.repeated} repeated{_first(self.first_repeated, self.repeated)}"


def coverage(indices: torch.Tensor | npt.ArrayLike, size: int, group: Any = None) -> Coverage:
    """Every rank's :class:`Coverage` of ``range(size)`` by all ranks' ``indices`` together.

    Pass the indices this rank used in the epoch (e.g. ``sampler.indices()``). Costs one
    ``all_reduce`` of ``size`` int32 counts plus one small metadata exchange.

    >>> print(coverage([0, 3, 6, 1, 4, 0], size=7))
    6 indices delivered for 7 samples: 2 missed (2, 5), 1 repeated (0)
    """
    try:
        indices, problem = as_indices(indices, size), None
    except Exception as exc:  # noqa: BLE001 - raised on every rank by agree, so none waits
        problem = exc
    agree({"problem": problem, "size": size}, ("size",), group, caller="coverage")
    device = collective_device(group)
    counts = torch.bincount(indices, minlength=size).to(device=device, dtype=torch.int32)
    if group_world(group)[0] > 1:
        torch_dist.all_reduce(counts, group=group)
    return Coverage.from_counts(counts.cpu().numpy())


def _first(shown: tuple[int, ...], total: int) -> str:
    if not shown:
        return ""
    more = ", ..." if total > len(shown) else ""
    return f" ({', '.join(map(str, shown))}{more})"
