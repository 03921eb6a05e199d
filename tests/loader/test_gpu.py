"""Batches to the GPU: pinned in a background thread, copied ahead on a side stream.

Skipped where there is no GPU (CI has none); run on a GPU machine before a release.
"""

import gc
import itertools
import multiprocessing
import threading
import time
import weakref

import pytest
import torch
from torch.utils._pytree import tree_leaves, tree_map
from torch.utils.data import DataLoader as TorchLoader
from torch.utils.data import Dataset

from shardwise import DataLoader
from tests.loader.test_failures import Collecting

pytestmark = [
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU"),
    pytest.mark.timeout(120),
]

WORKERS = [{"num_workers": 0}, {"num_workers": 2},
           {"num_workers": 2, "worker_type": "thread"}]


class Nested(Dataset):
    """Tensors nested in a dict, a tuple and a list, beside values that are not tensors."""

    def __len__(self) -> int:
        return 64

    def __getitem__(self, index: int) -> dict:
        image = torch.arange(3 * 32 * 32, dtype=torch.float32).reshape(3, 32, 32) + index
        return {"index": index, "name": f"item-{index}",
                "pair": (image, torch.tensor(index % 7)), "rest": [torch.full((5,), index)]}


class Failing(Nested):
    def __getitem__(self, index: int) -> dict:
        if index == 37:
            raise ValueError("bad item 37")
        return super().__getitem__(index)


def plain(batch):
    """The batch with every tensor as a list (device, pinning and dtype of storage aside)."""
    return tree_map(lambda x: x.tolist() if isinstance(x, torch.Tensor) else x, batch)


def tensors(batch) -> list[torch.Tensor]:
    return [x for x in tree_leaves(batch) if isinstance(x, torch.Tensor)]


def cpu_batches(**options) -> list:
    return list(DataLoader(Nested(), batch_size=8, **options))


@pytest.mark.parametrize("workers", WORKERS, ids=str)
@pytest.mark.parametrize("pin", [False, True])
def test_every_tensor_arrives_on_the_gpu_equal_to_the_cpu_batch(workers, pin):
    expected = cpu_batches(shuffle=True, generator=torch.Generator().manual_seed(4), **workers)
    batches = list(DataLoader(Nested(), batch_size=8, shuffle=True, pin_memory=pin,
                              generator=torch.Generator().manual_seed(4), device="cuda",
                              **workers))
    assert all(t.is_cuda for batch in batches for t in tensors(batch))
    assert [b["name"] for b in batches] == [b["name"] for b in expected]  # not tensors: as they are
    assert plain(batches) == plain(expected)


@pytest.mark.parametrize("workers", WORKERS, ids=str)
def test_pin_memory_pins_every_tensor(workers):
    batches = list(DataLoader(Nested(), batch_size=8, pin_memory=True, **workers))
    assert all(t.is_pinned() for batch in batches for t in tensors(batch))
    assert plain(batches) == plain(cpu_batches(**workers))


@pytest.mark.parametrize("workers", WORKERS, ids=str)
def test_the_step_may_use_and_drop_a_batch_while_the_next_is_copied(workers):
    """The caller's stream waits for each copy, and a batch's memory is not reused for a later
    copy while kernels queued on the caller's stream still read it."""
    expected = sum(b["pair"][0].double().sum() for b in cpu_batches(**workers))
    total = torch.zeros((), dtype=torch.float64, device="cuda")
    for batch in DataLoader(Nested(), batch_size=8, pin_memory=True, device="cuda", **workers):
        torch.cuda._sleep(2_000_000)  # a long step queued ahead of the read
        total += batch["pair"][0].double().sum()
        del batch
    assert total.item() == expected.item()


@pytest.mark.parametrize("workers", WORKERS, ids=str)
def test_a_resume_counts_the_batches_the_step_took_not_those_copied_ahead(workers):
    loader = DataLoader(Nested(), batch_size=8, shuffle=True, pin_memory=True, device="cuda",
                        generator=torch.Generator().manual_seed(9), **workers)
    taken = []
    for batch in loader:
        taken.append(batch["index"].tolist())
        if len(taken) == 3:
            state = loader.state_dict()
            break
    resumed = DataLoader(Nested(), batch_size=8, shuffle=True, pin_memory=True, device="cuda",
                         generator=torch.Generator().manual_seed(9), **workers)
    resumed.load_state_dict(state)
    rest = [batch["index"].tolist() for batch in resumed]
    whole = [b["index"].tolist() for b in cpu_batches(
        shuffle=True, generator=torch.Generator().manual_seed(9), **workers)]
    assert taken + rest == whole


def delivered(loader) -> tuple[list[list[int]], list[str]]:
    """The indices of each batch delivered, and the errors raised on the way, going on after each."""
    batches, errors, iterator = [], [], iter(loader)
    while True:
        try:
            batch = next(iterator)
        except StopIteration:
            return batches, errors
        except ValueError as error:
            errors.append(str(error))
        else:
            batches.append(batch["index"].tolist())


@pytest.mark.parametrize("workers", WORKERS, ids=str)
def test_a_dataset_error_fails_its_batch_alone_through_the_gpu_stages_as_in_torch(workers):
    batches, errors = delivered(DataLoader(Failing(), batch_size=8, pin_memory=True,
                                           device="cuda", **workers))
    torch_workers = {"num_workers": workers["num_workers"]}
    assert (batches, len(errors)) == (
        delivered(TorchLoader(Failing(), batch_size=8, pin_memory=True, **torch_workers))[0], 1)
    assert len(batches) == 7 and "bad item 37" in errors[0]
    if workers["num_workers"]:
        assert "indices [32, 33, 34, 35, 36, 37, 38, 39]" in errors[0]


@pytest.mark.parametrize("workers", WORKERS, ids=str)
def test_break_leaves_no_background_thread(workers):
    before = set(threading.enumerate())
    loader = DataLoader(Nested(), batch_size=8, pin_memory=True, device="cuda", **workers)
    for i, _ in enumerate(loader):
        if i == 2:
            break
    gc.collect()
    for thread in set(threading.enumerate()) - before:
        thread.join(timeout=5)
    assert [t.name for t in set(threading.enumerate()) - before if t.is_alive()] == []


@pytest.mark.parametrize("peer", [TorchLoader, DataLoader], ids=["torch", "shardwise"])
def test_a_gpu_batch_left_in_garbage_aborts_no_forked_worker(peer):
    """A forked worker that runs a garbage collection must not free the parent's CUDA tensors."""
    gc.disable()
    try:
        loader = DataLoader(Nested(), batch_size=8, pin_memory=True, device="cuda")
        cycle = [next(iter(loader))]
        cycle.append(cycle)
        del cycle
        forked = peer(Collecting(), batch_size=2, num_workers=2, multiprocessing_context="fork")
        assert [b.tolist() for b in forked] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    finally:
        gc.enable()


@pytest.mark.parametrize("workers", WORKERS, ids=str)
def test_batches_taken_on_alternating_streams_are_safe_on_each(workers):
    expected = sum(b["pair"][0].double().sum() for b in cpu_batches(**workers))
    streams = [torch.cuda.current_stream(), torch.cuda.Stream()]
    total = torch.zeros((), dtype=torch.float64, device="cuda")
    iterator = iter(DataLoader(Nested(), batch_size=8, pin_memory=True, device="cuda", **workers))
    for step in itertools.count():
        with torch.cuda.stream(streams[step % 2]):
            try:
                batch = next(iterator)
            except StopIteration:
                break
            torch.cuda._sleep(2_000_000)
            part = batch["pair"][0].double().sum()
            del batch
        streams[0].wait_stream(streams[1])
        total += part
    assert total.item() == expected.item()


@pytest.mark.parametrize("workers", WORKERS, ids=str)
def test_a_pass_dropped_with_an_error_fetched_ahead_is_freed_at_once(workers):
    before = set(threading.enumerate())
    iterator = iter(DataLoader(Failing(), batch_size=8, pin_memory=True, device="cuda",
                               **workers))
    for _ in range(3):  # batch 4 fails: the stages have read past it
        next(iterator)
    time.sleep(0.5)
    dropped = weakref.ref(iterator)
    del iterator
    assert dropped() is None  # by reference counting: no cycle through the held error
    for thread in set(threading.enumerate()) - before:
        thread.join(timeout=5)
    assert [t.name for t in set(threading.enumerate()) - before if t.is_alive()] == []


@pytest.mark.parametrize("workers", WORKERS, ids=str)
def test_epochs_left_one_batch_short_leave_no_workers_or_threads(workers):
    # The stages meet the end before the caller does: what they hold of it keeps no pass alive.
    threads = set(threading.enumerate())
    loader = DataLoader(Nested(), batch_size=8, pin_memory=True, device="cuda", **workers)
    for _ in range(3):
        for _, _ in zip(range(len(loader) - 1), loader):
            pass
        time.sleep(0.3)
    assert multiprocessing.active_children() == []
    assert [t.name for t in set(threading.enumerate()) - threads if t.is_alive()] == []


class Boxes(torch.Tensor):
    """A tensor subclass with metadata, as torchvision's ``tv_tensors.BoundingBoxes``."""


class WithBoxes(Nested):
    def __getitem__(self, index: int) -> dict:
        return {"index": index, "boxes": torch.full((2, 4), float(index))}


def boxes_collate(samples: list[dict]) -> dict:
    boxes = torch.stack([s["boxes"] for s in samples]).as_subclass(Boxes)
    boxes.format = "XYXY"
    return {"index": torch.tensor([s["index"] for s in samples]), "boxes": boxes}


# Pinned in this process, a plain subclass loses its attributes in torch's ``pin_memory``
# (``tv_tensors`` keep theirs); from a worker process it is pinned as a plain tensor in the slot.
@pytest.mark.parametrize(("workers", "pin"), [(w, False) for w in WORKERS] + [(WORKERS[1], True)],
                         ids=str)
def test_a_tensor_subclass_keeps_its_type_and_attributes_on_the_gpu(workers, pin):
    batches = list(DataLoader(WithBoxes(), batch_size=8, collate_fn=boxes_collate,
                              pin_memory=pin, device="cuda", **workers))
    assert all(type(b["boxes"]) is Boxes and b["boxes"].format == "XYXY" for b in batches)
    assert all(b["boxes"].is_cuda for b in batches)
    assert [b["boxes"][:, 0, 0].tolist() for b in batches] == [
        b["index"].float().tolist() for b in batches]


class Named(Nested):
    """Samples whose batch pickles to more than the pipe takes (it travels in the slot)."""

    def __getitem__(self, index: int) -> dict:
        return {"index": torch.tensor(index), "names": [f"item-{index}-{k}" for k in range(2_000)]}


@pytest.mark.parametrize("pin", [False, True])
def test_a_large_pickled_part_of_a_batch_arrives_beside_its_tensors_on_the_gpu(pin):
    batches = list(DataLoader(Named(), batch_size=8, num_workers=2, pin_memory=pin,
                              device="cuda"))
    assert all(b["index"].is_cuda for b in batches)
    assert [b["index"].tolist() for b in batches] == [list(range(i, i + 8))
                                                     for i in range(0, 64, 8)]
    assert [b["names"][-1][-1] for b in batches] == [f"item-{i + 7}-1999" for i in range(0, 64, 8)]
