"""Move bytes between ranks: every rank sends one buffer per destination and gets one per source.

This is the only place the file loader talks to ``torch.distributed``. The send sizes are
all-gathered first (so every rank knows what it will receive and how many rounds there are),
then the bytes move with ``all_to_all_single`` (gloo on CPU tensors, NCCL on CUDA tensors; both
take uneven split sizes), in rounds that move at most ``round_bytes // world_size`` bytes per
(source, destination) pair, so a huge exchange never becomes one message beyond what gloo (or a
32-bit size field somewhere) can carry. When one round suffices, on CPU, the collective reads
the caller's buffer and writes the result buffer in place: no byte is copied on the way. With no
process group there is one rank, and its buffer comes back as it is.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
import torch.distributed as torch_dist

from shardwise.distributed.consistency import InconsistentRanksError, disagreements
from shardwise.distributed.world import collective_device, group_world

DEFAULT_ROUND_BYTES = 2**30

Buffer = bytes | bytearray | memoryview | np.ndarray


def all_to_all_bytes(
    payloads: Sequence[Buffer], *, round_bytes: int = DEFAULT_ROUND_BYTES
) -> list[np.ndarray]:
    """Send ``payloads[r]`` to rank ``r``; return, for each source rank, the bytes it sent here.

    Every rank must call this with one payload per rank. Sizes may differ freely (zero too).

    >>> [bytes(b) for b in all_to_all_bytes([b"abc"])]
    [b'abc']
    """
    world_size, _ = group_world()
    if len(payloads) != world_size:
        raise ValueError(
            f"all_to_all_bytes needs one payload per rank: got {len(payloads)} for a world of "
            f"{world_size} (is torch.distributed initialised with the right world size?)"
        )
    sends = [_as_bytes(p) for p in payloads]
    received, sizes = all_to_all_joined(
        np.concatenate(sends), [s.size for s in sends], round_bytes=round_bytes
    )
    return np.split(received, np.cumsum(sizes)[:-1])


def all_to_all_joined(
    send: np.ndarray, send_sizes: Sequence[int], *, round_bytes: int = DEFAULT_ROUND_BYTES
) -> tuple[np.ndarray, np.ndarray]:
    """Exchange one buffer grouped by destination; receive one buffer grouped by source.

    ``send`` holds ``send_sizes[r]`` bytes for rank ``r``, one destination after another. Returns
    the received bytes, source after source, and how many came from each source.

    >>> received, sizes = all_to_all_joined(np.frombuffer(b"abc", np.uint8), [3])
    >>> bytes(received), sizes.tolist()
    (b'abc', [3])
    """
    world_size, rank = group_world()
    send = _as_bytes(send)
    send_sizes = np.asarray(send_sizes, dtype=np.int64)
    if send_sizes.shape != (world_size,) or send_sizes.min(initial=0) < 0:
        raise ValueError(f"send_sizes must hold one size per rank ({world_size}), got {send_sizes}")
    if send_sizes.sum() != send.size:
        raise ValueError(f"send_sizes add up to {send_sizes.sum()} but the buffer has {send.size} bytes")
    if world_size == 1:
        return send, send_sizes
    device = collective_device()
    sizes = _all_gather_sizes(send_sizes, round_bytes, world_size, device)  # sizes[src, dst]
    if round_bytes < world_size:  # checked after the gather, so every rank raises it
        raise ValueError(f"round_bytes must be at least the world size ({world_size}), got {round_bytes}")
    recv_sizes = sizes[:, rank]
    received = np.empty(int(recv_sizes.sum()), dtype=np.uint8)
    per_pair = round_bytes // world_size
    if sizes.max() <= per_pair and device.type == "cpu":
        _exchange(send, send_sizes, received, recv_sizes, device)  # one round, in place
        return received, recv_sizes
    send_starts, recv_starts = _starts(send_sizes), _starts(recv_sizes)
    for lo in range(0, int(sizes.max()), per_pair):
        out_splits = np.clip(recv_sizes - lo, 0, per_pair)
        in_splits = np.clip(send_sizes - lo, 0, per_pair)
        staged = np.concatenate([send[a + lo : a + lo + n] for a, n in zip(send_starts, in_splits)])
        landed = np.empty(int(out_splits.sum()), dtype=np.uint8)
        _exchange(staged, in_splits, landed, out_splits, device)
        for start, piece in zip(recv_starts, np.split(landed, np.cumsum(out_splits)[:-1])):
            received[start + lo : start + lo + piece.size] = piece
    return received, recv_sizes


def _exchange(send: np.ndarray, in_splits: np.ndarray, into: np.ndarray, out_splits: np.ndarray,
              device: torch.device) -> None:
    """One ``all_to_all_single``; on CPU the tensors share the arrays' memory."""
    # torch wants writable memory; a read-only buffer (from bytes) is copied once.
    source = torch.from_numpy(send if send.flags.writeable else send.copy()).to(device)
    target = torch.from_numpy(into) if device.type == "cpu" else torch.empty(
        into.size, dtype=torch.uint8, device=device)
    torch_dist.all_to_all_single(target, source, out_splits.tolist(), in_splits.tolist())
    if device.type != "cpu":
        into[:] = target.cpu().numpy()


def _starts(sizes: np.ndarray) -> np.ndarray:
    return np.cumsum(sizes) - sizes


def _as_bytes(payload: Buffer) -> np.ndarray:
    if isinstance(payload, np.ndarray):
        return np.ascontiguousarray(payload).reshape(-1).view(np.uint8)
    return np.frombuffer(payload, dtype=np.uint8)


def _all_gather_sizes(
    sizes: np.ndarray, round_bytes: int, world_size: int, device: torch.device
) -> np.ndarray:
    """Every rank's send sizes (``[src, dst]``), checking on the way that all use one ``round_bytes``.

    Ranks with different ``round_bytes`` would run different numbers of rounds, and one would wait
    for a round no other rank starts: the value rides along with the sizes, at no extra cost.
    """
    mine = torch.from_numpy(np.append(sizes, round_bytes)).to(device)
    gathered = [torch.empty_like(mine) for _ in range(world_size)]
    torch_dist.all_gather(gathered, mine)
    table = torch.stack(gathered).cpu().numpy()
    differ = disagreements([{"round_bytes": int(value)} for value in table[:, -1]])
    if differ:
        raise InconsistentRanksError("the exchange needs the same round_bytes on every rank: "
                                     + "; ".join(differ))
    return table[:, :-1]
