"""Recipe: train a DDP model on ``remainder="uneven"`` shares under ``Join``, over 3 gloo ranks.

25 samples, batch 4: rank 0 gets 9 samples (3 steps), ranks 1 and 2 get 8 (2 steps). Plain DDP
would leave rank 0 waiting forever in its third gradient all_reduce; ``Join`` lets the finished
ranks shadow it. Every sample is trained on exactly once, and the replicas stay identical.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.utils.data as tud
from torch.distributed.algorithms import Join
from torch.nn.parallel import DistributedDataParallel

from shardwise.distributed.consistency import check_consistent
from shardwise.distributed.coverage import coverage
from shardwise.distributed.launch import spawn_local
from shardwise.samplers.distributed import DistributedSampler

SIZE, BATCH = 25, 4


class Regression(tud.Dataset):
    """``(index, x, y)`` with y a fixed linear function of x."""

    def __init__(self) -> None:
        generator = torch.Generator().manual_seed(2)
        self.x = torch.randn(SIZE, 3, generator=generator)
        self.y = self.x @ torch.tensor([1.0, -2.0, 0.5]) + 0.25

    def __len__(self) -> int:
        return SIZE

    def __getitem__(self, index: int):
        return index, self.x[index], self.y[index]


def _train() -> dict:
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Linear(3, 1))
    start = [p.detach().clone() for p in model.parameters()]
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    data = Regression()
    sampler = DistributedSampler(data, seed=3, remainder="uneven")
    seen, steps = [], 0
    for epoch in range(2):
        sampler.set_epoch(epoch)
        check_consistent(sampler)  # before the loop: no collective may run inside Join
        epoch_seen = []
        with Join([model]):
            for index, x, y in tud.DataLoader(data, BATCH, sampler=sampler):
                loss = torch.nn.functional.mse_loss(model(x).squeeze(1), y)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                epoch_seen.append(index)
                steps += 1
        # After Join every rank is back in step; collectives are safe again.
        seen.append(coverage(torch.cat(epoch_seen), SIZE))
    params = torch.cat([p.detach().flatten() for p in model.parameters()])
    moved = float(sum((p.detach() - s).abs().sum() for p, s in zip(model.parameters(), start)))
    return {"steps": steps, "coverage": seen, "params": params.numpy().copy(), "moved": moved}


def test_uneven_shares_train_under_join_without_hanging():
    per_rank = spawn_local(_train, 3, timeout=120)  # a hang fails here, after 120 s
    assert [out["steps"] for out in per_rank] == [6, 4, 4]  # 3 + 3 steps against 2 + 2
    for out in per_rank:
        assert all(epoch.exact for epoch in out["coverage"])  # each sample once per epoch
        assert out["moved"] > 0  # it did train
        assert np.array_equal(out["params"], per_rank[0]["params"])  # replicas agree
