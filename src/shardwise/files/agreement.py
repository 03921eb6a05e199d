"""Before a load reads anything, every rank checks that all ranks planned the same load.

Each rank plans on its own (expanding paths, listing directories, asking file sizes), so ranks on
machines that see different directories, or planning while a file grows, may compute different
plans and would then silently read overlapping shares, losing and duplicating lines. One small
all-gather settles it: each rank sends any error it met while planning, its settings and a digest
of its file list (names and sizes). An error on any rank is raised on every rank; differing
settings or digests raise ``InconsistentRanksError`` on every rank, and only then are the full
file lists gathered, to name the first file that differs and the ranks involved.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from shardwise.distributed.consistency import (
    InconsistentRanksError,
    agree,
    group_ranks,
    name_ranks,
    together_noted,
)
from shardwise.distributed.world import gather_objects, group_world
from shardwise.files.columnar import TablePlan
from shardwise.files.plan import Plan, plan
from shardwise.files.read import line_bounds
from shardwise.files.sources import Paths, StorageOptions

Listing = list[tuple[str, int]]  # (name, size) of each planned file, in plan order
T = TypeVar("T")
P = TypeVar("P", Plan, TablePlan)  # text files by bytes, columnar ones by row groups


def agreed_plan(paths: Paths | Plan, *, storage_options: StorageOptions | None = None) -> Plan:
    """``plan(paths, world_size)`` for the process group, checked to be the same on every rank.

    Call it on every rank together (it is one collective); an error planning on any rank (a
    missing file) is raised on every rank, naming the rank. Pass the result to ``iter_chunks``,
    ``read_lines`` or ``read_bytes``, which never communicate themselves. URLs are opened with
    ``storage_options`` (see ``plan``).

    >>> import tempfile, pathlib
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "a.txt"
    >>> _ = path.write_text("1,2\\n")
    >>> agreed_plan(path).total_bytes
    4
    """
    the_plan, _ = plan_together(
        lambda world_size: (plan(paths, world_size, storage_options=storage_options), None, {}),
        caller="agreed_plan")
    return the_plan


def plan_together(
    prepare: Callable[[int], tuple[P, T, Mapping[str, Any]]], *, caller: str
) -> tuple[P, T]:
    """Run ``prepare(world_size)`` on every rank, in one collective: it checks arguments and plans,
    giving the plan, what else it prepared, and the settings every rank must share. Raise on every
    rank if it raised on any, if the settings differ, or if the plans do."""
    try:
        the_plan, prepared, settings = prepare(group_world()[0])
    except Exception as exc:
        agree({"problem": exc}, (), caller=caller)  # raises it on every rank
        raise
    files = _digest(_listing(the_plan))
    per_rank = agree({"problem": None, **settings, "files": files}, tuple(settings), caller=caller)
    if any(fields["files"] != files for fields in per_rank):
        raise InconsistentRanksError(files_differ(gather_objects(_listing(the_plan))))
    return the_plan, prepared


def read_together(step: Callable[[], T], the_plan: P, rank: int) -> T:
    """``together(step)`` for a step that reads ``rank``'s share of ``the_plan``, checking in the
    same collective that each rank's lines end where the next rank's begin (text over ranks)."""
    text = isinstance(the_plan, Plan) and group_world()[0] > 1
    result, bounds = together_noted(step, lambda _: line_bounds(the_plan, rank) if text else None)
    if text:
        check_cuts(the_plan, bounds)
    return result


def check_cuts(the_plan: Plan, bounds: Sequence[tuple[int, int] | None]) -> None:
    """Raise ``InconsistentRanksError`` where a rank's lines (``line_bounds``) end elsewhere than
    the next non-empty rank's begin: the file's copies (or the file, rewritten at the same size
    during the load) break lines differently at their cut, so lines would be lost or read twice.
    """
    before: tuple[int, int] | None = None  # (rank, stop) of the last rank with bytes
    for rank, mine in enumerate(bounds):
        if mine is None:
            continue
        if before is not None and before[1] != mine[0]:
            piece = the_plan.pieces(rank)[0]
            at = int(the_plan.offsets[piece.file])
            raise InconsistentRanksError(
                f"rank {before[0]}'s lines of {piece.source.name} end at byte {before[1] - at:,} "
                f"but rank {rank}'s begin at byte {mine[0] - at:,}: the file breaks its lines "
                "elsewhere on the two ranks (is it another file of the same size on one of their "
                "machines, or was it rewritten during the load?), so lines would be lost or read "
                "twice. Give every rank the same files and leave them unchanged during the load")
        before = (rank, mine[1])


def files_differ(listings: Sequence[Listing]) -> str:
    """Say where each rank's file list first parts from the most common one, and how to fix it.

    >>> print(files_differ([[("a", 4), ("b", 2)], [("b", 2), ("a", 4)], [("a", 4), ("b", 2)]]))
    ... # doctest: +NORMALIZE_WHITESPACE
    ranks planned different input files, so their shares would overlap or leave gaps: file 1 is
    b on rank 1 but a on ranks 0, 2 (the same files in another order). Give every rank the same
    files in the same order (a sorted list, not a set) and leave them unchanged during the load
    """
    groups = group_ranks(list(listings))
    usual, usual_ranks = max(groups, key=lambda group: len(group[1]))  # ties: the lowest rank
    sentences = [_first_difference(listing, name_ranks(ranks), usual, name_ranks(usual_ranks))
                 for listing, ranks in groups if ranks is not usual_ranks]
    return ("ranks planned different input files, so their shares would overlap or leave gaps: "
            + "; ".join(sentences) + ". Give every rank the same files in the same order (a sorted "
            "list, not a set) and leave them unchanged during the load")


def _first_difference(listing: Listing, ranks: str, usual: Listing, usual_ranks: str) -> str:
    names, usual_names = [name for name, _ in listing], [name for name, _ in usual]
    counts = f"({len(listing)} files there, {len(usual)} on {usual_ranks})"
    for index, ((name, size), (usual_name, usual_size)) in enumerate(zip(listing, usual)):
        if name == usual_name and size != usual_size:
            return (f"{name} has {size:,} bytes on {ranks} but {usual_size:,} on {usual_ranks} "
                    "(did it change while the ranks planned?)")
        if name != usual_name:
            if usual_name not in names:
                return f"{usual_name} is missing on {ranks} {counts}"
            if name not in usual_names:
                return f"{name} is planned on {ranks} only {counts}"
            same = sorted(names) == sorted(usual_names)
            order = " (the same files in another order)" if same else ""
            return f"file {index + 1} is {name} on {ranks} but {usual_name} on {usual_ranks}{order}"
    if len(listing) < len(usual):
        return f"{usual[len(listing)][0]} is missing on {ranks} {counts}"
    return f"{listing[len(usual)][0]} is planned on {ranks} only {counts}"


def _listing(the_plan: Plan | TablePlan) -> Listing:
    return [(source.name, source.size) for source in the_plan.sources]


def _digest(listing: Listing) -> str:
    return hashlib.blake2b(repr(listing).encode(), digest_size=16).hexdigest()
