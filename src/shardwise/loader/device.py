"""Stages between the workers and the caller: pinning in a background thread, and a copy to the
GPU on a side stream that is done by the time the training step asks for the batch."""

from __future__ import annotations

import collections.abc
import copy
import queue
import threading
import traceback
from collections.abc import Callable, Iterator
from typing import Any

import torch

from shardwise.loader.transport import rewrap, subclass_parts

SETTLE_POLL_SECONDS = 0.001


class Background(Iterator[Any]):
    """Runs ``source`` in a thread, up to ``ahead`` items ahead of the caller.

    Errors (and the end) reach the caller in order, in the caller's thread.

    >>> list(Background(iter(range(5)), ahead=2))
    [0, 1, 2, 3, 4]
    """

    def __init__(self, source: Iterator[Any], ahead: int) -> None:
        self._items: queue.Queue[tuple[bool, Any]] = queue.Queue(maxsize=max(1, ahead))
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(source,), daemon=True,
                                        name="shardwise-background")
        self._thread.start()

    def _run(self, source: Iterator[Any]) -> None:
        while True:
            try:
                item: tuple[bool, Any] = (True, next(source))
            except StopIteration:
                item = (False, StopIteration())
            except BaseException as error:  # noqa: BLE001 - all go to the caller
                item = (False, detached(error))
            while not self._stopping.is_set():
                try:
                    self._items.put(item, timeout=0.05)
                    break
                except queue.Full:
                    continue
            if self._stopping.is_set() or not (item[0] or _goes_on(item[1])):
                return
            # Not held while the next one is fetched: an error raised in the caller's thread
            # (a timeout, which the pass goes on past) gets a traceback there, whose frames
            # hold the pass, and a pass dropped after it would live on until the next item.
            del item

    def ready(self) -> bool:
        """Whether ``next`` returns (or raises) at once."""
        return not self._items.empty()

    def settle(self) -> None:
        """Wait until ``next`` would return (or raise) at once, or the thread has stopped."""
        while not self.ready() and self._thread.is_alive():
            self._thread.join(SETTLE_POLL_SECONDS)

    def __next__(self) -> Any:
        ok, value = self._items.get()
        if ok:
            return value
        try:
            raise value
        finally:  # (else this frame, in the error's traceback, holds the error: a cycle)
            del value

    def close(self) -> None:
        """Stop the thread (after the item it is working on) and wait for it."""
        self._stopping.set()
        if self._thread is not threading.current_thread():
            self._thread.join()


_ENDED = object()  # ToDevice's source has ended (or failed)


class ToDevice(Iterator[tuple[Any, int]]):
    """Copies each batch's tensors to a CUDA device on a side stream, a batch ahead when it can.

    When the caller takes batch ``k`` and batch ``k + 1`` is already at hand (``ready()``), it
    starts copying while the caller works on ``k``; a batch not yet at hand is fetched and
    copied when asked for, so the caller never waits for a later batch than the one it takes.
    The caller's stream waits only for what is still in flight. An error met while fetching or
    copying ahead is raised once the batch in hand is delivered: nothing is lost.

    The copies are made in memory of the caller's stream (the side stream first waits for what
    the caller queued), not moved there with ``record_stream``: a tensor so recorded makes a CUDA
    call when freed, which aborts a forked worker process whose garbage collection frees it.
    Only a batch taken on another stream than the one current when it was copied is recorded.
    """

    def __init__(self, source: Iterator[tuple[Any, int]], device: torch.device,
                 ready: Callable[[], bool] = lambda: False) -> None:
        self._source, self._device, self._ready = source, device, ready
        self._stream = torch.cuda.Stream(device)
        # A batch copying ahead (with the stream its memory belongs to), an error met ahead,
        # _ENDED, or None: nothing fetched ahead.
        self._next: tuple[Any, int, torch.cuda.Stream] | Exception | object | None = None

    def _issue(self) -> tuple[Any, int, torch.cuda.Stream] | Exception | object:
        try:
            batch, count = next(self._source)
            owner = torch.cuda.current_stream(self._device)
            self._stream.wait_stream(owner)
            return _copy(batch, self._device, self._stream), count, owner
        except StopIteration:
            return _ENDED
        except Exception as error:  # noqa: BLE001 - raised in its turn, after the batch in hand
            return detached(error)

    def __next__(self) -> tuple[Any, int]:
        ready = self._next if self._next is not None else self._issue()
        self._next = None
        if isinstance(ready, Exception):
            self._next = None if _goes_on(ready) else _ENDED  # (a timeout: asked again, it waits)
            try:
                raise ready
            finally:  # (else this frame, in the error's traceback, holds the error: a cycle)
                del ready
        if ready is _ENDED:
            self._next = _ENDED
            raise StopIteration
        batch, count, owner = ready
        current = torch.cuda.current_stream(self._device)
        current.wait_stream(self._stream)
        if current != owner:  # its memory may not be reused before this stream is done with it
            _record(batch, current)
        if self._ready():
            self._next = self._issue()
        return batch, count

    def close(self) -> None:
        if isinstance(self._next, tuple):  # its memory goes back to its stream once copied
            self._next[2].wait_stream(self._stream)
        self._next = _ENDED


def _goes_on(error: BaseException) -> bool:
    """Whether the pass goes on past ``error`` (a timeout), so a stage goes on fetching."""
    return bool(getattr(error, "pass_goes_on", False))


def _copy(batch: Any, device: torch.device, stream: torch.cuda.Stream) -> Any:
    """``batch`` with each tensor copied to ``device`` on ``stream``, into memory allocated on
    the current stream; a tensor subclass keeps its type and attributes."""
    if isinstance(batch, torch.Tensor):
        parts = subclass_parts(batch)
        if parts is not None:  # (``empty_like`` would drop its attributes, and often its type)
            plain, kind, state = parts
            return rewrap(_copy(plain, device, stream), kind, state)
        copied = torch.empty_like(batch, device=device)
        with torch.cuda.stream(stream):
            copied.copy_(batch, non_blocking=True)
        return copied
    return map_containers(lambda item: _copy(item, device, stream), batch)


def _record(batch: Any, stream: torch.cuda.Stream) -> None:
    for tensor in _tensors(batch):
        tensor.record_stream(stream)


def _tensors(batch: Any) -> Iterator[torch.Tensor]:
    """The tensors in ``batch``'s mappings, lists and tuples (read only: nothing is rebuilt)."""
    if isinstance(batch, torch.Tensor):
        yield batch
    elif isinstance(batch, collections.abc.Mapping):
        for item in batch.values():
            yield from _tensors(item)
    elif isinstance(batch, (list, tuple)):
        for item in batch:
            yield from _tensors(item)


def detached(error: BaseException) -> BaseException:
    """``error`` as a stage may hold it: its traceback, and those of the errors it chains, kept
    as text in a note rather than as frames.

    A frame keeps the locals of every call it was reached through, the pass's among them: a
    stage holding one would keep the pass, and with it its workers and threads, alive.
    """
    pending, seen = [error], set()
    while pending:
        current = pending.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        if current.__traceback__ is not None:
            text = "".join(traceback.format_tb(current.__traceback__)).rstrip()
            current.__traceback__ = None
            if hasattr(current, "add_note"):  # Python 3.11+
                current.add_note(f"Traceback of the error, most recent call last:\n{text}")
        pending += [current.__cause__, current.__context__]
    return error


def map_containers(fn: Any, obj: Any) -> Any:
    """``obj`` with ``fn`` applied to each item of its mappings, lists and tuples.

    As torch's ``pin_memory`` does, a mutable container is copied and its items replaced, so its
    type and attributes stay; a tuple (named too) is made anew; where its type cannot be rebuilt
    so, a plain dict or list comes back. Anything else is returned as it is.
    """
    if isinstance(obj, collections.abc.Mapping):
        items = {key: fn(value) for key, value in obj.items()}
        try:
            if isinstance(obj, collections.abc.MutableMapping):
                clone = copy.copy(obj)
                clone.update(items)
                return clone
            return type(obj)(items)
        except TypeError:
            return items
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):
        return type(obj)(*(fn(item) for item in obj))
    if isinstance(obj, (list, tuple)):
        items = [fn(item) for item in obj]
        try:
            if isinstance(obj, list):
                clone = copy.copy(obj)
                clone[:] = items
                return clone
            return type(obj)(items)
        except TypeError:
            return items
    return obj
