"""examples/exact_eval.py, run by itself: torch's padded metric is biased, shardwise's is exact."""

from __future__ import annotations

import re
import runpy
import subprocess
import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "exact_eval.py"


def test_example_shows_the_bias_and_the_exact_metric():
    run = subprocess.run([sys.executable, str(EXAMPLE)], capture_output=True, text=True,
                         timeout=180)
    assert run.returncode == 0, run.stderr
    rows = dict(re.findall(r"^(.+?):\s+accuracy (\d+/\d+) = ", run.stdout, flags=re.MULTILINE))
    # What one process computes over the whole set, from the example's own model.
    example = runpy.run_path(str(EXAMPLE))
    right = int(example["correct"](example["SAMPLES"], example["LABELS"]).sum())
    assert right == 5
    assert rows == {
        "torch DistributedSampler, summed": "7/9",  # samples 0 and 1 counted twice
        "shardwise.gather_by_index": f"{right}/7",
        "shardwise padding_mask": f"{right}/7",
    }
    assert "rank 1 evaluates samples [1, 4, 0]" in run.stdout  # seed 001's split
    assert "0 missed, 2 repeated (0, 1)" in run.stdout
