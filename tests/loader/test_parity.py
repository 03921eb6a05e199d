"""shardwise.DataLoader gives torch's DataLoader's batches, and torch's errors, argument for argument.

Datasets here draw from torch's, NumPy's and Python's random generators and read
``get_worker_info()``, so equal batches also mean equal worker seeding and worker assignment.
"""

import itertools
import random
import warnings

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader as TorchLoader
from torch.utils.data import Dataset, IterableDataset, RandomSampler, get_worker_info
from torch.utils.data.dataloader import _MultiProcessingDataLoaderIter

from shardwise import DataLoader

pytestmark = pytest.mark.timeout(120)


class Augmented(Dataset):
    """Samples with random augmentation from every generator a worker seeds."""

    def __len__(self) -> int:
        return 37

    def __getitem__(self, index: int) -> dict:
        worker = get_worker_info()
        return {"index": index, "noise": torch.rand(2), "numpy": np.random.rand(),
                "python": random.random(), "worker": -1 if worker is None else worker.id,
                "name": f"sample-{index}"}


class Batched(Augmented):
    """Fetches a whole batch in one call, as datasets with ``__getitems__`` do."""

    def __getitems__(self, indices: list[int]) -> list[dict]:
        return [{"index": i, "twice": 2 * i} for i in indices]


class Stream(IterableDataset):
    """Each worker streams its own, unequal share: workers end at different times."""

    def __iter__(self):
        worker = get_worker_info()
        wid, count = (0, 1) if worker is None else (worker.id, worker.num_workers)
        for i in range(wid, 23 + 5 * wid, count):
            yield torch.tensor([i, wid, torch.randint(0, 1000, ()).item()])


def plain(batch):
    """Batches as plain Python values, for comparing."""
    if isinstance(batch, dict):
        return {key: plain(value) for key, value in batch.items()}
    if isinstance(batch, (list, tuple)):
        return [plain(item) for item in batch]
    if isinstance(batch, torch.Tensor):
        return batch.tolist()
    return batch


def epochs(loader_class, dataset, count=1, **options):
    torch.manual_seed(5)
    random.seed(5)
    np.random.seed(5)
    loader = loader_class(dataset, **options)
    return [[plain(batch) for batch in loader] for _ in range(count)]


MAP_CASES = [
    {"batch_size": None}, {"batch_size": 1}, {"batch_size": 4}, {"batch_size": 4, "shuffle": True},
    {"batch_size": 4, "drop_last": True}, {"batch_size": 3, "shuffle": True,
                                           "generator": torch.Generator().manual_seed(9)},
]


@pytest.mark.parametrize("workers", [0, 1, 2])
@pytest.mark.parametrize("options", MAP_CASES, ids=str)
def test_map_style_batches_equal_torchs(workers, options):
    if "generator" in options:  # each loader needs its own, equally seeded, generator
        options = {**options, "generator": torch.Generator().manual_seed(9)}
        ours = epochs(DataLoader, Augmented(), num_workers=workers, **options)
        options = {**options, "generator": torch.Generator().manual_seed(9)}
    else:
        ours = epochs(DataLoader, Augmented(), num_workers=workers, **options)
    assert ours == epochs(TorchLoader, Augmented(), num_workers=workers, **options)


@pytest.mark.parametrize("workers", [0, 2, 3])
@pytest.mark.parametrize("options", [{"batch_size": None}, {"batch_size": 4},
                                     {"batch_size": 4, "drop_last": True}], ids=str)
def test_iterable_batches_equal_torchs(workers, options):
    assert epochs(DataLoader, Stream(), num_workers=workers, **options) == epochs(
        TorchLoader, Stream(), num_workers=workers, **options)


def test_persistent_workers_epochs_equal_torchs():
    options = {"batch_size": 4, "shuffle": True, "num_workers": 2, "persistent_workers": True}
    assert epochs(DataLoader, Augmented(), 3, **options) == epochs(
        TorchLoader, Augmented(), 3, **options)


@pytest.mark.parametrize("dataset", [Augmented(), Stream()], ids=["map", "iterable"])
def test_persistent_workers_cut_short_go_on_with_torchs_epochs(dataset):
    """After a break, the last pass's prefetched tasks are done (and dropped) before the next
    pass, as torch's workers do them: the random draws they leave are the same whatever the
    timing, so later epochs are torch's too."""
    def run(loader_class) -> list:
        torch.manual_seed(5)
        loader = loader_class(dataset, batch_size=3, num_workers=2, persistent_workers=True,
                              prefetch_factor=3)
        seen = []
        for cut in (1, None, 2, None):
            seen.append([plain(batch) for batch in itertools.islice(loader, cut)])
        return seen

    assert run(DataLoader) == run(TorchLoader)


def test_getitems_custom_collate_and_worker_init_equal_torchs():
    options = {"batch_size": 5, "num_workers": 2, "collate_fn": _pairs,
               "worker_init_fn": _reseed_python}
    assert epochs(DataLoader, Batched(), **options) == epochs(TorchLoader, Batched(), **options)


def _pairs(samples: list[dict]) -> tuple:
    return [s["index"] for s in samples], torch.tensor([s["twice"] for s in samples])


def _reseed_python(worker_id: int) -> None:
    random.seed(100 + worker_id)


class MixedTypes(Dataset):
    """Samples of two types: a worker stacks them into the first one's type, as torch's does."""

    def __init__(self, length: int, types: tuple[torch.dtype, torch.dtype]) -> None:
        self.length, self.types = length, types

    def __len__(self) -> int:
        return 2

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.ones(self.length, dtype=self.types[index])


def _collated(loader_class: type, dataset: Dataset, workers: int) -> object:
    try:
        batch = next(iter(loader_class(dataset, batch_size=2, num_workers=workers)))
    except TypeError as error:  # (from a worker: its traceback, then the error)
        return str(error).strip().splitlines()[-1].removeprefix("TypeError: ")
    return batch.dtype, batch.shape


@pytest.mark.parametrize("workers", [0, 1])
@pytest.mark.parametrize("length", [0, 10, 2**20])  # (empty; in a slot; larger than one)
@pytest.mark.parametrize("types", [(torch.float32, torch.float64), (torch.int64, torch.float32)])
def test_samples_of_other_types_are_stacked_as_torchs(workers, length, types):
    dataset = MixedTypes(length, types)  # (a float cannot be cast to an int: torch refuses it)
    assert _collated(DataLoader, dataset, workers) == _collated(TorchLoader, dataset, workers)


@pytest.mark.parametrize("workers", [0, 2])
def test_in_order_false_delivers_every_batch_once(workers):
    options = {"batch_size": 3, "num_workers": workers}
    if workers:
        options["in_order"] = False
    got = epochs(DataLoader, Augmented(), **options)[0]
    assert sorted(i for batch in got for i in batch["index"]) == list(range(37))


BAD_ARGUMENTS = [
    {"num_workers": -1},
    {"timeout": -1},
    {"prefetch_factor": 2},
    {"num_workers": 2, "prefetch_factor": -1},
    {"persistent_workers": True},
    {"sampler": [0, 1], "shuffle": True},
    {"batch_sampler": [[0, 1]], "batch_size": 2},
    {"batch_sampler": [[0, 1]], "drop_last": True},
    {"batch_size": None, "drop_last": True},
    {"multiprocessing_context": "spawn"},
    {"num_workers": 1, "multiprocessing_context": "no-such-method"},
    {"num_workers": 1, "multiprocessing_context": 3},
]


@pytest.mark.parametrize("options", BAD_ARGUMENTS, ids=str)
def test_conflicting_arguments_raise_torchs_errors(options):
    with pytest.raises(Exception) as theirs:
        TorchLoader(Augmented(), **options)
    with pytest.raises(type(theirs.value)) as ours:
        DataLoader(Augmented(), **options)
    assert str(ours.value) == str(theirs.value)


@pytest.mark.parametrize("options,error,message", [
    ({"num_workers": 2, "prefetch_factor": 0}, ValueError, "pass prefetch_factor=1 or more"),
    ({"shuffle": True, "generator": 3}, TypeError, "generator must be a torch.Generator, got 3"),
    ({"num_workers": 1.0}, TypeError, "num_workers must be an int .*got 1.0"),
    ({"num_workers": 1, "prefetch_factor": 1.5}, TypeError, "prefetch_factor must be an int"),
    ({"timeout": 5}, ValueError, "timeout=5 bounds the wait for workers, but num_workers=0"),
], ids=str)
def test_arguments_torch_fails_on_only_when_iterating_are_refused_at_once(options, error, message):
    with pytest.raises((AssertionError, TypeError)):  # torch: at the first pass
        list(TorchLoader(Augmented(), **options))
    with pytest.raises(error, match=message):
        DataLoader(Augmented(), **options)


@pytest.mark.parametrize("options", [{"shuffle": True}, {"sampler": RandomSampler(range(3))},
                                     {"batch_sampler": [[0]]}], ids=str)
def test_iterable_dataset_refusals_are_torchs(options):
    with pytest.raises(ValueError) as theirs:
        TorchLoader(Stream(), **options)
    with pytest.raises(ValueError) as ours:
        DataLoader(Stream(), **options)
    assert str(ours.value) == str(theirs.value)


def test_it_is_a_torch_dataloader_with_torchs_attributes():
    loader = DataLoader(Augmented(), batch_size=4, num_workers=2)
    assert isinstance(loader, TorchLoader)
    assert (loader.batch_size, loader.num_workers, loader.prefetch_factor, len(loader)) == (
        4, 2, 2, 10)
    with pytest.raises(ValueError, match="should not be set after"):
        loader.batch_size = 8


def test_it_is_generic_and_lists_its_workers_as_torchs_iterator_does():
    assert DataLoader[int] is not None  # annotations such as DataLoader[list[Tensor]] work
    iterator = iter(DataLoader(Augmented(), batch_size=4, num_workers=2))
    workers = {batch["worker"][0].item(): batch["index"] for batch in iterator}
    assert sorted(workers) == [0, 1] and len(iterator._workers) == 2
    assert all(worker.pid and not worker.is_alive() for worker in iterator._workers)


class Sized(IterableDataset):
    """Says it holds 5 items, streams 8 (in each worker)."""

    def __len__(self) -> int:
        return 5

    def __iter__(self):
        return iter(range(8))


@pytest.mark.parametrize("workers", [0, 1])
def test_an_iterable_dataset_past_its_length_warns_as_torchs(workers):
    for loader_type in (TorchLoader, DataLoader):
        loader = loader_type(Sized(), num_workers=workers)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            list(loader)  # len() not asked yet: nothing to compare with
        assert not [w for w in caught if "Length of IterableDataset" in str(w.message)]
        assert len(loader) == 5
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            list(loader)
        texts = [str(w.message) for w in caught if "Length of IterableDataset" in str(w.message)]
        assert len(texts) == 3, loader_type
        assert texts[0].endswith("but 6 samples have been fetched. " + (
            "For multiprocessing data-loading, this could be caused by not properly configuring "
            "the IterableDataset replica at each worker. Please see "
            "https://pytorch.org/docs/stable/data.html#torch.utils.data.IterableDataset for "
            "examples." if workers else ""))


@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_other_start_methods_give_the_same_batches(method):
    options = {"batch_size": 4, "num_workers": 2, "multiprocessing_context": method}
    assert epochs(DataLoader, Augmented(), **options) == epochs(TorchLoader, Augmented(), **options)


SCALE = {"factor": 1}  # set at run time by the test below, as a script sets its options


class Scaled(Dataset):
    """Reads module state set at run time, and holds a lambda: both need fork, as torch uses."""

    def __init__(self) -> None:
        self.transform = lambda i: i * SCALE["factor"]

    def __len__(self) -> int:
        return 6

    def __getitem__(self, index: int) -> int:
        return self.transform(index)


def test_workers_start_as_torchs_once_cuda_is_initialised(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)  # model.cuda() has run
    monkeypatch.setitem(SCALE, "factor", 10)
    options = {"batch_size": 2, "num_workers": 2}
    assert epochs(DataLoader, Scaled(), **options) == epochs(TorchLoader, Scaled(), **options)


class TorchIterating(DataLoader):
    """A subclass whose own ``_get_iterator`` makes torch's iterator (as Lightning's tests do)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.made = 0

    def _get_iterator(self):
        self.made += 1
        return _MultiProcessingDataLoaderIter(self)


def test_a_subclass_iterator_on_persistent_workers_is_kept_and_restarted_as_torch_keeps_it():
    loader = TorchIterating(list(range(6)), batch_size=2, num_workers=1, persistent_workers=True)
    first = iter(loader)
    batches = [b.tolist() for b in first]
    second = iter(loader)
    assert second is first and loader._iterator is first and loader.made == 1
    assert [b.tolist() for b in second] == batches == [[0, 1], [2, 3], [4, 5]]
    loader._iterator._shutdown_workers()  # as Lightning shuts it down, then lets it go
    loader._iterator = None
    assert loader._iterator is None and [b.tolist() for b in loader] == batches
    assert loader.made == 2
    loader._iterator._shutdown_workers()
