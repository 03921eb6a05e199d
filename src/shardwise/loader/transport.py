"""Batches between processes through reusable shared memory: arrays as bytes, the rest pickled.

A worker process owns a few slots, each an anonymous shared mapping (``memfd`` where the system
has it, else an already-unlinked file) whose descriptor it hands to the main process once. No
slot has a name, so nothing is left in ``/dev/shm`` when a process dies, and ``/dev/shm``'s size
limit (64 MiB in a default Docker container) does not apply. A batch's tensors and NumPy arrays
are written into a slot (default collation stacks them there directly, so they are written once);
only a small message travels through the pipe: the batch pickled as torch's workers pickle it,
with each array replaced by where it lies in the slot (a large pickle lies in the slot too).
The main process copies the arrays out and hands the slot back.
"""

from __future__ import annotations

import copyreg
import ctypes
import io
import mmap
import os
import pickle
import struct
import tempfile
import weakref
from multiprocessing import reduction
from multiprocessing.connection import Connection
from typing import Any

import numpy as np
import torch
from torch._tensor import _rebuild_from_type_v2

ALIGN = 64  # every array starts on a cache line, so any dtype can be viewed in place
HEADER = ALIGN  # a slot's first bytes: the flag that it holds a batch
# A batch pickled larger than this (thousands of strings, say) travels in its slot too: a pipe
# that full blocks the worker writing it, and the main process writing the worker a long list of
# indices would wait for the worker to read it, each waiting for the other.
PIPED_BYTES = 1 << 16
Array = torch.Tensor | np.ndarray


class SharedSlot:
    """An anonymous shared mapping of ``size`` bytes: made by a worker, adopted by the main process.

    Its first byte says whether it holds a batch the main process has not copied out yet: the
    worker sets it when it sends a batch, the main process clears it once the batch is copied,
    so handing a slot back costs no message. Arrays start after that header.

    >>> slot = SharedSlot(4096)
    >>> slot.full, slot.bytes(HEADER, 3).numpy().tolist()
    (False, [0, 0, 0])
    >>> slot.close()
    """

    def __init__(self, size: int, fd: int | None = None) -> None:
        self.size = size
        if fd is None:
            fd = _anonymous_file(size)
        self.fd = fd
        self.buffer = mmap.mmap(fd, size)
        self._base = torch.frombuffer(self.buffer, dtype=torch.uint8, count=size)
        self._address = self._base.data_ptr()
        _OPEN_SLOTS.add(self)

    @property
    def full(self) -> bool:
        return bool(self.buffer[0])  # the mapping's own byte: no tensor made to read it

    @full.setter
    def full(self, value: bool) -> None:
        self.buffer[0] = int(value)

    def bytes(self, offset: int, count: int) -> torch.Tensor:
        """A uint8 tensor over ``count`` bytes of the slot from ``offset`` (shared, not copied)."""
        return self._base[offset : offset + count]

    def copy_in(self, offset: int, count: int, address: int) -> None:
        """Copy ``count`` bytes from memory at ``address`` to ``offset`` (one memcpy, no views)."""
        ctypes.memmove(self._inside(offset, count), address, count)

    def copy_out(self, offset: int, count: int, address: int) -> None:
        """Copy ``count`` bytes from ``offset`` to memory at ``address`` (one memcpy, no views)."""
        ctypes.memmove(address, self._inside(offset, count), count)

    def _inside(self, offset: int, count: int) -> int:
        """The address of ``offset``, once ``count`` bytes from there are known to lie inside."""
        if not 0 <= offset <= offset + count <= self.size:
            raise ValueError(f"bytes {offset}..{offset + count} lie outside a slot of {self.size}")
        return self._address + offset

    def holds(self, tensor: torch.Tensor) -> int | None:
        """Where ``tensor``'s data starts in this slot, or ``None`` when it lies elsewhere."""
        start = tensor.data_ptr() - self._address
        inside = 0 <= start and start + tensor.numel() * tensor.element_size() <= self.size
        return start if inside and tensor.is_contiguous() else None

    def close(self) -> None:
        """Unmap and close; tensors over the slot must be gone by now."""
        del self._base
        self.buffer.close()
        os.close(self.fd)


# Every slot open in this process. A process forked from it closes them: they are not its own,
# and held there they would keep their shared memory as long as it lives (another loader's
# persistent workers, say). Batches never point into a slot: they are copied out of it.
_OPEN_SLOTS: weakref.WeakSet[SharedSlot] = weakref.WeakSet()


def _close_inherited_slots() -> None:
    for slot in list(_OPEN_SLOTS):
        try:
            slot.close()
        except (BufferError, OSError):  # (a view of it alive at the fork: it stays)
            pass
    _OPEN_SLOTS.clear()


os.register_at_fork(after_in_child=_close_inherited_slots)


def _anonymous_file(size: int) -> int:
    if hasattr(os, "memfd_create"):
        fd = os.memfd_create("shardwise-slot", os.MFD_CLOEXEC)
    else:  # unlinked at once: only the descriptor keeps it
        folder = "/dev/shm" if os.path.isdir("/dev/shm") else None
        with tempfile.TemporaryFile(dir=folder) as handle:
            fd = os.dup(handle.fileno())
    os.ftruncate(fd, size)
    return fd


def send(conn: Connection, message: Any) -> None:
    """Send a small message with plain pickle.

    ``Connection.send`` builds a multiprocessing pickler per call, whose copy of the reducer
    table torch has extended costs more than the rest of a batch's messages together.
    """
    conn.send_bytes(pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL))


def framed(message: Any) -> bytes:
    """``message`` as :func:`send` writes it to a pipe (a length, then the pickle), pickled now
    for a thread that writes it later (see ``ProcessPool``); :func:`receive` reads it.

    >>> frame = framed("hi")
    >>> int.from_bytes(frame[:4], "big") == len(frame) - 4
    True
    """
    payload = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    if len(payload) > 0x7FFFFFFF:  # as Connection.send_bytes: a -1, then a 64-bit length
        return struct.pack("!iQ", -1, len(payload)) + payload
    return struct.pack("!i", len(payload)) + payload


def receive(conn: Connection) -> Any:
    """The next message :func:`send` sent on ``conn``."""
    return pickle.loads(conn.recv_bytes())


def send_descriptor(conn: Connection, fd: int, pid: int) -> None:
    """Send file descriptor ``fd`` on ``conn`` to process ``pid``, leaving ``conn`` blocking."""
    reduction.send_handle(conn, fd, pid)
    # It went through a socket made on the pipe, which ``socket.setdefaulttimeout`` makes
    # non-blocking, the pipe with it: a long message would then fail half-written.
    os.set_blocking(conn.fileno(), True)


def receive_descriptor(conn: Connection) -> int:
    """The file descriptor :func:`send_descriptor` sent on ``conn``, left blocking."""
    fd = reduction.recv_handle(conn)
    os.set_blocking(conn.fileno(), True)  # (as in send_descriptor)
    return fd


# Where a batch's array went, in place of the array in the pickled batch: its number among the
# batch's arrays, whether it is NumPy's, its dtype, shape and layout (see ``_layout``).
Placed = tuple[int, bool, Any, tuple[int, ...], Any]


class Arena:
    """Places a batch's arrays one after another in a slot (a bump allocator).

    Default collation allocates its stacked tensors here, so they are written once; any other
    array is copied in by :func:`pack`. ``allocate`` gives ``None`` once the slot is full.
    """

    def __init__(self, slot: SharedSlot) -> None:
        self.slot = slot
        self.used = HEADER

    def reserve(self, count: int) -> int | None:
        """Where the next ``count`` bytes go in the slot; ``None`` when they do not fit."""
        start = _aligned(self.used)
        if start + count > self.slot.size or count == 0:
            return None
        self.used = start + count
        return start

    def allocate(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor | None:
        count = _numel(shape) * dtype.itemsize
        start = self.reserve(count)
        return None if start is None else self.slot.bytes(start, count).view(dtype).view(shape)


def flatten(batch: Any) -> tuple[bytes | int, list[Array]]:
    """``batch`` pickled, with each plain CPU tensor or numeric NumPy array left out: in its place
    the pickle holds a :data:`Placed` reference, and the arrays are returned to be packed. A
    pickle over :data:`PIPED_BYTES` is packed too, as the last array, and only its length given.

    Everything else is pickled as torch's workers pickle it, so containers, dataclasses,
    namedtuples and array subclasses come back as they were; an array that appears twice comes
    back as one array.

    >>> data, arrays = flatten({"x": torch.ones(2), "name": ["a", "b"]})
    >>> type(data).__name__, len(arrays)
    ('bytes', 1)
    >>> data, arrays = flatten(["a"] * PIPED_BYTES)
    >>> data == arrays[-1].nbytes, len(arrays)
    (True, 1)
    """
    out = io.BytesIO()
    pickler = _ArrayPickler(out)
    pickler.dump(batch)
    if out.tell() <= PIPED_BYTES:
        return out.getvalue(), pickler.arrays
    return out.tell(), [*pickler.arrays, np.frombuffer(out.getbuffer(), np.uint8).copy()]


class _ArrayPickler(pickle.Pickler):
    def __init__(self, file: io.BytesIO) -> None:
        # torch's workers pickle with the default protocol: so do these, and what is pickled
        # comes back alike (protocol 5 would bring NumPy arrays back read-only).
        super().__init__(file, protocol=pickle.DEFAULT_PROTOCOL)
        self.arrays: list[Array] = []
        self._placed: dict[int, Placed] = {}

    def persistent_id(self, obj: Any) -> Placed | None:
        key = id(obj)  # (the batch being pickled keeps each object, and so its id, alive)
        if (placed := self._placed.get(key)) is not None:  # an array that appears again
            return placed
        kind = type(obj)  # exactly: a subclass (a masked array, say) keeps its own pickling
        if kind is torch.Tensor:
            if obj.is_conj() or obj.is_neg():
                obj = obj.resolve_conj().resolve_neg()  # its values, as torch's workers send it
            if not _movable(obj) or obj.__dict__:  # attributes set on it: see reducer_override
                return None
            if not obj.is_contiguous() and (  # (a contiguous tensor never overlaps itself)
                    obj.numel() * obj.element_size() > obj.untyped_storage().nbytes()):
                return None  # overlapping (unfold, expand): pickled, its storage is the smaller
        elif kind is not np.ndarray or obj.dtype.kind not in "biufcmMV" or obj.dtype.hasobject:
            return None
        self.arrays.append(obj)
        placed = (len(self.arrays) - 1, kind is np.ndarray, obj.dtype, tuple(obj.shape),
                  _layout(obj))
        self._placed[key] = placed
        return placed

    def reducer_override(self, obj: Any) -> Any:
        """A tensor subclass (torchvision's ``tv_tensors``, say), or a tensor with attributes of
        its own, rebuilt as torch rebuilds it, around its plain tensor: that one travels in the
        slot (pinned when asked) like any other."""
        parts = subclass_parts(obj) if isinstance(obj, torch.Tensor) else None
        if parts is None:
            return NotImplemented
        plain, kind, state = parts
        return (_rebuild_from_type_v2, (_itself, kind, (plain,), state))


def subclass_parts(tensor: torch.Tensor) -> tuple[torch.Tensor, type, Any] | None:
    """``tensor`` as a plain tensor, its type and its state (attributes), from which
    ``rewrap`` makes it again around a copy; ``None`` for a plain tensor without attributes
    (nothing to rewrap), or a subclass that must keep its own pickling and copying.

    >>> class Boxes(torch.Tensor): pass
    >>> boxes = torch.zeros(2).as_subclass(Boxes); boxes.format = "XYXY"
    >>> plain, kind, state = subclass_parts(boxes)
    >>> type(plain).__name__, kind.__name__, rewrap(plain.clone(), kind, state).format
    ('Tensor', 'Boxes', 'XYXY')
    """
    kind = type(tensor)
    if kind is torch.Tensor and not tensor.__dict__:
        return None
    # Left alone: subclasses that pickle themselves (Parameter), have a reducer registered,
    # or wrap other tensors (``__torch_dispatch__``: DTensor, say).
    if (kind.__reduce_ex__ is not torch.Tensor.__reduce_ex__ or kind in copyreg.dispatch_table
            or kind.__torch_dispatch__ is not torch.Tensor.__torch_dispatch__
            or not _movable(tensor)):  # (a sparse tensor has no plain alias)
        return None
    plain = tensor.as_subclass(torch.Tensor)
    if type(plain) is not torch.Tensor:
        return None
    return plain, kind, torch._utils._get_obj_state(tensor)


def rewrap(plain: torch.Tensor, kind: type, state: Any) -> torch.Tensor:
    """``plain`` made a ``kind`` with ``state``, as unpickling makes it."""
    return _rebuild_from_type_v2(_itself, kind, (plain,), state)


def _itself(tensor: torch.Tensor) -> torch.Tensor:
    return tensor


def pack(arrays: list[Array], arena: Arena) -> list[int] | None:
    """Offsets of ``arrays`` in the arena's slot, copying in those not already there.

    ``None`` when they do not all fit: the caller grows the slot (see :func:`bytes_needed`).
    """
    offsets = []
    for array in arrays:
        tensor = _as_tensor(array)
        offset = arena.slot.holds(tensor)
        if offset is None:
            count = tensor.numel() * tensor.element_size()
            if not count:
                offset = 0  # nothing to copy: an empty array
            elif (offset := arena.reserve(count)) is None:
                return None
            else:
                arena.slot.copy_in(offset, count, tensor.data_ptr())
        offsets.append(offset)
    return offsets


def bytes_needed(arrays: list[Array]) -> int:
    """The slot size that holds ``arrays`` one after another, aligned."""
    total = HEADER
    for array in arrays:
        total = _aligned(total) + _as_tensor(array).numel() * _as_tensor(array).element_size()
    return total


def unpack(data: bytes | int, offsets: list[int], slot: SharedSlot, pin: bool = False) -> Any:
    """The batch :func:`flatten` pickled, its arrays copied out of ``slot`` into memory of their
    own (and the pickle itself, where only its length came).

    With ``pin`` the tensors land in page-locked memory, ready for an asynchronous copy to a GPU.
    """
    if isinstance(data, int):
        pickled = np.empty(data, np.uint8)
        slot.copy_out(offsets[-1], data, pickled.ctypes.data)
        data, offsets = pickled.data, offsets[:-1]
    return _ArrayUnpickler(data, offsets, slot, pin).load()


class _ArrayUnpickler(pickle.Unpickler):
    def __init__(self, data: bytes | memoryview, offsets: list[int], slot: SharedSlot,
                 pin: bool) -> None:
        super().__init__(io.BytesIO(data))
        self._offsets, self._slot, self._pin = offsets, slot, pin
        self._restored: dict[int, Array] = {}

    def persistent_load(self, placed: Placed) -> Array:
        index, numpy, dtype, shape, layout = placed
        array = self._restored.get(index)
        if array is not None:
            return array
        if numpy:
            array = np.empty(shape, dtype, order=layout or "C")
            address, count = array.ctypes.data, array.nbytes
        else:
            # One plain memcpy: torch's copy_ would start threads for it, and views cost more
            # than copying a small batch.
            if layout is None:
                array = torch.empty(shape, dtype=dtype, pin_memory=self._pin)
            else:
                array = torch.empty_strided(shape, layout, dtype=dtype, pin_memory=self._pin)
            address, count = array.data_ptr(), array.numel() * array.element_size()
        self._slot.copy_out(self._offsets[index], count, address)
        self._restored[index] = array
        return array


def _movable(tensor: torch.Tensor) -> bool:
    """Whether a tensor's values are its bytes in memory, which the slot can carry as they are
    (a lazily conjugated or negated view's are not)."""
    return (tensor.device.type == "cpu" and tensor.layout == torch.strided
            and not tensor.is_nested and not tensor.requires_grad and not tensor.is_quantized
            and not tensor.is_conj() and not tensor.is_neg())


def _layout(array: Array) -> Any:
    """How an array's elements lie in memory, when it is dense but not in row-major order: a
    tensor's strides (transposed, channels-last), ``"F"`` for a column-major NumPy array.
    ``None``: row-major, as every other array is sent."""
    if isinstance(array, np.ndarray):
        fortran = array.ndim > 1 and array.flags.f_contiguous and not array.flags.c_contiguous
        return "F" if fortran else None
    if array.is_contiguous() or not _dense(array):
        return None
    return array.stride()


def _dense(tensor: torch.Tensor) -> bool:
    """Whether ``tensor``'s elements fill the memory from its first one, each once."""
    extents = sorted((stride, size) for size, stride in zip(tensor.shape, tensor.stride())
                     if size > 1)
    expected = 1
    for stride, size in extents:
        if stride != expected:
            return False
        expected *= size
    return True


def _as_tensor(array: Array) -> torch.Tensor:
    """A contiguous tensor over ``array``'s bytes as :func:`_layout` places them (NumPy arrays
    as uint8)."""
    if isinstance(array, np.ndarray):
        ordered = array.T if _layout(array) == "F" else array
        return torch.from_numpy(np.ascontiguousarray(ordered).reshape(-1).view(np.uint8))
    if _layout(array) is not None:  # its memory as it lies: no reordering
        return array.as_strided((array.numel(),), (1,))
    return array.contiguous()


def _aligned(offset: int) -> int:
    return -(-offset // ALIGN) * ALIGN


def _numel(shape: tuple[int, ...]) -> int:
    count = 1
    for extent in shape:
        count *= extent
    return count
