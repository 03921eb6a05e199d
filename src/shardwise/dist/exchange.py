"""Move bytes between ranks: every rank hands one buffer per destination and gets one per source.

This is the only place the file loader talks to ``torch.distributed``. After the sizes are
all-gathered, every (source, destination) pair moves its bytes point to point
(``batch_isend_irecv``: gloo on CPU tensors, NCCL on CUDA tensors) in messages of at most
``round_bytes // world_size`` bytes, so a huge exchange never becomes one message beyond what gloo
(or a 32-bit size field somewhere) can carry. On CPU the messages are views of the caller's
buffers and of the one receive buffer, so no byte is copied on the way. With no process group
there is one rank, and the exchange hands its own buffer back without copying it.
"""

from __future__ import annotations

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
    The returned arrays are consecutive views of one buffer (see ``all_to_all_joined``).

    >>> [bytes(b) for b in all_to_all_bytes([b"abc"])]
    [b'abc']
    """
    received, sizes = all_to_all_joined(payloads, round_bytes=round_bytes)
    return np.split(received, np.cumsum(sizes)[:-1])


def all_to_all_joined(
    payloads: Sequence[Buffer], *, round_bytes: int = DEFAULT_ROUND_BYTES
) -> tuple[np.ndarray, np.ndarray]:
    """Like ``all_to_all_bytes``, but everything received arrives in one buffer, in source order.

    Returns the buffer and the number of bytes from each source. First the send sizes are
    all-gathered, then each pair's bytes move in messages of at most ``round_bytes // world_size``.

    >>> received, sizes = all_to_all_joined([b"abc"])
    >>> bytes(received), sizes.tolist()
    (b'abc', [3])
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
        return sends[0], np.array([sends[0].size])
    device = collective_device()
    recv_sizes = _all_gather_sizes([s.size for s in sends], world_size, device)[:, rank]
    received = np.empty(int(recv_sizes.sum()), dtype=np.uint8)
    inbox = np.split(received, np.cumsum(recv_sizes)[:-1])
    inbox[rank][:] = sends[rank]  # our own share never touches the network
    # On CUDA the whole exchange is staged on the device; on CPU the tensors share numpy's memory.
    # torch wants writable memory; read-only payloads (bytes) are copied once.
    outgoing = [torch.from_numpy(s if s.flags.writeable else s.copy()).to(device) for s in sends]
    incoming = [torch.from_numpy(b) if device.type == "cpu" else
                torch.empty(b.size, dtype=torch.uint8, device=device) for b in inbox]
    step = round_bytes // world_size
    ops = []
    for peer in range(world_size):
        if peer != rank:
            ops += [torch_dist.P2POp(torch_dist.isend, outgoing[peer][lo : lo + step], peer)
                    for lo in range(0, sends[peer].size, step)]
            ops += [torch_dist.P2POp(torch_dist.irecv, incoming[peer][lo : lo + step], peer)
                    for lo in range(0, inbox[peer].size, step)]
    for work in torch_dist.batch_isend_irecv(ops) if ops else ():
        work.wait()
    if device.type != "cpu":
        for peer, tensor in enumerate(incoming):
            if peer != rank:
                inbox[peer][:] = tensor.cpu().numpy()
    return received, recv_sizes


def _as_bytes(payload: Buffer) -> np.ndarray:
    if isinstance(payload, np.ndarray):
        return np.ascontiguousarray(payload).reshape(-1).view(np.uint8)
    return np.frombuffer(payload, dtype=np.uint8)


def _all_gather_sizes(sizes: list[int], world_size: int, device: torch.device) -> np.ndarray:
    mine = torch.tensor(sizes, dtype=torch.int64, device=device)
    gathered = [torch.empty_like(mine) for _ in range(world_size)]
    torch_dist.all_gather(gathered, mine)
    return torch.stack(gathered).cpu().numpy()
