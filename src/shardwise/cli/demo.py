"""``shardwise demo``: the whole system on a small data set, across local processes or torchrun's.

Writes labelled vectors to a few text files, loads them in parallel, trains a small model with
DistributedDataParallel through shardwise.DataLoader and a ClassBalancedSampler, evaluates it
exactly (and as torch's padded sampler would), then stops an epoch half-way and finishes it on
one rank fewer from the saved state, checking that every sample was trained exactly once.

    shardwise demo                                   # 3 local gloo processes
    torchrun --nproc-per-node 3 -m shardwise demo    # or torchrun's ranks, on one or more machines
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

from rich.console import Console

from shardwise.cli.folder import make_folder
from shardwise.cli.nproc import check_nproc
from shardwise.demo.data import WRITTEN
from shardwise.demo.job import FEWEST_SAMPLES_PER_RANK, MOST_SAMPLES, check_samples, run_rank
from shardwise.demo.report import print_report
from shardwise.distributed.launch import process_group_from_env, spawn_local
from shardwise.distributed.world import resolve_world

MOST_SEED = 2**63 - 1  # torch.manual_seed's largest
DESCRIPTION = (
    "The whole system on a small data set: files loaded in parallel, class-balanced DDP "
    "training through shardwise.DataLoader, exact evaluation beside torch's padded one, and an "
    "epoch stopped half-way and finished on one rank fewer, each sample trained exactly once. "
    "Runs on 3 local gloo processes, or under torchrun (torchrun --nproc-per-node 3 -m "
    "shardwise demo; with --nnodes and a rendezvous endpoint, across machines)."
)


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = sub.add_parser("demo", help="train across ranks and check every guarantee",
                            description=DESCRIPTION)
    parser.add_argument("--nproc", type=int, default=None,
                        help="local gloo processes to start (default 3; under torchrun, its ranks)")
    parser.add_argument("--epochs", type=int, default=2, help="training epochs (default 2)")
    parser.add_argument("--samples", type=int, default=3001,
                        help=f"samples in the data set, {FEWEST_SAMPLES_PER_RANK} a rank to "
                             f"{MOST_SAMPLES:,} (default 3001)")
    parser.add_argument("--seed", type=int, default=0,
                        help="data and training seed, in [0, 2**63 - 1] (default 0)")
    parser.add_argument("--workdir", type=Path, default=None,
                        help="an empty or new folder where the data set is written, on each "
                             "machine (default: a folder under the system's temporary "
                             "directory)")
    return parser


def check_workdir(folder: Path) -> None:
    """Refuse a ``--workdir`` that is a file, or holds files the demo did not write: it loads
    every file in the folder."""
    if folder.exists() and not folder.is_dir():
        raise ValueError(f"--workdir {folder} is a file: name an empty or new folder")
    others = sorted(p.name for p in folder.iterdir() if not WRITTEN.fullmatch(p.name)
                    ) if folder.exists() else []
    if others:
        shown = ", ".join(others[:3]) + (", ..." if len(others) > 3 else "")
        raise ValueError(f"--workdir {folder} holds files the demo did not write ({shown}), and "
                         "the demo loads every file there: name an empty or new folder")


def run(args: argparse.Namespace) -> int:
    if args.epochs < 1:
        raise ValueError(f"--epochs must be at least 1, got {args.epochs}")
    if not 0 <= args.seed <= MOST_SEED:
        raise ValueError(f"--seed must be in [0, 2**63 - 1], got {args.seed}")
    if args.workdir is not None:
        check_workdir(args.workdir)
    under_torchrun = "WORLD_SIZE" in os.environ
    if under_torchrun and args.nproc is not None:
        raise ValueError("--nproc starts local processes; under torchrun use its "
                         "--nproc-per-node instead")
    nproc = 3 if args.nproc is None else args.nproc
    check_nproc(nproc)
    check_samples(args.samples, resolve_world()[0] if under_torchrun else nproc)
    if args.workdir is not None:  # made once every flag is known to be good
        make_folder("--workdir", args.workdir)
    console = Console(highlight=False)
    if not console.is_terminal:
        console = Console(highlight=False, width=100)  # a log: never squeeze the tables
    options = {"epochs": args.epochs, "samples": args.samples, "seed": args.seed,
               "workdir": str(args.workdir or Path(tempfile.gettempdir())
                              / f"shardwise-demo-{args.samples}-{args.seed}"),
               "progress": console.is_terminal}
    if under_torchrun:  # its ranks
        with process_group_from_env(alone=True):  # the demo's collectives need a group
            report = run_rank(options)
    else:
        report = spawn_local(run_rank, nproc, options)[0]
    if report is None:  # not rank 0: rank 0 prints
        return 0
    return 0 if print_report(report, console) else 1
