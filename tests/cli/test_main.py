"""The ``shardwise`` command itself: help, version, every flag explained, hints in flag words."""

import argparse
import re
import subprocess
import sys
from pathlib import Path

import pytest

import shardwise
from shardwise.cli import COMMANDS, build_parser, main
from shardwise.cli.wording import in_cli_words


def test_bare_command_prints_help_and_succeeds(capsys):
    assert main([]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: shardwise") and "plan" in out and "load" in out


def test_version_comes_from_the_package():
    run = subprocess.run([sys.executable, "-m", "shardwise", "--version"],
                         capture_output=True, text=True)
    assert (run.returncode, run.stdout) == (0, f"shardwise {shardwise.__version__}\n")


def _parsers():
    yield build_parser()
    for module in COMMANDS.values():
        yield module.add_parser(argparse.ArgumentParser().add_subparsers())


@pytest.mark.parametrize("parser", list(_parsers()), ids=lambda p: p.prog)
def test_every_flag_has_help_in_plain_words(parser):
    for action in parser._actions:
        assert action.help, f"{parser.prog}: {action.option_strings or action.dest} has no help"
    text = parser.format_help()
    assert "``" not in text  # no RST markup
    assert not re.search(r"\bseed \d{3}\b", text)  # no internal article numbers


@pytest.mark.parametrize(
    "message,expected",
    [("bad line (fix the line, or pass on_error='skip' to count and skip such lines)",
      "bad line (fix the line, or pass --on-error skip to count and skip such lines)"),
     ("id 'x' is not an integer (pass ids='str' for string ids)",
      "id 'x' is not an integer (pass --ids str for string ids)"),
     ("permutation='feistel' needs O(1) memory", "--permutation feistel needs O(1) memory"),
     ("size=7 is fine as it is", "size=7 is fine as it is"),
     ("read by pattern: drop columns=", "read by pattern: drop --columns"),
     ("its columns are src, dst; name them in columns=",
      "its columns are src, dst; name them in --columns"),
     ("got 1 (every fvec line needs as many as the input's first line, or features=): '2'",
      "got 1 (every fvec line needs as many as the input's first line): '2'"),
     ("delimiter must be one character, got 'ab' (use parser= for anything more complex)",
      ("--delimiter must be one character, got 'ab' (for anything more complex, load the files "
       "from Python with parser=)")),
     (("the first vector in column 'v' is empty; pass features= to say how many values every "
       "vector holds"),
      ("the first vector in column 'v' is empty: shardwise load takes the vectors' length from "
       "it (from Python, pass features=)"))],
)
def test_library_hints_name_the_flags(message, expected):
    assert in_cli_words(message) == expected


def test_storage_option_hints_name_the_flag():
    assert in_cli_words("pass storage_options={'anon': True}, or check the credentials "
                        "(storage_options)") == ("pass --storage-option anon=true, or check the "
                                                 "credentials (--storage-option)")


@pytest.mark.parametrize("command", [["load", "data/"], ["demo"]])
def test_too_many_local_ranks_are_refused_naming_the_flag(command, capsys, monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    with pytest.raises(SystemExit) as caught:
        main([*command, "--nproc", "1000000"])
    assert caught.value.code == 2
    error = capsys.readouterr().err
    assert error.startswith(f"shardwise {command[0]}: error: --nproc 1,000,000 would start more "
                            "local processes than this machine runs well: at most ")
    assert error.endswith("run under torchrun across machines\n")



@pytest.mark.timeout(120)
@pytest.mark.parametrize("format", ["table", "json"])
def test_a_reader_that_goes_away_stops_the_command_quietly(format):
    run = subprocess.Popen([sys.executable, "-m", "shardwise", "plan", "--epochs", "1000",
                            "--format", format], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    run.stdout.read(10)
    run.stdout.close()  # as `| head -c 10` does
    assert (run.wait(timeout=100), run.stderr.read()) == (141, b"")


def test_a_broken_pipe_that_is_not_standard_output_is_an_error(monkeypatch, capsys, tmp_path):
    import socket

    def sends_to_a_closed_socket(args):
        mine, theirs = socket.socketpair()
        theirs.close()
        with mine:
            while True:
                mine.send(b"x" * 65536)

    monkeypatch.setattr(COMMANDS["plan"], "run", sends_to_a_closed_socket)
    with pytest.raises(SystemExit) as caught:
        main(["plan"])
    assert caught.value.code == 2
    assert "Broken pipe" in capsys.readouterr().err


def test_the_readmes_list_of_plan_flags_is_the_parsers():
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    listed = re.search(r"Flags: `([^`]*)`", readme).group(1).split()
    parser = COMMANDS["plan"].add_parser(argparse.ArgumentParser().add_subparsers())
    flags = {action.option_strings[-1]: action.choices for action in parser._actions
             if action.option_strings and action.option_strings[-1] != "--help"}
    in_readme = {word: None for word in listed if word.startswith("--")}
    for word, choices in zip(listed, listed[1:]):
        if word.startswith("--") and choices.startswith("{"):
            in_readme[word] = tuple(choices.strip("{}").split(","))
    assert in_readme == {flag: tuple(choices) if choices else None
                         for flag, choices in flags.items()}
