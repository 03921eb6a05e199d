"""What runs in a worker: seeding as torch does, fetching a batch, and the process worker's loop.

A process worker gets small messages on one duplex pipe from the main process (a task: its id
and the indices; a slot handed back; a new epoch; stop) and answers on the same pipe; batches
themselves travel through its shared-memory slots (:mod:`shardwise.loader.transport`).
"""

from __future__ import annotations

import gc
import os
import pickle
import random
import select
import signal
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

import numpy as np
import torch
import torch.utils.data._utils.worker as torch_worker
from torch._utils import ExceptionWrapper
from torch.utils.data._utils.collate import collate, collate_tensor_fn, default_collate_fn_map
from torch.utils.data.dataloader import _DatasetKind
from torch.utils.data.dataloader import default_collate as torch_default_collate

from shardwise.loader.datapipes import apply_shared_seed
from shardwise.loader.position import dataset_states, keeps_states
from shardwise.loader.transport import (
    Arena,
    SharedSlot,
    bytes_needed,
    flatten,
    pack,
    receive,
    send,
    send_descriptor,
)

FIRST_SLOT_BYTES = 4 * 2**20  # address space only: pages cost memory once a batch touches them
# An idle worker checks this often (milliseconds) that its main process still lives. (Not
# PR_SET_PDEATHSIG: that kills a worker when the *thread* that started it exits, not only its
# process.)
PARENT_CHECK_MS = 1000
SLOT_CHECK_MS = 1  # how often a worker looks again at a slot not yet copied out


@dataclass(frozen=True)
class WorkerSpec:
    """Everything a worker needs to fetch batches, fixed when the workers start."""

    dataset: Any
    kind: int  # torch's _DatasetKind.Map or _DatasetKind.Iterable
    auto_collation: bool
    collate_fn: Callable[[Any], Any]
    drop_last: bool
    init_fn: Callable[[int], None] | None
    # Each worker says it has started: it ran init_fn, or its copy of a Stateful dataset is kept
    # from the start: its states once it made its iterator, as torchdata keeps them. (Not for
    # every stream: an error in its __iter__ is then raised at the first batch, as torch raises
    # it, and a stream whose iterator alone keeps a state is kept from its first batch.)
    reports_start: bool
    num_workers: int
    slots: int  # batches a worker may have waiting in the main process: prefetch_factor


def seed_worker(spec: WorkerSpec, worker_id: int, base_seed: int) -> None:
    """Seed ``random``, torch and NumPy, and set ``get_worker_info()``, exactly as torch's workers."""
    seed = base_seed + worker_id
    random.seed(seed)
    torch.manual_seed(seed)
    np.random.seed(torch_worker._generate_state(base_seed, worker_id))
    torch_worker._worker_info = torch_worker.WorkerInfo(
        id=worker_id, num_workers=spec.num_workers, seed=seed, dataset=spec.dataset
    )


def task_failure(worker_id: int, index: Any, error: BaseException | None = None
                 ) -> ExceptionWrapper:
    """``error`` (else the exception being handled), with where it happened: worker and indices,
    as the caller sees (an IterableDataset's batches have no indices, only placeholders)."""
    where = f"in DataLoader worker process {worker_id}"
    if not (index is None or isinstance(index, list) and all(i is None for i in index)):
        shown = index if not isinstance(index, list) or len(index) <= 16 else [*index[:16], "..."]
        where += f" while loading indices {shown}"
    exc_info = None if error is None else (type(error), error, error.__traceback__)
    return ExceptionWrapper(exc_info, where=where)


class SlotCollate:
    """torch's ``default_collate``, with each stacked tensor allocated in the current arena.

    Stacking straight into shared memory writes every batch once; torch's own collation in a
    worker allocates fresh shared memory for each batch instead. Outside an arena, or when the
    arena is full, it stacks into ordinary memory.
    """

    def __init__(self) -> None:
        self.arena: Arena | None = None
        self._table = dict(default_collate_fn_map)
        if self._table.get(torch.Tensor) is collate_tensor_fn:
            self._table[torch.Tensor] = self._stack

    def __call__(self, batch: Any) -> Any:
        return collate(batch, collate_fn_map=self._table)

    def _stack(self, batch: list[torch.Tensor], *, collate_fn_map: Any = None) -> torch.Tensor:
        elem = batch[0]
        if elem.is_nested or elem.layout != torch.strided or elem.device.type != "cpu":
            # torch's own stacking (and error): where the samples are (meta, CUDA), or a layout
            # the slot cannot hold
            return collate_tensor_fn(batch, collate_fn_map=collate_fn_map)
        shape = (len(batch), *elem.shape)
        out = self.arena.allocate(shape, elem.dtype) if self.arena else None
        # As torch's workers stack, into a tensor of the first sample's type: the others are
        # cast to it (or refused), whether the batch fits the arena or not.
        return torch.stack(batch, 0, out=torch.empty(shape, dtype=elem.dtype) if out is None
                           else out)


def process_worker(conn: Connection, spec: WorkerSpec, worker_id: int, base_seed: int,
                   shared_seed: int | None, states: dict[str, Any] | None, new_pass: bool,
                   collecting: bool) -> None:
    """A worker process: fetch what the main process asks for until told to stop or it is gone.

    ``shared_seed`` seeds a datapipe's random steps alike in every worker (``None``: no datapipe);
    ``states`` are a Stateful dataset's (and its iterator's) to resume from, after which a
    ``new_pass`` starts a new iterator, as a persistent worker does for its next epoch.
    ``collecting``: whether the main process collects garbage (it paused to start this one).
    """
    # What a forked worker inherited is the main process's to free: a CUDA tensor freed here
    # would make a CUDA call and abort this process. So no collection ever looks at it.
    gc.freeze()
    if collecting:
        gc.enable()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the main process's to handle
    torch.set_num_threads(1)
    seed_worker(spec, worker_id, base_seed)
    apply_shared_seed(spec.dataset, shared_seed)
    collate_fn = SlotCollate() if spec.collate_fn is torch_default_collate else spec.collate_fn
    try:
        _ProcessWorker(conn, spec, worker_id, collate_fn, states or {}, new_pass).run()
    except (EOFError, BrokenPipeError, ConnectionResetError):
        pass  # the main process went away: so does this worker
    finally:
        conn.close()


class _ProcessWorker:
    def __init__(self, conn: Connection, spec: WorkerSpec, worker_id: int, collate_fn: Any,
                 states: dict[str, Any], new_pass: bool) -> None:
        self.conn, self.spec, self.worker_id, self.collate_fn = conn, spec, worker_id, collate_fn
        self.parent = os.getppid()
        # Made once: ``Connection.poll`` builds a new selector every call, twice a batch.
        self.incoming = select.poll()
        self.incoming.register(conn.fileno(), select.POLLIN)
        self.slots: list[SharedSlot | None] = [None] * spec.slots
        self.sent = 0  # batches sent: slots are filled round-robin
        self.pending: deque[tuple[int | str, Any]] = deque()  # tasks, and a new pass after them
        self.init_failure: ExceptionWrapper | None = None
        self.keeps_states = False  # until a fetcher is made (a failed start makes none)
        try:
            if spec.init_fn is not None:
                spec.init_fn(worker_id)
            # As torchdata restores: the dataset, then a new iterator, then the iterator's state.
            if "dataset" in states:
                spec.dataset.load_state_dict(states["dataset"])
            self._new_fetcher()
            if "dataset_iter" in states:
                self.fetcher.dataset_iter.load_state_dict(states["dataset_iter"])
            if states and new_pass:  # the saved one ended: this worker goes on to the next
                self._new_fetcher()
            elif states.get("ended"):  # its stream ended with its last batch
                self.fetcher.ended = True
        except Exception:  # noqa: BLE001 - reported with the first task, as torch does
            self.init_failure = ExceptionWrapper(where=f"in DataLoader worker process {worker_id}")
        if spec.reports_start:  # the main process waits for this, as torchdata's does
            # A failure is raised there at once; a persistent worker then makes its fetcher at
            # the next epoch, as torch's does.
            failure = None if self.init_failure is None else packed(self.init_failure)
            send(conn, ("started", failure, self._sendable_states()))
            self.init_failure = None

    def _new_fetcher(self) -> None:
        self.fetcher = _DatasetKind.create_fetcher(self.spec.kind, self.spec.dataset,
                                                   self.spec.auto_collation, self.collate_fn,
                                                   self.spec.drop_last)
        # A Stateful dataset's state goes with each batch: the main process keeps the one of the
        # last batch it delivered, and a resume starts this worker from it.
        self.iterator = getattr(self.fetcher, "dataset_iter", None)
        self.keeps_states = keeps_states(self.spec.dataset, self.iterator)

    def run(self) -> None:
        """Read every message that has come (a stop overtakes queued tasks), then fetch one."""
        while True:
            busy = bool(self.pending)
            if busy and self._next_slot_full():  # the main process has not copied it out yet
                wait = SLOT_CHECK_MS
            else:
                wait = 0 if busy else PARENT_CHECK_MS
            if self.incoming.poll(wait):
                if not self._handle(receive(self.conn)):
                    return
            elif busy and not self._next_slot_full():
                task_id, index = self.pending.popleft()
                if task_id == "epoch":
                    self._begin_pass(*index)
                else:
                    self._fetch(task_id, index)
            elif not busy and os.getppid() != self.parent:  # orphaned: the main process died
                return

    def _next_slot_full(self) -> bool:
        slot = self.slots[self.sent % len(self.slots)]
        return slot is not None and slot.full

    def _handle(self, message: tuple) -> bool:
        """Act on one message from the main process; ``False`` means stop."""
        kind = message[0]
        if kind == "task":
            self.pending.append((message[1], message[2]))
        elif kind == "epoch":  # persistent workers: a new pass, once the last one's tasks are
            # done (the main process drops their batches), as torch's workers go on: what their
            # random draws leave for the next pass is the same however far the workers had got.
            self.pending.append(("epoch", message[1:]))
        return kind != "stop"

    def _begin_pass(self, epoch: int, shared_seed: int | None) -> None:
        # Where its dataset stands as the pass ends, with the batches it fetched that were never
        # delivered: the new pass goes on from there, and so must a resume of it.
        states = self._sendable_states()
        apply_shared_seed(self.spec.dataset, shared_seed)
        if self.init_failure is None:
            self._new_fetcher()
        send(self.conn, ("epoch", epoch, states))

    def _fetch(self, task_id: int, index: Any) -> None:
        if self.init_failure is not None:
            failure, self.init_failure = self.init_failure, None
            send(self.conn, ("error", task_id, packed(failure), 0.0, None))
            return
        started = time.perf_counter()
        slot_id = self.sent % len(self.slots)
        slot = self.slots[slot_id] or self._new_slot(slot_id, FIRST_SLOT_BYTES)
        arena, retired = Arena(slot), None
        if isinstance(self.collate_fn, SlotCollate):
            self.collate_fn.arena = arena
        states = None
        try:
            batch = self.fetcher.fetch(index)
            states = self._states()
            data, arrays = flatten(batch)
            offsets = pack(arrays, arena)
            if offsets is None:  # the slot is too small for this batch: a larger one replaces it
                retired = slot
                arena = Arena(self._new_slot(slot_id, max(bytes_needed(arrays) * 5 // 4,
                                                          2 * slot.size)))
                offsets = pack(arrays, arena)
            del batch, arrays
            message = ("batch", task_id, slot_id, data, offsets, time.perf_counter() - started,
                       states)
            payload = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)  # may fail: here
        # Any exception is re-raised by the caller, SystemExit too, as worker threads do (a
        # process ended by it would be reported dead, with neither its indices nor its traceback)
        except BaseException as error:  # noqa: BLE001
            if isinstance(error, StopIteration) and self.spec.kind == _DatasetKind.Iterable:
                # This worker's share of the stream is used up; its dataset may have reset.
                message = ("end", task_id, self._states())
            else:
                failure = _unpicklable(states, self.worker_id)
                after = None
                if failure is None:  # the data failed: its dataset's states go on past it
                    failure = task_failure(self.worker_id, index)
                    after = self._sendable_states()
                message = ("error", task_id, packed(failure), time.perf_counter() - started,
                           after)
        finally:
            if isinstance(self.collate_fn, SlotCollate):
                self.collate_fn.arena = None
        if retired is not None:
            _close_quietly(retired)
        if message[0] == "batch":
            arena.slot.full = True
            self.sent += 1
        else:
            payload = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        self.conn.send_bytes(payload)

    def _states(self) -> dict[str, Any] | None:
        """A Stateful dataset's states after a batch, to go with it (None: it keeps none)."""
        if not self.keeps_states:
            return None
        return dataset_states(self.spec.dataset, self.iterator, copied=False,
                              ended=getattr(self.fetcher, "ended", False))

    def _sendable_states(self) -> dict[str, Any] | None:
        """A Stateful dataset's states as they stand, for a message that goes out whatever they
        are (a failed batch's, a new pass's acknowledgement): None where they cannot be taken or
        pickled, which the batches report themselves."""
        try:
            states = self._states()
        except Exception:  # noqa: BLE001 - reported with the batches, not here
            return None
        return None if _unpicklable(states, self.worker_id) is not None else states

    def _new_slot(self, slot_id: int, size: int) -> SharedSlot:
        """A new slot in place of ``slot_id``: its descriptor goes to the main process."""
        slot = SharedSlot(max(size, FIRST_SLOT_BYTES))
        self.slots[slot_id] = slot
        send(self.conn, ("slot", slot_id, slot.size))
        send_descriptor(self.conn, slot.fd, self.parent)
        return slot


# A worker's failure as it travels: its exception's class pickled on its own (None where it does
# not pickle), the class's name, the traceback's text and where it happened.
PackedFailure = tuple[bytes | None, str, str, str]


def packed(failure: ExceptionWrapper) -> PackedFailure:
    """``failure`` for the message to the main process, from which :func:`unpacked` makes it
    again even where its exception's class cannot be pickled (one defined in a function) or
    loaded there (a module only the worker imported): the rest of the message is not lost."""
    try:
        kind = pickle.dumps(failure.exc_type)
    except Exception:  # noqa: BLE001 - whatever stops it, the class stays in this process
        kind = None
    return kind, failure.exc_type.__name__, failure.exc_msg, failure.where


def unpacked(failure: PackedFailure) -> ExceptionWrapper:
    """The failure :func:`packed` packed; an exception whose class cannot be pickled or loaded
    here comes as a ``RuntimeError`` that names it, with its traceback.

    >>> class Local(Exception): pass
    >>> try:
    ...     raise Local("sample 3 is corrupt")
    ... except Local:
    ...     failure = unpacked(packed(ExceptionWrapper(where="in DataLoader worker process 0")))
    >>> failure.exc_type.__name__, failure.where
    ('RuntimeError', 'in DataLoader worker process 0 (raised Local, whose class cannot be pickled)')
    """
    kind, name, text, where = failure
    wrapper = ExceptionWrapper((RuntimeError, RuntimeError(), None), where)
    wrapper.exc_msg = text
    why = "cannot be pickled"
    if kind is not None:
        try:
            wrapper.exc_type = pickle.loads(kind)
            return wrapper
        except Exception as error:  # noqa: BLE001 - a module only the worker has, say
            why = f"cannot be loaded in this process: {error}"
    wrapper.where += f" (raised {name}, whose class {why})"
    return wrapper


def _unpicklable(states: dict[str, Any] | None, worker_id: int) -> ExceptionWrapper | None:
    """The error of pickling a dataset's states, when that is what failed (they go with each
    batch, so a state that does not pickle fails every batch, and is named, not the data)."""
    if states is None:
        return None
    try:
        pickle.dumps(states, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception:  # noqa: BLE001 - re-raised by the caller, with this traceback
        return ExceptionWrapper(where=f"in DataLoader worker process {worker_id} while pickling "
                                      "its dataset's state_dict(), which goes with each batch "
                                      "and so must pickle")
    return None


def _close_quietly(slot: SharedSlot) -> None:
    try:
        slot.close()
    except BufferError:  # something the dataset keeps still looks into it: leave it mapped
        pass
