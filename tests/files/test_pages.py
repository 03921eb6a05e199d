"""Loads allocate without NumPy's huge-page advice, and leave the process's setting as it was."""

from __future__ import annotations

from pathlib import Path

import pytest

from shardwise.files import load_graph
from shardwise.files.pages import _switch

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
