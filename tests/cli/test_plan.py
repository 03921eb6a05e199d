import json
import os
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardwise import DistributedSampler
from shardwise.cli import build_parser, main
from shardwise.cli.plan import plan_epochs
from shardwise.order import FeistelOrder


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
     (["--size", "-3"], "--size must be in [0, 2**63 - 1], got -3"),
     (["--epochs", "1000000000"], ("--epochs must be at most 1,000, as each epoch is computed "
                                   "and printed; got 1,000,000,000")),
     (["--world-size", str(2**63)], f"--world-size must be in [1, 2**63 - 1], got {2**63}"),
     (["--seed", str(2**64)], f"--seed must be in [-2**63, 2**64 - 1], got {2**64}"),
     (["--seed", str(-2**63 - 1)], f"--seed must be in [-2**63, 2**64 - 1], got {-2**63 - 1}"),
     # Refused before a list of 10**10 ranks or a set of 10**11 batch numbers is built.
     (["--world-size", str(10**10), "--max-ranks", str(10**19)],
      "--max-ranks must be at most 1,000, as each one shown is computed and printed; got "
      "10,000,000,000,000,000,000"),
     (["--size", str(10**12), "--permutation", "feistel", "--max-batches", str(10**12)],
      "--max-batches must be at most 1,000, as each one shown is computed and printed; got "
      "1,000,000,000,000")],
)
def test_bad_flags_are_named(capsys, flags, message):
    with pytest.raises(SystemExit) as exit_info:
        main(["plan", *flags])
    assert exit_info.value.code == 2 and message in capsys.readouterr().err


# A trillion samples over 1024 ranks: 1019 padding repeats, on the last 1019 ranks.
HUGE = ["--size", str(10**12 + 5), "--world-size", "1024", "--permutation", "feistel"]


def shardwise_plan(*flags, columns=None):
    env = {**os.environ, "COLUMNS": str(columns)} if columns else {
        k: v for k, v in os.environ.items() if k != "COLUMNS"}
    run = subprocess.run([sys.executable, "-m", "shardwise", "plan", *flags],
                         capture_output=True, text=True, env=env)
    assert run.returncode == 0, run.stderr
    return run.stdout


@pytest.mark.timeout(120)  # all ranks' indices of a trillion samples would take hours
def test_a_trillion_samples_are_summarised_from_counts():
    out = shardwise_plan(*HUGE)
    assert "ranks 4 to 1019 not shown (1,016 ranks" in out
    assert "per-rank lengths [976562501]; each epoch 1,019 padding repeats and 0 dropped" in out
    rows = [line for line in out.splitlines() if line.startswith("│")]
    padded = {str(rank) for rank in range(1020, 1024)}
    last_ranks = [row for row in rows if row.split("│")[1].strip() in padded]
    assert len(last_ranks) == 2 * 4 and all(row.count("*") == 1 for row in last_ranks)


@pytest.mark.timeout(120)
def test_json_of_a_trillion_samples_stays_small():
    out = shardwise_plan(*HUGE, "--batch-size", "1000", "--format", "json")
    assert len(out) < 100_000
    first = json.loads(out)["epochs"][0]
    assert (first["ranks_not_shown"], first["padding"]) == (1016, 1019)
    assert first["lengths"] == [976562501]
    assert [r["rank"] for r in first["ranks"]] == [0, 1, 2, 3, 1020, 1021, 1022, 1023]
    last = first["ranks"][-1]
    assert last["samples"] == 976562501 and last["batch_numbers"][-1] == 976562
    assert last["batch_numbers"][:11] == list(range(11))
    long_batch = last["batches"][0]
    assert len(long_batch) == 9 and long_batch[4] is None  # first 4, a gap, last 4 of 1000
    assert last["padding"][-1] == [False] * 4 + [None] + [False] * 3 + [True]  # padding comes last


@pytest.mark.timeout(120)
def test_padding_marks_survive_an_80_column_terminal():
    flags = [*HUGE, "--batch-size", "32", "--epochs", "1"]
    plan = json.loads(shardwise_plan(*flags, "--format", "json"))["epochs"][0]
    marks = sum(pad is True for r in plan["ranks"] for pads in r["padding"] for pad in pads)
    narrow = shardwise_plan(*flags, columns=80)
    assert max(map(len, narrow.splitlines())) <= 80
    body = [line for line in narrow.splitlines() if line.startswith("│")]
    assert sum(line.count("*") for line in body) == marks == 4  # on ranks 1020 to 1023
    assert "…" not in narrow  # nothing was cut


def test_shown_batches_are_the_samplers_own():
    flags = ["--size", "1000", "--world-size", "16", "--batch-size", "4", "--layout", "block",
             "--max-ranks", "4", "--max-batches", "3", "--seed", "5"]
    plan = json.loads(shardwise_plan(*flags, "--format", "json"))
    for epoch in plan["epochs"]:
        assert epoch["ranks_not_shown"] == 12 and epoch["lengths"] == [63]
        for rank in epoch["ranks"]:
            sampler = DistributedSampler(1000, 16, rank["rank"], seed=5, layout="block")
            sampler.set_epoch(epoch["epoch"])
            indices, mask = sampler.indices().tolist(), sampler.padding_mask().tolist()
            assert rank["batch_numbers"] == [0, 1, 15]
            for number, batch, pads in zip(rank["batch_numbers"], rank["batches"], rank["padding"]):
                assert batch == indices[number * 4 : number * 4 + 4]
                assert pads == mask[number * 4 : number * 4 + 4]


def test_uneven_ranks_show_both_lengths_and_each_ranks_last_batch(capsys):
    (epoch,) = plan_json(capsys, "--size", "103", "--world-size", "10", "--remainder", "uneven",
                         "--batch-size", "5", "--epochs", "1", "--max-batches", "1")["epochs"]
    assert epoch["lengths"] == [10, 11] and epoch["padding"] == 0
    by_rank = {r["rank"]: r["batch_numbers"] for r in epoch["ranks"]}
    assert by_rank == {0: [1, 2], 1: [1, 2], 2: [1, 2], 3: [1], 6: [1], 7: [1], 8: [1], 9: [1]}


def test_torch_permutation_of_a_huge_size_is_refused_with_the_way_out(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["plan", "--size", str(10**9)])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and len(err.splitlines()) == 1
    assert "1,000,000,000-sample permutation" in err and "use --permutation feistel" in err


def test_far_more_ranks_than_samples_lists_each_repeated_sample_once(capsys):
    plan = plan_json(capsys, "--size", "10", "--world-size", str(10**11), "--permutation",
                     "feistel", "--max-ranks", "3")
    first = plan["epochs"][0]
    assert first["repeated"] == list(range(10)) and first["repeated_count"] == 10


def test_a_trillion_ranks_one_sample_over_list_the_first_repeats(capsys):
    size, world = 10**12 + 1, 10**12
    (epoch,) = plan_json(capsys, "--size", str(size), "--world-size", str(world),
                         "--permutation", "feistel", "--epochs", "1")["epochs"]
    assert epoch["padding"] == epoch["repeated_count"] == world - 1
    # More than are listed: the first ones padding repeats, which are the order's first samples.
    first = FeistelOrder(size, seed=0, epoch=0).take(np.arange(20)).tolist()
    assert epoch["repeated"] == first and epoch["dropped_count"] == 0


def test_a_trillion_ranks_one_sample_short_list_the_first_drops(capsys):
    size, world = 2 * 10**12 - 1, 10**12
    (epoch,) = plan_json(capsys, "--size", str(size), "--world-size", str(world), "--permutation",
                         "feistel", "--epochs", "1", "--remainder", "drop")["epochs"]
    assert epoch["dropped_count"] == world - 1 and epoch["repeated_count"] == 0
    tail = FeistelOrder(size, seed=0, epoch=0).take(np.arange(world, world + 20)).tolist()
    assert epoch["dropped"] == tail


@settings(max_examples=100, deadline=None)
@given(size=st.integers(0, 60), world=st.integers(1, 40), epoch=st.integers(0, 3),
       remainder=st.sampled_from(["pad", "drop", "uneven"]),
       permutation=st.sampled_from(["torch", "feistel", None]))
def test_listed_repeats_and_drops_are_those_of_every_ranks_whole_pass(
        size, world, epoch, remainder, permutation):
    flags = ["plan", "--size", str(size), "--world-size", str(world), "--epochs", str(epoch + 1),
             "--remainder", remainder, "--max-batches", "1", "--seed", "7"]
    flags += ["--permutation", permutation] if permutation else ["--no-shuffle"]
    plan = plan_epochs(build_parser().parse_args(flags))[epoch]
    seen, repeated = set(), set()
    for rank in range(world):
        sampler = DistributedSampler(size, world, rank, shuffle=permutation is not None, seed=7,
                                     remainder=remainder, permutation=permutation or "torch")
        sampler.set_epoch(epoch)
        indices, pads = sampler.indices(), sampler.padding_mask()
        seen.update(indices.tolist())
        repeated.update(indices[pads].tolist())
    dropped = set(range(size)) - seen
    for listed, count, whole in ((plan.repeated, plan.repeated_count, repeated),
                                 (plan.dropped, plan.dropped_count, dropped)):
        assert count == len(whole) and len(listed) == min(count, 20)
        assert listed == sorted(whole) if count <= 20 else set(listed) <= whole
