"""The workers as the main process sees them: hand a task to a worker, take what comes back.

Two kinds, one interface. :class:`ProcessPool` runs worker processes, each on one duplex pipe,
and notices a dead worker the moment it dies: the pipes and the processes' sentinels are waited
on together. :class:`ThreadPool` runs worker threads in this process, for work that releases the
GIL (NumPy, decoding, I/O), with no copies at all.
"""

from __future__ import annotations

import contextlib
import gc
import multiprocessing as mp
import os
import pickle
import queue
import select
import signal
import socket
import threading
import time
import warnings
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

from torch._utils import ExceptionWrapper
from torch.utils.data.dataloader import _DatasetKind

from shardwise.loader.position import dataset_states, keeps_states
from shardwise.loader.transport import SharedSlot, framed, receive, receive_descriptor, unpack
from shardwise.loader.workers import WorkerSpec, process_worker, task_failure, unpacked
from shardwise.switches import OffWhileUsed

# A stopped worker gets this long to exit before it is killed: it holds nothing worth saving.
GRACE_SECONDS = 0.5
# After an error (a timeout, Ctrl-C, a dead worker) the caller should hear of it at once: a
# worker that is not idle, waiting for the stop, is killed sooner.
ABORT_GRACE_SECONDS = 0.05


@dataclass
class Event:
    """What a worker sent back: a ``"batch"``, an ``"error"``, the ``"end"`` of its stream."""

    kind: str
    task_id: int
    worker: int
    payload: Any = None  # the batch, or the worker's ExceptionWrapper
    busy: float = 0.0  # seconds the worker spent on the task
    states: dict[str, Any] | None = None  # a Stateful dataset's, after the batch


class FailedFetch(Exception):
    """A worker thread's batch that raised (the ``__cause__``), with its dataset's states after
    it, so that a resume does not read it again."""

    def __init__(self, states: dict[str, Any] | None) -> None:
        super().__init__()
        self.states = states


class WorkerDied(RuntimeError):
    """A worker process exited while the loader still needed it."""


class TimedOut(RuntimeError):
    """No batch came within the loader's ``timeout``: the workers go on, and asking again waits
    again, as with torch's loader (stages go on past it too: ``pass_goes_on``)."""

    pass_goes_on = True



# The main process's ends of its workers' pipes. A process forked from it closes them: a worker
# holding its own (or another's) would never see the pipe close when the main process dies, and
# would go on loading, or wait forever to write a batch nobody reads.
_MAIN_ENDS: weakref.WeakSet[Connection] = weakref.WeakSet()


def _close_main_ends() -> None:
    for conn in list(_MAIN_ENDS):
        conn.close()
    _MAIN_ENDS.clear()


os.register_at_fork(after_in_child=_close_main_ends)


class WorkersLate(RuntimeError):
    """Persistent workers did not begin a new pass within the loader's ``timeout``: still busy
    with the last pass's work, they go on and begin it, and the next ``iter()`` waits again."""


class Workers:
    """A pool and the base seed it was started with, stopped when its owner is garbage (or at exit).

    The owner is the loader when workers persist across epochs, else the pass's iterator.
    """

    def __init__(self, pool: ProcessPool | ThreadPool, base_seed: int, owner: object) -> None:
        self.pool, self.base_seed = pool, base_seed
        self._closer = weakref.finalize(owner, pool.close)

    @property
    def alive(self) -> bool:
        """Whether they run for this process: a process forked from the one that started them
        has none of them (its loader starts its own)."""
        return self._closer.alive and os.getpid() == self.pool._pid

    def close(self, grace: float = GRACE_SECONDS) -> None:
        """Stop the workers, giving each ``grace`` seconds to finish what it is on."""
        if self._closer.detach() is not None:
            self.pool.close(grace)

    def hand_to(self, owner: object) -> None:
        """Stop with ``owner`` instead (a pass still running on workers its loader lets go of)."""
        if self._closer.detach() is not None:
            self._closer = weakref.finalize(owner, self.pool.close)

    def __reduce__(self) -> Any:
        # A copy would own the same pipes and close them under the workers: refused, as torch
        # refuses to pickle its iterator (a loader's copy leaves its workers out).
        raise NotImplementedError(f"{type(self).__name__} cannot be pickled or copied")


def start_method_context(requested: Any) -> Any:
    """The multiprocessing context for worker processes: the one asked for, else Python's
    default (``set_start_method``'s, else the platform's: ``fork`` on Linux before Python 3.14),
    as torch's loader starts its workers.

    A CUDA context made here before the workers start does not change it (torch's does not): a
    forked worker cannot use CUDA, but datasets load on the CPU, and another method would need
    the dataset to pickle and would lose what the main process set at run time.
    """
    return mp.get_context() if requested is None else requested


def _set_collection(on: bool) -> bool:
    before = gc.isenabled()
    if on:
        gc.enable()
    else:
        gc.disable()
    return before


# No garbage collection while workers start (loaders in other threads may start theirs too). A
# forked worker starts with collection off, as it was here, and freezes what it inherited before
# turning it back on: it never frees the main process's garbage (a CUDA tensor freed in a forked
# child makes a CUDA call there and aborts it), and this process's own collections go on as
# before.
_COLLECTION = OffWhileUsed(_set_collection)

# torch's words, so that what users search for finds the answer.
_PICKLE_HINT = (
    "Got pickle error when attempting to start a worker Process. This might be because the "
    "worker Process arguments are not picklable. Python 3.14+ changed the multiprocessing start "
    "method in non-Mac POSIX platforms to 'forkserver', which requires the worker Process "
    "arguments to be picklable. You can also try multiprocessing.set_start_method('fork').")


class ProcessPool:
    """Worker processes, each fed tasks on its own pipe and returning batches in shared memory.

    This process never waits for a worker to read what it sends: what the pipe cannot take at
    once, a thread per worker writes (as torch's index queues' feeder threads do). Else a long
    list of indices sent to a worker busy sending a large message, an error's long text, say,
    would leave each waiting for the other; and a task the pipe could not take whole would wait
    for this process, not go while the caller works on its batches.
    """

    def __init__(self, spec: WorkerSpec, base_seed: int, shared_seed: int | None, context: Any,
                 pin: bool, states: list[dict[str, Any] | None], new_passes: list[bool]
                 ) -> None:
        """``states``: each worker's dataset's to resume from, then on a new pass or not."""
        self.num_workers, self.pin = spec.num_workers, pin
        self._reports_start = spec.reports_start
        self._pid = os.getpid()
        self.conns: list[Connection] = []
        self.procs: list[Any] = []
        self.slots: list[list[SharedSlot | None]] = []
        self._senders: list[_Sender] = []
        self._epoch = 0
        # One poller for the pipes and the process sentinels, made once: a dead worker wakes it.
        self._poller = select.poll()
        self._pipes: dict[int, int] = {}
        self._sentinels: dict[int, int] = {}
        with _COLLECTION.off() as collecting:
            for worker in range(spec.num_workers):
                ours, theirs = context.Pipe(duplex=True)
                _MAIN_ENDS.add(ours)
                proc = context.Process(target=process_worker,
                                       args=(theirs, spec, worker, base_seed, shared_seed,
                                             states[worker], new_passes[worker], collecting),
                                       name=f"shardwise-worker-{worker}", daemon=True)
                try:
                    proc.start()
                except BaseException as error:  # the workers started so far stop too
                    ours.close()
                    theirs.close()
                    self.close()
                    if isinstance(error, (TypeError, AttributeError, pickle.PicklingError)):
                        warnings.warn(_PICKLE_HINT, stacklevel=2)
                    raise
                theirs.close()
                self.conns.append(ours)
                self.procs.append(proc)
                self.slots.append([None] * spec.slots)
                self._pipes[ours.fileno()] = self._sentinels[proc.sentinel] = worker
                self._poller.register(ours.fileno(), select.POLLIN)
                self._poller.register(proc.sentinel, select.POLLIN)
        # Made once every worker has started: no worker is forked while their threads run.
        self._senders = [_Sender(worker, conn.fileno()) for worker, conn in enumerate(self.conns)]

    def submit(self, worker: int, task_id: int, index: Any) -> None:
        self._send(worker, ("task", task_id, index))

    def _send(self, worker: int, message: tuple) -> None:
        self._senders[worker].send(framed(message))

    def receive(self, timeout: float | None) -> Event | None:
        """The next thing any worker sent; ``None`` when ``timeout`` seconds pass first."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = None if deadline is None else max(0, int((deadline - time.monotonic()) * 1000))
            ready = [fd for fd, _ in self._poller.poll(left)]
            if not ready:
                return None
            for worker in (self._pipes[fd] for fd in ready if fd in self._pipes):
                try:
                    event = self._read(worker)
                except (EOFError, OSError):  # its end of the pipe closed: it died
                    raise WorkerDied(self._death_notice(worker)) from None
                if event is not None:
                    return event
            for worker in (self._sentinels[fd] for fd in ready if fd in self._sentinels):
                if not self.conns[worker].poll(0):  # it has nothing more to say: it is gone
                    raise WorkerDied(self._death_notice(worker))

    def _read(self, worker: int) -> Event | None:
        conn = self.conns[worker]
        message = receive(conn)
        kind = message[0]
        if kind == "slot":  # a new (larger) slot: its descriptor follows on the pipe
            slot_id, size = message[1], message[2]
            old, self.slots[worker][slot_id] = self.slots[worker][slot_id], None
            if old is not None:
                old.close()
            self.slots[worker][slot_id] = SharedSlot(size, receive_descriptor(conn))
            return None
        if kind == "batch":
            _, task_id, slot_id, data, offsets, busy, states = message
            slot = self.slots[worker][slot_id]
            try:
                batch = unpack(data, offsets, slot, pin=self.pin)
            except Exception:  # noqa: BLE001 - it fails its batch alone, raised as it is
                where = f"rebuilding the batch DataLoader worker process {worker} sent"
                return Event("error", task_id, worker, ExceptionWrapper(where=where), busy, states)
            finally:
                slot.full = False  # copied out: the worker may fill it again
            return Event("batch", task_id, worker, batch, busy, states)
        if kind == "error":
            return Event("error", message[1], worker, unpacked(message[2]), message[3],
                         message[4])
        if kind == "end":
            return Event("end", message[1], worker, states=message[2])
        if kind == "epoch":
            return Event("epoch", message[1], worker, states=message[2])
        if kind == "started":
            failure = None if message[1] is None else unpacked(message[1])
            return Event("started", -1, worker, failure, states=message[2])
        raise AssertionError(f"unexpected message {kind!r} from DataLoader worker {worker}")

    def wait_started(self, timeout: float | None
                     ) -> tuple[ExceptionWrapper | None, list[dict[str, Any] | None]]:
        """Wait until every worker has started, where they report it (``WorkerSpec``): the
        lowest failed worker's error, which ``iter()`` raises, as torchdata's loader does (every
        report is read: none is left in a persistent worker's pipe), and each worker's Stateful
        dataset's states as it began (None: it keeps none)."""
        waiting = set(range(self.num_workers)) if self._reports_start else set()
        failures = {}
        states: list[dict[str, Any] | None] = [None] * self.num_workers
        deadline = None if timeout is None else time.monotonic() + timeout
        while waiting:
            event = self.receive(None if deadline is None else deadline - time.monotonic())
            if event is None:
                raise RuntimeError(f"DataLoader timed out after {timeout} seconds waiting for "
                                   f"worker processes {sorted(waiting)} to start")
            waiting.discard(event.worker)
            states[event.worker] = event.states
            if event.payload is not None:
                failures[event.worker] = event.payload
        return (failures[min(failures)] if failures else None), states

    def new_epoch(self, shared_seed: int | None, timeout: float | None
                  ) -> list[dict[str, Any] | None]:
        """Persistent workers: finish the last pass's tasks (their batches are dropped) and
        start the dataset afresh, as torch's persistent workers do.

        ``shared_seed`` reseeds a datapipe's random steps for the new pass. Returns each
        worker's Stateful dataset's states as it starts the pass (None: it keeps none).
        """
        self._epoch += 1
        for worker in range(len(self.conns)):
            self._send(worker, ("epoch", self._epoch, shared_seed))
        return [event.states for event in _new_pass_begun(self, self._epoch, timeout)]

    def close(self, grace: float = GRACE_SECONDS) -> None:
        """Stop every worker: ``grace`` seconds to finish the sample at hand, then it is killed."""
        if os.getpid() != self._pid:  # a forked child's exit: the workers are not its own
            return
        for sender in self._senders:  # (after the tasks it has not read: killed after grace)
            sender.finish(framed(("stop",)))
        deadline = time.monotonic() + grace
        try:
            for proc in self.procs:
                proc.join(max(0.0, deadline - time.monotonic()))
        finally:  # (a Ctrl-C in the grace period: nothing is left open all the same)
            for proc in self.procs:
                if proc.is_alive():
                    proc.kill()
                    proc.join()
            # A sender still writing stops before its pipe is closed under it (whose number could
            # then be another file's): a worker's child may hold the worker's end open.
            for conn in self.conns:
                with (socket.fromfd(conn.fileno(), socket.AF_UNIX, socket.SOCK_STREAM) as end,
                      contextlib.suppress(OSError)):  # (where the worker's end is closed already)
                    end.shutdown(socket.SHUT_RDWR)  # (a hang-up: wakes a wait to write too)
            for sender in self._senders:
                if sender.thread is not None:
                    sender.thread.join()
            for conn in self.conns:
                conn.close()
            for slots in self.slots:
                for slot in slots:
                    if slot is not None:
                        slot.close()
            self.conns, self.procs, self.slots, self._senders = [], [], [], []

    def _death_notice(self, worker: int) -> str:
        proc = self.procs[worker]
        proc.join(1.0)  # reap it, so its exit code is known
        code = proc.exitcode
        if code is not None and code < 0:  # torch's own words first: tests and logs match them
            name = signal.Signals(-code).name
            cause = {"SIGKILL": ": often the out-of-memory killer",
                     "SIGSEGV": ": a crash in native code",
                     "SIGBUS": ": shared memory ran out"}.get(name, "")
            how = (f"is killed by signal: {signal.strsignal(-code)}. It was worker {worker}, "
                   f"killed by {name} (signal {-code}){cause}")
        else:
            how = f"exited unexpectedly with exit code {code}. It was worker {worker}"
        return f"DataLoader worker (pid {proc.pid}) {how}; the other workers were stopped"


class _Sender:
    """Sends a worker its messages, in order: what its pipe takes at once from this thread (a
    thread's hand-off costs more than a small task's write), the rest from a thread of its own,
    started when a message first waits (most loaders' tasks never do). (A dead worker's messages
    go nowhere: the wait for its batches reports it.)"""

    def __init__(self, worker: int, fd: int) -> None:
        self.worker, self.fd = worker, fd
        self.outbox: queue.SimpleQueue[memoryview | None] = queue.SimpleQueue()
        self.queued = 0  # messages in the outbox, or being written by the thread
        self.lock = threading.Lock()
        self.thread: threading.Thread | None = None

    def send(self, message: bytes) -> None:
        unsent = memoryview(message)
        with self.lock:
            if not self.queued:  # the thread is idle: none of the pipe's writers but this one
                os.set_blocking(self.fd, False)
                try:
                    unsent = unsent[os.write(self.fd, unsent):]
                except BlockingIOError:
                    pass  # the pipe is full
                except OSError:
                    return  # the worker is gone
                finally:
                    os.set_blocking(self.fd, True)
            if unsent:
                self.queued += 1
                self.outbox.put(unsent)
                if self.thread is None:
                    self.thread = threading.Thread(target=self._run, daemon=True,
                                                   name=f"shardwise-sender-{self.worker}")
                    self.thread.start()

    def finish(self, message: bytes) -> None:
        """Send ``message``, the last: the thread, if any, ends once it is written."""
        self.send(message)
        self.outbox.put(None)

    def _run(self) -> None:
        while (unsent := self.outbox.get()) is not None:
            try:
                while unsent:
                    try:
                        unsent = unsent[os.write(self.fd, unsent):]
                    except BlockingIOError:  # made non-blocking a moment (see send_descriptor)
                        writable = select.poll()
                        writable.register(self.fd, select.POLLOUT)
                        writable.poll()
            except OSError:  # the worker is gone
                return
            with self.lock:
                self.queued -= 1


class ThreadPool:
    """Worker threads in this process: batches come back as they are, with no copy.

    For an ``IterableDataset`` the threads share one iterator and take their batches from it in
    task order, so the stream is read once, in order, as with no workers at all. A Stateful
    dataset's states go with each batch, as they stand after it (the stream's exactly; a map
    dataset's as the threads left it).
    """

    def __init__(self, spec: WorkerSpec, stream_states: dict[str, Any] | None = None) -> None:
        """``stream_states``: where a Stateful stream resumes (its iterator's state, and
        whether it had ended)."""
        self.num_workers = spec.num_workers
        self._pid = os.getpid()
        self.spec = spec
        self.results: queue.SimpleQueue[Event] = queue.SimpleQueue()
        self.tasks: list[queue.SimpleQueue[Any]] = [queue.SimpleQueue() for _ in range(spec.num_workers)]
        self._stopping = threading.Event()
        self._epoch = 0
        self._start_epoch(stream_states or {})
        self.threads = [
            threading.Thread(target=self._work, args=(worker,), daemon=True,
                             name=f"shardwise-worker-{worker}")
            for worker in range(spec.num_workers)
        ]
        for thread in self.threads:
            thread.start()

    def _start_epoch(self, stream_states: dict[str, Any] | None = None) -> None:
        """A new pass: a stream's new iterator (``self.iterator``), or a map dataset's fetcher;
        ``self.fetch(task_id, index)`` gives a batch and the dataset's states after it."""
        self.iterator: Any = None
        self._stream: SharedStream | None = None
        if self.spec.kind == _DatasetKind.Iterable:
            stream = self._stream = SharedStream(self.spec, stream_states or {})
            self.fetch: Callable[[int, Any], tuple[Any, Any]] = stream.fetch
            self.iterator = stream.iterator
            return
        fetcher = _DatasetKind.create_fetcher(self.spec.kind, self.spec.dataset,
                                              self.spec.auto_collation,
                                              self.spec.collate_fn, self.spec.drop_last)
        keeps = keeps_states(self.spec.dataset)

        def states() -> dict[str, Any] | None:  # as the threads left the dataset
            return dataset_states(self.spec.dataset, None) if keeps else None

        def fetch(task_id: int, index: Any) -> tuple[Any, Any]:
            try:
                batch = fetcher.fetch(index)
            except Exception as error:
                raise FailedFetch(states()) from error
            return batch, states()

        self.fetch = fetch

    def submit(self, worker: int, task_id: int, index: Any) -> None:
        self.tasks[worker].put((task_id, index))

    def receive(self, timeout: float | None) -> Event | None:
        try:
            return self.results.get(timeout=timeout)
        except queue.Empty:
            return None

    def new_epoch(self, shared_seed: int | None, timeout: float | None
                  ) -> list[dict[str, Any] | None]:
        """Start the dataset afresh (a datapipe was already reseeded, in this process).

        Returns no worker states: the threads' dataset is this process's own.
        """
        self._epoch += 1
        for tasks in self.tasks:  # after the last pass's tasks, as worker processes take it
            tasks.put(("epoch", self._epoch))
        _new_pass_begun(self, self._epoch, timeout)  # each thread finished the last pass's tasks
        self._start_epoch()
        return []

    def close(self, grace: float = GRACE_SECONDS) -> None:
        """Stop the threads after the batch each is on (a thread cannot be interrupted),
        waiting ``grace`` seconds for them."""
        if os.getpid() != self._pid:  # a forked child has none of these threads
            return
        self._stopping.set()
        for tasks in self.tasks:
            tasks.put(None)
        if self._stream is not None:  # (a thread stopped before its task leaves later ones waiting)
            self._stream.abandon()
        deadline = time.monotonic() + grace
        for thread in self.threads:
            if thread is not threading.current_thread():
                thread.join(max(0.0, deadline - time.monotonic()))
        self.threads = []  # a thread still busy is a daemon: it ends with its batch

    def _work(self, worker: int) -> None:
        while (task := self.tasks[worker].get()) is not None and not self._stopping.is_set():
            task_id, index = task
            if task_id == "epoch":
                self.results.put(Event("epoch", index, worker))
                continue
            started = time.perf_counter()
            try:
                batch, states = self.fetch(task_id, index)
                event = Event("batch", task_id, worker, batch, states=states)
            # Any exception is re-raised by the caller, SystemExit too: a thread that ended
            # with one would leave its batch, and the caller, waiting forever.
            except BaseException as error:  # noqa: BLE001
                if isinstance(error, StopIteration) and self.spec.kind == _DatasetKind.Iterable:
                    event = Event("end", task_id, worker)
                elif isinstance(error, FailedFetch):
                    event = Event("error", task_id, worker,
                                  task_failure(worker, index, error.__cause__), states=error.states)
                else:
                    event = Event("error", task_id, worker, task_failure(worker, index))
            event.busy = time.perf_counter() - started
            self.results.put(event)


def _new_pass_begun(pool: ProcessPool | ThreadPool, epoch: int, timeout: float | None
                    ) -> list[Event]:
    """Every worker's word that it began pass ``epoch``, in worker order; what the pass before
    still sends is dropped. As torch's loader waits for its persistent workers, each message
    may take ``timeout`` seconds (None: as long as it takes), after which its timeout error."""
    begun: dict[int, Event] = {}
    while len(begun) < pool.num_workers:
        event = pool.receive(timeout)
        if event is None:
            late = sorted(set(range(pool.num_workers)) - set(begun))
            raise WorkersLate(f"DataLoader timed out after {timeout} seconds waiting for workers "
                              f"{late} to finish their last pass's work and begin the next")
        if event.kind == "epoch" and event.task_id == epoch:
            begun[event.worker] = event
    return [begun[worker] for worker in range(pool.num_workers)]


class SharedStream:
    """One iterator over an ``IterableDataset``, read a batch at a time in task order by threads.

    The thread with task ``k`` waits until tasks ``0 .. k-1`` have taken their items, takes its
    own, and collates them outside the lock.
    """

    def __init__(self, spec: WorkerSpec, states: dict[str, Any]) -> None:
        self.spec = spec
        self.iterator = iter(spec.dataset)
        if "dataset_iter" in states:
            self.iterator.load_state_dict(states["dataset_iter"])
        self.keeps_states = keeps_states(spec.dataset, self.iterator)
        self.ended = bool(states.get("ended"))
        self.turn = 0
        self.abandoned = False
        self.changed = threading.Condition()

    def abandon(self) -> None:
        """End the waits for turns: threads stopped before they took theirs leave them unserved."""
        with self.changed:
            self.abandoned = True
            self.changed.notify_all()

    def fetch(self, task_id: int, index: Any) -> tuple[Any, Any]:
        """Task ``task_id``'s batch, and the stream's states right after it was taken."""
        with self.changed:
            self.changed.wait_for(lambda: self.turn == task_id or self.abandoned)
            if self.abandoned:
                raise StopIteration
            try:
                items = self._take(index)
            except StopIteration:
                raise
            except Exception as error:  # the stream went on past the items it took
                raise FailedFetch(self._states()) from error
            else:
                states = self._states()
            finally:
                self.turn += 1
                self.changed.notify_all()
        try:
            return self.spec.collate_fn(items), states
        except Exception as error:
            raise FailedFetch(states) from error

    def _states(self) -> dict[str, Any] | None:
        """The stream's states as they stand (None: it keeps none)."""
        if not self.keeps_states:
            return None
        return dataset_states(self.spec.dataset, self.iterator, ended=self.ended)

    def _take(self, index: Any) -> Any:
        """The items of one batch, as torch's iterable fetcher takes them."""
        if self.ended:
            raise StopIteration
        if not self.spec.auto_collation:
            return next(self.iterator)
        items = []
        for _ in index:
            try:
                items.append(next(self.iterator))
            except StopIteration:
                self.ended = True
                break
        if not items or (self.spec.drop_last and len(items) < len(index)):
            raise StopIteration
        return items
