"""Make every rank agree: compare what each rank believes and fail loudly on all of them.

A rank whose sampler has another seed, epoch or dataset length than the others does not crash;
it silently reads data that overlaps theirs. :func:`check_consistent` turns that into an error
on every rank, at the cost of one small collective. Samplers never run collectives on their own,
so call it yourself, once per epoch, after ``set_epoch``.

Likewise a rank that fails alone would leave the others waiting in their next collective:
:func:`agree` and :func:`together` put one small all-gather before it, so that an error on any
rank is raised on every rank, in the failing rank's type, naming the rank.
"""

from __future__ import annotations

import contextlib
import copy
import pickle
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, TypeVar

from torch.utils.data import DistributedSampler as TorchDistributedSampler

from shardwise.distributed.world import gather_objects, group_world

T = TypeVar("T")


class InconsistentRanksError(RuntimeError):
    """Ranks that must agree do not; the message names which ranks differ in which field."""


class ConfiguredSampler(Protocol):
    """What :func:`check_consistent` needs of a sampler; ``shardwise.DistributedSampler`` has it."""

    rank: int

    def config(self) -> dict[str, Any]: ...

    def fingerprint(self) -> int: ...


def agree(
    mine: Mapping[str, Any], must_match: Sequence[str], group: Any = None, *, caller: str,
    advice: str = "",
) -> list[dict[str, Any]]:
    """Every rank's ``mine``, after making every rank raise if any rank's input is unusable.

    ``mine["problem"]`` is that rank's input error or ``None``; any such error is raised on all
    ranks (so none is left waiting in the next collective; see :func:`raise_first_problem`), then
    :class:`InconsistentRanksError` if a ``must_match`` field differs between ranks, its message
    ending in ``advice`` (how to make them match), if given.

    >>> agree({"problem": None, "size": 7}, ["size"], caller="coverage")
    [{'problem': None, 'size': 7}]
    """
    problem = mine["problem"]
    sent = {**mine, "problem": _portable(problem)}
    if problem is None and group_world(group)[0] > 1:
        try:  # pickled here first: failing inside the collective, this rank would fail alone
            pickle.dumps(sent)
        except Exception as exc:  # noqa: BLE001 - whatever it is, every rank raises it
            problem = TypeError(f"{caller} sends this rank's settings to the others, but they "
                                f"cannot be pickled ({type(exc).__name__}: {exc}); pass plain "
                                "values (numbers, strings)")
            problem.__cause__ = exc
            sent = {"problem": _portable(problem)}
    per_rank = gather_objects(sent, group)
    raise_first_problem([fields["problem"] for fields in per_rank], cause=problem)
    differ = disagreements([{key: fields[key] for key in must_match} for fields in per_rank])
    if differ:
        raise InconsistentRanksError(f"{caller} needs the same {', '.join(must_match)} on every "
                                     "rank: " + "; ".join(differ)
                                     + (f". {advice}" if advice else ""))
    return per_rank


def together(step: Callable[[], T], group: Any = None) -> T:
    """``step()`` on every rank; if it raised on any rank, it raises on every rank (one collective).

    Put it before a collective that a failed rank would never join, so no rank waits for it.

    >>> together(lambda: 7)
    7
    """
    return together_noted(step, lambda _: None, group)[0]


def together_noted(step: Callable[[], T], note: Callable[[T], Any], group: Any = None
                   ) -> tuple[T, list[Any]]:
    """``together``, also giving every rank's ``note(result)``, gathered in the same collective.

    >>> together_noted(lambda: 7, lambda result: result + 1)
    (7, [8])
    """
    try:
        result = step()
        mine = note(result)
    except Exception as exc:
        agree({"problem": exc}, (), group, caller="together")  # raises it on every rank
        raise
    per_rank = agree({"problem": None, "note": mine}, (), group, caller="together")
    return result, [fields["note"] for fields in per_rank]


def raise_first_problem(
    problems: Sequence[BaseException | None], cause: BaseException | None = None
) -> None:
    """Raise the lowest failing rank's exception, its message naming every failing rank.

    The exception keeps its type and attributes (a ``FileNotFoundError`` stays one) where it can
    be copied with a new message, else it becomes its nearest built-in base class. Ranks that
    failed with the same message are named together. ``cause`` (this rank's own exception, with
    its traceback) becomes the raised exception's ``__cause__``.

    >>> raise_first_problem([None, ValueError("size must be an int")])
    Traceback (most recent call last):
    ValueError: rank 1: size must be an int
    """
    failed: dict[tuple[type, str], tuple[BaseException, list[int]]] = {}  # by type and text
    for rank, exc in enumerate(problems):
        if exc is not None:
            failed.setdefault((type(exc), str(exc)), (exc, []))[1].append(rank)
    if not failed:
        return
    first = next(iter(failed.values()))[0]
    raised = type(_with_message(first, ""))  # the type the message will travel in
    parts = [f"{name_ranks(ranks)}: {'' if kind is raised else kind.__name__ + ': '}{text}"
             for (kind, text), (_, ranks) in list(failed.items())[:_SHOWN_PROBLEMS]]
    if len(failed) > _SHOWN_PROBLEMS:
        parts.append(f"and {len(failed) - _SHOWN_PROBLEMS} other problem(s) on other ranks")
    raise _with_message(first, "; ".join(parts)) from cause


def disagreements(per_rank: Sequence[Mapping[str, Any]]) -> list[str]:
    """One sentence per value that is not the most common one, for each field that differs.

    >>> disagreements([{"seed": 0}, {"seed": 0}, {"seed": 1}])
    ['rank 2 has seed=1 where ranks 0, 1 have seed=0']
    """
    names = dict.fromkeys(name for fields in per_rank for name in fields)  # in first-seen order
    sentences = []
    for field in names:
        groups = group_ranks([fields.get(field, _MISSING) for fields in per_rank])
        # The largest group is taken as the intended value (ties: the one with the lowest rank).
        usual_value, usual_ranks = max(groups, key=lambda group: len(group[1]))
        for value, ranks in groups:
            if ranks is not usual_ranks:
                sentences.append(f"{_ranks_have(ranks)} {_show(field, value)} where "
                                 f"{_ranks_have(usual_ranks)} {_show(field, usual_value)}")
    return sentences


def check_consistent(
    sampler: ConfiguredSampler | TorchDistributedSampler, group: Any = None, *,
    batching: Mapping[str, Any] | None = None, problem: BaseException | None = None,
) -> None:
    """Raise :class:`InconsistentRanksError` on every rank unless all samplers agree.

    Compares ``sampler.config()`` and ``sampler.fingerprint()`` across the ranks of ``group``
    (one ``all_gather_object``), and checks that ``num_replicas`` is the group's size and each
    sampler's ``rank`` its process's rank in the group. torch's ``DistributedSampler`` is
    compared by its dataset's length, ``seed``, ``epoch``, ``shuffle``, ``drop_last`` and
    ``num_replicas``. ``batching``: a loader's settings that fix how many steps each rank takes
    (``batch_size``, ``drop_last``), compared in the same collective. ``problem``: an error
    this rank met before the check, raised on every rank instead (none is left waiting for it).

    >>> from shardwise import DistributedSampler
    >>> check_consistent(DistributedSampler(7, num_replicas=1, rank=0), batching={"batch_size": 2})
    """
    world, _ = group_world(group)
    fields: dict[str, Any] = {}
    try:
        if batching is not None and not isinstance(batching, Mapping):
            raise TypeError(f"batching must be None or a mapping such as {{'batch_size': 32, "
                            f"'drop_last': False}}, got {batching!r} ({type(batching).__name__})")
        if problem is None:
            fields = sampler_fields(sampler)
    # (an unsupported sampler, or one whose config() or fingerprint() failed here)
    except Exception as error:  # noqa: BLE001 - raised on every rank: none waits for this one
        problem, batching = problem or error, None
    per_rank = agree({"problem": problem, "rank": getattr(sampler, "rank", None),
                      "fields": fields, "batching": dict(batching or {})}, (), group,
                     caller="check_consistent")
    problems = disagreements([mine["fields"] for mine in per_rank])
    problems += [f"rank {rank}'s sampler has rank={mine['rank']!r}"
                 for rank, mine in enumerate(per_rank) if mine["rank"] != rank]
    for value, ranks in group_ranks([mine["fields"].get("num_replicas") for mine in per_rank]):
        if value is not None and value != world:  # (None: a rank that splits nothing)
            problems.append(f"{_ranks_have(ranks)} num_replicas={value!r} but the process group "
                            f"has {world} rank{'s' if world != 1 else ''}")
    steps = disagreements([mine["batching"] for mine in per_rank])
    parts = []
    if problems:
        parts.append("samplers differ across ranks, so their shares would overlap or leave gaps: "
                     + "; ".join(problems))
    if steps:
        parts.append("loaders batch differently across ranks, or resume states saved at other "
                     "steps, so they take different numbers of steps (a collective in one step "
                     "would wait for a rank that has stopped): " + "; ".join(steps))
    if parts:
        raise InconsistentRanksError(
            ". ".join(parts) + ". Build the sampler and loader from the same arguments on every "
            "rank, call set_epoch(epoch) on all of them, and resume them all from states saved "
            "at the same step."
        )


def sampler_fields(sampler: ConfiguredSampler | TorchDistributedSampler) -> dict[str, Any]:
    """What :func:`check_consistent` compares of ``sampler``.

    >>> from torch.utils.data import DistributedSampler
    >>> sampler_fields(DistributedSampler(range(10), num_replicas=2, rank=0, seed=3))
    {'size': 10, 'seed': 3, 'epoch': 0, 'shuffle': True, 'drop_last': False, 'num_replicas': 2}
    """
    if callable(getattr(sampler, "config", None)):
        fields = dict(sampler.config())
        if callable(getattr(sampler, "fingerprint", None)):
            fields["fingerprint"] = int(sampler.fingerprint())
        return fields
    if isinstance(sampler, TorchDistributedSampler):
        return {"size": len(sampler.dataset), "seed": sampler.seed, "epoch": sampler.epoch,
                "shuffle": sampler.shuffle, "drop_last": sampler.drop_last,
                "num_replicas": sampler.num_replicas}
    raise TypeError(f"check_consistent compares shardwise's samplers and torch's "
                    f"DistributedSampler, not {type(sampler).__name__}")


class _Missing:
    def __repr__(self) -> str:
        return "<missing>"


_MISSING = _Missing()
_SHOWN_PROBLEMS = 8  # distinct problems a message lists; the rest are counted


def group_ranks(values: Sequence[Any]) -> list[tuple[Any, list[int]]]:
    """Each distinct value of ``values[rank]`` with the ranks that hold it, in first-seen order.

    >>> group_ranks(["a", "b", "a"])
    [('a', [0, 2]), ('b', [1])]
    """
    # Equality, not hashing, so unhashable values (lists, arrays' tuples) group too.
    groups: list[tuple[Any, list[int]]] = []
    for rank, value in enumerate(values):
        for known, ranks in groups:
            if known == value:
                ranks.append(rank)
                break
        else:
            groups.append((value, [rank]))
    return groups


def name_ranks(ranks: Sequence[int]) -> str:
    """``rank 2`` or ``ranks 0, 1``.

    >>> name_ranks([0, 1])
    'ranks 0, 1'
    """
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {', '.join(map(str, ranks))}"


def _ranks_have(ranks: Sequence[int]) -> str:
    return f"{name_ranks(ranks)} {'has' if len(ranks) == 1 else 'have'}"


def _with_message(exc: BaseException, message: str) -> BaseException:
    """A copy of ``exc`` saying ``message``: its own type where a copy can carry the message,
    else the nearest built-in base class that can (custom constructors, ``UnicodeDecodeError``)."""
    with contextlib.suppress(Exception):  # a type that cannot be copied falls back below
        copied = copy.copy(exc)  # through __reduce__, as pickle rebuilds it
        copied.args = (message,)
        if str(copied) == message:
            return copied
    for base in type(exc).__mro__:
        if base.__module__ == "builtins":
            with contextlib.suppress(Exception):  # e.g. UnicodeDecodeError wants five arguments
                rebuilt = base(message)
                if str(rebuilt) == message:
                    return rebuilt
    return RuntimeError(message)


def _portable(exc: BaseException | None) -> BaseException | None:
    """``exc`` if pickle can rebuild it on the other ranks, else a built-in stand-in naming it."""
    if exc is None:
        return None
    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:  # noqa: BLE001 - a custom constructor or an unpicklable attribute
        return _with_message(exc, f"{type(exc).__name__}: {exc}")


def _show(field: str, value: Any) -> str:
    if field == "fingerprint" and isinstance(value, int):
        return f"{field}={value:#018x}"
    return f"{field}={value!r}"
