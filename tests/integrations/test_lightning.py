"""Under Lightning's defaults (use_distributed_sampler=True) a shardwise sampler is kept as it is.

Lightning replaces any sampler that is not a torch DistributedSampler with its own wrapper, which
would leave each rank 1/W² of the data; shardwise's samplers (class-balanced and weighted too) are
ones, so each rank trains on exactly its share, and Lightning's set_epoch calls give its epochs.
"""

import json
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader, Dataset
from torch.utils.data import DistributedSampler as TorchSampler

from shardwise import ClassBalancedSampler, DistributedSampler, WeightedDistributedSampler

lightning = pytest.importorskip("lightning")
from .spawned import LeaveTheGroupTogether  # after the skip: it needs lightning

SIZE, WORLD, EPOCHS, SEED = 23, 2, 2, 3


class Indexed(Dataset):
    def __len__(self) -> int:
        return SIZE

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.tensor([float(index)])


class Recorder(lightning.LightningModule):
    """Writes each rank's training indices, epoch by epoch, to a file of its own."""

    def __init__(self, folder: str, kind: str = "distributed") -> None:
        super().__init__()
        self.folder, self.kind = folder, kind
        self.layer = torch.nn.Linear(1, 1)
        self.seen: dict[int, list[int]] = {}

    def train_dataloader(self) -> DataLoader:
        # World and rank from the process group.
        return DataLoader(Indexed(), batch_size=4, sampler=make_sampler(self.kind))

    def training_step(self, batch: torch.Tensor, _: int) -> torch.Tensor:
        self.seen.setdefault(self.current_epoch, []).extend(int(i) for i in batch.flatten())
        return self.layer(batch).sum()

    def on_train_end(self) -> None:
        Path(self.folder, f"rank{self.global_rank}.json").write_text(json.dumps(self.seen))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def make_sampler(kind: str, **world) -> TorchSampler:
    if kind == "class_balanced":
        return ClassBalancedSampler([i % 3 for i in range(SIZE)], seed=SEED, **world)
    if kind == "weighted":
        return WeightedDistributedSampler([1.0 + i % 4 for i in range(SIZE)], 9, seed=SEED, **world)
    return DistributedSampler(Indexed(), seed=SEED, **world)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("kind", ["distributed", "class_balanced", "weighted"])
def test_lightning_ddp_keeps_the_sampler_and_trains_each_rank_on_its_share(tmp_path, kind):
    trainer = lightning.Trainer(
        accelerator="cpu", devices=WORLD, strategy="ddp_spawn", max_epochs=EPOCHS,
        logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, default_root_dir=tmp_path, callbacks=[LeaveTheGroupTogether()],
    )
    trainer.fit(Recorder(str(tmp_path), kind))
    for rank in range(WORLD):
        seen = json.loads((tmp_path / f"rank{rank}.json").read_text())
        for epoch in range(EPOCHS):
            reference = (TorchSampler(range(SIZE), WORLD, rank, seed=SEED) if kind == "distributed"
                         else make_sampler(kind, num_replicas=WORLD, rank=rank))
            reference.set_epoch(epoch)
            assert seen[str(epoch)] == list(reference), (rank, epoch)


def test_lightning_can_rebuild_a_distributed_loader():
    """Lightning rebuilds loaders (to predict, say) from the arguments they were made with."""
    from lightning.fabric.utilities.data import _replace_dunder_methods
    from lightning.pytorch.trainer.states import RunningStage
    from lightning.pytorch.utilities.data import _update_dataloader
    from torch.utils.data import DataLoader as TorchLoader

    import shardwise

    with _replace_dunder_methods(TorchLoader, "dataset"):
        loader = shardwise.DataLoader(Indexed(), batch_size=4, shuffle=True, distributed=True,
                                      seed=SEED, num_workers=1, worker_type="thread")
    rebuilt = _update_dataloader(loader, loader.sampler)
    assert type(rebuilt) is shardwise.DataLoader and rebuilt.sampler is loader.sampler
    assert rebuilt.worker_type == "thread"
    batches = []
    for each in (rebuilt, loader):  # one sampler: set the epoch so both passes take epoch 0
        each.set_epoch(0)
        batches.append([b.tolist() for b in each])
    assert batches[0] == batches[1]
    # To predict, it is rebuilt with a batch sampler that wraps the loader's (and its sampler)
    with _replace_dunder_methods(TorchLoader, "dataset"):
        loader = shardwise.DataLoader(Indexed(), batch_size=4, distributed=True, seed=SEED)
    predicting = _update_dataloader(loader, loader.sampler, mode=RunningStage.PREDICTING)
    assert predicting.batch_sampler.sampler is loader.sampler
    assert [b.tolist() for b in predicting] == [b.tolist() for b in loader]


def test_lightning_rebuilds_a_loader_made_outside_its_hooks_with_every_argument():
    """Made outside Lightning's hooks, a loader is rebuilt from its attributes: each shardwise
    argument is one."""
    from lightning.pytorch.utilities.data import _update_dataloader

    import shardwise

    loader = shardwise.DataLoader(Indexed(), batch_size=4, num_workers=1, worker_type="thread",
                                  device="cpu", progress=False, verify=False, distributed=True,
                                  seed=SEED, snapshot_every_n_steps=5)
    sampler = TorchSampler(Indexed(), num_replicas=2, rank=0, shuffle=False)
    rebuilt = _update_dataloader(loader, sampler)
    assert (rebuilt.worker_type, rebuilt.device, rebuilt.verify, rebuilt.seed,
            rebuilt.snapshot_every_n_steps) == ("thread", "cpu", False, SEED, 5)
    expected = DataLoader(Indexed(), 4, sampler=sampler)
    assert [b.tolist() for b in rebuilt] == [b.tolist() for b in expected]


class Fitting(lightning.LightningModule):
    """A model fed by a shardwise loader with persistent workers."""

    def __init__(self, worker_type: str) -> None:
        super().__init__()
        self.layer, self.worker_type = torch.nn.Linear(1, 1), worker_type

    def train_dataloader(self):
        import shardwise

        return shardwise.DataLoader(Indexed(), batch_size=4, num_workers=2,
                                    persistent_workers=True, worker_type=self.worker_type)

    def training_step(self, batch: torch.Tensor, _: int) -> torch.Tensor:
        return self.layer(batch).sum()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("worker_type", ["process", "thread"])
def test_lightning_shuts_persistent_workers_down_when_fit_ends(tmp_path, worker_type):
    import multiprocessing
    import threading

    threads = set(threading.enumerate())
    trainer = lightning.Trainer(
        accelerator="cpu", devices=1, max_epochs=2, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp_path,
    )
    trainer.fit(Fitting(worker_type))
    assert multiprocessing.active_children() == []
    assert [t.name for t in set(threading.enumerate()) - threads if t.is_alive()] == []


def test_a_combined_loader_in_use_pickles_without_its_iterator():
    import pickle

    from lightning.pytorch.utilities.combined_loader import CombinedLoader

    import shardwise

    combined = CombinedLoader([shardwise.DataLoader(Indexed(), batch_size=4), list(range(3))])
    iter(combined)
    restored = pickle.loads(pickle.dumps(combined))
    assert [b.tolist() for b in restored.flattened[0]] == [b.tolist() for b in
                                                           DataLoader(Indexed(), batch_size=4)]
