"""`shardwise load` end to end: spawned gloo ranks, saved partitions that add up to the input."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from shardwise.cli import main


def test_load_spawns_ranks_and_saves_partitions_that_add_up_to_the_input(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = [(i % 7, i * 3 + 2**40, i / 8) for i in range(500)]
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "big.csv").write_text("".join(f"{a},{b},{w}\n" for a, b, w in rows[:450]))
    (tmp_path / "in" / "small.csv").write_text("".join(f"{a},{b},{w}\n" for a, b, w in rows[450:]))
    assert main(["load", str(tmp_path / "in"), "--pattern", "fmap", "--nproc", "2",
                 "--save", str(tmp_path / "out")]) == 0
    printed = capsys.readouterr().out
    assert "shardwise load: 2 rank(s)" in printed and "balance (max/mean): bytes" in printed
    saved = sorted((tmp_path / "out").glob("*.npz"))
    assert [p.name for p in saved] == ["rank-00000-of-00002.npz", "rank-00001-of-00002.npz"]
    union: Counter = Counter()
    for path in saved:
        with np.load(path) as part:
            src = np.repeat(part["row_ids"], np.diff(part["indptr"]))
            union.update(zip(src.tolist(), part["dst"].tolist(), part["weight"].tolist()))
    assert union == Counter(rows)


def test_load_of_raw_lines_in_one_process(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "a.txt").write_text("x\n\ny\r\n")
    assert main(["load", str(tmp_path / "a.txt"), "--pattern", "linesplit", "--save", str(tmp_path)]) == 0
    with np.load(tmp_path / "rank-00000-of-00001.npz") as part:
        assert part["lines"].tolist() == ["x", "", "y"]
    assert "1 rank(s)" in capsys.readouterr().out
