"""`shardwise demo`: the whole system, on local processes, under torchrun, and on two "nodes"."""

import os
import subprocess
import sys

import pytest

from shardwise.distributed.launch import free_port

pytestmark = pytest.mark.timeout(240)
CHECKS = ("OK every batch held every class",
          "OK the epoch's 2,400 samples, both worlds together: each exactly once")


def shardwise(*args, tmp_path, timeout=200):
    return subprocess.run([sys.executable, "-m", "shardwise", *args, "--workdir", str(tmp_path)],
                          capture_output=True, text=True, timeout=timeout)


def torchrun(*args):
    return [sys.executable, "-m", "torch.distributed.run", *args, "-m", "shardwise", "demo"]


def test_the_demo_spawns_three_ranks_and_every_guarantee_holds(tmp_path):
    run = shardwise("demo", tmp_path=tmp_path)
    assert run.returncode == 0, run.stderr
    assert "shardwise demo: 3 ranks" in run.stdout
    for check in CHECKS:
        assert check in run.stdout
    assert "601" in run.stdout and "603" in run.stdout  # torch's padded split counts 2 twice


def test_one_rank_skips_only_the_resume(tmp_path):
    run = shardwise("demo", "--nproc", "1", "--epochs", "1", tmp_path=tmp_path)
    assert run.returncode == 0, run.stderr
    assert CHECKS[0] in run.stdout and "skipped: one rank cannot lose a rank" in run.stdout


def test_under_torchrun(tmp_path):
    command = torchrun("--standalone", "--nproc-per-node", "3") + ["--workdir", str(tmp_path)]
    run = subprocess.run(command, capture_output=True, text=True, timeout=200)
    assert run.returncode == 0, run.stderr[-3000:]
    assert all(check in run.stdout for check in CHECKS)


def test_across_two_nodes_with_a_c10d_rendezvous(tmp_path):
    rendezvous = ["--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d",
                  "--rdzv-endpoint", f"127.0.0.1:{free_port()}", "--rdzv-id", "shardwise-demo"]
    nodes = [subprocess.Popen(torchrun(*rendezvous) + ["--workdir", str(tmp_path)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    outputs = [node.communicate(timeout=200) for node in nodes]
    assert [node.returncode for node in nodes] == [0, 0], outputs[0][1][-2000:]
    printed = "".join(out for out, _ in outputs)
    assert "shardwise demo: 2 ranks" in printed and all(check in printed for check in CHECKS)


def test_bad_flags_are_one_line(tmp_path):
    run = shardwise("demo", "--epochs", "0", tmp_path=tmp_path)
    assert run.returncode == 2 and run.stderr.strip() == (
        "shardwise demo: error: --epochs must be at least 1, got 0")


@pytest.mark.parametrize("samples, says", [
    ("1", "--samples must be in [80, 1,000,000] for 2 ranks (40 a rank), got 1"),
    ("79", "--samples must be in [80, 1,000,000] for 2 ranks (40 a rank), got 79"),
    (str(10**12), ("--samples must be in [80, 1,000,000] for 2 ranks (40 a rank), got "
                   "1,000,000,000,000")),
])
def test_samples_out_of_bounds_are_one_line_naming_the_flag(tmp_path, samples, says):
    run = shardwise("demo", "--nproc", "2", "--samples", samples, tmp_path=tmp_path)
    assert (run.returncode, run.stderr) == (2, f"shardwise demo: error: {says}\n")


def test_the_fewest_samples_allowed_run_every_step(tmp_path):
    run = shardwise("demo", "--nproc", "2", "--samples", "80", "--epochs", "1",
                    tmp_path=tmp_path)
    assert run.returncode == 0, run.stderr
    assert CHECKS[0] in run.stdout
    assert "OK the epoch's 64 samples, both worlds together: each exactly once" in run.stdout


def test_under_torchrun_with_one_rank(tmp_path):
    command = torchrun("--standalone", "--nproc-per-node", "1") + [
        "--epochs", "1", "--workdir", str(tmp_path)]
    run = subprocess.run(command, capture_output=True, text=True, timeout=200, check=False)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "shardwise demo: 1 rank," in run.stdout and CHECKS[0] in run.stdout


@pytest.mark.parametrize("command", ["demo", "load"])
def test_a_malformed_world_size_is_named(tmp_path, command):
    paths = ["data/"] if command == "load" else []
    run = subprocess.run([sys.executable, "-m", "shardwise", command, *paths],
                         capture_output=True, text=True, timeout=100, cwd=tmp_path,
                         env={**os.environ, "WORLD_SIZE": "abc"}, check=False)
    assert run.returncode == 2
    assert run.stderr == (f"shardwise {command}: error: environment variable WORLD_SIZE='abc' is "
                          "not an integer of at least 1, as torchrun sets it: unset it to run "
                          "alone\n")


@pytest.mark.parametrize("seed", ["-1", str(10**23)])
def test_a_seed_out_of_range_is_named(tmp_path, seed):
    run = shardwise("demo", "--nproc", "1", "--seed", seed, tmp_path=tmp_path)
    assert (run.returncode, run.stderr) == (
        2, f"shardwise demo: error: --seed must be in [0, 2**63 - 1], got {seed}\n")


def test_a_workdir_holding_other_files_or_being_a_file_is_refused(tmp_path):
    (tmp_path / "notes.txt").write_text("my notes\n")
    run = shardwise("demo", "--nproc", "1", tmp_path=tmp_path)
    assert (run.returncode, run.stderr) == (2, (
        f"shardwise demo: error: --workdir {tmp_path} holds files the demo did not write "
        "(notes.txt), and the demo loads every file there: name an empty or new folder\n"))
    assert (tmp_path / "notes.txt").read_text() == "my notes\n"
    run = shardwise("demo", "--nproc", "1", tmp_path=tmp_path / "notes.txt")
    assert (run.returncode, run.stderr) == (2, (
        f"shardwise demo: error: --workdir {tmp_path / 'notes.txt'} is a file: name an empty or "
        "new folder\n"))


def test_a_workdir_that_cannot_be_made_is_named(tmp_path):
    (tmp_path / "notes.txt").write_text("my notes\n")
    folder = tmp_path / "notes.txt" / "demo"  # its parent is a file
    run = shardwise("demo", "--nproc", "1", tmp_path=folder)
    assert (run.returncode, run.stderr) == (2, (
        f"shardwise demo: error: --workdir {folder}: the folder cannot be made (Not a directory: "
        f"{folder}): name a folder that can be written\n"))
