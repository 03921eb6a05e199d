"""Describe a ``parser=`` hook alike in every process, so that ranks can compare theirs.

A name alone does not tell parsers apart: every ``functools.partial`` is "functools.partial", and
the bound methods of two objects share their method's name. So a partial is described by its
function and arguments, and a bound method by its object. Values are described by their
``repr`` where it is the same in every process (text, bytes, numbers, ``None`` and tuples of
them; a compiled pattern by its pattern and flags), else by their type: never by an ``id`` or a
memory address, which differ between processes for the same value and would make ranks that
agree disagree.
"""

from __future__ import annotations

import functools
import inspect
import re

from shardwise.names import qualified_name

_PLAIN = (str, bytes, int, float, type(None))  # (bool is an int)


def describe(value: object) -> str:
    """``value`` (a parser, or one of its arguments) as text that is the same in every process.

    >>> describe(functools.partial(str.split, sep=";", maxsplit=2))
    "partial(str.split, maxsplit=2, sep=';')"
    >>> describe(re.compile(r"[;,]").split), describe(";".join)
    ("re.compile('[;,]', 32).split", "';'.join")
    >>> describe(object())  # an object by its type only: its default repr holds its address
    'builtins.object'
    """
    if isinstance(value, _PLAIN):
        return repr(value)
    if isinstance(value, tuple):
        return f"({', '.join(map(describe, value))},)"
    if isinstance(value, re.Pattern):
        return f"re.compile({value.pattern!r}, {int(value.flags)})"
    if isinstance(value, functools.partial):
        keywords = [f"{key}={describe(item)}" for key, item in sorted(value.keywords.items())]
        return f"partial({', '.join([describe(value.func), *map(describe, value.args), *keywords])})"
    bound = getattr(value, "__self__", None)
    if bound is not None and not inspect.ismodule(bound) and hasattr(value, "__name__"):
        return f"{describe(bound)}.{value.__name__}"  # a bound method: its object's, not another's
    return qualified_name(value if hasattr(value, "__qualname__") else type(value))
