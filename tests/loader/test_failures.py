"""Failures reach the caller clearly and at once, and nothing is left behind, however a pass ends.

Leftovers are counted for real: child processes, threads, shared-memory mappings and open file
descriptors of this process, before and after.
"""

import copy
import gc
import os
import pickle
import signal
import subprocess
import sys
import textwrap
import threading
import time
import weakref
from collections.abc import Callable
from functools import partial
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader as TorchLoader
from torch.utils.data import Dataset

from shardwise import DataLoader, DistributedSampler
from shardwise.loader.pools import WorkerDied

pytestmark = pytest.mark.timeout(60)
WORKER_TYPES = ["process", "thread"]


class Failing(Dataset):
    """Index 7 raises; with ``kill`` set, index 10 ends the worker with that signal."""

    def __init__(self, kill: int | None = None, sleep: float = 0.0) -> None:
        self.kill, self.sleep = kill, sleep

    def __len__(self) -> int:
        return 64

    def __getitem__(self, index: int) -> torch.Tensor:
        if self.sleep:
            time.sleep(self.sleep)
        if index == 7 and self.kill is None:
            raise ValueError(f"sample {index} is corrupt")
        if index == 10 and self.kill is not None:
            os.kill(os.getpid(), self.kill)
        return torch.full((4,), float(index))


def leftovers() -> dict:
    """What loaders could leave behind in this process."""
    maps = Path("/proc/self/maps").read_text() if Path("/proc/self/maps").exists() else ""
    return {"children": sorted(_children()),
            "threads": sorted(t.name for t in threading.enumerate()),
            "slots": maps.count("shardwise-slot"),
            "fds": len(os.listdir("/proc/self/fd")) if Path("/proc/self/fd").exists() else 0}


def _children() -> list[int]:
    import multiprocessing

    return [p.pid for p in multiprocessing.active_children()]


@pytest.fixture
def clean():
    """Assert that the test leaves nothing behind."""
    gc.collect()
    before = leftovers()
    yield
    gc.collect()
    deadline = time.monotonic() + 10  # a worker thread finishes the batch it is on
    while leftovers() != before and time.monotonic() < deadline:
        time.sleep(0.1)
        gc.collect()
    assert leftovers() == before


@pytest.mark.parametrize("worker_type", WORKER_TYPES)
def test_a_worker_exception_names_the_worker_the_indices_and_the_traceback(worker_type, clean):
    loader = DataLoader(Failing(), batch_size=4, num_workers=2, worker_type=worker_type)
    with pytest.raises(ValueError) as raised:
        list(loader)
    message = str(raised.value)
    assert "Caught ValueError in DataLoader worker process 1" in message
    assert "indices [4, 5, 6, 7]" in message
    assert "sample 7 is corrupt" in message and "in __getitem__" in message  # the traceback


class Exits(Dataset):
    def __len__(self) -> int:
        return 8

    def __getitem__(self, index: int) -> torch.Tensor:
        if index == 5:
            sys.exit("sample 5 ends the program")
        return torch.tensor(index)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("worker_type", WORKER_TYPES)
def test_a_worker_that_raises_system_exit_raises_it_here_as_no_workers_would(worker_type, clean):
    loader = DataLoader(Exits(), batch_size=2, num_workers=2, worker_type=worker_type)
    iterator = iter(loader)
    assert next(iterator).tolist() == [0, 1] and next(iterator).tolist() == [2, 3]
    with pytest.raises(SystemExit, match="sample 5 ends the program"):
        next(iterator)
    assert next(iterator).tolist() == [6, 7]  # the pass goes on, as after any failed batch
    with pytest.raises(SystemExit, match="sample 5 ends the program"):
        list(TorchLoader(Exits(), batch_size=2))


class RaisesAtFive(Dataset):
    """Sample 5 raises ``error(its message)``."""

    def __init__(self, error: Callable[[str], Exception]) -> None:
        self.error = error

    def __len__(self) -> int:
        return 8

    def __getitem__(self, index: int) -> torch.Tensor:
        if index == 5:
            raise self.error(f"sample {index} is corrupt")
        return torch.tensor(index)


@pytest.mark.parametrize("where", ["__getitem__", "worker_init_fn"])
def test_an_exception_whose_class_cannot_be_pickled_arrives_named(where, clean):
    class LocalError(Exception):  # defined in a function: pickle cannot find it by name
        pass

    def init(worker_id: int) -> None:
        raise LocalError(f"worker {worker_id} cannot start")

    loader = DataLoader(RaisesAtFive(LocalError), batch_size=2, num_workers=1,
                        worker_init_fn=init if where == "worker_init_fn" else None)
    with pytest.raises(RuntimeError) as raised:
        list(loader)
    message = str(raised.value)
    assert "raised LocalError, whose class cannot be pickled" in message
    assert "in DataLoader worker process 0" in message and "Traceback" in message
    if where == "__getitem__":
        assert "while loading indices [4, 5]" in message and "sample 5 is corrupt" in message
    else:
        assert "worker 0 cannot start" in message


def _workers_only_error(folder: str, message: str) -> Exception:
    """An exception whose class lives in a module in ``folder``, which only the workers import."""
    sys.path.insert(0, folder)
    from workers_only import WorkersOnlyError

    return WorkersOnlyError(message)


def test_an_exception_whose_class_this_process_cannot_load_fails_its_batch_alone(tmp_path,
                                                                                  clean):
    (tmp_path / "workers_only.py").write_text("class WorkersOnlyError(Exception):\n    pass\n")
    iterator = iter(DataLoader(RaisesAtFive(partial(_workers_only_error, str(tmp_path))),
                               batch_size=2, num_workers=1))
    assert next(iterator).tolist() == [0, 1] and next(iterator).tolist() == [2, 3]
    with pytest.raises(RuntimeError, match="raised WorkersOnlyError, whose class cannot be "
                                           "loaded in this process: No module named") as raised:
        next(iterator)
    assert "sample 5 is corrupt" in str(raised.value)
    assert next(iterator).tolist() == [6, 7]  # the pass goes on
    del raised, iterator


class Endless(torch.utils.data.IterableDataset):
    def __iter__(self):
        return iter(range(10**6))


def _slow_first(items: list[int]) -> torch.Tensor:
    if items[0] == 0:
        time.sleep(0.5)  # batch 0 collates slowly; the next ones are quick
    return torch.tensor(items)


@pytest.mark.timeout(60)
def test_a_stream_pass_dropped_while_threads_wait_for_their_turn_leaves_no_thread(clean):
    """A thread stopped before the task it was given leaves the later tasks' turns unserved:
    their threads are let go, not left waiting for them."""
    for _ in range(3):
        loader = DataLoader(Endless(), batch_size=2, num_workers=2, worker_type="thread",
                            collate_fn=_slow_first)
        batches = iter(loader)
        time.sleep(0.2)  # thread 1 did task 1 and waits for task 3's turn; task 2 is queued
        del batches, loader


class FailingStream(torch.utils.data.IterableDataset):
    def __iter__(self):
        yield from range(3)
        raise ValueError("the stream broke")


@pytest.mark.parametrize("worker_type", WORKER_TYPES)
def test_a_stream_error_names_the_worker_and_no_indices_as_torch(worker_type, clean):
    def message(loader) -> str:
        with pytest.raises(ValueError) as raised:
            list(loader)
        return str(raised.value).splitlines()[0]

    ours = message(DataLoader(FailingStream(), batch_size=2, num_workers=1,
                              worker_type=worker_type))
    assert ours == message(TorchLoader(FailingStream(), batch_size=2, num_workers=1))
    assert ours == "Caught ValueError in DataLoader worker process 0."


@pytest.mark.parametrize("workers,worker_type", [(0, "process"), (2, "process"), (2, "thread")])
def test_a_failed_batch_fails_alone_and_the_pass_goes_on_as_in_torch(workers, worker_type, clean):
    def outcomes(loader) -> list:
        iterator, seen = iter(loader), []
        while True:
            try:
                seen.append(next(iterator)[:, 0].tolist())
            except ValueError as error:
                seen.append(str(error).splitlines()[-1])
            except StopIteration:
                return seen

    torch_loader = torch.utils.data.DataLoader(Failing(), batch_size=4, num_workers=workers)
    ours = DataLoader(Failing(), batch_size=4, num_workers=workers, worker_type=worker_type)
    expected = outcomes(torch_loader)
    assert expected[1].endswith("sample 7 is corrupt") and len(expected) == 16
    assert outcomes(ours) == expected


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("sampler", ["shardwise", "torch"])
def test_a_resume_after_a_failed_batch_neither_repeats_nor_retries(workers, sampler):
    def make() -> DataLoader:
        if sampler == "shardwise":
            return DataLoader(Failing(), batch_size=4, num_workers=workers,
                              sampler=DistributedSampler(Failing(), num_replicas=1, rank=0, seed=1))
        return DataLoader(Failing(), batch_size=4, num_workers=workers, shuffle=True,
                          generator=torch.Generator().manual_seed(3))

    first, seen = iter(loader := make()), []
    while True:  # until index 7's batch raises
        try:
            seen.extend(next(first)[:, 0].int().tolist())
        except ValueError:
            break
    seen.extend(next(first)[:, 0].int().tolist())  # the pass goes on past it
    resumed = make()
    resumed.load_state_dict(loader.state_dict())
    seen += [int(value) for batch in resumed for value in batch[:, 0]]
    lost = set(range(64)) - set(seen)
    assert len(seen) == len(set(seen)) and 7 in lost and len(lost) == 4  # only that batch


@pytest.mark.parametrize("kill,name", [(signal.SIGKILL, "SIGKILL"), (signal.SIGSEGV, "SIGSEGV")])
def test_a_killed_worker_is_named_with_its_signal_at_once(kill, name, clean):
    iterator = iter(DataLoader(Failing(kill=kill), batch_size=2, num_workers=2))
    started = time.monotonic()
    with pytest.raises(RuntimeError, match=rf"DataLoader worker \(pid \d+\) is killed by signal: "
                                           rf".+\. It was worker 1, killed by {name} "
                                           rf"\(signal {int(kill)}\)"):
        list(iterator)
    assert time.monotonic() - started < 30  # noticed by its sentinel, not by a timeout
    # The pass is over, its rest lost: asking again says so rather than end as if whole.
    with pytest.raises(RuntimeError, match=r"this pass ended at an earlier error \(WorkerDied\)"):
        next(iterator)


def test_a_worker_killed_with_batches_still_in_its_pipe_is_named_when_its_next_task_fails(clean):
    # Its batches are read first; the task that follows them meets a closed pipe, and that too
    # says which worker died and how, as torch does, not as a bare BrokenPipeError.
    iterator = iter(DataLoader(Failing(kill=signal.SIGKILL), batch_size=1, num_workers=1))
    next(iterator)
    time.sleep(0.5)  # the prefetched batches are in its pipe
    os.kill(iterator._workers[0].pid, signal.SIGKILL)
    time.sleep(0.5)
    with pytest.raises(RuntimeError, match=r"DataLoader worker \(pid \d+\) is killed by signal: "
                                           r".+\. It was worker 0, killed by SIGKILL"):
        list(iterator)


@pytest.mark.parametrize("copy_loader", [copy.deepcopy, lambda l: pickle.loads(pickle.dumps(l))],
                         ids=["deepcopy", "pickle"])
def test_a_loader_copied_mid_pass_leaves_its_workers_to_the_original(copy_loader, clean):
    # torch refuses to copy a loader with persistent workers; a copy here is the same loader
    # with none of its own yet, and the original's workers and pipes are untouched by it.
    data = torch.arange(20.0)
    loader = DataLoader(data, batch_size=2, num_workers=2, persistent_workers=True)
    iterator = iter(loader)
    first = next(iterator)
    twin = copy_loader(loader)
    assert [b.tolist() for b in twin] == [b.tolist() for b in TorchLoader(data, 2)]
    assert next(iterator).tolist() == [2.0, 3.0] and first.tolist() == [0.0, 1.0]
    with pytest.raises(NotImplementedError, match="cannot be pickled"):
        pickle.dumps(iterator)  # a pass holds processes, as torch's does
    del iterator, loader, twin


@pytest.mark.parametrize("worker_type", WORKER_TYPES)
def test_timeout_is_honoured(worker_type, clean):
    loader = DataLoader(Failing(sleep=2.0), batch_size=2, num_workers=1, timeout=0.3,
                        worker_type=worker_type)
    iterator = iter(loader)
    with pytest.raises(RuntimeError, match=r"DataLoader timed out after 0.3 seconds"):
        next(iterator)
    for _ in range(30):  # the workers went on: asking again gets the late batch, as in torch
        try:
            assert next(iterator)[:, 0].tolist() == [0.0, 1.0]
            break
        except RuntimeError as error:
            assert "timed out" in str(error)
    else:
        pytest.fail("the late batch never came")
    del iterator


class SlowFromFour(Dataset):
    """Indices below 4 at once, the others after a second each."""

    def __len__(self) -> int:
        return 12

    def __getitem__(self, index: int) -> int:
        if index >= 4:
            time.sleep(1.0)
        return index


@pytest.mark.parametrize("worker_type", WORKER_TYPES)
def test_timeout_bounds_the_wait_for_persistent_workers_to_begin_a_new_pass(worker_type, clean):
    # As torch's loader: its persistent workers finish the work at hand before a new pass, and
    # go on with it after the timeout, to begin the pass asked for next.
    loader = DataLoader(SlowFromFour(), batch_size=2, num_workers=1, persistent_workers=True,
                        timeout=0.3, worker_type=worker_type)
    assert next(iter(loader)).tolist() == [0, 1]
    time.sleep(0.5)  # the worker is inside the slow [4, 5] (2 s), begun before the new pass
    workers = loader._workers
    with pytest.raises(RuntimeError, match=r"timed out after 0.3 seconds waiting for workers "
                                           r"\[0\] to finish their last pass's work"):
        iter(loader)
    assert loader._workers is workers
    time.sleep(2.0)  # [4, 5] done
    assert next(iter(loader)).tolist() == [0, 1] and loader._workers is workers
    del loader


class SlowEach(Dataset):
    def __len__(self) -> int:
        return 40

    def __getitem__(self, index: int) -> int:
        time.sleep(0.2)
        return index


@pytest.mark.parametrize("worker_type", WORKER_TYPES)
def test_timeout_bounds_each_of_the_last_passs_batches_a_new_pass_waits_for(worker_type, clean):
    # Six batches of 0.2 s were asked for ahead: a new pass waits for them all, as torch's
    # persistent workers finish theirs, and the timeout bounds each one, not their sum.
    loader = DataLoader(SlowEach(), batch_size=1, num_workers=1, persistent_workers=True,
                        timeout=0.7, prefetch_factor=6, worker_type=worker_type)
    iterator = iter(loader)
    assert [next(iterator).tolist() for _ in range(3)] == [[0], [1], [2]]
    assert next(iter(loader)).tolist() == [0]
    del iterator, loader


@pytest.mark.parametrize("worker_type", WORKER_TYPES)
@pytest.mark.parametrize("persistent", [False, True])
def test_break_and_garbage_collection_leave_nothing(worker_type, persistent, clean):
    loader = DataLoader(torch.arange(1000.0), batch_size=8, num_workers=2,
                        worker_type=worker_type, persistent_workers=persistent)
    for step, _ in enumerate(loader):
        if step == 3:
            break
    assert next(iter(loader)).tolist() == list(range(8))  # a second pass, dropped unfinished
    del loader


def test_a_finished_pass_stops_its_workers_at_once(clean):
    loader = DataLoader(torch.arange(100.0), batch_size=8, num_workers=2)
    assert len(list(loader)) == 13
    assert _children() == []  # no garbage collection needed


SCRIPT = textwrap.dedent("""
    import os, signal, sys, time, torch
    from shardwise import DataLoader, DistributedSampler

    class Slow(torch.utils.data.Dataset):
        def __len__(self): return 10_000
        def __getitem__(self, i):
            time.sleep(0.01)
            return i

    loader = DataLoader(Slow(), batch_size=4, num_workers=2, persistent_workers=True)
    iterator = iter(loader)
    next(iterator)
    print(" ".join(str(p.pid) for p in iterator._pool.procs), flush=True)
    if sys.argv[1] == "interrupt":
        os.kill(os.getpid(), signal.SIGINT)
        for batch in iterator:
            pass
    # "exit": leave with the workers running and the iterator alive
""")


@pytest.mark.parametrize("how", ["interrupt", "exit"])
def test_ctrl_c_and_interpreter_exit_leave_no_workers(tmp_path, how):
    script = tmp_path / "run.py"
    script.write_text(SCRIPT)
    run = subprocess.run([sys.executable, str(script), how], capture_output=True, text=True,
                         timeout=60)
    pids = [int(p) for p in run.stdout.split()]
    assert len(pids) == 2, run.stderr
    if how == "interrupt":
        assert "KeyboardInterrupt" in run.stderr
    else:
        assert run.returncode == 0, run.stderr
    deadline = time.monotonic() + 5
    while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(_alive(pid) for pid in pids)


INTERRUPTED_CLOSE = textwrap.dedent("""
    import gc, os, signal, threading, time, torch
    from shardwise import DataLoader

    class SlowMegabytes(torch.utils.data.Dataset):
        def __len__(self): return 1000
        def __getitem__(self, i):
            time.sleep(0.05)
            return torch.ones(1 << 20, dtype=torch.uint8)  # 16 MiB batches: the slots grow

    def slot_files():
        return sum(1 for fd in os.listdir("/proc/self/fd")
                   if "shardwise" in os.path.realpath(f"/proc/self/fd/{fd}"))

    loader = DataLoader(SlowMegabytes(), batch_size=16, num_workers=2)
    iterator = iter(loader)
    next(iterator), next(iterator)  # the workers are busy with the next batches
    threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGINT)).start()
    try:
        iterator.close()  # waits for the busy workers, and is interrupted
        time.sleep(5)  # (were the close over before the Ctrl-C, it lands here)
    except KeyboardInterrupt:
        print("interrupted", flush=True)
    del iterator, loader
    gc.collect()
    print(slot_files(), flush=True)
""")


@pytest.mark.timeout(60)
def test_a_ctrl_c_while_workers_are_stopped_leaves_no_shared_memory_open(tmp_path):
    script = tmp_path / "run.py"
    script.write_text(INTERRUPTED_CLOSE)
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         timeout=50)
    assert run.stdout.split() == ["interrupted", "0"], run.stdout + run.stderr


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    status = Path(f"/proc/{pid}/status")
    return not (status.exists() and "zombie" in status.read_text())


def test_a_worker_whose_main_process_is_killed_exits(tmp_path):
    script = tmp_path / "run.py"
    script.write_text(SCRIPT.replace('if sys.argv[1] == "interrupt":',
                                     'os.kill(os.getpid(), signal.SIGKILL)\n'
                                     'if sys.argv[1] == "interrupt":'))
    run = subprocess.run([sys.executable, str(script), "exit"], capture_output=True, text=True,
                         timeout=60)
    pids = [int(p) for p in run.stdout.split()]
    assert run.returncode == -signal.SIGKILL and len(pids) == 2
    deadline = time.monotonic() + 10  # an orphaned worker notices within about a second
    while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(_alive(pid) for pid in pids)


ORPHANED = textwrap.dedent("""
    import os, signal, time, torch
    from shardwise import DataLoader

    class Named(torch.utils.data.Dataset):  # batches of text: they travel in the pipe itself
        def __len__(self): return 10_000
        def __getitem__(self, i):
            time.sleep(float(os.environ["SECONDS_A_SAMPLE"]))
            return f"{i:08d}-" + "x" * 7400

    iterator = iter(DataLoader(Named(), batch_size=8, num_workers=2, prefetch_factor=8))
    next(iterator)
    print(" ".join(str(p.pid) for p in iterator._pool.procs), flush=True)
    time.sleep(0.5)  # (the workers fill their pipes, or load on)
    os.kill(os.getpid(), signal.SIGKILL)
""")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("seconds_a_sample", [0.0, 0.5])
def test_workers_busy_when_their_main_process_is_killed_exit(tmp_path, seconds_a_sample):
    """Writing into a full pipe, or loading the batches queued to it, a worker goes as its main
    process does: no process forked from the main one holds the main process's pipe ends."""
    script = tmp_path / "run.py"
    script.write_text(ORPHANED)
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         timeout=50, env={**os.environ, "SECONDS_A_SAMPLE": str(seconds_a_sample)})
    pids = [int(p) for p in run.stdout.split()]
    assert run.returncode == -signal.SIGKILL and len(pids) == 2, run.stderr
    deadline = time.monotonic() + 10  # at most a batch in hand, or a second when idle
    while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    alive = [pid for pid in pids if _alive(pid)]
    for pid in alive:
        os.kill(pid, signal.SIGKILL)
    assert alive == []


class Megabytes(Dataset):
    def __init__(self, megabytes: int) -> None:
        self.megabytes = megabytes

    def __len__(self) -> int:
        return 8

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.ones(self.megabytes << 18)  # float32: 4 bytes each


def _slot_bytes(pid: int) -> int:
    """The bytes of shardwise's slots that process ``pid`` holds open or mapped."""
    held = {}
    for fd in os.listdir(f"/proc/{pid}/fd"):
        path = f"/proc/{pid}/fd/{fd}"
        try:
            if "shardwise" in os.readlink(path):
                held[os.stat(path).st_ino] = os.stat(path).st_size
        except OSError:
            continue  # closed meanwhile
    for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
        if "shardwise" in line:
            low, high = (int(bound, 16) for bound in line.split()[0].split("-"))
            held.setdefault(int(line.split()[4]), high - low)
    return sum(held.values())


@pytest.mark.timeout(60)
@pytest.mark.parametrize("worker_type", WORKER_TYPES)
def test_a_forked_child_iterates_its_copy_of_a_persistent_loader_with_workers_of_its_own(
        worker_type):
    """The parent's persistent workers are not the child's (nor are its threads): the child's
    loader starts its own and gives the same batches; the parent's go on."""
    loader = DataLoader(torch.arange(20), batch_size=4, num_workers=2, persistent_workers=True,
                        worker_type=worker_type)
    first = [batch.tolist() for batch in loader]
    child = os.fork()
    if child == 0:  # pragma: no cover - the child reports through its exit code
        signal.alarm(30)  # (a hang ends the child, and the test with it)
        same = False
        try:
            same = [batch.tolist() for batch in loader] == first
        finally:
            os._exit(0 if same else 1)
    _, status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert [batch.tolist() for batch in loader] == first


@pytest.mark.timeout(120)
def test_a_worker_holds_no_other_loaders_shared_memory(clean):
    """Forked while another loader's slots are open here, it closes them: held, they would stay
    in memory for as long as it lives."""
    first = DataLoader(Megabytes(16), batch_size=2, num_workers=2, persistent_workers=True)
    list(first)  # its slots grow to some 32 MiB each
    second = DataLoader(Megabytes(1), batch_size=2, num_workers=1, persistent_workers=True)
    batches = iter(second)
    next(batches)
    worker = batches._pool.procs[0].pid
    del first
    gc.collect()
    assert _slot_bytes(worker) <= 4 * 2**20 * 4  # its own few small slots at most
    del batches, second


def test_persistent_workers_start_afresh_after_a_failed_pass(clean):
    loader = DataLoader(Failing(), batch_size=4, num_workers=2, persistent_workers=True)
    with pytest.raises(ValueError, match="sample 7 is corrupt"):
        list(loader)
    assert next(iter(loader)).tolist()[0] == [0.0] * 4  # the next epoch works again
    del loader


class Unpicklable(Dataset):
    def __len__(self) -> int:
        return 8

    def __getitem__(self, index: int):
        return {"row": torch.zeros(2), "handle": lambda: index}  # a lambda cannot be pickled


def test_a_batch_that_cannot_be_sent_is_a_clear_error(clean):
    loader = DataLoader(Unpicklable(), batch_size=2, num_workers=1, collate_fn=list)
    with pytest.raises(Exception, match="in DataLoader worker process 0 while loading indices"):
        next(iter(loader))


@pytest.mark.parametrize("persistent", [False, True])
def test_dropping_a_loader_stops_its_workers_with_no_garbage_collection(persistent, clean):
    """No reference cycle holds a pass or a loader: its workers stop when it is dropped."""
    gc.disable()
    try:
        loader = DataLoader(torch.arange(100.0), batch_size=4, num_workers=2,
                            persistent_workers=persistent)
        iterator = iter(loader)
        next(iterator)
        del iterator
        if persistent:
            assert len(_children()) == 2  # kept for the next epoch...
            del loader  # ...until the loader goes
        assert _children() == []
    finally:
        gc.enable()


@pytest.mark.parametrize("workers, worker_type", [(0, "process"), (2, "process"), (2, "thread")])
def test_a_pass_dropped_after_a_failed_batch_is_freed_with_no_garbage_collection(
        workers, worker_type, clean):
    """Raising a dataset's error makes no reference cycle through the pass: dropped, it stops."""
    gc.disable()
    try:
        iterator = iter(DataLoader(Failing(), batch_size=4, num_workers=workers,
                                   worker_type=worker_type))
        alive = weakref.ref(iterator)
        with pytest.raises(ValueError, match="sample 7 is corrupt"):
            list(iterator)
        del iterator
        assert alive() is None and _children() == []
    finally:
        gc.enable()


class FreedWhere:
    """Garbage in a cycle (only a collection frees it) that notes which process freed it."""

    def __init__(self, path: Path) -> None:
        self.path, self.itself = path, self

    def __del__(self) -> None:
        with open(self.path, "a") as notes:
            notes.write(f"{os.getpid()}\n")


class Collecting(Dataset):
    def __len__(self) -> int:
        return 8

    def __getitem__(self, index: int) -> int:
        gc.collect()
        return index


def test_forked_workers_leave_the_parents_garbage_to_the_parent(tmp_path):
    """A CUDA tensor freed in a forked child aborts it: workers never collect what they inherit,
    and the parent's young garbage stays young (a collection of the young generations frees it)."""
    notes = tmp_path / "freed"
    gc.disable()
    try:
        FreedWhere(notes)
        loader = DataLoader(Collecting(), batch_size=2, num_workers=2,
                            multiprocessing_context="fork")
        assert [b.tolist() for b in loader] == [[0, 1], [2, 3], [4, 5], [6, 7]]
        assert not gc.isenabled()  # as it was
    finally:
        gc.enable()
    gc.collect(1)
    assert notes.read_text().split() == [str(os.getpid())]


def _failing_init(worker_id: int) -> None:
    raise ValueError(f"worker {worker_id} cannot start")


@pytest.mark.parametrize("persistent", [False, True])
def test_a_failing_worker_init_fn_is_raised_as_torch_raises_it(persistent):
    def outcome(make) -> tuple[str, list]:
        loader = make(list(range(8)), batch_size=2, num_workers=1, worker_init_fn=_failing_init,
                      persistent_workers=persistent)
        with pytest.raises(ValueError) as raised:
            next(iter(loader))
        # Persistent workers go on: their next pass has a fresh fetcher, as torch's do.
        return str(raised.value).splitlines()[0], [b.tolist() for b in loader] if persistent else []

    assert outcome(DataLoader) == outcome(TorchLoader)
    assert outcome(DataLoader)[0] == "Caught ValueError in DataLoader worker process 0."


@pytest.mark.parametrize("persistent", [False, True])
def test_a_failing_worker_init_fn_is_raised_by_iter_as_torchdata_raises_it(persistent):
    loader = DataLoader(list(range(8)), batch_size=2, num_workers=2, worker_init_fn=_failing_init,
                        persistent_workers=persistent)
    before = set(_children())  # (an earlier test's persistent workers may be there)
    with pytest.raises(ValueError, match="worker 0 cannot start"):
        iter(loader)  # every worker has reported: the lowest one's error
    if not persistent:
        assert set(_children()) - before == set()  # stopped at once
    else:  # they go on to the next pass, as torch's do
        assert [b.tolist() for b in loader] == [[0, 1], [2, 3], [4, 5], [6, 7]]
        del loader
        gc.collect()  # (the error's traceback held the loader)
        assert set(_children()) - before == set()


def _dies_once(worker_id: int) -> None:
    flag = os.environ["SHARDWISE_TEST_FLAG"]
    if worker_id == 1 and not os.path.exists(flag):
        open(flag, "w").close()
        os._exit(3)


def test_a_persistent_worker_dead_in_worker_init_fn_leaves_a_loader_that_starts_afresh(
        tmp_path, monkeypatch):
    monkeypatch.setenv("SHARDWISE_TEST_FLAG", str(tmp_path / "died"))
    loader = DataLoader(list(range(6)), batch_size=2, num_workers=2, persistent_workers=True,
                        worker_init_fn=_dies_once)
    with pytest.raises(WorkerDied, match="exit code 3. It was worker 1"):
        iter(loader)
    assert loader._workers is None
    assert [b.tolist() for b in loader] == [[0, 1], [2, 3], [4, 5]]


def _fails_once(worker_id: int) -> None:
    flag = os.environ["SHARDWISE_TEST_FLAG"]
    if not os.path.exists(flag):
        open(flag, "w").close()
        raise ValueError("not yet")


@pytest.mark.parametrize("persistent", [False, True])
def test_a_pass_that_fails_to_start_leaves_the_loaded_state_to_the_next(tmp_path, monkeypatch,
                                                                         persistent):
    monkeypatch.setenv("SHARDWISE_TEST_FLAG", str(tmp_path / "failed"))

    def make(init=None):
        return DataLoader(list(range(12)), batch_size=2, num_workers=1, worker_init_fn=init,
                          persistent_workers=persistent)

    loader = make()
    iterator = iter(loader)
    taken = [next(iterator).tolist() for _ in range(3)]
    state = loader.state_dict()
    del iterator, loader
    resumed = make(_fails_once)
    resumed.load_state_dict(state)
    with pytest.raises(ValueError, match="not yet"):
        iter(resumed)
    assert resumed.state_dict() == state
    assert taken + [b.tolist() for b in resumed] == [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9],
                                                     [10, 11]]


@pytest.mark.parametrize("worker_type", ["process", "thread"])
@pytest.mark.parametrize("let_go", ["iterator", "load_state_dict"])
def test_a_pass_goes_on_when_its_loader_lets_go_of_its_persistent_workers(worker_type, let_go):
    before = set(_children())  # (an earlier test's persistent workers may be there)
    loader = DataLoader(list(range(8)), batch_size=2, num_workers=2, persistent_workers=True,
                        worker_type=worker_type)
    iterator = iter(loader)
    first = next(iterator).tolist()
    if let_go == "iterator":
        loader._iterator = None  # as torch's loader lets go of its iterator
    else:
        loader.load_state_dict(loader.state_dict())
    assert [first] + [b.tolist() for b in iterator] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert loader._workers is None
    del iterator  # the workers stop with it
    assert set(_children()) - before == set()


def _slow_start(worker_id: int) -> None:
    time.sleep(3)


def test_timeout_bounds_the_wait_for_every_worker_to_start():
    loader = DataLoader(list(range(4)), batch_size=2, num_workers=2, worker_init_fn=_slow_start,
                        timeout=0.5)
    with pytest.raises(RuntimeError, match=r"timed out after 0.5 seconds waiting for worker "
                                           r"processes \[0, 1\] to start"):
        iter(loader)
    assert loader._workers is None


class SlowAtNine(Dataset):
    def __init__(self, seconds: float = 30) -> None:
        self.seconds = seconds

    def __len__(self) -> int:
        return 64

    def __getitem__(self, index: int) -> torch.Tensor:
        if index == 9:
            time.sleep(self.seconds)  # a slow (or hung) sample, in flight when the caller stops
        return torch.tensor(index)


@pytest.fixture(params=["pinning-stubbed", "gpu"])
def slow_loader(request, monkeypatch):
    """Loaders of ``SlowAtNine`` whose batches pass through a stage thread. On a GPU, the real
    stages: pinning and the copy to the GPU. Elsewhere pinning alone, with only the pinning
    itself left out (the thread and how the pass stops it are the real ones)."""
    import shardwise.loader.iterator as iterator_module

    def loader(**options) -> DataLoader:
        dataset = SlowAtNine(options.pop("seconds", 30))
        if request.param == "gpu":
            return DataLoader(dataset, batch_size=2, num_workers=2, pin_memory=True,
                              device="cuda", **options)
        made = DataLoader(dataset, batch_size=2, num_workers=2, **options)
        made._pinning = True
        return made

    if request.param == "gpu":
        if not torch.cuda.is_available():
            pytest.skip("needs a GPU")
        # CUDA opens files of its own when first used: not what the test counts as left behind.
        list(DataLoader(list(range(4)), batch_size=2, pin_memory=True, device="cuda"))
        return loader
    monkeypatch.setattr(iterator_module, "pin_batch", lambda batch: batch)
    pool = iterator_module.ProcessPool
    monkeypatch.setattr(iterator_module, "ProcessPool",
                        lambda *args, **options: pool(*args, **{**options, "pin": False}))
    return loader


@pytest.mark.timeout(60)
def test_a_pass_left_while_a_slow_sample_loads_stops_its_stages_and_workers_at_once(
        slow_loader, clean):
    for step, _ in enumerate(slow_loader()):
        if step == 3:  # the stage thread now waits for batch 4, the slow one
            break
    started = time.monotonic()
    while (_children() or _staged()) and time.monotonic() - started < 5:
        time.sleep(0.05)
    assert not _children() and not _staged()  # within seconds, not the 30 the sample takes


def _staged() -> list[str]:
    return [thread.name for thread in threading.enumerate()
            if thread.name == "shardwise-background"]


@pytest.mark.timeout(60)
def test_ctrl_c_while_a_stage_waits_for_a_slow_sample_reaches_the_caller_at_once(
        slow_loader, clean):
    iterator = iter(slow_loader())
    for _ in range(4):
        next(iterator)
    threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT)).start()
    started = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        next(iterator)
    assert time.monotonic() - started < 10  # not the 30 s the sample takes
    with pytest.raises(RuntimeError, match=r"ended at an earlier error \(KeyboardInterrupt\)"):
        next(iterator)
    del iterator


@pytest.mark.timeout(60)
def test_a_timeout_leaves_a_pass_with_a_pinning_stage_going(slow_loader, clean):
    iterator = iter(slow_loader(seconds=2.0, timeout=0.5))
    for _ in range(4):
        next(iterator)
    timeouts = 0
    while True:  # batch 4 holds the slow sample: asking again waits again, until it comes
        try:
            batch = next(iterator)
            break
        except RuntimeError as error:
            assert "timed out after 0.5 seconds" in str(error)
            timeouts += 1
    assert timeouts >= 1 and batch.tolist() == [8, 9]
    assert [b.tolist() for b in iterator][0] == [10, 11]
    del iterator


@pytest.mark.timeout(60)
def test_a_pass_dropped_after_a_timeout_stops_its_stages_and_workers_at_once(slow_loader, clean):
    iterator = iter(slow_loader(timeout=3))
    for _ in range(4):
        next(iterator)
    with pytest.raises(RuntimeError, match="timed out after 3 seconds"):
        next(iterator)  # batch 4 holds the 30 s sample
    del iterator  # the stage goes on waiting for it, but no longer for this pass
    started = time.monotonic()
    while (_children() or _staged()) and time.monotonic() - started < 10:
        time.sleep(0.05)
    assert time.monotonic() - started < 2  # not at the next timeout, 3 s on


class LargeMessages(Dataset):
    """With ``fails``, batch 1 fails with an error text of 1 MiB: a message that large."""

    def __init__(self, fails: bool) -> None:
        self.fails = fails

    def __len__(self) -> int:
        return 10**6

    def __getitem__(self, index: int) -> int:
        if index == BIG_BATCH and self.fails:
            time.sleep(0.3)  # long enough for this process to be sending the next long task
            raise ValueError("x" * 2**20)
        return index


BIG_BATCH = 100_000


def _arrays_each(samples: list[int]) -> list:
    import numpy

    return [numpy.full(1, sample) for sample in samples]  # a batch of 100k arrays: a long message


def _second_batch_arrives(large: str, timeout: float) -> None:
    """``LargeMessages``' second batch comes as sent: its 1 MiB error, or its 100k arrays."""
    collate_fn = _arrays_each if large != "error" else None
    iterator = iter(DataLoader(LargeMessages(large == "error"), batch_size=BIG_BATCH,
                               num_workers=1, timeout=timeout, collate_fn=collate_fn))
    assert len(next(iterator)) == BIG_BATCH
    if large == "error":
        with pytest.raises(ValueError, match="x" * 1000):
            next(iterator)
    else:
        second = next(iterator)
        assert [int(a[0]) for a in second[::10_000]] == list(range(BIG_BATCH, 2 * BIG_BATCH,
                                                                   10_000))


@pytest.mark.timeout(30)
@pytest.mark.parametrize("large", ["error", "batch of many arrays"])
def test_a_worker_sending_a_large_message_while_given_long_tasks_does_not_hang(large, clean):
    """A worker writing a large message waits for this process to read it, and this process
    never waits for a worker to read its long lists of indices: neither waits for the other."""
    _second_batch_arrives(large, timeout=10)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("large", ["error", "batch of many arrays"])
def test_a_default_socket_timeout_leaves_the_workers_pipes_as_they_were(large, clean):
    """A slot's descriptor passes through a socket made on the worker's pipe, and a socket made
    with ``socket.setdefaulttimeout`` set is non-blocking: so would the pipe stay, and a large
    message through it fail half-written (torch's loader runs as usual)."""
    import socket

    before = socket.getdefaulttimeout()
    socket.setdefaulttimeout(5)
    try:
        _second_batch_arrives(large, timeout=30)
    finally:
        socket.setdefaulttimeout(before)


class Listed(Dataset):
    """Each batch is its indices as they are (``__getitems__``): the work is the collation's."""

    def __len__(self) -> int:
        return 10**7

    def __getitems__(self, indices: list[int]) -> list[int]:
        return indices


def _slowly_counted(samples: list[int]) -> int:
    time.sleep(1.0)  # a worker's second of work on each batch
    return len(samples)


@pytest.mark.timeout(60)
def test_a_long_task_reaches_its_worker_while_the_caller_works(clean):
    """A list of indices the pipe cannot take whole goes on while the caller works on its
    batches (not only while it waits for the next one): the worker loads ahead meanwhile."""
    loader = DataLoader(Listed(), batch_size=10**6, num_workers=1, prefetch_factor=2,
                        collate_fn=_slowly_counted)
    iterator = iter(loader)
    assert next(iterator) == 10**6
    waits = []
    for _ in range(3):
        time.sleep(1.5)  # the caller's step: the worker loads the next batch meanwhile
        started = time.monotonic()
        assert next(iterator) == 10**6
        waits.append(time.monotonic() - started)
    assert max(waits) < 0.7  # not the second a batch takes to load
    del iterator


class ForksAChild(Listed):
    """A worker's first batch forks a child that holds the worker's pipe open for 20 s; each
    batch takes the worker half a second."""

    forked = False

    def __getitems__(self, indices: list[int]) -> list[int]:
        if not self.forked and os.fork() == 0:
            time.sleep(20)
            os._exit(0)
        self.forked = True
        time.sleep(0.5)
        return indices


@pytest.mark.timeout(60)
def test_a_pass_dropped_while_a_long_task_is_sent_to_a_worker_whose_child_holds_its_pipe(clean):
    """The worker is killed, but its pipe stays open in its child, and nobody reads it: the
    tasks being written to it stop all the same, not when the child exits."""
    loader = DataLoader(ForksAChild(), batch_size=10**6, num_workers=1, prefetch_factor=4,
                        collate_fn=len)
    iterator = iter(loader)
    assert next(iterator) == 10**6  # and the worker loads the next, its pipe full of the rest
    started = time.monotonic()
    del iterator
    assert time.monotonic() - started < 5
