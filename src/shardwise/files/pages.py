"""Fresh memory at full speed: loads allocate without NumPy's huge-page advice.

NumPy advises the kernel to back every large array with transparent huge pages
(``madvise(MADV_HUGEPAGE)``). Where the kernel compacts memory on demand for advised regions
(``madvise`` in ``/sys/kernel/mm/transparent_hugepage/defrag``, the default of common
distributions) and huge pages are scarce, as on shared VMs, each first touch of such memory
waits on a compaction that then fails. Here a fresh 93 MB record array took 203 ms to fill with
the advice and 39 ms without it, and a load writes about three times the bytes it reads into
fresh memory. So a load runs without the advice; the setting, a process-wide hint, is put back
when the load returns. Where NumPy offers no switch, nothing changes.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from shardwise.switches import OffWhileUsed

try:  # NumPy 2
    from numpy._core.multiarray import _set_madvise_hugepage
except ImportError:  # pragma: no cover - NumPy 1, or a NumPy without the switch
    try:
        from numpy.core.multiarray import _set_madvise_hugepage
    except ImportError:
        _set_madvise_hugepage = None

_advice = None if _set_madvise_hugepage is None else OffWhileUsed(_set_madvise_hugepage)


@contextlib.contextmanager
def plain_pages() -> Iterator[None]:
    """Within: NumPy allocates without huge-page advice (loads in other threads too, until the
    last of them returns). Also a decorator.

    >>> with plain_pages():
    ...     import numpy as np
    ...     int(np.ones(1 << 22).sum())
    4194304
    """
    if _advice is None:
        yield
        return
    with _advice.off():
        yield
