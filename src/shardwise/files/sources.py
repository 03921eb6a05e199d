"""Turn what the user passed (files, directories, globs, fsspec URLs) into an ordered list of files.

Every rank expands the same arguments to the same list, in the same order, so every rank computes
the same plan without talking to the others.
"""

from __future__ import annotations

import os
import posixpath
from collections.abc import Iterable
from dataclasses import dataclass, field

import fsspec
from fsspec.spec import AbstractFileSystem

PathLike = str | os.PathLike[str]
Paths = PathLike | Iterable[PathLike]


@dataclass(frozen=True)
class Source:
    """One input file: its name as the user should see it, its size in bytes, its filesystem."""

    name: str
    size: int
    path: str = field(repr=False)
    fs: AbstractFileSystem = field(repr=False, compare=False)

    def open(self):
        """The file opened for binary reading."""
        return self.fs.open(self.path, "rb")


def expand(paths: Paths) -> list[Source]:
    """The files named by ``paths``, in the order given; directories and globs expand sorted.

    Directories are walked recursively, skipping names that start with ``.`` or ``_`` (such as
    ``_SUCCESS`` markers and ``.crc`` files). A file named twice is an error, as it would be read twice.

    >>> expand([])
    Traceback (most recent call last):
    ...
    ValueError: no input paths given: pass at least one file, directory or glob
    """
    items = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
    if not items:
        raise ValueError("no input paths given: pass at least one file, directory or glob")
    sources: list[Source] = []
    for item in items:
        sources.extend(_expand_one(os.fspath(item)))
    seen: set[str] = set()
    for source in sources:
        key = source.fs.unstrip_protocol(source.path)
        if key in seen:
            raise ValueError(
                f"{source.name} is named twice in the inputs (directly, or by a directory or glob); "
                "each file may be given once, or its lines would be read twice"
            )
        seen.add(key)
    return sources


def _expand_one(url: str) -> list[Source]:
    fs, path = fsspec.core.url_to_fs(url)
    if any(char in path for char in "*?["):
        found = {p: info for p, info in fs.glob(path, detail=True).items() if info["type"] == "file"}
        if not found:
            raise FileNotFoundError(f"no input file matches the glob {url!r}")
    elif fs.isdir(path):
        found = {
            p: info for p, info in fs.find(path, detail=True).items()
            if not _hidden(posixpath.relpath(p, path))
        }
        if not found:
            raise FileNotFoundError(f"input directory {url!r} holds no files")
    elif fs.isfile(path):
        found = {path: fs.info(path)}
    else:
        raise FileNotFoundError(f"input file not found: {url!r} (check the path or URL)")
    return [
        Source(name=_display_name(url, fs, p), size=int(found[p]["size"]), path=p, fs=fs)
        for p in sorted(found)
    ]


def _hidden(relative: str) -> bool:
    return any(part.startswith((".", "_")) for part in relative.split("/"))


def _display_name(url: str, fs: AbstractFileSystem, path: str) -> str:
    # Local files keep the user's spelling style (plain paths); others keep their protocol.
    if "://" not in url:
        return path
    return fs.unstrip_protocol(path)
