"""The samplers a loader makes when it is given none: torch's own, that also keep an epoch.

A state saved as an epoch's last batch was delivered, before the pass saw its end (a checkpoint
on the last step), resumes either the empty rest of that epoch (a loop that goes on with the
saved epoch, as torchdata's loader resumes it) or the next epoch whole (a trainer that starts
the next one, as Lightning does). Only the epoch set on the sampler tells them apart, and torch's
``RandomSampler`` and ``SequentialSampler`` have none. These are torch's classes, drawing
exactly as they do, with a ``set_epoch`` that notes the epoch: trainers call it on every sampler
that has one, at each epoch's start.

>>> sampler = SequentialSampler(range(3))
>>> sampler.set_epoch(2)
>>> sampler.epoch, list(sampler)
(2, [0, 1, 2])
"""

from __future__ import annotations

from torch.utils.data import RandomSampler as TorchRandomSampler
from torch.utils.data import SequentialSampler as TorchSequentialSampler

from shardwise.checks import require_int


class _KeepsEpoch:
    epoch: int | None = None  # None: never set

    def set_epoch(self, epoch: int) -> None:
        """Note ``epoch``; the order is torch's all the same (a ``generator`` seeds it)."""
        self.epoch = require_int("epoch", epoch)


class RandomSampler(_KeepsEpoch, TorchRandomSampler):
    """torch's ``RandomSampler``, with ``set_epoch``."""


class SequentialSampler(_KeepsEpoch, TorchSequentialSampler):
    """torch's ``SequentialSampler``, with ``set_epoch``."""
