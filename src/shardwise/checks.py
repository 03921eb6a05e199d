"""Argument checks whose errors quote the bad value and say what is accepted."""

from __future__ import annotations

import numbers
from collections.abc import Mapping, Sequence
from collections.abc import Set as AbstractSet

import numpy as np


def require_int(
    name: str, value: object, minimum: int | None = None, maximum: int | None = None
) -> int:
    """``value`` as an ``int`` (bools refused, NumPy integers accepted), within the bounds given.

    >>> require_int("seed", np.int64(3))
    3
    >>> require_int("size", 2**63, minimum=0, maximum=2**63 - 1)
    Traceback (most recent call last):
    ValueError: size must be at most 9223372036854775807, got 9223372036854775808
    """
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {value!r} ({type(value).__name__})")
    value = int(value)
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be at least {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise ValueError(f"{name} must be at most {maximum}, got {value}")
    return value


def refuse_unordered(name: str, value: object, item: str) -> None:
    """Refuse a mapping or a set given for ``name``, one ``item`` per sample in sample order:
    iterating it gives keys, or an order of its own (per process, for strings).

    >>> refuse_unordered("weights", {0: 1.0}, "weight")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    TypeError: weights must be a sequence of one weight per sample, in sample order, got a dict: ...
    """
    if isinstance(value, (Mapping, AbstractSet)):
        raise TypeError(f"{name} must be a sequence of one {item} per sample, in sample order, "
                        f"got a {type(value).__name__}: pass a list, an array or a tensor")


def require_bool(name: str, value: object) -> bool:
    """``value`` as a ``bool``: a bool, a NumPy bool, or the integer 0 or 1 (as a config file
    may give it, and torch takes); anything else, ``"False"`` included, is refused.

    >>> require_bool("shuffle", np.bool_(False)), require_bool("drop_last", 1)
    (False, True)
    """
    if isinstance(value, (bool, np.bool_)) or (
            isinstance(value, (int, np.integer)) and value in (0, 1)):
        return bool(value)
    raise TypeError(f"{name} must be a bool, got {value!r} ({type(value).__name__})")


def require_choice(name: str, value: object, choices: Sequence[str]) -> str:
    """``value`` if it is one of ``choices``, else a ``ValueError`` that lists them.

    >>> require_choice("layout", "block", ("strided", "block"))
    'block'
    """
    if not isinstance(value, str) or value not in choices:
        accepted = ", ".join(repr(choice) for choice in choices)
        raise ValueError(f"unknown {name} {value!r}; choose one of {accepted}")
    return value  # type: ignore[return-value]


def same_saved(saved: object, mine: object) -> bool:
    """Whether a saved state's field is this object's: an int as an int (3.0 and True are not
    3 and 1; a NumPy integer is), anything else equal.

    >>> same_saved(np.int64(3), 3), same_saved(3.0, 3), same_saved(True, 1), same_saved("a", "a")
    (True, False, False, True)
    """
    if isinstance(mine, int) and not isinstance(mine, bool):
        return isinstance(saved, numbers.Integral) and not isinstance(saved, (bool, np.bool_)) \
            and int(saved) == mine
    return bool(saved == mine)


def require_saved_state(state: object, what: str, version: int) -> None:
    """Refuse a ``state`` that is not a dict this version's ``state_dict()`` could have given.

    >>> try:
    ...     require_saved_state({"version": 1}, "ShuffleBuffer", 2)
    ... except ValueError as error:
    ...     print(str(error)[:64])
    the state was saved by another version of shardwise (its Shuffle
    """
    if not isinstance(state, Mapping):
        raise TypeError(f"a {what} state is the dict state_dict() gave, got "
                        f"{type(state).__name__}")
    if state.get("version") != version:
        raise ValueError(f"the state was saved by another version of shardwise (its {what} state "
                         f"version {state.get('version')!r}; this one reads {version}): resume "
                         f"it with the version that saved it")
