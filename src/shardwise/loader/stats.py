"""What a loader did: batches, samples per second, and how long the caller waited for data."""

from __future__ import annotations

import time
from dataclasses import dataclass


@dataclass(frozen=True)
class WorkerStats:
    """One worker's share of a pass: its batches delivered, and the seconds it spent making
    batches (those it made ahead, not delivered yet, too)."""

    worker: int
    batches: int
    busy_seconds: float

    @property
    def batches_per_second(self) -> float:
        """Batches per second of this worker's busy time."""
        return self.batches / self.busy_seconds if self.busy_seconds else 0.0


@dataclass(frozen=True)
class LoaderStats:
    """A pass so far: the batches and samples delivered to the caller (a batch whose loading
    raised is not one). ``stall`` is the share of the pass the caller spent waiting for data.

    >>> LoaderStats(batches=10, samples=640, seconds=2.0, waiting_seconds=0.5).stall
    0.25
    """

    batches: int
    samples: int
    seconds: float  # from the pass's start to now, or to its end (or to when it was dropped)
    waiting_seconds: float  # inside next(), waiting for a batch
    workers: tuple[WorkerStats, ...] = ()

    @property
    def samples_per_second(self) -> float:
        return self.samples / self.seconds if self.seconds else 0.0

    @property
    def stall(self) -> float:
        return self.waiting_seconds / self.seconds if self.seconds else 0.0

    def __str__(self) -> str:
        return (f"{self.batches} batches, {self.samples} samples in {self.seconds:.2f} s: "
                f"{self.samples_per_second:,.0f} samples/s; waited for data "
                f"{self.waiting_seconds:.2f} s ({self.stall:.0%})")


class Clock:
    """The running counts behind :class:`LoaderStats`, kept by a pass as it goes."""

    def __init__(self, workers: int) -> None:
        self.started = time.perf_counter()
        self.stopped: float | None = None  # when the pass ended (or was dropped)
        self.waiting = 0.0
        self.made = [0] * workers  # batches delivered, by worker
        self.busy = [0.0] * workers
        self.batches = self.samples = 0

    def stop(self) -> None:
        """The pass is over: its seconds stop counting (the first call decides)."""
        if self.stopped is None:
            self.stopped = time.perf_counter()

    def waited(self, seconds: float) -> None:
        self.waiting += seconds

    def worked(self, worker: int, seconds: float) -> None:
        """``worker`` made a batch (delivered or not) in ``seconds``."""
        self.busy[worker] += seconds

    def delivered(self, worker: int | None, samples: int) -> None:
        """A batch of ``samples`` from ``worker`` (``None``: this process) reached the caller."""
        self.batches += 1
        self.samples += samples
        if worker is not None:
            self.made[worker] += 1

    def stats(self) -> LoaderStats:
        workers = tuple(WorkerStats(w, made, busy)
                        for w, (made, busy) in enumerate(zip(self.made, self.busy)))
        end = time.perf_counter() if self.stopped is None else self.stopped
        return LoaderStats(self.batches, self.samples, end - self.started, self.waiting, workers)
