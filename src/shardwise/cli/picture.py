"""``shardwise plan --format svg`` / ``html``: the rank x batch grid of each epoch as a picture.

One panel per epoch: a row per rank, a column per batch, each sample a box with its index;
padding repeats are red, and the samples no rank sees are listed under the panel. Plain SVG,
written by hand (no plotting library), so it opens in any browser and embeds in any page.
"""

from __future__ import annotations

from html import escape
from typing import Any

BOX, GAP, BATCH_GAP = 34, 4, 18  # a sample's box, between boxes, between batches
ROW, LABEL, MARGIN = 46, 70, 20
PANEL_TITLE, PANEL_FOOT, PANEL_GAP = 30, 34, 24
COLOURS = {"sample": "#dbe8f6", "pad": "#d62728", "text": "#1b1b1b", "pad_text": "#ffffff",
           "rule": "#9aa5b1", "gap": "#f4f6f8"}
FONT = "font-family='DejaVu Sans, Arial, sans-serif'"
LEGEND = "a padding repeat: a sample this epoch hands out a second time, so every rank gets as many"


def render_svg(title: str, epochs: list[Any]) -> str:
    """The SVG of ``epochs`` (``EpochPlan``s of ``shardwise plan``), under ``title``."""
    texts = [_text_width(title, 15, bold=True), _text_width(LEGEND, 13)]
    texts += [LABEL + _text_width(_note(plan), 12) for plan in epochs]
    width = int(max([*(_panel_width(plan) for plan in epochs), *texts])) + 2 * MARGIN
    parts: list[str] = []
    top = MARGIN + 24
    parts.append(_text(MARGIN, MARGIN + 10, title, size=15, weight="bold"))
    for plan in epochs:
        parts.extend(_panel(plan, top))
        top += _panel_height(plan) + PANEL_GAP
    legend = top
    parts.append(f"<rect x='{MARGIN}' y='{legend}' width='16' height='16' rx='3' "
                 f"fill='{COLOURS['pad']}'/>")
    parts.append(_text(MARGIN + 22, legend + 13, LEGEND))
    height = legend + 16 + MARGIN
    return (f"<svg xmlns='http://www.w3.org/2000/svg' width='{width}' height='{height}' "
            f"viewBox='0 0 {width} {height}'>\n<rect width='100%' height='100%' fill='white'/>\n"
            + "\n".join(parts) + "\n</svg>\n")


def render_html(title: str, epochs: list[Any]) -> str:
    """A page holding the SVG, for a browser or a notebook."""
    return (f"<!DOCTYPE html>\n<html><head><meta charset='utf-8'><title>{escape(title)}</title>"
            f"</head>\n<body style='margin:0'>\n{render_svg(title, epochs)}</body></html>\n")


def _columns(plan: Any) -> list[int]:
    return sorted({b for rank in plan.ranks for b in rank.batch_numbers})


def _column_widths(plan: Any) -> dict[int, int]:
    widths: dict[int, int] = {}
    for rank in plan.ranks:
        for number, batch in zip(rank.batch_numbers, rank.batches):
            widths[number] = max(widths.get(number, 0), len(batch))
    return widths


def _panel_width(plan: Any) -> int:
    widths = _column_widths(plan)
    boxes = sum(count * (BOX + GAP) for count in widths.values())
    skips = sum(1 for a, b in zip(_columns(plan), _columns(plan)[1:]) if b != a + 1)
    return LABEL + boxes + BATCH_GAP * len(widths) + skips * (BOX + BATCH_GAP)


def _panel_height(plan: Any) -> int:
    return PANEL_TITLE + ROW * len(plan.ranks) + PANEL_FOOT


def _panel(plan: Any, top: int) -> list[str]:
    """One epoch: batch headings, a row of boxes per rank, the dropped samples underneath."""
    parts = [_text(MARGIN, top + 14, f"epoch {plan.epoch}", size=14, weight="bold")]
    widths = _column_widths(plan)
    lefts: dict[int, int] = {}
    x, previous = MARGIN + LABEL, None
    for number in _columns(plan):
        if previous is not None and number != previous + 1:  # batches left out: a gap
            parts.append(_text(x + 4, top + PANEL_TITLE + ROW * len(plan.ranks) / 2, "…",
                               size=18))
            x += BOX + BATCH_GAP
        lefts[number] = x
        parts.append(_text(x, top + PANEL_TITLE - 6, f"batch {number}", size=11,
                           fill=COLOURS["rule"]))
        x += widths[number] * (BOX + GAP) + BATCH_GAP
        previous = number
    for row, rank in enumerate(plan.ranks):
        y = top + PANEL_TITLE + row * ROW
        parts.append(_text(MARGIN, y + BOX / 2 + 5, f"rank {rank.rank}", size=12))
        for number, batch, pads in zip(rank.batch_numbers, rank.batches, rank.padding):
            for slot, (index, pad) in enumerate(zip(batch, pads)):
                parts.extend(_box(lefts[number] + slot * (BOX + GAP), y, index, pad))
    foot = top + PANEL_TITLE + ROW * len(plan.ranks) + 14
    parts.append(_text(MARGIN, foot, _note(plan), size=12))
    return parts


def _note(plan: Any) -> str:
    """The line under an epoch: the samples no rank sees, and the ranks left out."""
    dropped = ", ".join(map(str, plan.dropped)) or "none"
    if plan.dropped_count > len(plan.dropped):
        dropped += f", ... ({plan.dropped_count:,} in all)"
    note = f"dropped (no rank sees them this epoch): {dropped}"
    if plan.ranks_not_shown:
        note += f"   ·   {plan.ranks_not_shown:,} ranks not shown"
    return note


def _text_width(text: str, size: int, bold: bool = False) -> float:
    """About how wide ``text`` is drawn: no font metrics here, so a generous average."""
    return len(text) * size * (0.64 if bold else 0.58)


def _box(x: float, y: float, index: int | None, pad: bool | None) -> list[str]:
    if index is None:  # the middle of a long batch, left out
        return [_text(x + 8, y + BOX / 2 + 5, "…", size=16)]
    fill, ink = (COLOURS["pad"], COLOURS["pad_text"]) if pad else (COLOURS["sample"],
                                                                   COLOURS["text"])
    label = str(index)
    size = 12 if len(label) <= 4 else max(6, int(12 * 4 / len(label)))
    return [f"<rect x='{x}' y='{y}' width='{BOX}' height='{BOX}' rx='4' fill='{fill}'/>",
            _text(x + BOX / 2, y + BOX / 2 + size / 3, label, size=size, fill=ink,
                  anchor="middle")]


def _text(x: float, y: float, text: str, *, size: int = 13, weight: str = "normal",
          fill: str = COLOURS["text"], anchor: str = "start") -> str:
    return (f"<text x='{x}' y='{y}' {FONT} font-size='{size}' font-weight='{weight}' "
            f"fill='{fill}' text-anchor='{anchor}'>{escape(text)}</text>")
