"""Which ranks a plan shows when there are too many to list: the first ones and the last ones."""

from __future__ import annotations

from collections.abc import Sized

MOST_SHOWN = 1_000  # --max-ranks, --max-batches: a typo must not list 10**12 of them


def check_shown(flag: str, value: int) -> None:
    """Refuse a ``--max-ranks`` or ``--max-batches`` below 1 or above ``MOST_SHOWN``.

    >>> check_shown("--max-ranks", 0)
    Traceback (most recent call last):
    ValueError: --max-ranks must be at least 1, got 0
    """
    if value < 1:
        raise ValueError(f"{flag} must be at least 1, got {value}")
    if value > MOST_SHOWN:
        raise ValueError(f"{flag} must be at most {MOST_SHOWN:,}, as each one shown is computed "
                         f"and printed; got {value:,}")


def shown_ranks(world_size: int, most: int) -> list[int]:
    """All ranks, or the first ``most - most // 2`` and the last ``most // 2`` (padding's).

    >>> shown_ranks(3, 8), shown_ranks(100, 5)
    ([0, 1, 2], [0, 1, 2, 98, 99])
    """
    if world_size <= most:
        return list(range(world_size))
    head = head_count(range(most))
    return [*range(head), *range(world_size - (most - head), world_size)]


def head_count(shown: Sized) -> int:
    """How many of the ranks shown are the first ranks, when not all are shown."""
    return len(shown) - len(shown) // 2


def not_shown(shown: Sized, left_out: int) -> str:
    """The line that says which ranks a listing of ``shown`` leaves out (``left_out`` of them).

    >>> not_shown([0, 1, 2, 98, 99], 95)
    '  ranks 3 to 97 not shown (95 ranks; see --max-ranks)'
    """
    first = head_count(shown)
    return (f"  ranks {first} to {first + left_out - 1} not shown ({left_out:,} ranks; see "
            "--max-ranks)")
