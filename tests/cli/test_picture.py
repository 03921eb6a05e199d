"""`shardwise plan --format svg|html`: a well-formed picture with every padding repeat in red."""

import subprocess
import sys
from xml.etree import ElementTree

import pytest

from shardwise.cli import main

SVG = "{http://www.w3.org/2000/svg}"


def picture(capsys, *flags):
    assert main(["plan", "--format", "svg", *flags]) == 0
    return ElementTree.fromstring(capsys.readouterr().out)


def test_the_seven_sample_example_as_a_picture(capsys):
    root = picture(capsys)
    red = [r for r in root.iter(f"{SVG}rect") if r.get("fill") == "#d62728"]
    assert len(red) == 2 * 2 + 1  # two repeats in each of two epochs, and the legend's swatch
    texts = [t.text for t in root.iter(f"{SVG}text")]
    assert texts.count("epoch 0") == 1 and texts.count("epoch 1") == 1
    assert sum(t in {str(i) for i in range(7)} for t in texts) == 2 * 9  # 9 boxes an epoch
    assert any(t.startswith("dropped (no rank sees them this epoch): none") for t in texts)


def test_dropped_samples_are_listed(capsys):
    root = picture(capsys, "--no-shuffle", "--remainder", "drop", "--epochs", "1")
    texts = [t.text for t in root.iter(f"{SVG}text")]
    assert "dropped (no rank sees them this epoch): 6" in texts


def test_html_holds_the_svg(capsys):
    assert main(["plan", "--format", "html"]) == 0
    page = capsys.readouterr().out
    assert page.startswith("<!DOCTYPE html>") and "<svg" in page and page.rstrip().endswith("</html>")


@pytest.mark.timeout(60)
def test_a_trillion_samples_draw_in_seconds():
    run = subprocess.run([sys.executable, "-m", "shardwise", "plan", "--format", "svg", "--size",
                          "1000000000000", "--world-size", "1024", "--permutation", "feistel",
                          "--epochs", "1"], capture_output=True, text=True, timeout=50)
    assert run.returncode == 0, run.stderr
    root = ElementTree.fromstring(run.stdout)
    assert any("1,016 ranks not shown" in (t.text or "") for t in root.iter(f"{SVG}text"))
