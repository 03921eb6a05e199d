"""Output folders named by a flag (``--save``, ``--workdir``): made before any work, so that one
that cannot be made is named as its flag at once, not as a bare OS error after the work."""

from __future__ import annotations

from pathlib import Path


def make_folder(flag: str, folder: Path) -> None:
    """Make ``folder`` and its parents, or raise ``ValueError`` naming ``flag``.

    >>> make_folder("--save", Path("/dev/null/out"))  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ValueError: --save /dev/null/out: the folder cannot be made (Not a directory: ...): name a ...
    """
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        why = error.strerror or type(error).__name__
        where = f": {error.filename}" if error.filename else ""
        raise ValueError(f"{flag} {folder}: the folder cannot be made ({why}{where}): name a "
                         "folder that can be written") from None
