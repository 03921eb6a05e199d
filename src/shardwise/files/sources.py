"""Turn what the user passed (files, directories, globs, fsspec URLs) into an ordered list of files.

The order is the one given, with directories and globs expanded sorted and unordered collections
(a ``set`` of paths) sorted, so ranks given the same arguments list the same files in the same
order. Whether they really do (another machine may see another directory) is checked by
``agreed_plan`` before a load reads anything.

URLs (``s3://``, ``gs://``, ``az://``, ``http(s)://``...) go through fsspec with the
``storage_options`` given (credentials, an endpoint); their listings are retried like every other
request to an object store (``remote.py``), and they are named without their credentials.
"""

from __future__ import annotations

import glob
import heapq
import io
import os
import posixpath
import re
import stat
from collections.abc import Callable, Iterable, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import fsspec
from fsspec.implementations.local import LocalFileSystem
from fsspec.spec import AbstractFileSystem
from fsspec.utils import glob_translate

from shardwise.files.credentials import hide, public_url, secrets_in
from shardwise.files.remote import RetriedFile, retried

PathLike = str | os.PathLike[str]
Paths = PathLike | Iterable[PathLike]
StorageOptions = Mapping[str, Any]  # fsspec's keyword arguments for the URLs' filesystems
# A remote file's reads are range requests: small reads (a line, a footer) are served from one
# request of this many bytes; pyarrow's large reads (a column chunk) go straight through.
_REMOTE_BUFFER_BYTES = 256 * 2**10
# This process's copies of remote filesystems planned in a parent process (Source.fs); equal
# filesystems (the same class and options) share one. A forked child starts afresh.
_REMADE: dict[AbstractFileSystem, AbstractFileSystem] = {}
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_REMADE.clear)


@dataclass(frozen=True)
class Source:
    """One input file: its name as the user should see it, its size in bytes, its filesystem.

    ``secrets`` are the credentials its URL and storage options hold, hidden from any message.
    ``planned_fs`` is the filesystem it was listed with, in process ``planned_in``; use ``fs``.
    """

    name: str
    size: int
    path: str = field(repr=False)
    planned_fs: AbstractFileSystem = field(repr=False, compare=False)
    secrets: frozenset[str] = field(default=frozenset(), repr=False, compare=False)
    planned_in: int = field(default_factory=os.getpid, repr=False, compare=False)

    @property
    def fs(self) -> AbstractFileSystem:
        """The filesystem, usable in this process.

        In another process (a DataLoader worker forked after planning) a remote one is made again
        from its options: fsspec's async filesystems (s3fs, http) refuse to run after a fork.
        """
        if self.planned_in == os.getpid() or not self.remote:
            return self.planned_fs
        fs = self.planned_fs
        remade = _REMADE.get(fs)
        if remade is None:
            remade = _REMADE[fs] = type(fs)(*fs.storage_args, **fs.storage_options)
        return remade

    @property
    def remote(self) -> bool:
        """Whether every read is a request to a server (an object store, HTTP), not a local file."""
        return not isinstance(self.planned_fs, LocalFileSystem)

    def open(self, buffer_bytes: int = _REMOTE_BUFFER_BYTES) -> io.BufferedIOBase:
        """The file opened for binary reading; a remote one reads by retried range requests, a
        read of fewer than ``buffer_bytes`` asking for that many."""
        if self.remote:
            return io.BufferedReader(RetriedFile(self), buffer_size=buffer_bytes)
        try:
            return self.fs.open(self.path, "rb")
        except OSError as error:  # it names the absolute path: name the file as the user did
            hint = ": check its permissions" if isinstance(error, PermissionError) else ""
            raise type(error)(f"input {self.name!r} cannot be opened "
                              f"({error.strerror or error}){hint}") from None


def expand(paths: Paths, storage_options: StorageOptions | None = None) -> list[Source]:
    """The files named by ``paths``, in the order given; directories, globs and sets expand sorted.

    Directories are walked recursively, following symlinked directories but walking each real
    directory once (so a symlink loop ends), and skipping names that start with ``.`` or ``_``
    (such as ``_SUCCESS`` markers and ``.crc`` files). A glob matches as Spark's do: a directory
    it matches is walked so, and a file whose path below the glob's fixed folders has a part
    starting with ``.`` or ``_`` (``_tmp/a.txt``) is skipped, unless the glob spells that part
    out; a glob ending in ``/`` matches folders only. A file named twice (directly, by a
    directory or glob, or through a symbolic or hard link) is an error, as its lines would be
    read twice. A local path that names a file or
    directory is that one, even with glob characters in its name (``data[1].txt``). URLs are
    opened with ``storage_options`` (fsspec's keyword arguments, such as ``key``, ``secret`` and
    ``endpoint_url`` for ``s3://``).

    >>> expand([])
    Traceback (most recent call last):
    ...
    ValueError: no input paths given: pass at least one file, directory or glob
    """
    if storage_options is None:
        storage_options = {}
    if not isinstance(storage_options, Mapping):
        raise TypeError(
            "storage_options must be a dict of fsspec options, such as {'endpoint_url': "
            f"'http://127.0.0.1:9000'}} for s3:// URLs; got a {type(storage_options).__name__}")
    if isinstance(paths, (str, os.PathLike)):
        items = [paths]
    elif isinstance(paths, AbstractSet):  # iteration order may differ between processes
        items = sorted(paths, key=os.fspath)
    else:
        items = list(paths)
    if not items:
        raise ValueError("no input paths given: pass at least one file, directory or glob")
    if any(not os.fspath(item) for item in items):  # '' would be the working directory, whole
        raise ValueError("an input path is empty ('': an unset variable?): name a file, "
                         "directory or glob")
    sources: list[Source] = []
    for item in items:
        sources.extend(_expand_one(os.fspath(item), storage_options))
    seen: dict[str | tuple[int, int], Source] = {}
    for source in sources:
        first = seen.setdefault(_identity(source), source)
        if first is not source:
            same = "" if first.name == source.name else f" (the same file as {first.name})"
            raise ValueError(
                f"{source.name}{same} is named twice in the inputs (directly, by a directory or "
                "glob, or through a link); each file may be given once, or its lines would be "
                "read twice"
            )
    return sources


def _expand_one(url: str, storage_options: StorageOptions) -> list[Source]:
    secrets = secrets_in(url, storage_options)
    try:
        fs, path = fsspec.core.url_to_fs(url, **storage_options)
    except ImportError as error:  # fsspec says which package serves the protocol
        raise ValueError(f"cannot read {public_url(url)}: {hide(str(error), secrets)}") from None
    if isinstance(fs, LocalFileSystem):
        root, found = _expand_local(url, path)
    else:
        root, found = _expand_remote(url, fs, path, secrets)
    globbed = _is_glob(path) and root != path  # (a path naming a file is that file)
    return [
        Source(name=_display_name(url, fs, root, p, globbed), size=int(found[p]), path=p,
               planned_fs=fs, secrets=secrets)
        for p in sorted(found)
    ]


def _expand_local(url: str, path: str) -> tuple[str, dict[str, int]]:
    """The folder names are relative to, and each file's size, for one local path or glob (a
    path naming a file or directory, ``data[1].txt`` say, is that one, not a glob)."""
    if _is_glob(path) and not os.path.lexists(path):
        root = LocalFileSystem._strip_protocol(_glob_prefix(url))
        return root, _glob_local(url, _glob_as_given(url, path), partial(_local_name, url, root, True))
    shown = partial(_local_name, url, path, False)
    if os.path.isdir(path):
        found = _walk_local(path, shown=shown)
        if not found:
            raise FileNotFoundError(f"input directory {url!r} holds no files (names that start "
                                    "with . or _ are skipped)")
        return path, found
    if os.path.lexists(path):  # a file, or a FIFO, device or broken link, which it names
        return path, {path: _local_size(path, shown)}
    raise FileNotFoundError(f"input file not found: {url!r} (check the path or URL)")


def _glob_local(url: str, pattern: str, shown: Callable[[str], str]) -> dict[str, int]:
    """The visible files a local glob matches, and those under the directories it matches.

    A real directory is read under one name, the first matched, so a symlink to a sibling
    directory (``data/*`` matching ``data/a`` and ``data/link``) adds nothing, as in a walk.
    """
    found: dict[str, int] = {}
    names: dict[tuple[int, int], str] = {}  # each real directory, and the name it is read under
    prefix, named = _glob_prefix(pattern), _literal_parts(pattern)
    # fsspec's glob neither follows nor types symlinks: Python's glob does
    for match in sorted(map(os.path.normpath, _glob_once_through_links(pattern, named))):
        if _hidden(posixpath.relpath(match, prefix), named):
            continue
        if (size := _local_size(match, shown)) is None:  # a directory, unless walked (``**``)
            if _inode(match) not in names:
                found.update(_walk_local(match, names, shown))
        elif names.setdefault(_inode(folder := os.path.dirname(match) or "."), folder) == folder:
            found[match] = size
    if not found:
        raise FileNotFoundError(f"no input file matches the glob {url!r} (names that start "
                                "with . or _ are skipped)")
    return found


def _glob_once_through_links(pattern: str, named: AbstractSet[str]) -> list[str]:
    """``glob.glob(pattern, recursive=True)``, except that a ``**`` never enters a folder it is
    already inside: Python's glob follows every path through links back to an ancestor (two
    such links in a folder make 2**40 paths before the system's link limit stops it). Nor
    does it enter hidden folders (see ``_hidden``) but those ``named``."""
    parts = pattern.split(os.sep)
    if "**" not in parts:
        return glob.glob(pattern)
    at = parts.index("**")
    base = os.sep.join(parts[:at]) or (os.sep if pattern.startswith(os.sep) else os.curdir)
    rest = os.sep.join(parts[at + 1 :])
    matches = []
    for top in glob.glob(base) if _is_glob(base) else [base]:
        for folder in _folders_under(top, named) if os.path.isdir(top) else ():
            matches += _glob_once_through_links(os.path.join(glob.escape(folder), rest),
                                                named) if rest else [folder]
    return matches


def _folders_under(top: str, named: AbstractSet[str]) -> list[str]:
    """``top`` and the folders under it, through links, hidden ones left out but those
    ``named`` (see ``_hidden``). Each folder comes once, by the name that sorts first among
    those Python's glob would give it (walking every path to it, through links, costs the
    factorial of their number); a name through a hidden folder, skipped, is not one of them."""
    folders, seen = [], set()
    # Paths come off the heap in sorted order (each after the path it extends), so a folder is
    # first reached by its first name; ``/`` ends each key as it goes on in a file's path.
    waiting = [(top + os.sep, top)]
    while waiting:
        _, folder = heapq.heappop(waiting)
        if (inode := _inode(folder)) in seen:
            continue
        seen.add(inode)
        folders.append(folder)
        try:
            with os.scandir(folder) as entries:
                names = [entry.name for entry in entries if entry.is_dir() and not (
                    entry.name.startswith(".") or _hidden(entry.name, named))]  # (as ** skips)
        except OSError:  # (a folder that cannot be listed holds nothing to find, as for os.walk)
            continue
        for name in names:
            path = os.path.join(folder, name)
            heapq.heappush(waiting, (path + os.sep, path))
    return folders


def _expand_remote(url: str, fs: AbstractFileSystem, path: str,
                   secrets: frozenset[str]) -> tuple[str, dict[str, int]]:
    """As ``_expand_local`` for a URL: one object, a prefix holding objects, or a glob."""
    public = public_url(url)
    ask = partial(retried, name=public, secrets=secrets)
    # In an http(s) URL "?" starts the query (a presigned URL's signature), as fsspec reads it.
    if _is_glob(path, "*[" if "http" in fs.protocol else "*?["):
        root = _glob_prefix(path)
        root = fs.root_marker if root == "." else root  # a wildcard at the store's top
        found = _glob_remote(fs, _glob_as_given(url, path), root, ask)
        if not found:
            raise FileNotFoundError(f"no input file matches the glob {public!r} (names that "
                                    "start with . or _ are skipped)")
        return root, found
    try:
        info = ask(lambda: fs.info(path), request="asking what it is")
    except FileNotFoundError:
        raise FileNotFoundError(f"input file not found: {public!r} (check the path or URL)"
                                ) from None
    if info["type"] == "directory":
        found = _find_remote(fs, path, ask)
        if not found:
            raise FileNotFoundError(f"input directory {public!r} holds no files (names that "
                                    "start with . or _ are skipped)")
        return path, found
    if info.get("size") is None:
        raise ValueError(f"{public} has no known size (the server sent no Content-Length), so "
                         "it cannot be split into byte ranges; serve it with its length")
    return path, {path: info["size"]}


def _glob_remote(fs: AbstractFileSystem, pattern: str, root: str,
                 ask: Callable) -> dict[str, int]:
    """The visible objects a glob matches, and those under the prefixes it matches."""
    if "**" in pattern:
        # fsspec's glob lists everything under the root for ``**``: list it once here and match
        # in memory, rather than list each matched prefix again.
        listed = ask(lambda: fs.find(root, withdirs=True, detail=True),
                     request="listing the objects it matches")
        matches = re.compile(glob_translate(pattern)).match
        matched = {path for path, info in listed.items()
                   if matches(path) or info["type"] == "directory" and matches(path + "/")}
        if matches(posixpath.join(root, "")):  # ``x/**/``: no folder below, x itself too
            matched.add(root)
        below = {path: info["size"] for path, info in listed.items()
                 if info["type"] != "directory" and _under(path, matched, root)}
    else:
        listed = ask(lambda: fs.glob(pattern, detail=True), request="listing the objects it matches")
        below = {}
        for match, info in listed.items():
            if info["type"] == "directory":
                below.update(_find_remote(fs, match, ask))
            else:
                below[match] = info["size"]
    named = _literal_parts(pattern)
    return {path: size for path, size in below.items()
            if not _hidden(posixpath.relpath(path, root or "."), named)}


def _under(path: str, folders: AbstractSet[str], root: str) -> bool:
    """Whether ``path`` or a folder above it, below ``root``, is in ``folders``."""
    while path not in folders:
        parent = posixpath.dirname(path)
        if parent == path or len(parent) < len(root):
            return False
        path = parent
    return True


def _find_remote(fs: AbstractFileSystem, folder: str, ask: Callable) -> dict[str, int]:
    """The visible objects under ``folder`` (a prefix) and their sizes."""
    listed = ask(lambda: fs.find(folder, detail=True), request="listing the objects under it")
    return {p: entry["size"] for p, entry in listed.items()
            if not _hidden(posixpath.relpath(p, folder))}


def _walk_local(root: str, names: dict[tuple[int, int], str] | None = None,
                shown: Callable[[str], str] = str) -> dict[str, int]:
    """The visible files under ``root`` and their sizes, through symlinked directories too.

    Each real directory (device and inode) is walked once, under the first name it is reached
    by (``names`` holds those read already), so a link back to an ancestor (a loop) or a second
    link to a walked directory adds nothing and cannot recurse forever. Errors name a path as
    ``shown`` spells it.
    """
    found: dict[str, int] = {}
    names = {} if names is None else names
    names[_inode(root)] = root

    def unreadable(error: OSError) -> None:
        raise type(error)(f"input folder {shown(error.filename)!r} cannot be read "
                          f"({error.strerror})") from None

    for folder, folders, files in os.walk(root, followlinks=True, onerror=unreadable):
        kept = []
        for name in sorted(folders):
            path = os.path.join(folder, name)
            if not _hidden(name) and names.setdefault(_inode(path), path) == path:
                kept.append(name)
        folders[:] = kept
        for name in files:
            if not _hidden(name):
                path = os.path.join(folder, name)
                if (size := _local_size(path, shown)) is not None:
                    found[path] = size
    return found


def _local_size(path: str, shown: Callable[[str], str] = str) -> int | None:
    """The size of the regular file at ``path`` (through symlinks); None for a directory.

    Errors name it as ``shown`` spells it.
    """
    try:
        info = os.stat(path)
    except OSError as error:  # a dangling symlink, a loop of symlinks, a folder closed to us
        link = os.path.islink(path)
        what = "a symbolic link that leads nowhere" if link else "unreadable"
        raise (FileNotFoundError if link else type(error))(
            f"input {shown(path)!r} is {what} ({error.strerror}): fix or remove it") from None
    if stat.S_ISDIR(info.st_mode):
        return None
    if not stat.S_ISREG(info.st_mode):
        raise ValueError(f"input {shown(path)!r} is neither a file nor a directory (a socket, "
                         "FIFO or device): only regular files can be split and read")
    return info.st_size


def _inode(path: str) -> tuple[int, int]:
    info = os.stat(path)
    return info.st_dev, info.st_ino


def _identity(source: Source) -> str | tuple[int, int]:
    """What makes two sources the same file: its device and inode locally (so symlinks and hard
    links to it are it), its URL elsewhere."""
    if isinstance(source.fs, LocalFileSystem):
        return _inode(source.path)
    return source.fs.unstrip_protocol(source.path)


def _hidden(relative: str, named: AbstractSet[str] = frozenset()) -> bool:
    """Whether a path below a walked or globbed folder has a part starting with ``.`` or ``_``
    (Spark's hidden files) that the user did not spell out (``named``)."""
    return any(part.startswith((".", "_")) and part not in (".", "..") and part not in named
               for part in relative.split("/"))


def _literal_parts(pattern: str) -> frozenset[str]:
    """The parts of a glob without wildcards, which it names on purpose: ``_tmp`` in ``_tmp/*``."""
    return frozenset(part for part in pattern.split("/") if not _is_glob(part))


def _display_name(url: str, fs: AbstractFileSystem, root: str, path: str, globbed: bool) -> str:
    """The name to show and compare across ranks: URLs keep their protocol; local files keep the
    user's spelling (``data/b.txt``, not an absolute path), so ranks started in different working
    directories name the same files alike."""
    if "://" in url:
        return public_url(fs.unstrip_protocol(path))
    return _local_name(url, root, globbed, path)


def _local_name(url: str, root: str, globbed: bool, path: str) -> str:
    """A local ``path`` found under ``root`` as the user spelled it in ``url``."""
    prefix = _glob_prefix(url) if globbed else url
    return prefix if path == root else os.path.normpath(
        os.path.join(prefix, posixpath.relpath(path, root)))


def _is_glob(path: str, wildcards: str = "*?[") -> bool:
    return any(char in path for char in wildcards)


def _glob_as_given(url: str, path: str) -> str:
    """The glob ``path`` with the ``/`` that ends ``url`` put back (fsspec takes it off): a glob
    ending in ``/`` matches folders only, as in a shell.

    >>> _glob_as_given("data/*/", "/work/data/*"), _glob_as_given("data/*", "/work/data/*")
    ('/work/data/*/', '/work/data/*')
    """
    return path + "/" if url.endswith("/") and not path.endswith("/") else path


def _glob_prefix(pattern: str) -> str:
    """The folders of a glob before its first wildcard: ``data`` for ``data/*/x.txt``."""
    parts = pattern.split("/")
    first = next(i for i, part in enumerate(parts) if _is_glob(part))
    return "/".join(parts[:first]) or ("/" if pattern.startswith("/") else ".")
