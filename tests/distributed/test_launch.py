"""spawn_local on real gloo ranks: failures surface at once, as the rank's own error, and no
process outlives it (a failure, a timeout, Ctrl-C, or the parent killed outright)."""

from __future__ import annotations

import multiprocessing
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as torch_dist

from shardwise.distributed import launch
from shardwise.distributed.launch import LaunchError, RemoteTraceback, spawn_local

REPO = Path(__file__).resolve().parents[2]


class NeedsTwo(Exception):
    """Pickles, but cannot be rebuilt from its message alone."""

    def __init__(self, first: str, second: str) -> None:
        super().__init__(f"{first} and {second}")


class Hinted(ValueError):
    """Rebuilt from its message, its constructor would add the hint a second time."""

    def __init__(self, what: str) -> None:
        super().__init__(f"{what} (a hint)")


def _whoami() -> tuple[int, int, str]:
    if torch_dist.get_rank() == 0:
        time.sleep(0.5)  # rank 0 reports last
    return torch_dist.get_rank(), torch_dist.get_world_size(), os.environ["RANK"]


def _rank_1_does(action: str) -> None:
    """Rank 1 does ``action``; the others wait for it in a collective that never completes."""
    if torch_dist.get_rank() == 1:
        if action == "sigkill":
            os.kill(os.getpid(), signal.SIGKILL)
        if action == "exit":
            os._exit(3)
        if action == "raise":
            raise ValueError("bad value 7")
        if action == "raise named":
            raise ValueError("rank 1: bad value 7")
        if action == "raise named together":
            raise ValueError("ranks 0, 1: bad value 7")
        if action == "sleep":
            time.sleep(600)
    torch_dist.barrier()


def _every_rank_raises() -> None:
    torch_dist.barrier()
    raise ValueError(f"bad value {torch_dist.get_rank()}")


# Built in the rank: an argument would make the round trip through pickle on its way there.
_ERRORS = {"Hinted": lambda: Hinted("bad line"), "NeedsTwo": lambda: NeedsTwo("x", "y"),
           "SystemExit": lambda: SystemExit(3)}


def _raises(name: str) -> None:
    raise _ERRORS[name]()


def _no_rank_left() -> bool:
    return not multiprocessing.active_children()


@pytest.mark.timeout(120)
def test_results_come_back_in_rank_order() -> None:
    assert spawn_local(_whoami, 3) == [(0, 3, "0"), (1, 3, "1"), (2, 3, "2")]
    assert _no_rank_left()


def test_nccl_without_a_gpu_per_rank_is_refused_before_any_rank_starts() -> None:
    if torch.cuda.device_count() >= 2:
        pytest.skip("this machine has the GPUs")
    with pytest.raises(ValueError, match=r"backend='nccl' gives each rank a GPU .* use backend"):
        spawn_local(_whoami, 2, backend="nccl")


@pytest.mark.timeout(60)  # the default timeout is 300 s: passing at all means it was noticed
def test_a_killed_rank_is_reported_at_once_with_its_signal() -> None:
    with pytest.raises(LaunchError, match=r"^rank 1 was killed by SIGKILL \(signal 9\)"):
        spawn_local(_rank_1_does, 3, "sigkill")
    assert _no_rank_left()


@pytest.mark.timeout(60)
def test_a_rank_that_exits_is_reported_with_its_exit_code() -> None:
    with pytest.raises(LaunchError, match=r"^rank 1 exited with code 3 before returning a result$"):
        spawn_local(_rank_1_does, 3, "exit")
    assert _no_rank_left()


@pytest.mark.timeout(60)
def test_a_rank_error_is_raised_here_as_itself_with_its_traceback() -> None:
    with pytest.raises(ValueError) as caught:
        spawn_local(_rank_1_does, 3, "raise")
    assert type(caught.value) is ValueError and str(caught.value) == "rank 1: bad value 7"
    cause = caught.value.__cause__
    assert isinstance(cause, RemoteTraceback)
    assert "_rank_1_does" in str(cause) and "ValueError: bad value 7" in str(cause)
    assert _no_rank_left()


@pytest.mark.timeout(60)
def test_a_message_that_names_a_rank_is_left_alone() -> None:
    with pytest.raises(ValueError, match=r"^rank 1: bad value 7$"):
        spawn_local(_rank_1_does, 2, "raise named")
    with pytest.raises(ValueError, match=r"^ranks 0, 1: bad value 7$"):
        spawn_local(_rank_1_does, 2, "raise named together")


@pytest.mark.timeout(60)
def test_when_every_rank_raises_the_lowest_rank_wins() -> None:
    with pytest.raises(ValueError, match=r"^rank 0: bad value 0$"):
        spawn_local(_every_rank_raises, 3)


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "name,expected,message",
    [
        ("Hinted", Hinted, "rank 0: bad line (a hint)"),
        ("NeedsTwo", LaunchError, "rank 0 raised NeedsTwo: x and y"),
        ("SystemExit", LaunchError, "rank 0 raised SystemExit: 3"),  # must not end the caller
    ],
)
def test_errors_that_do_not_simply_unpickle(name, expected, message) -> None:
    with pytest.raises(expected) as caught:
        spawn_local(_raises, 1, name)
    assert type(caught.value) is expected and str(caught.value) == message
    assert isinstance(caught.value.__cause__, RemoteTraceback)


@pytest.mark.timeout(60)
def test_timeout_names_the_ranks_without_a_result() -> None:
    with pytest.raises(LaunchError, match=r"^no result from rank\(s\) 0, 1 within 3 s"):
        spawn_local(_rank_1_does, 2, "sleep", timeout=3)
    assert _no_rank_left()


def _write_pid_then_block(directory: str) -> None:
    """Rank 0 blocks in a collective (inside gloo's C++), rank 1 in Python."""
    rank = torch_dist.get_rank()
    path = Path(directory) / f"{rank}.pid"
    path.with_suffix(".tmp").write_text(str(os.getpid()))
    path.with_suffix(".tmp").rename(path)
    if rank == 0:
        torch_dist.barrier()
    time.sleep(600)


_PARENT = (
    "import sys\n"
    "from shardwise.distributed.launch import spawn_local\n"
    "from tests.distributed.test_launch import _write_pid_then_block\n"
    "spawn_local(_write_pid_then_block, 2, sys.argv[1])\n"
)


def _gone(pid: int) -> bool:
    """No such process, or a zombie that only waits for its new parent to reap it."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (FileNotFoundError, IndexError):
        return not Path("/proc").is_dir()  # no /proc: os.kill said it exists


@pytest.mark.timeout(180)
@pytest.mark.parametrize("how", ["SIGINT to the parent", "SIGINT to the process group",
                                 "SIGKILL to the parent"])
def test_no_rank_survives_its_parent(tmp_path: Path, how: str) -> None:
    if how == "SIGKILL to the parent" and not sys.platform.startswith("linux"):
        pytest.skip("children die with their parent through Linux's PR_SET_PDEATHSIG")
    parent = subprocess.Popen(
        [sys.executable, "-c", _PARENT, str(tmp_path)], cwd=REPO, start_new_session=True,
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )
    try:
        pid_files = [tmp_path / "0.pid", tmp_path / "1.pid"]
        while not all(p.exists() for p in pid_files):
            assert parent.poll() is None, parent.stderr.read() if parent.stderr else ""
            time.sleep(0.1)
        pids = [int(p.read_text()) for p in pid_files]
        time.sleep(0.5)  # rank 0 is now inside its barrier
        if how == "SIGINT to the parent":
            parent.send_signal(signal.SIGINT)
        elif how == "SIGINT to the process group":  # what Ctrl-C in a terminal does
            os.killpg(parent.pid, signal.SIGINT)
        else:
            parent.kill()
        parent.wait(timeout=60)
        deadline = time.monotonic() + 30
        while not all(map(_gone, pids)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert [pid for pid in pids if not _gone(pid)] == []
    finally:
        if parent.poll() is None:
            os.killpg(parent.pid, signal.SIGKILL)
            parent.wait()


@pytest.mark.timeout(120)
def test_a_port_taken_before_rank_0_listens_on_it_is_traded_for_another(monkeypatch):
    """The port is found free, then bound by rank 0 seconds later (as it starts): another
    process may take it in between, which must not fail the launch (EADDRINUSE)."""
    found_free = launch.free_port
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        offered = iter([taken.getsockname()[1]])
        monkeypatch.setattr(launch, "free_port", lambda: next(offered, None) or found_free())
        assert spawn_local(torch_dist.get_rank, 2, timeout=90) == [0, 1]
