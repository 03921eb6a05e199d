"""``DistributedSamplerWrapper``: any sampler's epoch, split over the ranks like a dataset's.

The inner sampler's output for an epoch is the epoch's order: the ranks split its positions with
the same layouts and remainders as :class:`shardwise.DistributedSampler` (so padding, uneven
shares, resume and elastic resume all work the same way). The split is disjoint only if every
rank's inner sampler yields the same order: a ``RandomSampler`` seeded differently on each rank
(the default, from each process's own random state) silently overlaps. ``check_consistent`` (and
``shardwise.DataLoader``, each epoch) compares the ranks' orders and stops them if they differ.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sized
from typing import Any

import numpy as np

from shardwise.mix import digest
from shardwise.samplers.distributed import DistributedSampler


class ListOrder:
    """An epoch's order given as the list of its samples.

    >>> ListOrder(np.array([5, 3, 9])).take(np.array([2, 0])).tolist()
    [9, 5]
    """

    def __init__(self, samples: np.ndarray) -> None:
        self.size = len(samples)
        self._samples = samples

    def take(self, positions: np.ndarray) -> np.ndarray:
        return self._samples[positions]

    def digest(self) -> str:
        """A digest of the whole order, as a saved state keeps it."""
        return f"{digest(self._samples):#018x}"


class DistributedSamplerWrapper(DistributedSampler):
    """Split what ``sampler`` yields each epoch over ``num_replicas`` ranks.

    ``set_epoch`` reaches the inner sampler (when it has one) before it is iterated for an epoch.
    Resuming needs an inner sampler that yields the same order for the same epoch: a state
    keeps a digest of the epoch's order, and a resume whose inner sampler yields another is
    refused.

    >>> from torch.utils.data import WeightedRandomSampler
    >>> import torch
    >>> inner = WeightedRandomSampler([1.0] * 10, 10, generator=torch.Generator().manual_seed(0))
    >>> len(DistributedSamplerWrapper(inner, num_replicas=3, rank=2))
    4
    """

    def __init__(
        self,
        sampler: Iterable[int] | Sized,
        num_replicas: int | None = None,
        rank: int | None = None,
        *,
        remainder: str = "pad",
        layout: str = "strided",
    ) -> None:
        if not hasattr(sampler, "__len__"):
            raise TypeError(f"the wrapped sampler must have a length, got "
                            f"{type(sampler).__name__} without __len__")
        self.sampler = sampler
        super().__init__(len(sampler), num_replicas, rank, shuffle=False, remainder=remainder,
                         layout=layout)

    @property
    def effective_permutation(self) -> str:
        return f"wrapped {type(self.sampler).__name__}"

    def _order_of(self, epoch: int) -> ListOrder:
        if self._cached_order is None or self._cached_order[0] != epoch:
            self._cached_order = None
            if callable(getattr(self.sampler, "set_epoch", None)):
                self.sampler.set_epoch(epoch)
            samples = np.fromiter((int(i) for i in self.sampler), dtype=np.int64)
            if len(samples) != self.size:
                raise ValueError(f"the wrapped {type(self.sampler).__name__} yielded "
                                 f"{len(samples)} indices where its length says {self.size}")
            self._cached_order = (epoch, ListOrder(samples))
        return self._cached_order[1]

    def config(self) -> dict[str, Any]:
        return {**super().config(), "sampler": type(self.sampler).__qualname__}

    def state_dict(self, consumed: int | None = None, *, batch_size: int | None = None,
                   drop_last: bool = False, begun: bool = False) -> dict[str, Any]:
        state = super().state_dict(consumed, batch_size=batch_size, drop_last=drop_last,
                                   begun=begun)
        # The order drawn for the saved epoch, if drawn: drawing it only for the state would
        # move on a generator that the next epoch draws from.
        if self._cached_order is not None and self._cached_order[0] == state["epoch"]:
            state["order_digest"] = self._cached_order[1].digest()
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        # The order first, the position only once it matches: a refused state leaves the
        # sampler where it stood (the inner sampler has drawn the epoch, as a pass would).
        saved = state.get("order_digest") if isinstance(state, Mapping) else None
        if saved is not None and (drawn := self._order_of(
                self._checked_epoch(state.get("epoch"))).digest()) != saved:
            name = type(self.sampler).__name__
            raise ValueError(
                f"the wrapped {name} yields another order for epoch {state['epoch']} than it "
                f"did when the state was saved (digest {drawn}, saved {saved}): resuming needs "
                f"an order that follows the epoch alone, so give the {name} a set_epoch, or a "
                "generator seeded from the epoch")
        super().load_state_dict(state)
