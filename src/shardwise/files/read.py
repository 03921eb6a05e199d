"""Read one rank's lines: the lines whose first byte lies in the rank's planned byte range.

Each cut point ``c`` inside a file moves forward to the next line start (the byte after the first
``\\n`` at or after ``c - 1``). Neighbouring ranks move their shared cut point the same way, so the
line-aligned ranges tile every file: each line is read once, by one rank, and no file is cut
short by a blank line. A file without a final newline simply ends its last line at end of file.

Reading never talks to other ranks: each rank reads its share of the plan it is given. Bytes
appended to a file after it was planned are not read (the plan fixed its size); a file that has
shrunk since is an error naming it. ``agreed_plan`` checks that every rank planned the same.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import AnyStr

import numpy as np

from shardwise.distributed.world import resolve_world
from shardwise.files.plan import Plan, plan
from shardwise.files.sources import Paths, Source

# Below glibc's largest mmap threshold (32 MiB), so each chunk's buffer is reused from the heap
# instead of being freshly mapped and page-faulted in: reading runs about 3x faster.
DEFAULT_BLOCK_BYTES = 16 * 2**20
_SCAN_BYTES = 64 * 2**10


@dataclass(frozen=True)
class Chunk:
    """Whole lines of one file: ``data`` is its bytes ``[start, start + len(data))``."""

    source: Source
    start: int
    data: bytes

    def line_count(self) -> int:
        """The number of lines in ``data``, blank ones included (a last line may lack its ``\\n``)."""
        raw = np.frombuffer(self.data, dtype=np.uint8)
        # Compared a slice at a time into one small scratch buffer: a chunk-sized temporary would
        # be fresh memory every time, and page faults would cost more than the comparison.
        scratch = np.empty(min(max(raw.size, 1), _SCAN_BYTES * 16), dtype=bool)
        newlines = 0
        for lo in range(0, raw.size, scratch.size):
            part = raw[lo : lo + scratch.size]
            newlines += int(np.count_nonzero(np.equal(part, 10, out=scratch[: part.size])))
        return newlines + (not self.data.endswith(b"\n"))

    def line_number(self, offset: int = 0) -> int:
        """1-based line number, in its file, of the line holding ``data[offset]``.

        Counts the newlines before ``start`` by reading the file's prefix: meant for error
        messages, not for every line.
        """
        before = 0
        with self.source.open() as f:
            remaining = self.start
            while remaining > 0:
                block = f.read(min(remaining, DEFAULT_BLOCK_BYTES))
                if not block:
                    break
                before += block.count(b"\n")
                remaining -= len(block)
        return before + self.data.count(b"\n", 0, offset) + 1


def iter_chunks(
    paths: Paths | Plan,
    rank: int | None = None,
    world_size: int | None = None,
    *,
    block_bytes: int = DEFAULT_BLOCK_BYTES,
) -> Iterator[Chunk]:
    """This rank's bytes as line-aligned chunks of about ``block_bytes``: the fast path for parsers.

    ``rank`` / ``world_size`` default to the process group (or ``RANK`` / ``WORLD_SIZE``). No
    communication: under a process group, pass ``agreed_plan(paths)`` to have the ranks check
    first that they all planned the same files (else ranks that list the files differently
    would silently read overlapping shares).
    """
    world_size, rank = resolve_world(world_size, rank)
    if block_bytes < 1:
        raise ValueError(f"block_bytes must be positive, got {block_bytes}")
    if not (isinstance(paths, Plan) and paths.world_size == world_size):
        paths = plan(paths, world_size)
    for piece in paths.pieces(rank):
        size = piece.source.size
        _check_not_shrunk(piece.source)
        with piece.source.open() as f:
            cuts = [*range(piece.start, piece.stop, block_bytes), piece.stop]
            starts = [_line_start(f, cut, size) for cut in cuts]
            for lo, hi in zip(starts, starts[1:]):
                if lo < hi:
                    f.seek(lo)
                    yield Chunk(piece.source, lo, _read_exactly(f, hi - lo, piece.source))


def read_bytes(
    paths: Paths | Plan, rank: int | None = None, world_size: int | None = None
) -> bytes:
    """All of this rank's lines as one buffer; a ``\\n`` is added where a file lacked its last one.

    >>> import tempfile, pathlib
    >>> folder = pathlib.Path(tempfile.mkdtemp())
    >>> _ = (folder / "a").write_bytes(b"one\\ntwo"); _ = (folder / "b").write_bytes(b"three\\n")
    >>> read_bytes(folder, rank=0, world_size=1)
    b'one\\ntwo\\nthree\\n'
    """
    parts = []
    for chunk in iter_chunks(paths, rank, world_size):
        parts.append(chunk.data)
        if not chunk.data.endswith(b"\n"):
            parts.append(b"\n")
    return b"".join(parts)


def read_lines(
    paths: Paths | Plan,
    rank: int | None = None,
    world_size: int | None = None,
    *,
    skip_blank: bool = False,
) -> list[str]:
    """This rank's lines, decoded as UTF-8, without their ``\\n`` or ``\\r\\n`` terminators.

    >>> import tempfile, pathlib
    >>> folder = pathlib.Path(tempfile.mkdtemp())
    >>> _ = (folder / "a").write_bytes(b"one\\r\\n\\ntwo\\n"); _ = (folder / "b").write_bytes(b"three")
    >>> [read_lines(folder, rank=r, world_size=2) for r in (0, 1)]
    [['one', '', 'two'], ['three']]
    >>> read_lines(folder, rank=0, world_size=1, skip_blank=True)
    ['one', 'two', 'three']
    """
    lines: list[str] = []
    for chunk in iter_chunks(paths, rank, world_size):
        lines.extend(chunk_lines(chunk))
    return [line for line in lines if line] if skip_blank else lines


def leading_lines(paths: Paths | Plan) -> Iterator[bytes]:
    """The input's lines from its very start, as bytes without terminators, read as asked for.

    For looking at the first lines (every rank sees the same ones), not for reading a share.

    >>> import tempfile, pathlib
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "a"
    >>> _ = path.write_bytes(b"one\\r\\ntwo\\n")
    >>> next(leading_lines(path))
    b'one'
    """
    for source in (paths if isinstance(paths, Plan) else plan(paths, 1)).sources:
        if source.size:
            with source.open() as f:
                for line in f:
                    yield split_lines(line)[0]


def chunk_lines(chunk: Chunk) -> list[str]:
    """The lines of one chunk, decoded, terminators removed (blank lines kept)."""
    try:
        text = chunk.data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise ValueError(
            f"{chunk.source.name}:{chunk.line_number(error.start)}: not valid UTF-8 "
            f"({error.reason}); re-encode the file as UTF-8"
        ) from None
    return split_lines(text)


def split_lines(text: AnyStr) -> list[AnyStr]:
    """``text`` (``str`` or ``bytes``) split into lines without their ``\\n`` or ``\\r\\n``.

    >>> split_lines(b"a\\r\\n\\nb")
    [b'a', b'', b'b']
    """
    newline, carriage = ("\n", "\r") if isinstance(text, str) else (b"\n", b"\r")
    lines = text.split(newline)
    if text.endswith(newline):
        lines.pop()
    if carriage in text:
        lines = [line[:-1] if line.endswith(carriage) else line for line in lines]
    return lines


def _line_start(f, cut: int, size: int) -> int:
    """The first line start at or after ``cut``: 0, ``size``, or just past a newline at >= cut - 1."""
    if cut <= 0 or cut >= size:
        return min(max(cut, 0), size)
    f.seek(cut - 1)
    position = cut - 1
    while position < size:
        block = f.read(_SCAN_BYTES)
        if not block:
            break
        newline = block.find(b"\n")
        if newline >= 0:
            return min(position + newline + 1, size)
        position += len(block)
    return size


def _check_not_shrunk(source: Source) -> None:
    """A file must still hold the bytes planned for it, or the ranks' shares no longer tile it."""
    now = source.fs.size(source.path)
    if now < source.size:
        raise OSError(
            f"{source.name} has {now:,} bytes but had {source.size:,} when the load was planned: it "
            "shrank (was it rewritten during the load?); load it again once it is complete"
        )


def _read_exactly(f, count: int, source: Source) -> bytes:
    data = f.read(count)
    if len(data) != count:
        raise OSError(
            f"{source.name} shrank while being read: expected {count} more bytes, got {len(data)}"
        )
    return data
