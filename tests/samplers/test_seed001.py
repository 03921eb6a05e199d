"""Seed 001's worked example: 7 samples, 3 processes, batch size 2, two epochs."""

from collections import Counter

from torch.utils.data import DataLoader

from shardwise import DistributedSampler

TRAIN = [1, 2, 3, 4, 5, 6, 7]
TEST = [-1, -2, -3, -4, -5, -6, -7]


def run_article_loop():
    """The article's loop on every rank: train shuffled, then ``set_epoch(epoch + 1)``, then test."""
    seen = {}
    train = [DistributedSampler(TRAIN, 3, rank, shuffle=True) for rank in range(3)]
    test = [DistributedSampler(TEST, 3, rank, shuffle=False) for rank in range(3)]
    for epoch in range(2):
        for rank in range(3):
            loader = DataLoader(TRAIN, batch_size=2, sampler=train[rank])
            seen["train", epoch, rank] = [batch.tolist() for batch in loader]
            train[rank].set_epoch(epoch + 1)
        for rank in range(3):
            loader = DataLoader(TEST, batch_size=2, sampler=test[rank])
            seen["test", epoch, rank] = [batch.tolist() for batch in loader]
    return seen


def repeated(seen, split, epoch):
    counts = Counter(v for rank in range(3) for batch in seen[split, epoch, rank] for v in batch)
    return sorted(v for v, n in counts.items() if n > 1)


def test_the_articles_batches():
    seen = run_article_loop()
    assert [seen["train", 0, r] for r in range(3)] == [[[5, 4], [2]], [[1, 3], [5]], [[6, 7], [1]]]
    assert [seen["train", 1, r] for r in range(3)] == [[[1, 4], [5]], [[7, 6], [1]], [[2, 3], [7]]]
    for epoch in range(2):
        assert [seen["test", epoch, r] for r in range(3)] == [
            [[-1, -4], [-7]], [[-2, -5], [-1]], [[-3, -6], [-2]]]


def test_the_articles_repeats():
    seen = run_article_loop()
    # Shuffled: the padding repeats change with the epoch (1 and 5, then 1 and 7).
    assert repeated(seen, "train", 0) == [1, 5]
    assert repeated(seen, "train", 1) == [1, 7]
    # Not shuffled: always the first two samples.
    assert repeated(seen, "test", 0) == repeated(seen, "test", 1) == [-2, -1]
    # 9 samples are seen where the data set has 7.
    assert sum(len(b) for r in range(3) for b in seen["test", 0, r]) == 9


def test_uneven_and_the_mask_remove_the_repeats():
    uneven = [list(DistributedSampler(TEST, 3, r, shuffle=False, remainder="uneven"))
              for r in range(3)]
    assert uneven == [[0, 3, 6], [1, 4], [2, 5]]
    padded = [DistributedSampler(TEST, 3, r, shuffle=False) for r in range(3)]
    kept = [i for s in padded for i, pad in zip(s.indices(), s.padding_mask()) if not pad]
    assert sorted(kept) == list(range(7))


def test_forgetting_set_epoch_no_longer_repeats_the_order():
    sampler = DistributedSampler(TRAIN, 3, 0)
    assert list(sampler) != list(sampler)
