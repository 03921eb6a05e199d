"""`shardwise load` end to end: spawned gloo ranks, saved partitions that add up to the input."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from shardwise.cli import main
from shardwise.distributed.launch import free_port


def saved_lines(part) -> list[str]:
    """The lines a rank's --save file holds, as docs/files.md says to read them."""
    text, offsets = part["text"], part["offsets"]
    return [bytes(text[offsets[i]:offsets[i + 1]]).decode() for i in range(len(offsets) - 1)]


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
    (tmp_path / "a.txt").write_text("x\n\ny\r\nz\0\n")
    assert main(["load", str(tmp_path / "a.txt"), "--pattern", "linesplit", "--save", str(tmp_path)]) == 0
    with np.load(tmp_path / "rank-00000-of-00001.npz") as part:
        assert saved_lines(part) == ["x", "", "y", "z\0"]  # a trailing NUL kept
    assert "1 rank(s)" in capsys.readouterr().out


def test_raw_lines_of_a_columnar_file_are_refused_by_name(tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    pq.write_table(pa.table({"src": [1]}), tmp_path / "e.parquet")
    with pytest.raises(SystemExit):
        main(["load", str(tmp_path / "e.parquet"), "--pattern", "linesplit"])
    assert "e.parquet is a columnar file: load its rows with --columns" in capsys.readouterr().err


@pytest.mark.parametrize(("options", "says"), [
    (["--pattern", "fvec", "--kind", "undirected"],
     "--kind undirected says what to build from edges; --pattern fvec builds vectors"),
    (["--pattern", "linesplit", "--kind", "matrix"],
     "--kind matrix says what to build from edges; --pattern linesplit reads raw text lines"),
    (["--pattern", "linesplit", "--columns", "src,dst"],
     "--columns reads Parquet or Arrow IPC columns into records; --pattern linesplit reads raw"),
    (["--columns", "src,dst", "--delimiter", ";"],
     "--delimiter ';' splits text lines; --columns reads Parquet or Arrow IPC columns"),
])
def test_an_option_the_pattern_has_no_use_for_is_refused_by_name(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], options: list[str], says: str) -> None:
    (tmp_path / "v.csv").write_text("1,0.5\n")
    with pytest.raises(SystemExit) as caught:
        main(["load", str(tmp_path / "v.csv"), *options])
    assert caught.value.code == 2 and says in capsys.readouterr().err
    assert main(["load", str(tmp_path / "v.csv"), "--pattern", "fvec"]) == 0


@pytest.mark.parametrize("spelled", ["\t", "\\t", "\\\\t"])
def test_a_tab_delimiter_may_be_spelled_as_an_escape(tmp_path: Path, spelled: str) -> None:
    (tmp_path / "e.tsv").write_text("1\t2\n2\t3\t0.5\n")
    assert main(["load", str(tmp_path / "e.tsv"), "--delimiter", spelled, "--save",
                 str(tmp_path)]) == 0
    with np.load(tmp_path / "rank-00000-of-00001.npz") as part:
        assert part["dst"].tolist() == [2, 3] and part["weight"].tolist() == [1.0, 0.5]


def test_save_naming_a_file_is_refused_before_loading(tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "e.csv").write_text("1,2\n")
    with pytest.raises(SystemExit) as caught:
        main(["load", str(tmp_path / "e.csv"), "--save", str(tmp_path / "e.csv")])
    assert caught.value.code == 2
    assert capsys.readouterr().err == (f"shardwise load: error: --save {tmp_path / 'e.csv'} is a "
                                       "file: name a folder (it is made if need be)\n")


def test_a_save_folder_that_cannot_be_made_is_named_before_loading(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "e.csv").write_text("1,2\n")
    with pytest.raises(SystemExit) as caught:  # its parent is a file
        main(["load", str(tmp_path / "e.csv"), "--save", str(tmp_path / "e.csv" / "out")])
    assert caught.value.code == 2
    printed = capsys.readouterr()
    assert printed.out == ""  # nothing was loaded, no report printed
    assert printed.err == (f"shardwise load: error: --save {tmp_path / 'e.csv' / 'out'}: the "
                           f"folder cannot be made (Not a directory: {tmp_path / 'e.csv' / 'out'})"
                           ": name a folder that can be written\n")


def shardwise_load(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "shardwise", "load", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.timeout(120)
def test_a_bad_line_is_one_clean_line_under_nproc_as_in_process(tmp_path: Path) -> None:
    (tmp_path / "bad.csv").write_text("1,2\n3,4\n5,x\n")
    errors = {}
    for nproc in ([], ["--nproc", "2"]):
        run = shardwise_load(str(tmp_path / "bad.csv"), *nproc)
        _, err = run.communicate()
        assert run.returncode == 2 and len(err.splitlines()) == 1, err
        errors[bool(nproc)] = err
    assert errors[True].startswith("shardwise load: error: rank 1: ")  # the line is rank 1's
    assert re.sub(r"rank \d+: ", "", errors[True]) == re.sub(r"rank \d+: ", "", errors[False])
    assert "pass --ids str" in errors[True] and "--on-error skip" in errors[True]
    assert "ids='str'" not in errors[True] and "on_error" not in errors[True]


def test_skipping_a_bad_raw_line_keeps_the_byte_order_mark_out(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "a.txt").write_bytes(b"\xef\xbb\xbfone\nt\xffwo\nthree\n")
    assert main(["load", str(tmp_path / "a.txt"), "--pattern", "linesplit", "--on-error", "skip",
                 "--save", str(tmp_path / "out")]) == 0
    assert "a.txt:2: not valid UTF-8" in capsys.readouterr().out
    with np.load(tmp_path / "out" / "rank-00000-of-00001.npz") as part:
        assert saved_lines(part) == ["one", "three"]


@pytest.mark.timeout(120)
def test_raw_lines_fail_together_on_ranks_started_apart_or_skip_the_bad_line(tmp_path: Path) -> None:
    """Ranks started as torchrun starts them: a line that is not UTF-8 on rank 1's share is
    raised by rank 0 too (not a lost connection), and --on-error skip counts it instead."""
    (tmp_path / "a.txt").write_bytes(b"one\ntwo\nthree\n" + b"fo\xffur\nfive\nsix\n")
    port = str(free_port())
    for skip in ([], ["--on-error", "skip"]):
        runs = [subprocess.Popen(
            [sys.executable, "-m", "shardwise", "load", str(tmp_path / "a.txt"), "--pattern",
             "linesplit", "--save", str(tmp_path / "out"), *skip],
            env={**os.environ, "RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2",
                 "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port},
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for rank in range(2)]
        outputs = [run.communicate() for run in runs]
        if skip:
            assert [run.returncode for run in runs] == [0, 0], outputs
            assert "skipped" in outputs[0][0]
            with np.load(tmp_path / "out" / "rank-00001-of-00002.npz") as part:
                assert saved_lines(part) == ["five", "six"]
        else:
            assert [run.returncode for run in runs] == [2, 2], outputs
            for _, err in outputs:
                assert err.strip().endswith("a.txt:4: not valid UTF-8 (invalid start byte); "
                                            "re-encode the file as UTF-8"), err
        port = str(free_port())


@pytest.mark.timeout(120)
def test_a_rank_that_cannot_save_its_part_is_named_on_every_rank(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("1,2\n3,4\n5,6\n7,8\n")
    (tmp_path / "out" / "rank-00001-of-00002.npz").mkdir(parents=True)  # rank 1's name, taken
    port = str(free_port())
    runs = [subprocess.Popen(
        [sys.executable, "-m", "shardwise", "load", str(tmp_path / "a.txt"), "--save",
         str(tmp_path / "out")],
        env={**os.environ, "RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2",
             "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for rank in range(2)]
    outputs = [run.communicate() for run in runs]
    assert [run.returncode for run in runs] == [2, 2], outputs
    for _, err in outputs:  # (not a lost connection on rank 0)
        assert "rank 1: [Errno 21] Is a directory" in err and "rank-00001-of-00002.npz" in err, err


def _rank_processes(parent: int) -> list[int]:
    """The spawned ranks among ``parent``'s children (not multiprocessing's resource tracker)."""
    ranks = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            cmdline = (stat.parent / "cmdline").read_bytes()
        except (OSError, IndexError):
            continue  # gone meanwhile
        if ppid == parent and b"spawn_main" in cmdline:
            ranks.append(int(stat.parent.name))
    return sorted(ranks)


@pytest.mark.timeout(120)
@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="finds the ranks through /proc")
def test_a_killed_rank_is_one_clean_line(tmp_path: Path) -> None:
    (tmp_path / "edges.csv").write_text("1,2\n3,4\n")
    run = shardwise_load(str(tmp_path / "edges.csv"), "--nproc", "2")
    while len(ranks := _rank_processes(run.pid)) < 2:
        assert run.poll() is None, run.communicate()
        time.sleep(0.02)
    os.kill(ranks[-1], signal.SIGKILL)  # while it still imports torch: long before it finishes
    _, err = run.communicate()
    assert run.returncode == 1
    assert re.fullmatch(r"shardwise load: error: rank [01] was killed by SIGKILL \(signal 9\)"
                        r"[^\n]*\n", err), err


@pytest.mark.timeout(120)
@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="finds the ranks through /proc")
def test_ctrl_c_reaching_a_rank_as_it_starts_is_left_to_the_parent(tmp_path: Path) -> None:
    """Ctrl-C in a terminal signals every process; a rank still importing torch must not print
    a traceback of its own (the parent stops the ranks and prints one line)."""
    (tmp_path / "edges.csv").write_text("1,2\n3,4\n")
    run = shardwise_load(str(tmp_path / "edges.csv"), "--nproc", "2")
    while len(ranks := _rank_processes(run.pid)) < 2:
        assert run.poll() is None, run.communicate()
        time.sleep(0.02)
    for _ in range(10):  # while they import torch: long before they join the group
        for pid in ranks:
            with contextlib.suppress(ProcessLookupError):  # a rank it killed
                os.kill(pid, signal.SIGINT)
        time.sleep(0.05)
    out, err = run.communicate()
    assert (run.returncode, err) == (0, ""), err
    assert "shardwise load: 2 rank(s)" in out


def test_the_report_shows_plain_numbers_and_flag_hints(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "a.csv").write_text("1,2,0.5\n3,x\n5,6\n7,8,1.5\n")
    assert main(["load", str(tmp_path / "a.csv"), "--on-error", "skip", "--nproc", "2"]) == 0
    out = capsys.readouterr().out
    assert "skipped" in out and "np." not in out and "int64" not in out
    assert "pass --ids str" in out and "ids='str'" not in out


@pytest.mark.timeout(120)
def test_load_of_parquet_columns_shows_row_groups_per_rank_and_saves_every_edge(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pa, pq = pytest.importorskip("pyarrow"), pytest.importorskip("pyarrow.parquet")
    rows = [(i % 11, i * 5, i / 4) for i in range(600)]
    (tmp_path / "in").mkdir()
    for number in range(3):
        part = rows[number * 200:(number + 1) * 200]
        pq.write_table(pa.table({"a": [r[0] for r in part], "b": [r[1] for r in part],
                                 "w": [r[2] for r in part]}),
                       tmp_path / "in" / f"part-{number}.parquet", row_group_size=50)
    assert main(["load", str(tmp_path / "in"), "--columns", "a,b,w", "--nproc", "2",
                 "--save", str(tmp_path / "out")]) == 0
    printed = capsys.readouterr().out
    header = next(line for line in printed.splitlines() if "rank" in line and "rows" in line)
    assert "row groups" in header and "lines" not in header
    union: Counter = Counter()
    for path in sorted((tmp_path / "out").glob("*.npz")):
        with np.load(path) as part:
            src = np.repeat(part["row_ids"], np.diff(part["indptr"]))
            union.update(zip(src.tolist(), part["dst"].tolist(), part["weight"].tolist()))
    assert union == Counter(rows)
    with pytest.raises(SystemExit, match="2"):  # no columns named: a one-line hint
        main(["load", str(tmp_path / "in")])
    assert "--columns src,dst or --columns src,dst,weight" in capsys.readouterr().err


@pytest.mark.timeout(120)
@pytest.mark.parametrize("command", ["plan", "load"])
@pytest.mark.parametrize("given", [{}, {"AWS_ACCESS_KEY_ID": "AKIANEVERSHOWN1234"}])
def test_an_s3_url_without_credentials_says_how_to_give_them(command: str, given: dict) -> None:
    env = {name: value for name, value in os.environ.items() if not name.startswith("AWS_")}
    env.update(AWS_CONFIG_FILE=os.devnull, AWS_SHARED_CREDENTIALS_FILE=os.devnull,
               AWS_EC2_METADATA_DISABLED="true", **given)
    run = subprocess.run(
        [sys.executable, "-m", "shardwise", command, "s3://some-bucket/edges/",
         "--storage-option", "endpoint_url=http://127.0.0.1:9"],  # never reached: nothing to sign
        capture_output=True, text=True, env=env, timeout=100, check=False)
    assert run.returncode == 2, run.stderr
    assert run.stderr.count("\n") == 1 and "Traceback" not in run.stderr
    assert "s3://some-bucket/edges/" in run.stderr and "AWS_ACCESS_KEY_ID" in run.stderr
    assert "--storage-option key=... --storage-option secret=..." in run.stderr
    assert "--storage-option anon=true" in run.stderr
    assert "AKIANEVERSHOWN1234" not in run.stdout + run.stderr


@pytest.mark.timeout(120)
def test_the_report_in_a_narrow_terminal_elides_no_number(tmp_path: Path) -> None:
    (tmp_path / "edges.csv").write_text("1,2\n3,4\n" * 50_000)  # 400,000 bytes
    run = subprocess.run(  # FORCE_COLOR: rich takes the pipe for a terminal, COLUMNS wide
        [sys.executable, "-m", "shardwise", "load", str(tmp_path / "edges.csv")],
        capture_output=True, text=True, env={**os.environ, "FORCE_COLOR": "1", "COLUMNS": "40"})
    assert run.returncode == 0, run.stderr
    plain = re.sub(r"\x1b\[[0-9;]*m", "", run.stdout)
    assert "…" not in plain, plain
    assert "bytes read" in plain and "400,000" in plain and "100,000" in plain, plain
