"""Every Python block in the README and in docs/ is a whole script: each runs here as users run it.

A block whose leading comments name ``torchrun --nproc-per-node N`` runs under torchrun with N
local gloo processes; any other block runs with plain ``python``. A leading ``# needs: package``
skips the block where that package is not installed. The scripts check their own claims with
``assert``, so a recipe that stops being true fails here.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
TORCHRUN = re.compile(r"torchrun --nproc-per-node[ =](\d+)")
NEEDS = re.compile(r"^# needs: (\w+)", re.MULTILINE)


def python_blocks(path: Path) -> list[tuple[int, str]]:
    """``(line number, code)`` of each fenced ```python block of a Markdown file."""
    blocks, lines = [], path.read_text().splitlines()
    start = None
    for number, line in enumerate(lines, 1):
        if start is None and line.strip() == "```python":
            start = number
        elif start is not None and line.strip() == "```":
            blocks.append((start, "\n".join(lines[start:number - 1]) + "\n"))
            start = None
    return blocks


RECIPES = [(doc, line, code) for doc in DOCUMENTS for line, code in python_blocks(doc)]


def test_every_document_is_scanned_and_has_recipes():
    assert {doc.name for doc, _, _ in RECIPES} >= {
        "README.md", "resume.md", "shuffling.md", "exact_evaluation.md", "balance.md", "files.md"}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("doc,line,code", RECIPES,
                         ids=[f"{doc.name}:{line}" for doc, line, _ in RECIPES])
def test_recipe_runs_as_a_whole_script(tmp_path: Path, tmp_path_factory: pytest.TempPathFactory,
                                       doc: Path, line: int, code: str) -> None:
    header = "\n".join(line for line in code.splitlines() if line.startswith("#"))
    for package in NEEDS.findall(header):
        pytest.importorskip(package)
    script = tmp_path / "recipe.py"
    script.write_text(code)
    launch = TORCHRUN.search(header)
    command = [sys.executable, str(script)]
    if launch:
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                   f"--nproc-per-node={launch.group(1)}", str(script)]
    # Its temporary folders under pytest's (a short path: forkserver puts sockets there)
    temporary = tmp_path_factory.mktemp("tmp")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TMPDIR": str(temporary)}
    run = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=280,
                         env=env)
    assert run.returncode == 0, f"{doc.name}:{line} failed:\n{run.stdout}\n{run.stderr[-4000:]}"
