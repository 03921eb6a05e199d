"""Move bytes between ranks: every rank hands one buffer per destination and gets one per source.

This is the only place the file loader talks to ``torch.distributed``. Buffers travel with
``all_to_all_single`` (gloo supports uneven split sizes on CPU tensors; NCCL on CUDA tensors), in
rounds capped at ``round_bytes`` so a huge exchange never becomes one message beyond what gloo
(or a 32-bit size field somewhere) can carry. With no process group there is one rank, and the
exchange hands its own buffer back without copying it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch
import torch.distributed as torch_dist

from shardwise.dist.world import collective_device, group_world

DEFAULT_ROUND_BYTES = 256 * 2**20

Buffer = bytes | bytearray | memoryview | np.ndarray


def all_to_all_bytes(
    payloads: Sequence[Buffer], *, round_bytes: int = DEFAULT_ROUND_BYTES
) -> list[np.ndarray]:
    """Send ``payloads[r]`` to rank ``r``; return, for each source rank, the bytes it sent here.

    Every rank must call this with one payload per rank. Sizes may differ freely (zero too).
    First the send sizes are all-gathered (so every rank knows the number of rounds), then each
    round moves at most ``round_bytes // world_size`` bytes of every (source, destination) pair.

    >>> [bytes(b) for b in all_to_all_bytes([b"abc"])]
    [b'abc']
    """
    world_size, rank = group_world()
    if len(payloads) != world_size:
        raise ValueError(
            f"all_to_all_bytes needs one payload per rank: got {len(payloads)} for a world of "
            f"{world_size} (is torch.distributed initialised with the right world size?)"
        )
    if round_bytes < world_size:
        raise ValueError(f"round_bytes must be at least the world size ({world_size}), got {round_bytes}")
    sends = [_as_bytes(p) for p in payloads]
    if world_size == 1:
        return sends
    device = collective_device()
    sizes = _all_gather_sizes([s.size for s in sends], world_size, device)  # sizes[src, dst]
    recv_sizes = sizes[:, rank]
    per_pair = round_bytes // world_size
    rounds = math.ceil(int(sizes.max()) / per_pair)
    outputs = [np.empty(int(n), dtype=np.uint8) for n in recv_sizes]
    for lo in range(0, rounds * per_pair, per_pair):
        parts = [s[lo : lo + per_pair] for s in sends]
        in_splits = [p.size for p in parts]
        out_splits = [int(np.clip(n - lo, 0, per_pair)) for n in recv_sizes]
        send = torch.from_numpy(np.concatenate(parts)).to(device)
        recv = torch.empty(sum(out_splits), dtype=torch.uint8, device=device)
        torch_dist.all_to_all_single(recv, send, out_splits, in_splits)
        received = recv.cpu().numpy()
        start = 0
        for out, n in zip(outputs, out_splits):
            out[lo : lo + n] = received[start : start + n]
            start += n
    return outputs


def _as_bytes(payload: Buffer) -> np.ndarray:
    if isinstance(payload, np.ndarray):
        return np.ascontiguousarray(payload).reshape(-1).view(np.uint8)
    return np.frombuffer(payload, dtype=np.uint8)


def _all_gather_sizes(sizes: list[int], world_size: int, device: torch.device) -> np.ndarray:
    mine = torch.tensor(sizes, dtype=torch.int64, device=device)
    gathered = [torch.empty_like(mine) for _ in range(world_size)]
    torch_dist.all_gather(gathered, mine)
    return torch.stack(gathered).cpu().numpy()
