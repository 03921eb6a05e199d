"""Where a loader stands in its epoch, as a state that resumes at exactly the next batch.

The count is of batches *delivered to the caller*, however far the workers ran ahead. Resuming
takes one of three routes, by what the loader iterates:

- a shardwise sampler (a ``DistributedSampler`` or anything with ``state_dict(consumed)``): its
  own state, at the samples delivered; O(1), and on any world size;
- any other sampler (torch's ``RandomSampler``, ``SequentialSampler``, ``BatchSampler``, ...):
  the random generator states the pass started from, and a skip of the delivered batches'
  indices (no data is loaded for them);
- an ``IterableDataset``: the delivered batches are loaded again and dropped.

Nothing is recorded per step: the state is built when asked for.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils.data import BatchSampler
from torch.utils.data.dataloader import _DatasetKind

STATE_VERSION = 1


def resumable_sampler(loader: Any) -> Any | None:
    """The sampler whose own state can place the loader: one with ``state_dict(consumed=...)``."""
    candidates = [loader.sampler]
    if isinstance(loader.batch_sampler, BatchSampler):
        candidates.append(loader.batch_sampler.sampler)
    for sampler in candidates:
        if callable(getattr(sampler, "state_dict", None)) and hasattr(sampler, "fingerprint"):
            return sampler
    return None


def generators_of(loader: Any) -> dict[str, torch.Generator]:
    """The torch generators a pass draws from besides the global one, by where they live."""
    found: dict[str, torch.Generator] = {}
    if loader.generator is not None:
        found["loader"] = loader.generator
    owners = {"sampler": loader.sampler, "batch_sampler": loader.batch_sampler,
              "batch_sampler.sampler": getattr(loader.batch_sampler, "sampler", None)}
    for name, owner in owners.items():
        generator = getattr(owner, "generator", None)
        if isinstance(generator, torch.Generator) and all(generator is not g for g in found.values()):
            found[name] = generator
    return found


def random_states(loader: Any) -> dict[str, torch.Tensor]:
    """The global torch RNG state and every generator's, as a pass starts."""
    return {"global": torch.get_rng_state(),
            **{name: g.get_state() for name, g in generators_of(loader).items()}}


@contextlib.contextmanager
def replayed_randomness(loader: Any, states: dict[str, torch.Tensor]) -> Iterator[None]:
    """Draw as the interrupted pass drew, then give the caller's global RNG back untouched."""
    callers = torch.get_rng_state()
    torch.set_rng_state(states["global"])
    for name, generator in generators_of(loader).items():
        if name in states:
            generator.set_state(states[name])
    try:
        yield
    finally:
        torch.set_rng_state(callers)


@dataclass
class PassRecord:
    """One pass of a loader: how it began and what it has delivered."""

    route: str  # "sampler", "replay" or "iterable": how a resume finds the place
    randomness: dict[str, torch.Tensor] = field(default_factory=dict)
    sampler_epoch: Any = None  # the resumable sampler's epoch, once the pass delivered a batch
    base_seed: int = 0  # the workers' base seed
    drew_base_seed: bool = False  # the pass drew the base seed (the first pass of its workers)
    resumed_batches: int = 0  # batches a resumed pass started after
    batches: int = 0  # delivered by this pass
    samples: int = 0  # indices behind the batches this pass delivered
    finished: bool = False
    out_of_order: bool = False


def new_record(loader: Any) -> PassRecord:
    """The record of a pass about to begin (its random state taken now, before any draw)."""
    route = _route(loader, resumable_sampler(loader))
    return PassRecord(route, random_states(loader) if route == "replay" else {})


def current(loader: Any, record: PassRecord) -> bool:
    """Whether ``record`` still describes where the loader stands (its sampler has not moved on)."""
    if record.route != "sampler" or record.sampler_epoch is None:
        return True
    return getattr(resumable_sampler(loader), "epoch", None) == record.sampler_epoch


def resumed_batches(loader: Any, resume: Resume | None, record: PassRecord | None) -> int:
    """Batches of this epoch delivered before a resume that the sampler's pass no longer holds.

    A sampler resumed mid-epoch yields only the rest of the epoch, so this is added to its
    length: ``len(loader)`` stays the epoch's, as trainers that count steps (Lightning) expect.
    """
    if resume is not None:
        return resume.resumed_batches if resume.skip == 0 else 0
    if record is not None and record.route == "sampler" and current(loader, record):
        return record.resumed_batches
    return 0


def loader_state(loader: Any, record: PassRecord | None) -> dict[str, Any]:
    """The state of ``loader`` after what ``record`` says was delivered."""
    sampler = resumable_sampler(loader)
    if record is None or not current(loader, record):
        record = new_record(loader)  # no pass yet, or the sampler moved on: the next pass's start
    if record.out_of_order:
        warnings.warn("in_order=False delivered batches out of order: the state counts the "
                      "batches delivered, so a resume may repeat or skip a few; pass "
                      "in_order=True for an exact resume", stacklevel=3)
    state: dict[str, Any] = {"version": STATE_VERSION, "route": record.route,
                             "batches": record.resumed_batches + record.batches,
                             "finished": record.finished, "base_seed": record.base_seed,
                             "drew_base_seed": record.drew_base_seed}
    if record.route == "sampler":
        state["sampler"] = sampler.state_dict(consumed=record.samples)
    elif record.route == "replay":
        state["randomness"] = record.randomness
    return state


def _route(loader: Any, sampler: Any | None) -> str:
    if sampler is not None:
        return "sampler"
    if loader._dataset_kind == _DatasetKind.Iterable:
        return "iterable"
    return "replay"


@dataclass(frozen=True)
class Resume:
    """What the next pass must do to continue a saved one."""

    skip: int  # batches to pass over without delivering them again
    resumed_batches: int  # where the count of delivered batches starts
    randomness: dict[str, torch.Tensor]  # the interrupted pass's starting random states
    base_seed: int
    drew_base_seed: bool


def read_state(loader: Any, state: Any) -> Resume:
    """Check a saved loader state, place a resumable sampler, and say what the next pass does."""
    if not isinstance(state, dict) or state.get("version") != STATE_VERSION:
        raise ValueError(f"not a shardwise loader state (version {STATE_VERSION}): {state!r:.200}")
    sampler = resumable_sampler(loader)
    route = _route(loader, sampler)
    if state.get("route") != route:
        raise ValueError(f"the state was saved by a loader that resumes by {state.get('route')!r} "
                         f"but this loader resumes by {route!r}: build it with the same kind of "
                         "dataset and sampler")
    batches, seed, drew = int(state["batches"]), int(state["base_seed"]), bool(state["drew_base_seed"])
    if route == "sampler":
        sampler.load_state_dict(state["sampler"])  # the sampler places the pass itself
        return Resume(0, batches, {}, seed, drew)
    return Resume(batches, batches, dict(state.get("randomness", {})), seed, drew)
