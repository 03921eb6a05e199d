"""``ShardedIterable``: a stream, or a list of shards, split over ranks and DataLoader workers.

Data that cannot be indexed (a stream of records, tar shards, lines of files, a streaming
dataset) is split over every consumer of the job: ``rank * num_workers + worker``, for
``world_size * num_workers`` consumers in all. Nothing is read twice and nothing is lost:

- a list of shards with at least as many shards as consumers: consumer ``c`` reads shards
  ``c, c + C, c + 2C, ...`` whole (no shard is opened by two consumers);
- fewer shards, or a plain stream: every consumer reads the items in order and keeps items
  ``c, c + C, ...`` (each reads everything; nothing is kept twice).

Progress is kept as (shard, offset, items read) per consumer, so ``state_dict()`` resumes
mid-stream, mid-shard without reading the shards already done, on as many ranks and workers.
torchdata's ``StatefulDataLoader`` saves and restores it per worker; with no workers it is this
object's own. Each new pass starts from the beginning, but the first pass after
``load_state_dict``. Pass a stream that can be iterated again (a list, a dataset; not a one-off
generator), or, for one that must be reopened, ``shards=[open_it]``.

A state holds its own rank's places. A rank given another rank's (Lightning saves rank 0's
loader state for every rank) goes on after as many items of its own share as the saved rank's
consumer with its worker number had read: ranks training together take as many batches each.
It reads them again to find its place.

Ranks given different shard lists (another order, one more file) would read some shards twice and
others never: ``config()`` and ``fingerprint()`` describe the list, so ``check_consistent`` (and
``shardwise.DataLoader`` at each pass) stops ranks that differ.
"""

from __future__ import annotations

import functools
import os
import types
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from itertools import islice
from typing import Any

import torch.utils.data._utils.worker as torch_worker
from torch.utils.data import IterableDataset, get_worker_info

from shardwise.checks import require_int, require_saved_state
from shardwise.distributed.world import resolve_world
from shardwise.mix import digest
from shardwise.names import qualified_name

STATE_VERSION = 2  # 2: each consumer's items read in the pass, too
Shard = Iterable[Any] | Callable[[], Iterable[Any]]


class ShardedIterable(IterableDataset):
    """This rank's (and this DataLoader worker's) share of a stream or of a list of shards.

    >>> [list(shard_iterable(range(10), rank=r, world_size=3)) for r in range(3)]
    [[0, 3, 6, 9], [1, 4, 7], [2, 5, 8]]
    >>> [list(shard_iterable(shards=[[0, 1], [2], [3, 4, 5]], rank=r, world_size=2)) for r in (0, 1)]
    [[0, 1, 3, 4, 5], [2]]
    """

    def __init__(
        self,
        iterable: Iterable[Any] | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        *,
        shards: Sequence[Shard] | None = None,
    ) -> None:
        if (iterable is None) == (shards is None):
            raise ValueError("pass either an iterable (a stream of items) or shards= (a list of "
                             "shards, each an iterable or a function that opens one), not both")
        if shards is not None and (isinstance(shards, (str, bytes)) or not isinstance(shards, Sequence)):
            raise TypeError(f"shards must be a list of shards, got {type(shards).__name__}")
        named = [("the stream", iterable)] if shards is None else [
            (f"shard {number}", shard) for number, shard in enumerate(shards)]
        for what, given in named:
            if isinstance(given, (str, bytes, os.PathLike)):  # (its characters, or an error)
                raise TypeError(
                    f"{what} is a path ({os.fsdecode(given)!r}), not its items: pass "
                    "shards=line_shards(paths) (or row_group_shards(paths)) from "
                    "shardwise.streams.files to read files' lines (or Parquet rows)")
        self.world_size, self.rank = resolve_world(world_size, rank, name="world_size")
        self.shards = list(shards) if shards is not None else [iterable]
        self.streamed = shards is None
        # consumer -> (its shard number, items read in it, items read in the pass): this
        # pass's, and a loaded one's
        self._progress: dict[int, tuple[int, int, int]] = {}
        self._resume: dict[int, tuple[int, int, int]] = {}
        self._consumers: int | None = None  # of the pass begun here, or of a loaded state

    def consumer(self) -> tuple[int, int]:
        """``(this consumer, all consumers)``: this rank and DataLoader worker among all of them."""
        worker = get_worker_info()
        workers, worker_id = (1, 0) if worker is None else (worker.num_workers, worker.id)
        return self.rank * workers + worker_id, self.world_size * workers

    def by_shard(self, consumers: int) -> bool:
        """Whether consumers read whole shards (there are enough shards) or pick items."""
        return not self.streamed and len(self.shards) >= consumers

    def shards_of(self, consumer: int, consumers: int) -> range:
        """The shards ``consumer`` reads: whole ones, round-robin; or every shard, keeping every
        C-th item (rotated per shard so short shards do not all favour the first consumers)."""
        if self.by_shard(consumers):
            return range(consumer, len(self.shards), consumers)
        return range(len(self.shards))

    def __iter__(self) -> Iterator[Any]:
        me, consumers = self.consumer()
        if self._resume and self._consumers not in (None, consumers):
            raise ValueError(
                f"the state was saved by {self._consumers} consumers (ranks x DataLoader "
                f"workers) but this pass has {consumers}: resume with as many workers, or the "
                "stream would read some items twice and others never")
        self._consumers = consumers
        mine = self.shards_of(me, consumers)
        # Placed now, not when the first item is asked for: a loader that puts a state back
        # and then begins a new pass makes two iterators, and only the second is read.
        first, offset, read, passed = self._place(me, consumers)
        if first > len(mine):
            raise ValueError(f"the state says consumer {me} read {first} shards, but it has "
                             f"{len(mine)}: was it saved with another shard list?")
        self._progress[me] = (first, offset, read)
        return self._read(me, consumers, mine, first, offset, read, passed)

    def _read(self, me: int, consumers: int, mine: range, first: int, offset: int, read: int,
              passed: int) -> Iterator[Any]:
        """Consumer ``me``'s items from ``mine``, its shards, from its shard number ``first``
        and ``offset`` items into it, ``read`` of the pass read by then, passing over those up
        to the ``passed``-th."""
        whole = self.by_shard(consumers)
        for number in range(first, len(mine)):
            items = _open(self.shards[mine[number]])
            if not whole:
                items = islice(items, (me - mine[number]) % consumers, None, consumers)
            if offset and sum(1 for _ in islice(items, offset)) < offset:
                raise ValueError(
                    f"the state places consumer {me} after item {offset} of shard "
                    f"{mine[number]} ({shard_identity(self.shards[mine[number]])}), which "
                    "holds fewer now: was it changed since the state was saved? Resume over "
                    "the shards it was saved with, or begin the epoch afresh")
            for item in items:
                offset += 1
                read += 1
                self._progress[me] = (number, offset, read)
                if read > passed:
                    yield item
            offset = 0
            self._progress[me] = (number + 1, 0, read)
        if read < passed:  # this share ended before the other rank's: they did not go alike
            raise ValueError(
                f"this rank's consumer {me} read its whole share ({read} items) before the "
                f"{passed} that the other rank's state says it had read: its workers did not "
                "take as many batches as that rank's, so its place cannot be known from that "
                "state; save a state on every rank and load each rank's own")

    def _place(self, me: int, consumers: int) -> tuple[int, int, int, int]:
        """Where consumer ``me`` starts this pass: its shard number, the items read in that
        shard and in the pass, and how many items of the pass it passes over (read again)."""
        if not self._resume:  # each pass starts afresh, unless resumed
            return 0, 0, 0, 0
        if me in self._resume:
            return (*self._resume.pop(me), 0)
        # Another rank's state: its consumer with this one's worker number had read as many.
        workers = consumers // self.world_size
        twin = min(self._resume, key=lambda consumer: (consumer % workers != me % workers,
                                                       consumer))
        if twin % workers != me % workers:
            raise ValueError(f"the state holds no place of a consumer with worker number "
                             f"{me % workers}: load a state this loader saved")
        return 0, 0, 0, self._resume.pop(twin)[2]

    def state_dict(self) -> dict[str, Any]:
        """Each consumer's (shard number among its shards, items read in it, items read in the
        pass): resumes mid-shard; loaded by another rank (of as many), each consumer passes
        over as many items of its share as the saved consumer with its worker number read."""
        return {"version": STATE_VERSION, "world_size": self.world_size,
                "consumers": self._consumers,
                "progress": {str(c): list(p) for c, p in self._progress.items()},
                "files": self._files_digest}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from a saved progress (the same world size and number of workers)."""
        require_saved_state(state, "ShardedIterable", STATE_VERSION)
        if state.get("world_size") != self.world_size:
            raise ValueError(f"the state was saved by {state.get('world_size')!r} ranks; this "
                             f"stream is split over {self.world_size}: resume it on as many ranks")
        progress, consumers = state.get("progress"), state.get("consumers")
        if not isinstance(progress, Mapping) or not all(
                isinstance(place, (list, tuple)) and len(place) == 3 for place in progress.values()):
            raise TypeError("the state has no 'progress' of its consumers, each [shard, offset, "
                            "items read]: pass what state_dict() gave")
        if state.get("files", self._files_digest) != self._files_digest:
            raise ValueError(
                "the state was saved over another shard list than this stream's (other files or "
                "row groups, or another number of shards): a shard added, removed or changed "
                "since would move every shard after it to another consumer, so some would be "
                "read twice and others never. Resume over the shards the state was saved with, "
                "or begin the epoch afresh")
        # None: saved before any pass began.
        consumers = None if consumers is None else require_int("saved consumers", consumers,
                                                               minimum=1)
        if any(not (isinstance(c, str) and c.isdecimal() and int(c) < (consumers or 0))
               for c in progress):
            raise ValueError(f"the state's progress is by consumer number, below the number of "
                             f"consumers that saved it ({consumers}), got "
                             f"{sorted(map(str, progress))}: pass what state_dict() gave")
        self._resume = {int(c): (require_int("saved shard", p[0], minimum=0),
                                 require_int("saved offset", p[1], minimum=0),
                                 require_int("saved items read", p[2], minimum=0))
                        for c, p in progress.items()}
        self._progress = dict(self._resume)
        self._consumers = consumers
        self._check_placeable()

    def _check_placeable(self) -> None:
        """Refuse another rank's state that cannot place this rank: one of its consumers had
        read its whole share, after which that rank's workers took turns unlike this one's.
        (With one consumer a rank there are no turns: a rank whose share is shorter than the
        count is refused as it reads.)"""
        if not self._resume or self._consumers is None:
            return
        workers = max(1, self._consumers // self.world_size)
        if workers == 1 or any(consumer // workers == self.rank for consumer in self._resume):
            return  # this rank's own
        ended = sorted(c for c, (shard, _, _) in self._resume.items()
                       if shard >= len(self.shards_of(c, self._consumers)))
        if ended:
            raise ValueError(
                f"the state is another rank's, whose consumer {ended[0]} had read its whole "
                "share: after that its workers took turns unlike this rank's, so this rank's "
                "place cannot be known from it; save a state on every rank and load each "
                "rank's own")

    def config(self) -> dict[str, Any]:
        """What every rank must agree on, compared by :func:`shardwise.check_consistent`."""
        return {"dataset": "ShardedIterable", "shards": len(self.shards),
                "streamed": self.streamed, "num_replicas": self.world_size}

    @functools.cached_property
    def _files_digest(self) -> str:
        """A digest of the shard list that a resume must find again: the shards that name
        files (by path and size, or row group) and the number of the others (a function's name
        holds line numbers, which an edited script moves). Taken once: every state holds it,
        and a loader takes a state with each batch (a list of 10^5 files hashes in ~50 ms)."""
        # (paths are refused as shards: a file shard is one that says what it reads)
        names = [shard_identity(shard) if callable(getattr(shard, "identity", None)) else ""
                 for shard in self.shards]
        return f"{_digest(names):#018x}"

    def fingerprint(self) -> int:
        """A digest of the shard list, in order, each shard named alike on every rank (a file
        by its path, a function by its qualified name and the text it holds)."""
        return _digest([shard_identity(shard) for shard in self.shards])


def shard_iterable(
    iterable: Iterable[Any] | None = None,
    rank: int | None = None,
    world_size: int | None = None,
    *,
    shards: Sequence[Shard] | None = None,
) -> ShardedIterable:
    """Split a stream (``iterable``) or a list of shards (``shards=``) over ranks and workers."""
    return ShardedIterable(iterable, rank, world_size, shards=shards)


def shard_identity(shard: Shard) -> str:
    """What names a shard alike on every rank: a file shard by its file (and row group), a path
    by itself, a function by its qualified name (with the paths and other text it holds as
    defaults or in its closure, so ``[lambda p=p: read(p) for p in paths]`` differ; numbers,
    often this rank's own, are left out), a ``functools.partial`` by its arguments too, an
    object that is called by its class and text attributes, a short list of plain values by its
    values, anything else by its type and length.

    >>> shard_identity([1, 2]), shard_identity("data/a.txt"), shard_identity(range(3))
    ('list[1, 2]', 'data/a.txt', 'range(0, 3)')
    >>> shard_identity(functools.partial(pow, 2))
    'partial(builtins.pow, 2)'
    """
    if callable(getattr(shard, "identity", None)):
        return str(shard.identity())
    if isinstance(shard, (str, os.PathLike)):
        return os.fspath(shard)
    if isinstance(shard, range):
        return repr(shard)
    if isinstance(shard, functools.partial):
        parts = [shard_identity(shard.func), *map(_plain, shard.args),
                 *(f"{key}={_plain(value)}" for key, value in sorted(shard.keywords.items()))]
        return f"partial({', '.join(parts)})"
    if callable(shard) and not hasattr(shard, "__iter__"):
        return _callable_identity(shard)
    if isinstance(shard, (list, tuple)) and len(shard) <= _LISTED and all(
            isinstance(item, _PLAIN) for item in shard):
        return f"{type(shard).__name__}{list(shard)!r}"
    try:
        size = f"[{len(shard)}]"  # type: ignore[arg-type]
    except Exception:  # noqa: BLE001 - no length (a stream), or one that refuses to tell
        size = ""
    return f"{qualified_name(type(shard))}{size}"


def _digest(names: list[str]) -> int:
    return digest(*(name.encode("utf-8", "backslashreplace") + b"\0" for name in names))


_PLAIN = (int, float, str, bytes, bool, type(None))
_LISTED = 64  # a list of at most this many plain values is named by them


def _plain(value: Any) -> str:
    return repr(value) if isinstance(value, _PLAIN) else shard_identity(value)


def _callable_identity(function: Callable[..., Any]) -> str:
    """A function or method by its qualified name and the text values it holds; any other
    callable object by its class and its text attributes."""
    if isinstance(function, types.MethodType):
        return f"{_plain(function.__self__)}.{function.__name__}"
    if not isinstance(function, (types.FunctionType, types.BuiltinFunctionType, type)):
        held = getattr(function, "__dict__", {})
        return f"{qualified_name(type(function))}({_held(held.items())})"
    name = qualified_name(function)
    if not isinstance(function, types.FunctionType):
        return name
    code = function.__code__
    cells = [cell.cell_contents for cell in function.__closure__ or () if _filled(cell)]
    values = [*(function.__defaults__ or ()), *(function.__kwdefaults__ or {}).values(), *cells]
    held = _held((str(index), value) for index, value in enumerate(values))
    return f"{name}:{code.co_firstlineno}({held})" if held else f"{name}:{code.co_firstlineno}"


def _held(items: Iterable[tuple[str, Any]]) -> str:
    """``name=value`` for the text values (paths, URLs, names) among ``items``, in order.

    Numbers are left out: a shard's function often holds this rank's own (its rank, a seed
    from it), which must not make ranks that list the same shards look different.
    """
    return ", ".join(f"{name}={os.fspath(value)!r}" for name, value in items
                     if isinstance(value, (str, bytes, os.PathLike)))


def _filled(cell: types.CellType) -> bool:
    try:
        cell.cell_contents  # noqa: B018 - an empty cell raises
    except ValueError:
        return False
    return True


def _open(shard: Shard) -> Iterator[Any]:
    """The shard's items. A dataset that splits itself over DataLoader workers (Hugging Face's
    streaming datasets and webdataset's do) is shown no worker, so it is read whole: this
    consumer owns it (or picks its items from all of it)."""
    items = shard() if callable(shard) and not hasattr(shard, "__iter__") else shard
    if isinstance(items, IterableDataset):
        return _as_in_main_process(items)
    return iter(items)


def _as_in_main_process(dataset: IterableDataset) -> Iterator[Any]:
    hidden = torch_worker._worker_info
    if hidden is None:
        yield from dataset
        return
    try:
        torch_worker._worker_info = None
        iterator = iter(dataset)
    finally:
        torch_worker._worker_info = hidden
    while True:
        torch_worker._worker_info = None  # only while the dataset makes its next item
        try:
            item = next(iterator)
        except StopIteration:
            return
        finally:
            torch_worker._worker_info = hidden
        yield item
