"""Names of functions and classes that are the same in every process of a job.

A script's own functions are in ``__main__`` where the script runs, and in ``__mp_main__`` in a
process that multiprocessing spawned to run it: ranks comparing what they were given (a
parser, a shard list) name both ``__main__``.
"""

from __future__ import annotations

from typing import Any


def qualified_name(thing: Any) -> str:
    """``module.qualname`` of a function or class (the qualified name alone without a module).

    >>> qualified_name(qualified_name), qualified_name(str.split)
    ('shardwise.names.qualified_name', 'str.split')
    """
    module = getattr(thing, "__module__", None)  # (str.split has none)
    if module == "__mp_main__":
        module = "__main__"
    qualname = getattr(thing, "__qualname__", "?")
    return f"{module}.{qualname}" if module else qualname
