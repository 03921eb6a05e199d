"""Batches through shared-memory slots come back equal, whatever they hold."""

from collections import OrderedDict, namedtuple

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from shardwise.loader.transport import Arena, SharedSlot, bytes_needed, flatten, pack, unpack
from shardwise.loader.workers import SlotCollate

Pair = namedtuple("Pair", "left right")
DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.uint8,
          torch.int64, torch.bool, torch.complex64]


def round_trip(batch, size=1 << 20):
    slot = SharedSlot(size)
    try:
        tree, arrays = flatten(batch)
        offsets = pack(arrays, Arena(slot))
        if offsets is None:
            return None
        copy = unpack(tree, offsets, slot)
        del arrays
        return copy
    finally:
        slot.close()


def assert_same(a, b):
    assert type(a) is type(b)
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
        assert a.numel() == 0 or a.data_ptr() != b.data_ptr()  # a copy, not a view of the slot
    elif isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and np.array_equal(a, b)
    elif isinstance(a, dict):
        assert list(a) == list(b)
        for key in a:
            assert_same(a[key], b[key])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            assert_same(x, y)
    else:
        assert a == b


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_every_dtype_comes_back_equal(dtype):
    values = (torch.randn(5, 3) * 10).to(dtype)
    assert_same(values, round_trip(values))


def test_nested_containers_keep_their_types():
    batch = OrderedDict(
        image=torch.arange(24, dtype=torch.float32).reshape(2, 3, 4),
        pair=Pair(torch.tensor([1, 2]), np.arange(4, dtype=np.int16)),
        names=["a", "b"], meta=(3, "x", None), empty=torch.zeros(0, 5),
        strided=torch.arange(20).reshape(4, 5)[:, ::2], scalar=torch.tensor(7.5),
        grad=torch.ones(2, requires_grad=True),  # not moved: pickled as it is
    )
    copy = round_trip(batch)
    assert type(copy) is OrderedDict and type(copy["pair"]) is Pair
    for key in ("image", "pair", "names", "meta", "empty", "strided", "scalar"):
        assert_same(batch[key], copy[key])
    assert copy["grad"] is batch["grad"]  # flatten leaves it in the message


def test_a_batch_larger_than_the_slot_asks_for_a_larger_one():
    big = torch.randn(1000, 100)
    assert round_trip(big, size=4096) is None
    assert bytes_needed([big]) >= big.numel() * 4
    assert_same(big, round_trip(big, size=bytes_needed([big])))


def test_default_collation_writes_straight_into_the_slot():
    slot = SharedSlot(1 << 20)
    collate = SlotCollate()
    collate.arena = Arena(slot)
    batch = collate([{"x": torch.full((3,), float(i)), "y": i} for i in range(4)])
    assert slot.holds(batch["x"]) is not None  # stacked in place: no copy left to make
    assert batch["y"].tolist() == [0, 1, 2, 3]
    tree, arrays = flatten(batch)
    offsets = pack(arrays, collate.arena)
    assert offsets[0] == slot.holds(batch["x"])
    assert unpack(tree, offsets, slot)["x"][:, 0].tolist() == [0.0, 1.0, 2.0, 3.0]
    del batch, arrays, tree
    collate.arena = None
    slot.close()


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(DTYPES), st.lists(st.integers(0, 6), max_size=3)),
                max_size=6))
def test_any_list_of_arrays_round_trips(specs):
    batch = [(torch.rand(tuple(shape)) * 5).to(dtype) for dtype, shape in specs]
    assert_same(batch, round_trip(batch))
