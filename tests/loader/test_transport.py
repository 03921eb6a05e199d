"""Batches through shared-memory slots come back equal, whatever they hold."""

import copyreg
from collections import OrderedDict, defaultdict, namedtuple

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.nn.utils.rnn import PackedSequence, pack_padded_sequence
from torch.testing._internal.two_tensor import TwoTensor

from shardwise.loader.transport import Arena, SharedSlot, bytes_needed, flatten, pack, unpack
from shardwise.loader.workers import SlotCollate

Pair = namedtuple("Pair", "left right")
DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.uint8,
          torch.int64, torch.bool, torch.complex64]


def round_trip(batch, size=1 << 20):
    slot = SharedSlot(size)
    try:
        data, arrays = flatten(batch)
        offsets = pack(arrays, Arena(slot))
        if offsets is None:
            return None
        copy = unpack(data, offsets, slot)
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
    assert copy["grad"].requires_grad and torch.equal(copy["grad"], batch["grad"])  # pickled


def test_a_batch_larger_than_the_slot_asks_for_a_larger_one():
    big = torch.randn(1000, 100)
    assert round_trip(big, size=4096) is None
    assert bytes_needed([big]) >= big.numel() * 4
    assert_same(big, round_trip(big, size=bytes_needed([big])))


def test_a_large_pickle_travels_in_the_slot_too():
    batch = {"names": [f"sample-{i}" for i in range(20_000)], "x": torch.arange(5)}
    data, _ = flatten(batch)
    assert isinstance(data, int)  # only its length goes through the pipe
    assert_same(batch, round_trip(batch))


@pytest.mark.timeout(60)
def test_long_index_lists_and_large_pickled_batches_do_not_wait_on_each_other():
    # Each task is a long list of indices, each batch a large pickle: with both through the
    # pipes, the worker would block writing its batch while the main process blocks writing
    # the worker its next task.
    from shardwise import DataLoader

    class Names(torch.utils.data.Dataset):
        def __len__(self):
            return 200_000

        def __getitem__(self, index):
            return f"sample-{index}"

    batches = list(DataLoader(Names(), batch_size=50_000, num_workers=1))
    assert [len(batch) for batch in batches] == [50_000] * 4
    assert batches[3][-1] == "sample-199999"


def test_default_collation_stacks_samples_off_the_cpu_where_they_are_as_torchs():
    collate = SlotCollate()
    collate.arena = Arena(SharedSlot(1 << 16))
    stacked = collate([torch.empty(2, device="meta")] * 3)
    assert stacked.device.type == "meta" and stacked.shape == (3, 2)
    collate.arena.slot.close()


def test_default_collation_writes_straight_into_the_slot():
    slot = SharedSlot(1 << 20)
    collate = SlotCollate()
    collate.arena = Arena(slot)
    batch = collate([{"x": torch.full((3,), float(i)), "y": i} for i in range(4)])
    assert slot.holds(batch["x"]) is not None  # stacked in place: no copy left to make
    assert batch["y"].tolist() == [0, 1, 2, 3]
    data, arrays = flatten(batch)
    offsets = pack(arrays, collate.arena)
    assert offsets[0] == slot.holds(batch["x"])
    assert unpack(data, offsets, slot)["x"][:, 0].tolist() == [0.0, 1.0, 2.0, 3.0]
    del batch, arrays
    collate.arena = None
    slot.close()


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(DTYPES), st.lists(st.integers(0, 6), max_size=3)),
                max_size=6))
def test_any_list_of_arrays_round_trips(specs):
    batch = [(torch.rand(tuple(shape)) * 5).to(dtype) for dtype, shape in specs]
    assert_same(batch, round_trip(batch))


class Tagged(list):
    """A list subclass with an attribute of its own."""

    tag = None


class Subclassed(torch.Tensor):
    pass


def fidelity_batch():
    tagged = Tagged([torch.ones(1)])
    tagged.tag = "kept"
    shared = torch.arange(3.0)
    return {
        "masked": np.ma.masked_array([1, 2, 3], mask=[0, 1, 0]),
        "default": defaultdict(list, a=[torch.ones(1)]),
        "subclass": torch.ones(2).as_subclass(Subclassed),
        "tagged": tagged,
        "fortran": np.asfortranarray(np.arange(6.0).reshape(2, 3)),
        "transposed": torch.arange(6).reshape(2, 3).t(),
        "channels_last": torch.rand(2, 3, 4, 5).contiguous(memory_format=torch.channels_last),
        "twice": [shared, shared],
        "conjugate": torch.tensor([1 + 2j, 3 - 1j]).conj(),  # a lazy view: its bytes are not it
        "negative": torch.tensor([1 + 2j, 3 - 1j])._neg_view(),
        # Overlapping views: a dense copy would be 1000x their memory (and writable).
        "windows": torch.arange(2000.0).unfold(0, 1000, 1),
        "expanded": torch.ones(1).expand(1000),
    }


def test_what_is_not_a_plain_container_or_array_comes_back_as_pickle_brings_it():
    batch = fidelity_batch()
    copy = round_trip(batch)
    assert np.array_equal(copy["masked"].mask, [False, True, False])
    assert type(copy["default"]) is defaultdict and copy["default"]["new"] == []
    assert type(copy["subclass"]) is Subclassed
    assert type(copy["tagged"]) is Tagged and copy["tagged"].tag == "kept"
    assert copy["fortran"].flags.f_contiguous and np.array_equal(copy["fortran"], batch["fortran"])
    assert copy["transposed"].stride() == (1, 3)
    assert torch.equal(copy["transposed"], batch["transposed"])
    assert copy["channels_last"].is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(copy["channels_last"], batch["channels_last"])
    assert copy["twice"][0] is copy["twice"][1]  # one array, as torch's pickling keeps it
    # Their values arrive, the lazy bits resolved (``numpy()`` refuses a tensor with them); torch's
    # workers drop a conjugate bit and send the values unconjugated.
    for lazy in ("conjugate", "negative"):
        assert copy[lazy].tolist() == batch[lazy].tolist()
        assert not copy[lazy].is_conj() and not copy[lazy].is_neg()


class FidelityDataset(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 2

    def __getitem__(self, index: int) -> dict:
        return fidelity_batch()


def pack_sequences(samples):
    data = torch.stack([sample[0] for sample in samples], 1)
    lengths = torch.tensor([data.shape[0] - i for i in range(data.shape[1])])
    return pack_padded_sequence(data, lengths, enforce_sorted=False)


@pytest.mark.timeout(120)
def test_worker_batches_keep_their_types_and_layouts_as_torchs_workers_do():
    from shardwise import DataLoader

    batch = next(iter(DataLoader(FidelityDataset(), batch_size=None, num_workers=1)))
    expected = next(iter(torch.utils.data.DataLoader(FidelityDataset(), batch_size=None,
                                                     num_workers=1)))
    for key in expected:
        assert type(batch[key]) is type(expected[key])
    assert batch["tagged"].tag == "kept" and batch["twice"][0] is batch["twice"][1]
    for key in ("transposed", "fortran", "channels_last"):  # (NumPy's converted to a tensor)
        assert batch[key].stride() == expected[key].stride()
    for key in ("windows", "expanded"):  # sent as the storage they view, as torch sends them
        assert torch.equal(batch[key], expected[key])
        assert batch[key].stride() == expected[key].stride()
        assert batch[key].untyped_storage().nbytes() == expected[key].untyped_storage().nbytes()
    data = torch.utils.data.TensorDataset(torch.arange(50.0).view(10, 5))
    packed = list(DataLoader(data, batch_size=2, collate_fn=pack_sequences, num_workers=1))
    assert all(type(p) is PackedSequence for p in packed) and len(packed) == 5
    assert torch.equal(packed[0].data, pack_sequences([data[0], data[1]]).data)


def test_tensor_subclasses_and_tensors_with_attributes_travel_in_the_slot_and_come_back_whole():
    labelled = torch.arange(4.0)
    labelled.label = "boxes"
    subclass = torch.ones(3).as_subclass(Subclassed)
    subclass.format = "xyxy"
    batch = {"labelled": labelled, "subclass": subclass}
    _, arrays = flatten(batch)
    assert len(arrays) == 2  # both in the slot (pinned there when asked), not pickled whole
    copy = round_trip(batch)
    assert type(copy["subclass"]) is Subclassed and copy["subclass"].format == "xyxy"
    assert copy["labelled"].label == "boxes" and torch.equal(copy["labelled"], labelled)


class Registered(torch.Tensor):
    """A subclass whose pickling a library registered with copyreg: it travels as a list."""


copyreg.pickle(Registered, lambda tensor: (torch.tensor, (tensor.tolist(),)))


def test_subclasses_that_wrap_tensors_or_pickle_their_own_way_keep_their_pickling():
    wrapper = TwoTensor(torch.zeros(3), torch.ones(3))  # __torch_dispatch__: its alias is one too
    sparse = torch.sparse_coo_tensor([[0, 2]], [1.0, 2.0], (3,))
    copy = round_trip({"wrapper": wrapper, "registered": torch.ones(2).as_subclass(Registered),
                       "sparse": sparse})
    assert torch.equal(copy["sparse"].to_dense(), sparse.to_dense())  # pickled, as torch does
    assert type(copy["wrapper"]) is TwoTensor and copy["wrapper"].b.tolist() == [1.0] * 3
    assert type(copy["registered"]) is torch.Tensor  # as its reducer says, as pickle does


class Handle:
    """An object whose unpickling fails in the main process with an OSError."""

    def __getstate__(self) -> dict:
        return {"path": "/no/such/file"}

    def __setstate__(self, state: dict) -> None:
        with open(state["path"]):
            pass


class Handles(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 3

    def __getitem__(self, index: int):
        return {"x": torch.full((2,), float(index)), "handle": Handle() if index == 1 else None}


@pytest.mark.timeout(120)
def test_a_batch_that_cannot_be_rebuilt_here_fails_alone_with_its_own_error():
    from shardwise import DataLoader

    iterator = iter(DataLoader(Handles(), batch_size=None, num_workers=1))
    assert next(iterator)["x"].tolist() == [0.0, 0.0]
    with pytest.raises(FileNotFoundError, match="rebuilding the batch DataLoader worker process 0"):
        next(iterator)  # its own error, as torch raises it: not a worker reported dead
    assert next(iterator)["x"].tolist() == [2.0, 2.0]
