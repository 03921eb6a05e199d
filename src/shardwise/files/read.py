"""Read one rank's lines: the lines whose first byte lies in the rank's planned byte range.

Each cut point ``c`` inside a file moves forward to the next line start (the byte after the first
``\\n`` at or after ``c - 1``). Neighbouring ranks move their shared cut point the same way, so the
line-aligned ranges tile every file: each line is read once, by one rank, and no file is cut
short by a blank line. A file without a final newline simply ends its last line at end of file.

Reading never talks to other ranks: each rank reads its share of the plan it is given. Bytes
appended to a file after it was planned are not read (the plan fixed its size); a file that has
shrunk since is an error naming it. ``agreed_plan`` checks that every rank planned the same.

A local file is read through one open file; a remote one (an object store, HTTP) by one retried
range request per read, a chunk ahead of the parser (``remote.py``).
"""

from __future__ import annotations

import bisect
import math
import threading
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from typing import AnyStr

import numpy as np

from shardwise.distributed.world import resolve_world
from shardwise.files.plan import Piece, Plan, plan
from shardwise.files.remote import current_size, read_ahead, read_range
from shardwise.files.sources import Paths, Source, StorageOptions

ReadRange = Callable[[int, int], bytes]  # bytes [start, stop) of one file (fewer at its end)

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
        return newlines + (bool(self.data) and not self.data.endswith(b"\n"))  # b"": no line

    def line_number(self, offset: int = 0) -> int:
        """1-based line number, in its file, of the line holding ``data[offset]``.

        Counts the newlines before ``start`` by reading the file from the nearest place counted
        before (its start, the first time): meant for error messages, not for every line, though
        a file with a bad line every few kilobytes is read about once, not once per bad line.
        """
        with _COUNTED_LOCK:
            marks = _counted_marks(self.source)
            at, before = marks[bisect.bisect_right(marks, (self.start, math.inf)) - 1]
            if at < self.start:
                with _ranges(self.source) as read:
                    for start in range(at, self.start, DEFAULT_BLOCK_BYTES):
                        stop = min(start + DEFAULT_BLOCK_BYTES, self.start)
                        before += read(start, stop).count(b"\n")
                bisect.insort(marks, (self.start, before))
        return before + self.data.count(b"\n", 0, offset) + 1


# Newlines counted before places in a file, (offset, count) in order, by the Source object (not
# an equal one: a file rewritten at the same size is planned anew), for as long as it lives (a
# plan holds it); the lock keeps threads parsing chunks from counting at once.
_COUNTED: dict[int, list[tuple[int, int]]] = {}
_COUNTED_LOCK = threading.Lock()


def _counted_marks(source: Source) -> list[tuple[int, int]]:
    marks = _COUNTED.get(id(source))
    if marks is None:
        marks = _COUNTED[id(source)] = [(0, 0)]
        weakref.finalize(source, _COUNTED.pop, id(source), None)
    return marks


def iter_chunks(
    paths: Paths | Plan,
    rank: int | None = None,
    world_size: int | None = None,
    *,
    block_bytes: int = DEFAULT_BLOCK_BYTES,
    storage_options: StorageOptions | None = None,
) -> Iterator[Chunk]:
    """This rank's bytes as line-aligned chunks of about ``block_bytes``: the fast path for parsers.

    ``rank`` / ``world_size`` default to the process group (or ``RANK`` / ``WORLD_SIZE``). No
    communication: under a process group, pass ``agreed_plan(paths)`` to have the ranks check
    first that they all planned the same files (else ranks that list the files differently
    would silently read overlapping shares). URLs are opened with ``storage_options`` (see
    ``plan``), and read a chunk ahead: the next chunk's range is requested while this one is used.
    """
    world_size, rank = resolve_world(world_size, rank, name="world_size")
    if block_bytes < 1:
        raise ValueError(f"block_bytes must be positive, got {block_bytes}")
    if not (isinstance(paths, Plan) and paths.world_size == world_size):
        paths = plan(paths, world_size, storage_options=storage_options)
    chunks = _chunks(paths.pieces(rank), block_bytes)
    yield from read_ahead(chunks) if any(s.remote for s in paths.sources) else chunks


def _chunks(pieces: list[Piece], block_bytes: int) -> Iterator[Chunk]:
    for piece in pieces:
        source, size = piece.source, piece.source.size
        now = _check_not_shrunk(source)
        with _ranges(source) as read:
            # Each chunk's end is found just before it is read: a remote file's first chunk is
            # then not kept waiting for a request per cut.
            lo = _line_start(read, piece.start, size)
            for cut in [*range(piece.start + block_bytes, piece.stop, block_bytes), piece.stop]:
                if cut <= lo:  # a line longer than a block: its end is already past this cut
                    continue
                if source.remote:
                    hi, data = _through_line_end(read, lo, cut, source)
                else:
                    hi = _line_start(read, cut, size)
                    data = _read_exactly(read, lo, hi, source)
                # (a local file is looked at again here: it may have grown since ``now``)
                if hi == size and data and not data.endswith(b"\n") and (
                        now > size or not source.remote):
                    _check_last_line_ended(read, source)
                if data:
                    yield Chunk(source, lo, data)
                lo = hi


def _through_line_end(read: ReadRange, lo: int, cut: int, source: Source) -> tuple[int, bytes]:
    """``(hi, bytes [lo, hi))``, ``hi`` the first line start at or after ``cut``, in one request.

    The request runs ``_SCAN_BYTES`` past the cut, where the line end nearly always lies: a
    remote chunk then costs one round trip, not a second one to look for its end.
    """
    size = source.size
    data = _read_exactly(read, lo, min(cut + _SCAN_BYTES, size), source)
    if cut >= size:
        return size, data
    newline = data.find(b"\n", cut - 1 - lo)
    if newline >= 0:
        return lo + newline + 1, data[: newline + 1]
    hi = _line_start(read, lo + len(data), size)  # a line longer than the scan: read on to its end
    return hi, data + _read_exactly(read, lo + len(data), hi, source)


def read_bytes(
    paths: Paths | Plan,
    rank: int | None = None,
    world_size: int | None = None,
    *,
    storage_options: StorageOptions | None = None,
) -> bytes:
    """All of this rank's lines as one buffer; a ``\\n`` is added where a file lacked its last one,
    and a byte order mark that opens a file is left out, as it is not part of the first line.

    >>> import tempfile, pathlib
    >>> folder = pathlib.Path(tempfile.mkdtemp())
    >>> _ = (folder / "a").write_bytes(b"one\\ntwo"); _ = (folder / "b").write_bytes(b"\\xef\\xbb\\xbfthree\\n")
    >>> read_bytes(folder, rank=0, world_size=1)
    b'one\\ntwo\\nthree\\n'
    """
    parts = []
    for chunk in iter_chunks(paths, rank, world_size, storage_options=storage_options):
        data = without_bom(chunk).data
        parts.append(data)
        if data and not data.endswith(b"\n"):  # (a file of only a mark has no line to end)
            parts.append(b"\n")
    return b"".join(parts)


def read_lines(
    paths: Paths | Plan,
    rank: int | None = None,
    world_size: int | None = None,
    *,
    skip_blank: bool = False,
    storage_options: StorageOptions | None = None,
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
    for chunk in iter_chunks(paths, rank, world_size, storage_options=storage_options):
        lines.extend(chunk_lines(chunk))
    return [line for line in lines if line] if skip_blank else lines


def leading_lines(paths: Paths | Plan) -> Iterator[bytes]:
    """The input's lines from its very start, as bytes without terminators, read as asked for.

    For looking at the first lines (every rank sees the same ones), not for reading a share. A
    file's byte order mark is not part of its first line, as the parse reads it.

    >>> import tempfile, pathlib
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "a"
    >>> _ = path.write_bytes(b"one\\r\\ntwo\\n")
    >>> next(leading_lines(path))
    b'one'
    """
    for source in (paths if isinstance(paths, Plan) else plan(paths, 1)).sources:
        with _ranges(source) as read:
            pending: list[bytes] = []  # the start of a line that does not end in this block
            for start in range(0, source.size, _SCAN_BYTES):
                block = read(start, min(start + _SCAN_BYTES, source.size))
                if start == 0:
                    block = block.removeprefix(BOM)
                end = block.rfind(b"\n") + 1
                if end:
                    yield from split_lines(b"".join([*pending, block[:end]]))
                    pending = []
                pending.append(block[end:])
            if any(pending):
                yield from split_lines(b"".join(pending))


BOM = b"\xef\xbb\xbf"  # a UTF-8 byte order mark, which some editors put first in a file


def without_bom(chunk: Chunk) -> Chunk:
    """``chunk`` without the byte order mark that may open its file: not part of the first line.

    >>> without_bom(Chunk(None, 0, b"\\xef\\xbb\\xbfa\\n")).data
    b'a\\n'
    """
    if chunk.start == 0 and chunk.data.startswith(BOM):
        return Chunk(chunk.source, len(BOM), chunk.data[len(BOM):])
    return chunk


def chunk_lines(chunk: Chunk) -> list[str]:
    """The lines of one chunk, decoded, terminators removed (blank lines kept; a byte order
    mark opening the file removed)."""
    chunk = without_bom(chunk)
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
    if not text:
        return []  # not one empty line
    newline, carriage = ("\n", "\r") if isinstance(text, str) else (b"\n", b"\r")
    lines = text.split(newline)
    if text.endswith(newline):
        lines.pop()
    if carriage in text:
        lines = [line[:-1] if line.endswith(carriage) else line for line in lines]
    return lines


@contextmanager
def _ranges(source: Source) -> Iterator[ReadRange]:
    """A function that reads byte ranges of ``source``: through one open file if it is local,
    else one range request (retried) per call."""
    if source.remote:
        yield partial(read_range, source)
        return
    with source.open() as f:

        def read(start: int, stop: int) -> bytes:
            f.seek(start)
            return f.read(stop - start)

        yield read


def _line_start(read: ReadRange, cut: int, size: int) -> int:
    """The first line start at or after ``cut``: 0, ``size``, or just past a newline at >= cut - 1."""
    if cut <= 0 or cut >= size:
        return min(max(cut, 0), size)
    position = cut - 1
    while position < size:
        block = read(position, min(position + _SCAN_BYTES, size))
        if not block:
            break
        newline = block.find(b"\n")
        if newline >= 0:
            return min(position + newline + 1, size)
        position += len(block)
    return size


def line_bounds(the_plan: Plan, rank: int) -> tuple[int, int] | None:
    """Global ``[start, stop)`` of ``rank``'s lines: its range's ends moved to line starts, as
    its reads move them (``None`` when its range is empty). A rank's ``stop`` must be the next
    non-empty rank's ``start``, or their copies of the file break lines differently there."""
    pieces = the_plan.pieces(rank)
    if not pieces:
        return None
    ends = []
    for piece, cut in ((pieces[0], pieces[0].start), (pieces[-1], pieces[-1].stop)):
        with _ranges(piece.source) as read:
            at = _line_start(read, cut, piece.source.size)
        ends.append(int(the_plan.offsets[piece.file]) + at)
    return ends[0], ends[1]


def _check_not_shrunk(source: Source) -> int:
    """A file must still hold the bytes planned for it, or the ranks' shares no longer tile it:
    its size now."""
    now = _size_now(source)
    if now < source.size:
        raise OSError(
            f"{source.name} has {now:,} bytes but had {source.size:,} when the load was planned: it "
            "shrank (was it rewritten during the load?); load it again once it is complete"
        )
    return now


def _check_last_line_ended(read: ReadRange, source: Source) -> None:
    """A planned last line with no ``\n``: bytes added to the file since must begin with its
    end, or they go on with it and it would be loaded cut short."""
    if read(source.size, source.size + 1) not in (b"", b"\n"):
        raise OSError(
            f"{source.name} grew from {source.size:,} bytes, when the load was planned, to "
            f"{_size_now(source):,}, and the bytes added go on with its last line, which would "
            "be loaded cut short: load it again once it is complete")


def _size_now(source: Source) -> int:
    if source.remote:
        return current_size(source)
    try:
        return source.fs.size(source.path)
    except FileNotFoundError:
        raise FileNotFoundError(
            f"{source.name} is gone: it was there when the load was planned (was it moved or "
            "deleted during the load?); load it again once it is back") from None


def _read_exactly(read: ReadRange, start: int, stop: int, source: Source) -> bytes:
    data = read(start, stop)
    if len(data) != stop - start:
        raise OSError(f"{source.name} shrank while being read: expected {stop - start} more bytes "
                      f"at byte {start:,}, got {len(data)}")
    return data
