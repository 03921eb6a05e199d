import json
import subprocess
import sys

import pytest

from shardwise.cli import main


def plan_json(capsys, *flags):
    assert main(["plan", "--format", "json", *flags]) == 0
    return json.loads(capsys.readouterr().out)


def test_defaults_are_seed_001s_example(capsys):
    plan = plan_json(capsys)
    assert plan["config"] == {
        "shuffle": True, "size": 7, "world_size": 3, "batch_size": 2, "epochs": 2, "seed": 0,
        "remainder": "pad", "layout": "strided", "permutation": "torch",
    }
    first, second = plan["epochs"]
    assert [r["batches"] for r in first["ranks"]] == [[[4, 3], [1]], [[0, 2], [4]], [[5, 6], [0]]]
    assert [r["padding"] for r in first["ranks"]] == [
        [[False, False], [False]], [[False, False], [True]], [[False, False], [True]]]
    # The article's samples 1 and 5, then 1 and 7, are indices 0 and 4, then 0 and 6.
    assert (first["repeated"], second["repeated"]) == ([0, 4], [0, 6])
    assert first["padding"] == 2 and first["dropped"] == []


def test_unshuffled_drop_lists_the_dropped_sample(capsys):
    (epoch,) = plan_json(capsys, "--no-shuffle", "--remainder", "drop", "--epochs", "1")["epochs"]
    assert [r["batches"] for r in epoch["ranks"]] == [[[0, 3]], [[1, 4]], [[2, 5]]]
    assert epoch["dropped"] == [6] and epoch["repeated"] == []


def test_table_marks_repeats_in_plain_text_when_piped():
    out = subprocess.run(
        [sys.executable, "-m", "shardwise", "plan", "--no-shuffle"],
        capture_output=True, text=True, check=True,
    ).stdout
    assert "\x1b[" not in out  # no colour codes when piped
    rows = [line for line in out.splitlines() if line.startswith("│")]
    assert [row.split("│")[1:4] for row in rows[:3]] == [
        ["    0 ", " 0 3     ", " 6       "],
        ["    1 ", " 1 4     ", " 0*      "],
        ["    2 ", " 2 5     ", " 1*      "],
    ]
    assert "repeated: 2 (0, 1)" in out and "2 padding repeats and 0 dropped" in out


@pytest.mark.parametrize(
    "flags,message",
    [(["--world-size", "0"], "--world-size must be at least 1, got 0"),
     (["--size", "-3"], "dataset size must be at least 0, got -3")],
)
def test_bad_flags_are_named(capsys, flags, message):
    with pytest.raises(SystemExit) as exit_info:
        main(["plan", *flags])
    assert exit_info.value.code == 2 and message in capsys.readouterr().err
