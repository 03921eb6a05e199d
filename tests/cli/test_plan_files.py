"""``shardwise plan PATHS``: how the ranks split files, local or in a bucket, credentials hidden."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from urllib.parse import quote

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from shardwise.cli import main


def plan_json(capsys: pytest.CaptureFixture[str], *args: str) -> dict:
    assert main(["plan", *args, "--format", "json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_text_files_are_split_by_bytes_across_files(tmp_path: Path, capsys) -> None:
    (tmp_path / "a.csv").write_text("1,2\n" * 30)
    (tmp_path / "b.csv").write_text("3,4\n" * 10)
    plan = plan_json(capsys, str(tmp_path), "--world-size", "4")
    assert (plan["kind"], plan["total_bytes"]) == ("bytes", 160)
    assert [rank["bytes"] for rank in plan["ranks"]] == [40] * 4
    assert plan["ranks"][2]["pieces"] == [
        {"file": str(tmp_path / "a.csv"), "start": 80, "stop": 120}]
    assert main(["plan", str(tmp_path), "--world-size", "4"]) == 0
    table = capsys.readouterr().out
    assert "2 files, 160 bytes, 4 ranks" in table and f"{tmp_path / 'b.csv'}@40" in table


def test_a_table_of_many_ranks_shows_the_first_and_last_as_a_samplers_does(tmp_path: Path,
                                                                           capsys) -> None:
    (tmp_path / "a.csv").write_text("1,2\n" * 30)
    pq.write_table(pa.table({"id": range(100)}), tmp_path / "t.parquet", row_group_size=5)
    for path in (tmp_path / "a.csv", tmp_path / "t.parquet"):
        assert main(["plan", str(path), "--world-size", "20", "--max-ranks", "4"]) == 0
        table = capsys.readouterr().out
        assert "ranks 2 to 17 not shown (16 ranks; see --max-ranks)" in table, table
        assert "│   19 │" in table and "│    2 │" not in table, table
        assert len(plan_json(capsys, str(path), "--world-size", "20")["ranks"]) == 20


def test_a_samplers_options_with_files_are_refused_by_name(tmp_path: Path, capsys) -> None:
    (tmp_path / "a.csv").write_text("1,2\n")
    with pytest.raises(SystemExit) as exit_code:
        main(["plan", str(tmp_path), "--size", "10", "--no-shuffle"])
    assert exit_code.value.code == 2
    assert "--size, --no-shuffle shape a sampler's plan, not a plan of the files given as PATH" \
        in capsys.readouterr().err


def test_parquet_files_are_split_by_row_groups(tmp_path: Path, capsys) -> None:
    pq.write_table(pa.table({"id": range(100)}), tmp_path / "t.parquet", row_group_size=25)
    plan = plan_json(capsys, str(tmp_path / "t.parquet"), "--world-size", "2")
    assert (plan["kind"], plan["total_rows"], plan["by_rows"]) == ("row groups", 100, False)
    shares = [[g["row_group"] for g in rank["row_groups"]] for rank in plan["ranks"]]
    assert sum(shares, []) == [0, 1, 2, 3] and all(shares)  # whole groups, balanced by bytes
    assert main(["plan", str(tmp_path), "--world-size", "2"]) == 0
    assert "4 row groups, 100 rows, 2 ranks" in capsys.readouterr().out


@pytest.mark.parametrize("args, message", [
    (["{folder}", "--world-size", "0"], "--world-size must be at least 1, got 0"),
    (["{folder}", "--format", "svg"], "a plan of files is shown as a table or as JSON"),
    (["{folder}"], "the inputs mix columnar files"),
    (["--storage-option", "anon=true"], "--storage-option is for the files given as PATH"),
    (["{folder}/a.csv", "--world-size", str(10**10), "--max-ranks", str(10**19)],
     "--max-ranks must be at most 1,000, as each one shown is computed and printed"),
])
def test_bad_file_plans_are_named(tmp_path: Path, capsys, args: list[str], message: str) -> None:
    (tmp_path / "a.csv").write_text("1,2\n")
    pq.write_table(pa.table({"id": [1]}), tmp_path / "b.parquet")
    with pytest.raises(SystemExit) as exit_code:
        main(["plan", *(arg.format(folder=tmp_path) for arg in args)])
    assert exit_code.value.code == 2 and message in capsys.readouterr().err


@pytest.mark.timeout(120)
def test_a_plan_of_a_bucket_never_shows_credentials(capsys) -> None:
    store_module = pytest.importorskip("tests.files.object_store")
    key, secret, token = store_module.KEY, store_module.SECRET, "SessionTokenNeverShown123"
    with store_module.object_store() as store:
        store.upload({"plan/a.csv": b"1,2\n" * 50, "plan/b.csv": b"3,4\n" * 20})
        flags = [f"--storage-option=key={key}", f"--storage-option=secret={secret}",
                 f"--storage-option=token={token}",
                 f'--storage-option=client_kwargs={{"endpoint_url": "{store.url}"}}']
        bucket = f"s3://{store_module.BUCKET}"
        assert main(["plan", f"{bucket}/plan/", "--world-size", "3", *flags]) == 0
        assert main(["plan", f"{bucket}/plan/", *flags, "--format", "json"]) == 0
        presigned = store.http_url("plan/a.csv")  # its query holds the access key
        assert main(["plan", presigned, "--world-size", "2"]) == 0
        out = capsys.readouterr().out
        assert f"{bucket}/plan/b.csv" in out and "Signature=***" in out
        with pytest.raises(SystemExit) as exit_code:
            main(["plan", f"{bucket}/plan/none.csv", *flags])
        assert exit_code.value.code == 2
        with pytest.raises(SystemExit) as exit_code:
            main(["plan", presigned.replace("plan/a.csv", "plan/none.csv")])
        assert exit_code.value.code == 2
    printed = capsys.readouterr()
    assert printed.err.count("shardwise plan: error:") == 2
    for text in (out, printed.out, printed.err):
        for value in (key, secret, token):
            assert value not in text and quote(value, safe="") not in text


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", ["a.csv", "t.parquet"])
def test_an_ascii_only_output_gets_ascii_tables(tmp_path: Path, name: str) -> None:
    if name.endswith(".parquet"):
        pq.write_table(pa.table({"id": range(10)}), tmp_path / name)
    else:
        (tmp_path / name).write_text("1,2\n" * 10)
    run = subprocess.run([sys.executable, "-m", "shardwise", "plan", name], cwd=tmp_path,
                         env={**os.environ, "PYTHONIOENCODING": "ascii"}, capture_output=True,
                         timeout=100, check=False)
    assert (run.returncode, run.stderr) == (0, b"")
    assert run.stdout.isascii() and b"| rank |" in run.stdout


@pytest.mark.timeout(60)  # listing 10**10 ranks would take days
def test_json_of_more_ranks_than_it_can_list_is_refused_naming_the_table(tmp_path: Path,
                                                                         capsys) -> None:
    (tmp_path / "a.csv").write_text("1,2\n")
    with pytest.raises(SystemExit) as exit_code:
        main(["plan", str(tmp_path / "a.csv"), "--world-size", str(10**10), "--format", "json"])
    error = capsys.readouterr().err
    assert exit_code.value.code == 2 and error.count("\n") == 1
    assert "--format json lists every rank, at most 1,000,000; got --world-size 10,000,000,000" \
        in error and "--format table" in error
    assert main(["plan", str(tmp_path / "a.csv"), "--world-size", str(10**10)]) == 0
