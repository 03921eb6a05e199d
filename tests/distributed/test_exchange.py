"""all_to_all_bytes over real gloo groups: every byte reaches exactly the rank it was sent to."""

from __future__ import annotations

import numpy as np
import pytest

from shardwise.distributed.consistency import InconsistentRanksError
from shardwise.distributed.exchange import all_to_all_bytes
from shardwise.distributed.launch import spawn_local
from shardwise.distributed.world import gather_objects, group_world


def _payload(src: int, dst: int, seed: int) -> bytes:
    """The bytes rank ``src`` sends to ``dst``: uneven sizes, some empty, content tagged."""
    rng = np.random.default_rng([seed, src, dst])
    size = int(rng.choice([0, 1, 7, 1000, 50_000]))
    return rng.integers(0, 256, size=size, dtype=np.uint8).tobytes()


def _exchange_checks(seed: int) -> dict:
    world_size, rank = group_world()
    results = {}
    # Per-pair round caps from "hundreds of rounds" to "everything in one round".
    for per_pair in (333, 4096, 10**9):
        sends = [_payload(rank, dst, seed) for dst in range(world_size)]
        received = all_to_all_bytes(sends, round_bytes=per_pair * world_size)
        results[per_pair] = [bytes(r) for r in received]
    results["gathered"] = gather_objects({"rank": rank})
    return results


@pytest.mark.parametrize("world_size", [2, 3])
def test_every_rank_gets_exactly_what_each_source_sent_it(world_size: int) -> None:
    per_rank = spawn_local(_exchange_checks, world_size, 11)
    for rank, results in enumerate(per_rank):
        for key, received in results.items():
            if key == "gathered":
                assert received == [{"rank": r} for r in range(world_size)]
                continue
            assert received == [_payload(src, rank, 11) for src in range(world_size)], key


def test_without_a_process_group_the_single_rank_gets_its_own_bytes_back() -> None:
    assert group_world() == (1, 0)
    payload = np.arange(10, dtype=np.int64)
    (back,) = all_to_all_bytes([payload])
    assert back.view(np.int64).tolist() == list(range(10))
    assert gather_objects("x") == ["x"]


def test_wrong_number_of_payloads_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="one payload per rank: got 2 for a world of 1"):
        all_to_all_bytes([b"a", b"b"])


def _exchange_with_round_bytes(per_rank_round_bytes: list[int]) -> tuple[str, str]:
    world_size, rank = group_world()
    try:
        all_to_all_bytes([b"x" * 100] * world_size, round_bytes=per_rank_round_bytes[rank])
    except (InconsistentRanksError, ValueError) as exc:
        return type(exc).__name__, str(exc)
    return "ok", ""


@pytest.mark.timeout(120)
def test_ranks_with_different_round_bytes_all_fail_instead_of_one_waiting() -> None:
    # Rank 1 would run 34 rounds where the others run 1: every rank must refuse, naming rank 1.
    per_rank = spawn_local(_exchange_with_round_bytes, 3, [300, 9, 300], timeout=60)
    refused = ("the exchange needs the same round_bytes on every rank: rank 1 has round_bytes=9 "
               "where ranks 0, 2 have round_bytes=300")
    assert per_rank == [("InconsistentRanksError", refused)] * 3
    too_small = spawn_local(_exchange_with_round_bytes, 3, [2, 2, 2], timeout=60)
    too_few = "round_bytes must be at least the world size (3), got 2"
    assert too_small == [("ValueError", too_few)] * 3
