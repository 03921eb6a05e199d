"""The random states a loader's pass draws from, taken, saved as plain text, and put back.

A pass over torch's samplers (or an IterableDataset) is resumed by replaying its draws: from
torch's global generator (``RandomSampler`` seeds itself there, and the workers' base seed
comes from it), from the loader's and samplers' own torch generators, and from NumPy's and
Python's global generators, which samplers of one's own often shuffle with. A state holds them
as plain strings and numbers, so ``json`` can write it.

>>> saved = encoded(random_states(None))  # (None: no loader, only the global generators)
>>> first = torch.rand(2).tolist(), np.random.rand(), random.random()
>>> restore_randomness(None, decoded(saved))
>>> (torch.rand(2).tolist(), np.random.rand(), random.random()) == first
True
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch

GLOBAL = ("global", "numpy", "python")  # the process-wide generators, by their names in a state


def generators_of(loader: Any) -> dict[str, torch.Generator]:
    """The torch generators a pass draws from besides the global one, by where they live."""
    found: dict[str, torch.Generator] = {}
    if loader is None:
        return found
    if loader.generator is not None:
        found["loader"] = loader.generator
    owners = {"sampler": loader.sampler, "batch_sampler": loader.batch_sampler,
              "batch_sampler.sampler": getattr(loader.batch_sampler, "sampler", None)}
    for name, owner in owners.items():
        generator = getattr(owner, "generator", None)
        if isinstance(generator, torch.Generator) and all(generator is not g for g in found.values()):
            found[name] = generator
    return found


def global_states() -> dict[str, Any]:
    """The process-wide generators' states: torch's, NumPy's and Python's."""
    return {"global": torch.get_rng_state(), "numpy": np.random.get_state(),
            "python": random.getstate()}


def random_states(loader: Any) -> dict[str, Any]:
    """Every generator's state, as a pass starts."""
    return {**global_states(),
            **{name: g.get_state() for name, g in generators_of(loader).items()}}


def restore_randomness(loader: Any, states: dict[str, Any]) -> None:
    """Put back the generators ``states`` holds (a state saved before NumPy's and Python's were
    kept leaves them as they are)."""
    if "global" in states:
        torch.set_rng_state(states["global"])
    if "numpy" in states:
        np.random.set_state(states["numpy"])
    if "python" in states:
        random.setstate(states["python"])
    for name, generator in generators_of(loader).items():
        if name in states:
            generator.set_state(states[name])


def encoded(states: dict[str, Any]) -> dict[str, Any]:
    """``states`` as plain strings and numbers. Hex for the large ones: a torch generator's
    state is 5 KB, which as a list of numbers took 25 µs a state."""
    plain: dict[str, Any] = {}
    for name, state in states.items():
        if name == "numpy":
            kind, keys, position, has_gauss, gauss = state
            plain[name] = [kind, keys.astype("<u4").tobytes().hex(), int(position), int(has_gauss),
                           float(gauss)]
        elif name == "python":
            version, words, gauss = state
            plain[name] = [version, np.asarray(words, dtype="<u4").tobytes().hex(), gauss]
        else:
            plain[name] = state.numpy().tobytes().hex()
    return plain


def decoded(plain: dict[str, Any]) -> dict[str, Any]:
    """What :func:`encoded` wrote, as the generators take it (a torch state may also be a list
    of byte values, as states were saved before)."""
    states: dict[str, Any] = {}
    for name, saved in plain.items():
        if name == "numpy":
            kind, keys, position, has_gauss, gauss = saved
            states[name] = (kind, np.frombuffer(bytes.fromhex(keys), dtype="<u4").astype(np.uint32),
                            int(position), int(has_gauss), float(gauss))
        elif name == "python":
            version, words, gauss = saved
            states[name] = (int(version),
                            tuple(np.frombuffer(bytes.fromhex(words), dtype="<u4").tolist()), gauss)
        elif isinstance(saved, str):
            states[name] = torch.frombuffer(bytearray.fromhex(saved), dtype=torch.uint8)
        else:
            states[name] = torch.as_tensor(saved, dtype=torch.uint8)
    return states
