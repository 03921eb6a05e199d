"""Argument checks whose errors quote the bad value and say what is accepted."""

from __future__ import annotations

import numbers
from collections.abc import Sequence


def require_int(name: str, value: object, minimum: int | None = None) -> int:
    """``value`` as an ``int`` (bools refused), at least ``minimum`` when given.

    >>> require_int("seed", 3)
    3
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {value!r} ({type(value).__name__})")
    value = int(value)
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be at least {minimum}, got {value}")
    return value


def require_choice(name: str, value: object, choices: Sequence[str]) -> str:
    """``value`` if it is one of ``choices``, else a ``ValueError`` that lists them.

    >>> require_choice("layout", "block", ("strided", "block"))
    'block'
    """
    if value not in choices:
        accepted = ", ".join(repr(choice) for choice in choices)
        raise ValueError(f"unknown {name} {value!r}; choose one of {accepted}")
    return value  # type: ignore[return-value]
