"""Lightning checkpoints shardwise.DataLoader's state and resumes mid-epoch at the next batch.

Lightning saves the state of every loader that has ``state_dict``/``load_state_dict`` in its
checkpoints; a run stopped mid-epoch and resumed from the checkpoint trains every sample of the
epoch exactly once across the two runs, on every rank.
"""

import json
from collections import Counter
from pathlib import Path

import pytest
import torch
from torch.utils.data import Dataset

from shardwise import DataLoader, shard_iterable

lightning = pytest.importorskip("lightning")
from .spawned import LeaveTheGroupTogether  # after the skip: it needs lightning

SIZE, WORLD, BATCH = 40, 2, 2  # 10 steps an epoch on each rank


class Indexed(Dataset):
    def __len__(self) -> int:
        return SIZE

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.tensor([float(index)])


class Counted(torch.utils.data.IterableDataset):
    """A stream with its length on each rank: Lightning fetches a batch ahead of a loader
    without one, and its checkpoint would count that batch as trained."""

    def __init__(self, stream: torch.utils.data.IterableDataset, length: int) -> None:
        self.stream, self.length = stream, length

    def __iter__(self):
        return iter(self.stream)

    def __len__(self) -> int:
        return self.length

    def state_dict(self) -> dict:
        return self.stream.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.stream.load_state_dict(state)


class Recorder(lightning.LightningModule):
    def __init__(self, folder: str, run: str, streamed: bool = False, workers: int = 1) -> None:
        super().__init__()
        self.folder, self.run, self.streamed, self.workers = folder, run, streamed, workers
        self.layer = torch.nn.Linear(1, 1)
        self.seen: list[tuple[int, int]] = []  # (epoch, sample)

    def train_dataloader(self) -> DataLoader:
        if self.streamed:  # shards of 5 samples; Lightning gives every rank rank 0's state
            shards = [[torch.tensor([float(i)]) for i in range(start, start + 5)]
                      for start in range(0, SIZE, 5)]
            stream = Counted(shard_iterable(shards=shards), SIZE // WORLD)
            return DataLoader(stream, batch_size=BATCH, num_workers=self.workers)
        return DataLoader(Indexed(), batch_size=BATCH, shuffle=True, distributed=True, seed=5,
                          num_workers=self.workers)

    def training_step(self, batch: torch.Tensor, _: int) -> torch.Tensor:
        self.seen.extend((self.current_epoch, int(i)) for i in batch.flatten())
        return self.layer(batch).sum()

    def on_train_end(self) -> None:
        path = Path(self.folder, f"{self.run}-rank{self.global_rank}.json")
        path.write_text(json.dumps(self.seen))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def trainer(tmp_path: Path, callbacks: list | tuple = (), devices: int = WORLD,
            **options) -> "lightning.Trainer":
    return lightning.Trainer(accelerator="cpu", devices=devices, strategy="ddp_spawn", logger=False,
                             enable_progress_bar=False, enable_model_summary=False,
                             default_root_dir=tmp_path,
                             callbacks=[*callbacks, LeaveTheGroupTogether()], **options)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("streamed", [False, True], ids=["sampler", "stream"])
def test_a_run_resumed_mid_epoch_trains_each_sample_once(tmp_path, streamed):
    checkpoints = tmp_path / "checkpoints"
    saver = lightning.pytorch.callbacks.ModelCheckpoint(dirpath=checkpoints, every_n_train_steps=4,
                                                        save_top_k=-1)
    trainer(tmp_path, max_steps=4, callbacks=[saver]).fit(
        Recorder(str(tmp_path), "first", streamed))
    (checkpoint,) = checkpoints.glob("*.ckpt")
    trainer(tmp_path, max_epochs=1).fit(Recorder(str(tmp_path), "second", streamed),
                                        ckpt_path=checkpoint)
    assert sorted(trained(tmp_path, {"first": WORLD, "second": WORLD})[0].elements()) == list(
        range(SIZE))


@pytest.mark.timeout(300)
def test_a_stream_checkpointed_at_an_epochs_end_resumes_the_next_epoch_whole(tmp_path):
    """The checkpoint Lightning saves as an epoch ends, over a stream read with no workers:
    the resumed run trains the next epoch whole on every rank."""
    checkpoints = tmp_path / "checkpoints"
    saver = lightning.pytorch.callbacks.ModelCheckpoint(dirpath=checkpoints, save_top_k=-1,
                                                        save_on_train_epoch_end=True)
    trainer(tmp_path, max_epochs=1, callbacks=[saver]).fit(
        Recorder(str(tmp_path), "first", streamed=True, workers=0))
    (checkpoint,) = checkpoints.glob("*.ckpt")
    trainer(tmp_path, max_epochs=2).fit(
        Recorder(str(tmp_path), "second", streamed=True, workers=0), ckpt_path=checkpoint)
    epochs = trained(tmp_path, {"first": WORLD, "second": WORLD})
    assert [sorted(epochs[epoch].elements()) for epoch in (0, 1)] == [list(range(SIZE))] * 2


def trained(folder: Path, runs: dict[str, int]) -> dict[int, Counter]:
    """The samples each epoch trained, over ``runs`` (their names and processes)."""
    epochs: dict[int, Counter] = {}
    for run, processes in runs.items():
        for rank in range(processes):
            for epoch, sample in json.loads((folder / f"{run}-rank{rank}.json").read_text()):
                epochs.setdefault(epoch, Counter())[sample] += 1
    return epochs


@pytest.mark.timeout(300)
def test_a_run_resumed_mid_epoch_on_fewer_processes_trains_every_epoch_whole(tmp_path):
    """Lightning keeps the epoch length it reads after loading the state for the whole run:
    the resumed epoch, shorter there, ends at its own end, and the next ones are whole."""
    checkpoints = tmp_path / "checkpoints"
    saver = lightning.pytorch.callbacks.ModelCheckpoint(dirpath=checkpoints, every_n_train_steps=4,
                                                        save_top_k=-1)
    trainer(tmp_path, max_steps=4, callbacks=[saver]).fit(Recorder(str(tmp_path), "first"))
    (checkpoint,) = checkpoints.glob("*.ckpt")
    trainer(tmp_path, devices=1, max_epochs=2).fit(Recorder(str(tmp_path), "second"),
                                                   ckpt_path=checkpoint)
    epochs = trained(tmp_path, {"first": WORLD, "second": 1})
    assert [sorted(epochs[epoch].elements()) for epoch in (0, 1)] == [list(range(SIZE))] * 2


class EpochRecorder(lightning.LightningModule):
    """Trains one process on a plain (unshuffled) loader, recording each batch's epoch."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(1, 1)
        self.seen: list[tuple[int, list[int]]] = []

    def train_dataloader(self) -> DataLoader:
        return DataLoader(list(range(10)), batch_size=2)  # 5 steps an epoch

    def training_step(self, batch: torch.Tensor, _: int) -> torch.Tensor:
        self.seen.append((self.current_epoch, batch.tolist()))
        return self.layer(batch.float()[:, None]).sum()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


@pytest.mark.timeout(300)
def test_a_checkpoint_on_an_epochs_last_step_resumes_with_the_next_epoch_whole(tmp_path):
    def fit(model, ckpt_path=None, **options):
        lightning.Trainer(accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
                          enable_model_summary=False, default_root_dir=tmp_path, max_epochs=3,
                          **options).fit(model, ckpt_path=ckpt_path)

    saver = lightning.pytorch.callbacks.ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=5,
                                                        save_top_k=-1)
    whole = EpochRecorder()
    fit(whole, callbacks=[saver])
    resumed = EpochRecorder()
    fit(resumed, ckpt_path=tmp_path / "epoch=0-step=5.ckpt")
    assert resumed.seen == whole.seen[5:]  # epochs 1 and 2, as the run went on (none lost)
