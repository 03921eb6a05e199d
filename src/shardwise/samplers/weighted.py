"""``WeightedDistributedSampler``: torch's ``WeightedRandomSampler``, spread over ranks, at any size.

With replacement each rank draws its own stream, from its own child of one root seed, so no two
ranks ever draw the same stream; a draw is one uniform number looked up in the weights'
cumulative sums (no limit on the number of categories, where ``torch.multinomial`` stops at
2^24). The stream's generator (PCG64) jumps to any position, so a resume costs nothing.
Without replacement one global weighted permutation of all samples (Efraimidis and Spirakis'
exponential keys) is split over the ranks: no sample is drawn twice across the whole world.
Each ``W`` consecutive places of it are dealt to the ranks in a random order, so every rank
draws alike (in rank order, lower ranks would draw heavier samples).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch

from shardwise.checks import refuse_unordered, require_bool, require_int
from shardwise.distributed.world import resolve_world
from shardwise.mix import digest, mix_arrays, mix_ints
from shardwise.order import feistel_take
from shardwise.samplers.passes import MAX_SIZE, SEED_MAX, SEED_MIN
from shardwise.samplers.rank_streams import RankStreamSampler, StreamPosition

_DEAL = 0xDEA1  # keys the deal of each group of W draws without replacement to the ranks


class WeightedDistributedSampler(RankStreamSampler):
    """Draw ``num_samples`` indices a rank, each ``i`` with probability proportional to ``weights[i]``.

    Args:
        weights: one non-negative weight per sample (a sequence, NumPy array or tensor).
        num_samples: draws per rank per epoch.
        replacement: draw with replacement (independent per-rank streams) or without (one global
            weighted permutation, split over the ranks: ``num_samples * W`` may not exceed the
            number of positive weights).
        num_replicas, rank: the world, from the process group or the environment by default.
        seed: the same on every rank.

    Passes, ``set_epoch``, automatic epochs and ``state_dict`` / ``load_state_dict`` behave as
    :class:`shardwise.DistributedSampler`'s (a state resumes on the world size it was saved with).

    >>> sampler = WeightedDistributedSampler([0.0, 1.0, 0.0, 3.0], 6, num_replicas=2, rank=0)
    >>> sorted(set(sampler))
    [1, 3]
    """

    def __init__(
        self,
        weights: Sequence[float] | np.ndarray | torch.Tensor,
        num_samples: int,
        replacement: bool = True,
        num_replicas: int | None = None,
        rank: int | None = None,
        seed: int = 0,
    ) -> None:
        self.weights = _checked_weights(weights)
        self.replacement = require_bool("replacement", replacement)
        self.num_replicas, self.rank = resolve_world(num_replicas, rank)
        # Every rank's draws are numbered in one int64 stream (and len() takes no more)
        self.num_samples = require_int("num_samples", num_samples, minimum=0,
                                       maximum=MAX_SIZE // self.num_replicas)
        self.seed = require_int("seed", seed, minimum=SEED_MIN, maximum=SEED_MAX)
        positive = int(np.count_nonzero(self.weights))
        if not self.replacement and self.num_samples * self.num_replicas > positive:
            raise ValueError(
                f"without replacement {self.num_replicas} ranks cannot draw {self.num_samples} "
                f"samples each: only {positive} samples have a positive weight; lower "
                "num_samples or pass replacement=True")
        # Weights near the largest float add up past it: their sum is taken at a scale that
        # fits (the draws are proportional all the same).
        self._cumulative = np.cumsum(self.weights / self.weights.max())
        self._last_drawable = int(np.flatnonzero(self.weights)[-1])
        self._weights_digest = digest(self.weights)  # every weight counts, not a sample of them
        self._cached_permutation: tuple[int, np.ndarray] | None = None
        self._init_epochs()

    def _take(self, at: StreamPosition, context: Any, start: int, stop: int) -> np.ndarray:
        first, count = at.offset + start, stop - start
        if not self.replacement:
            positions = np.arange(first, first + count, dtype=np.int64)
            return self._permutation(at.epoch)[positions * self.num_replicas
                                               + self._slots(at.epoch, positions)]
        generator = np.random.PCG64(self._stream_seed(at.epoch))
        generator.advance(first)  # one 64-bit draw a sample: jump straight to the position
        uniform = np.random.Generator(generator).random(count) * self._cumulative[-1]
        found = np.searchsorted(self._cumulative, uniform, side="right")
        # A draw rounded up to the total itself would land past the last positive weight.
        return np.minimum(found, self._last_drawable).astype(np.int64)

    def _slots(self, epoch: int, groups: np.ndarray) -> np.ndarray:
        """This rank's place in each group of ``W`` consecutive draws of the permutation: the
        same keyed shuffle of the group on every rank. Taken in rank order, rank 0 would always
        have the heavier draw of the group (the permutation's earlier places are heavier)."""
        world = self.num_replicas
        if world == 1:
            return np.zeros(groups.shape, dtype=np.int64)
        return feistel_take(np.full(groups.shape, world), mix_arrays(self.seed, _DEAL, groups),
                            epoch, np.full(groups.shape, self.rank))

    def _stream_seed(self, epoch: int) -> np.random.SeedSequence:
        """This rank's child of the epoch's root seed: children of one root never coincide."""
        return np.random.SeedSequence(_words(self.seed, epoch), spawn_key=(self.rank,))

    def _permutation(self, epoch: int) -> np.ndarray:
        """The epoch's global weighted permutation: the same on every rank (exponential keys)."""
        if self._cached_permutation is None or self._cached_permutation[0] != epoch:
            self._cached_permutation = None
            uniform = np.random.Generator(np.random.PCG64(
                np.random.SeedSequence(_words(self.seed, epoch)))).random(
                len(self.weights))
            # Exponential keys of rate w, -log(1 - u) / w, compared by their logarithms: a
            # tiny weight's key stays finite there instead of tying with zero weights' (inf).
            with np.errstate(divide="ignore"):
                keys = np.log(-np.log1p(-uniform)) - np.log(self.weights)
            order = np.argsort(keys, kind="stable")[: self.num_samples * self.num_replicas]
            self._cached_permutation = (epoch, order.astype(np.int64))
        return self._cached_permutation[1]

    # -- checks across ranks ---------------------------------------------------------------------

    def config(self) -> dict[str, Any]:
        """What every rank must agree on: compared by :func:`shardwise.check_consistent`."""
        return {"sampler": "WeightedDistributedSampler", "size": len(self.weights),
                "seed": self.seed, "epoch": self.epoch, "num_samples": self.num_samples,
                "replacement": self.replacement, "num_replicas": self.num_replicas,
                **self.drawn_from()}  # (named, so that ranks with other weights are told so)

    def drawn_from(self) -> dict[str, str]:
        """The weights' digest, which a saved state must match."""
        return {"weights_digest": f"{self._weights_digest:#018x}"}

    def fingerprint(self) -> int:
        """A digest of all the weights, and the position."""
        return mix_ints(self._weights_digest, self._at.offset)


def _words(seed: int, epoch: int) -> list[int]:
    """``(seed, epoch)`` as four 32-bit words: NumPy's ``SeedSequence`` takes each number as its
    own words, as few as it needs, so ``[2**32 + 5, 0]`` and ``[5, 1]`` would seed alike.

    >>> _words(2**32 + 5, 0), _words(5, 1)
    ([5, 1, 0, 0], [5, 0, 1, 0])
    """
    return [word for value in (seed % 2**64, epoch % 2**64)
            for word in (value & 0xFFFFFFFF, value >> 32)]


def _checked_weights(weights: Any) -> np.ndarray:
    if isinstance(weights, torch.Tensor):
        if weights.is_complex():  # (torch would drop the imaginary parts, with a warning)
            raise TypeError(f"weights must be numbers, got {weights.dtype} values")
        weights = weights.detach().cpu().to(torch.float64).numpy()  # (NumPy has no bfloat16)
    refuse_unordered("weights", weights, "weight")
    if isinstance(weights, Iterator):  # (NumPy makes one object of a generator)
        weights = list(weights)
    values = np.asarray(weights)
    if values.dtype.kind not in "biuf":  # NumPy would read "1" as 1.0; torch refuses it too
        raise TypeError(f"weights must be numbers, got {values.dtype} values")
    values = values.astype(np.float64)
    if values.ndim != 1 or values.size == 0:
        raise ValueError(f"weights must be a non-empty 1-D sequence, got shape {values.shape}")
    bad = np.flatnonzero(~np.isfinite(values) | (values < 0))
    if bad.size:
        raise ValueError(f"weights[{bad[0]}] = {values[bad[0]]} is not a finite, non-negative "
                         f"number ({bad.size} such weights)")
    if not values.any():
        raise ValueError("all weights are zero: at least one sample needs a positive weight")
    return values
