"""Process-wide on/off settings turned off for a while by users that may overlap (threads).

The first user to come turns the setting off, the last to leave puts back what it was before
the first came: overlapping users never leave it off, nor turn it on under one another.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator


class OffWhileUsed:
    """A setting, given as ``set(on) -> the previous value``, kept off while any user needs it.

    >>> state = {"on": True}
    >>> def set_state(on):
    ...     before, state["on"] = state["on"], on
    ...     return before
    >>> setting = OffWhileUsed(set_state)
    >>> with setting.off() as before, setting.off():
    ...     before, state["on"]
    (True, False)
    >>> state["on"]
    True
    """

    def __init__(self, set_to: Callable[[bool], bool]) -> None:
        self._set_to = set_to
        self._lock = threading.Lock()
        self._users = 0
        self._before = False

    @contextlib.contextmanager
    def off(self) -> Iterator[bool]:
        """Off within; yields whether it was on before the first of the overlapping users."""
        with self._lock:
            if self._users == 0:
                self._before = self._set_to(False)
            self._users += 1
            before = self._before
        try:
            yield before
        finally:
            with self._lock:
                self._users -= 1
                if self._users == 0:
                    self._set_to(self._before)
