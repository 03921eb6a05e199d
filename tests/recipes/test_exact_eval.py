"""Recipe: exact distributed evaluation of a DDP model over 3 gloo ranks.

Two ways give the single-process metric exactly: shardwise's padded split with its padding
weighted out (``padding_mask``), and torch's own padded split with the per-sample results put
back in dataset order by ``gather_by_index``. Summing over torch's split naively does not.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as torch_dist
import torch.nn.functional as F
import torch.utils.data as tud
from torch.nn.parallel import DistributedDataParallel

from shardwise.distributed.consistency import check_consistent
from shardwise.distributed.coverage import coverage
from shardwise.distributed.gather import gather_by_index
from shardwise.distributed.launch import spawn_local
from shardwise.samplers.distributed import DistributedSampler

SIZE, BATCH, CLASSES = 23, 4, 3  # 23 over 3 ranks: torch pads to 24


class Numbered(tud.Dataset):
    """``(index, features, label)``: fixed random data that knows its own index."""

    def __init__(self) -> None:
        generator = torch.Generator().manual_seed(1)
        self.features = torch.randn(SIZE, 4, generator=generator)
        self.labels = torch.randint(0, CLASSES, (SIZE,), generator=generator)

    def __len__(self) -> int:
        return SIZE

    def __getitem__(self, index: int):
        return index, self.features[index], self.labels[index]


def make_model() -> torch.nn.Module:
    torch.manual_seed(0)  # the same weights in every process, and in the reference
    return torch.nn.Linear(4, CLASSES).double()


def per_sample(model, features, labels) -> torch.Tensor:
    """``[n, 2]``: whether each sample is classified right, and its loss."""
    logits = model(features.double())
    correct = (logits.argmax(dim=1) == labels).double()
    return torch.stack([correct, F.cross_entropy(logits, labels, reduction="none")], dim=1)


def reference() -> torch.Tensor:
    """Accuracy and mean loss of the whole set in one process."""
    data = Numbered()
    with torch.no_grad():
        return per_sample(make_model(), data.features, data.labels).mean(dim=0)


def _evaluate() -> dict:
    model = DistributedDataParallel(make_model())
    model.eval()
    data = Numbered()
    out = {}
    with torch.no_grad():
        # (a) shardwise's padded split: same step count on every rank, padding weighted 0.
        sampler = DistributedSampler(data, shuffle=True, seed=7, remainder="pad")
        sampler.set_epoch(3)
        check_consistent(sampler)  # one small collective, at the start of the epoch
        real = ~torch.from_numpy(sampler.padding_mask())
        totals = torch.zeros(3, dtype=torch.float64)  # correct, loss, samples
        for step, (_, features, labels) in enumerate(tud.DataLoader(data, BATCH, sampler=sampler)):
            keep = real[step * BATCH: step * BATCH + len(labels)]
            results = per_sample(model, features, labels)[keep]
            totals += torch.cat([results.sum(dim=0), torch.tensor([len(results)])])
        torch_dist.all_reduce(totals)
        out["masked"] = (totals[:2] / totals[2]).tolist()
        out["masked_samples"] = int(totals[2])
        out["masked_coverage"] = coverage(sampler.indices()[real.numpy()], SIZE)

        # (b) torch's sampler, results put back in dataset order: each sample once.
        sampler = tud.DistributedSampler(data, shuffle=True, seed=7)
        sampler.set_epoch(3)
        indices, results = [], []
        for index, features, labels in tud.DataLoader(data, BATCH, sampler=sampler):
            indices.append(index)
            results.append(per_sample(model, features, labels))
        results, indices = torch.cat(results), torch.cat(indices)
        out["gathered"] = gather_by_index(results, indices, SIZE).mean(dim=0).tolist()

        # (c) the same results summed naively: the padded samples count twice.
        totals = torch.cat([results.sum(dim=0), torch.tensor([len(results)], dtype=torch.float64)])
        torch_dist.all_reduce(totals)
        out["naive"] = (totals[:2] / totals[2]).tolist()
        out["naive_samples"] = int(totals[2])
    return out


def test_masked_and_gathered_metrics_equal_the_single_process_ones():
    accuracy, loss = reference().tolist()
    # Ranks return plain lists: a tensor's shared memory may vanish with its process.
    for out in spawn_local(_evaluate, 3, timeout=120):
        assert out["masked_samples"] == SIZE and out["masked_coverage"].exact
        for exact in (out["masked"], out["gathered"]):
            assert exact[0] == accuracy  # a ratio of integers: equal to the last bit
            assert exact[1] == pytest.approx(loss, rel=1e-12)  # sums in another order
        # The bias the recipes remove: torch's padding shows 24 samples, and it shows.
        assert out["naive_samples"] == SIZE + 1
        assert out["naive"][0] != accuracy and out["naive"][1] != pytest.approx(loss)
