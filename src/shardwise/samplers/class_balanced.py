"""``ClassBalancedSampler``: every class in every round, on every rank ("equibatch").

Each rank's stream is a series of rounds; a round holds every class exactly once, in a fresh
random class order. So any ``|C|`` consecutive samples of a round-aligned stretch hold every class,
and a batch size that is a multiple of ``|C|`` puts every class in every batch.

A class's samples come from its pool, shuffled afresh each epoch from ``(seed, epoch)`` and split
disjointly over the ranks (rank ``r`` takes pool positions ``r, r + W, ...``). A rank draws its
share of a class in order; when a small class's share runs out before the epoch ends, the share
is reshuffled and drawn again, so within an epoch a sample repeats only when its class must be
oversampled. A class with fewer samples than ranks cannot be split: every rank then draws from
all of it, each in an order of its own. Every permutation is a keyed Feistel network, so the
sample at any stream position is computed directly: O(|C|) to resume anywhere, nothing stored
per epoch.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from shardwise.checks import refuse_unordered, require_int
from shardwise.distributed.world import resolve_world
from shardwise.mix import digest, mix64, mix_arrays, mix_ints
from shardwise.order import feistel_take
from shardwise.samplers.passes import MAX_SIZE, SEED_MAX, SEED_MIN
from shardwise.samplers.rank_streams import RankStreamSampler, StreamPosition
from shardwise.split import rank_count


class ClassBalancedSampler(RankStreamSampler):
    """Per-rank streams of rounds, each round every class once, in a fresh random order.

    Args:
        labels: one class label per sample (a list, NumPy array or tensor; ints or strings).
        num_replicas, rank: the world, from the process group or the environment by default.
        seed: the same on every rank.
        num_samples: the length of each rank's stream per epoch; default ``ceil(N / W)``.

    Deterministic in ``(seed, epoch)``; ``set_epoch``, automatic epochs, passes, and
    ``state_dict`` / ``load_state_dict`` behave as :class:`shardwise.DistributedSampler`'s
    (a state resumes on the world size it was saved with).

    >>> sampler = ClassBalancedSampler([0, 0, 0, 0, 1, 1, 2], num_replicas=1, rank=0)
    >>> stream = [[0, 0, 0, 0, 1, 1, 2][i] for i in sampler]
    >>> [sorted(stream[k:k + 3]) for k in (0, 3)]
    [[0, 1, 2], [0, 1, 2]]
    """

    def __init__(
        self,
        labels: Sequence[Any] | np.ndarray | torch.Tensor,
        num_replicas: int | None = None,
        rank: int | None = None,
        seed: int = 0,
        num_samples: int | None = None,
    ) -> None:
        codes, self.classes = _class_codes(labels)
        self.size = len(codes)
        self.num_replicas, self.rank = resolve_world(num_replicas, rank)
        self.seed = require_int("seed", seed, minimum=SEED_MIN, maximum=SEED_MAX)
        default = -(-self.size // self.num_replicas)
        self.num_samples = default if num_samples is None else require_int(
            "num_samples", num_samples, minimum=0, maximum=MAX_SIZE)  # (len() takes no more)
        self.class_sizes = np.bincount(codes, minlength=len(self.classes))
        self._members = np.argsort(codes, kind="stable")  # class c's samples, in index order
        self._starts = np.concatenate([[0], np.cumsum(self.class_sizes)])
        # Every label counts: two ranks whose labels differ only in order would draw overlapping
        # samples. Codes in the smallest integer type, so 10^7 labels hash in about 10 ms.
        self._labels_digest = digest(codes.astype(np.min_scalar_type(len(self.classes))),
                                     repr(self.classes.tolist()).encode())
        self._init_epochs()

    # -- the stream ------------------------------------------------------------------------------

    def _take(self, at: StreamPosition, context: Any, start: int, stop: int) -> np.ndarray:
        positions = np.arange(at.offset + start, at.offset + stop, dtype=np.int64)
        return self.stream(at.epoch, positions)

    def stream(self, epoch: int, positions: np.ndarray) -> np.ndarray:
        """The samples at ``positions`` of this rank's stream in ``epoch`` (any positions, any order).

        >>> sampler = ClassBalancedSampler(["a", "b", "b"], num_replicas=1, rank=0)
        >>> sampler.stream(0, np.arange(4)).shape
        (4,)
        """
        rounds, slots = np.divmod(positions, len(self.classes))
        # Each round's class order once (a chunk spans few rounds when there are many classes)
        distinct, which = np.unique(rounds, return_inverse=True)
        classes = self._round_orders(epoch, distinct)[which.reshape(-1), slots]
        # The q-th round holds each class once: so its draw of a class is that class's q-th.
        return self._draws(epoch, classes, rounds)

    def _round_orders(self, epoch: int, rounds: np.ndarray) -> np.ndarray:
        """The class order of each round: a permutation of the classes per row."""
        key = np.uint64(mix_ints(self.seed, epoch, self.rank, 0xC1A55))
        round_keys = mix64(key ^ rounds.astype(np.uint64))
        slot_keys = mix64(round_keys[:, None] ^ np.arange(len(self.classes), dtype=np.uint64))
        return np.argsort(slot_keys, axis=1)

    def _draws(self, epoch: int, classes: np.ndarray, draws: np.ndarray) -> np.ndarray:
        """The sample of each class's ``draws``-th draw on this rank (drawing past the share
        reshuffles it): all classes at once, so many classes cost no more than a few."""
        world, rank = self.num_replicas, self.rank
        sizes = self.class_sizes[classes]
        split = sizes >= world  # too small to split: every rank draws from all of it
        shares = np.where(split, rank_count(sizes, world, rank, "uneven"), sizes)
        cycles, places = np.divmod(draws, shares)
        # A class too small to split is drawn in the rank's own order from its first cycle on:
        # in the pool's order, shared by all ranks, every rank would draw the same sample at
        # the same step until the class was used up. (A share of one: nothing moves.)
        again = np.flatnonzero(((cycles > 0) | ~split) & (shares > 1))
        places[again] = feistel_take(shares[again], mix_arrays(
            self.seed, classes[again], rank, cycles[again]), epoch, places[again])
        pool_positions = np.where(split, places * world + rank, places)
        pools = mix_arrays(self.seed, classes)  # the same on every rank
        return self._members[self._starts[classes]
                             + feistel_take(sizes, pools, epoch, pool_positions)]

    # -- checks across ranks ---------------------------------------------------------------------

    def config(self) -> dict[str, Any]:
        """What every rank must agree on: compared by :func:`shardwise.check_consistent`."""
        return {"sampler": "ClassBalancedSampler", "size": self.size, "seed": self.seed,
                "epoch": self.epoch, "classes": len(self.classes),
                "num_replicas": self.num_replicas, "num_samples": self.num_samples,
                **self.drawn_from()}  # (named, so that ranks with other labels are told so)

    def drawn_from(self) -> dict[str, str]:
        """The labels' digest, which a saved state must match."""
        return {"labels_digest": f"{self._labels_digest:#018x}"}

    def fingerprint(self) -> int:
        """A digest of all the labels, and the position."""
        return mix_ints(self._labels_digest, self._at.offset)

    def __repr__(self) -> str:
        return f"ClassBalancedSampler(rank={self.rank}, " + ", ".join(
            f"{key}={value!r}" for key, value in self.config().items() if key != "sampler") + ")"


def _class_codes(labels: Any) -> tuple[np.ndarray, np.ndarray]:
    """Each label's class number (classes sorted), and the classes.

    >>> codes, classes = _class_codes([2**63, 1, 2**63 + 1])  # (NumPy would make floats of
    >>> codes.tolist(), classes.tolist()                       # them: one class of the two)
    ([1, 0, 2], [1, 9223372036854775808, 9223372036854775809])
    """
    if isinstance(labels, torch.Tensor):
        labels = labels.detach().cpu()
        if labels.dtype == torch.bfloat16:  # (NumPy has none: every bfloat16 is a float32)
            labels = labels.float()
        labels = labels.numpy()
    refuse_unordered("labels", labels, "label")
    if not isinstance(labels, np.ndarray) and hasattr(labels, "__array__"):
        labels = np.asarray(labels)  # (pandas: list() of a DataFrame gives its column names)
    given = labels if isinstance(labels, np.ndarray) else list(labels)
    values = np.asarray(given)
    if values.ndim != 1 or values.size == 0:
        raise ValueError(f"labels must be a non-empty 1-D sequence (one label per sample), got "
                         f"shape {values.shape}")
    if values.dtype.kind == "f" and np.isnan(values).any():
        raise ValueError("labels hold NaN: give every sample a class")
    if values.dtype.kind == "O" or (values.dtype.kind in "USf" and given is not labels):
        values = _one_kind(given, values)
    classes, codes = np.unique(values, return_inverse=True)
    return codes.reshape(-1).astype(np.int64), classes


def _one_kind(labels: list[Any] | np.ndarray, values: np.ndarray) -> np.ndarray:
    """``labels`` as an array of one kind that keeps them apart: NumPy would make equal strings
    of ``[1, "1"]`` or ``["a", b"a"]``, equal floats of integers past 2**63, and objects of
    strings from pandas."""
    kinds = {_kind(label) for label in labels}
    if kinds == {"int"}:
        for exact in (np.int64, np.uint64):
            try:
                return np.array(labels, dtype=exact)
            except OverflowError:
                continue
        raise ValueError("labels hold integers that no 64-bit type holds together (below "
                         "-2**63, past 2**64 - 1, or negatives with some past 2**63 - 1): "
                         "number the classes 0, 1, 2, ...")
    if len(kinds) == 1 and kinds <= {"str", "bytes"}:
        return np.array(labels, dtype=str if kinds == {"str"} else bytes)
    if values.dtype.kind == "f" and kinds <= {"int", "float"}:
        return values
    raise TypeError(f"labels must be numbers or strings of one type, got "
                    f"{' and '.join(sorted(kinds))}")


def _kind(label: Any) -> str:
    if isinstance(label, (torch.Tensor, np.ndarray)) and label.ndim == 0:
        label = label.item()  # ([y for _, y in dataset] gives 0-d tensors, as NumPy reads them)
    if isinstance(label, (str, np.str_)):
        return "str"
    if isinstance(label, (bytes, np.bytes_)):
        return "bytes"
    if isinstance(label, (int, np.integer)):  # (bool too: a class of its own, as NumPy sorts it)
        return "int"
    if isinstance(label, (float, np.floating)):
        return "float"
    return type(label).__name__
