"""Loads allocate without NumPy's huge-page advice, and leave the process's setting as it was."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from shardwise.files import load_graph
from shardwise.files.pages import _set_madvise_hugepage as _switch

pytestmark = pytest.mark.skipif(_switch is None, reason="this NumPy has no huge-page switch")


def advised() -> bool:
    setting = _switch(False)
    _switch(setting)
    return setting


@pytest.mark.parametrize("before", [True, False])
def test_a_load_runs_without_the_advice_and_puts_the_setting_back(tmp_path: Path, before):
    (tmp_path / "edges.txt").write_text("".join(f"{i},{i + 1}\n" for i in range(100)))
    seen = []

    def parse(line: str) -> list[str]:  # runs within the load
        seen.append(advised())
        return line.split(",")

    _switch(before)
    try:
        graph = load_graph([tmp_path / "edges.txt"], "fmap", parser=parse)
        assert advised() is before
    finally:
        _switch(True)
    assert graph.num_edges == 100 and seen and not any(seen)


@pytest.mark.timeout(60)
def test_loads_overlapping_in_threads_leave_it_off_until_the_last_returns(tmp_path: Path):
    (tmp_path / "edges.txt").write_text("".join(f"{i},{i + 1}\n" for i in range(10)))
    both_in, first_done = threading.Barrier(2, timeout=20), threading.Event()
    after_first: list[bool] = []

    def load(waits_for_first: bool) -> None:
        def parse(line: str) -> list[str]:
            if line.startswith("0,"):
                both_in.wait()
                if waits_for_first:
                    first_done.wait(20)
                    after_first.append(advised())
            return line.split(",")

        load_graph([tmp_path / "edges.txt"], "fmap", parser=parse, threads=1)
        if not waits_for_first:
            first_done.set()

    _switch(True)
    loads = [threading.Thread(target=load, args=(waits,)) for waits in (False, True)]
    for thread in loads:
        thread.start()
    for thread in loads:
        thread.join(30)
    assert after_first == [False] and advised()
