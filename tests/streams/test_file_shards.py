"""Files and Parquet row groups as the shards of a stream: each line or row once, resumable."""

from collections import Counter
from itertools import islice

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from shardwise import DataLoader, shard_iterable
from shardwise.streams.files import line_shards, row_group_shards


def write_lines(folder, files=6):
    lines = []
    for number in range(files):
        these = [f"file{number}-line{i}" for i in range(3 + number)]
        (folder / f"part-{number}.txt").write_text("".join(f"{line}\r\n" for line in these))
        lines += these
    return lines


@pytest.mark.timeout(60)
@pytest.mark.parametrize("workers", [0, 2])
def test_text_files_as_shards_over_ranks_and_workers(tmp_path, workers):
    lines = write_lines(tmp_path)
    seen = Counter()
    for rank in range(2):
        stream = shard_iterable(shards=line_shards(tmp_path), rank=rank, world_size=2)
        seen.update(DataLoader(stream, batch_size=None, num_workers=workers))
    assert seen == Counter(lines)


def test_parquet_row_groups_as_shards_resume_mid_group(tmp_path):
    table = pa.table({"id": list(range(50)), "name": [f"n{i}" for i in range(50)]})
    pq.write_table(table, tmp_path / "t.parquet", row_group_size=8)
    shards = row_group_shards(tmp_path, columns=["id"])
    assert len(shards) == 7
    stream = shard_iterable(shards=shards, rank=0, world_size=1)
    iterator = iter(stream)
    head = [row["id"] for row in islice(iterator, 21)]
    state = stream.state_dict()
    resumed = shard_iterable(shards=row_group_shards(tmp_path, columns=["id"]), rank=0,
                             world_size=1)
    resumed.load_state_dict(state)
    assert head + [row["id"] for row in resumed] == list(range(50))


@pytest.mark.timeout(60)
@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("change", ["a file cut short", "a file added in front"])
def test_a_state_over_files_changed_since_is_refused_not_resumed_with_lines_lost(
        tmp_path, workers, change):
    write_lines(tmp_path, files=2)  # 3 and 4 lines
    loader = DataLoader(shard_iterable(shards=line_shards(tmp_path), rank=0, world_size=1),
                        batch_size=None, num_workers=workers)
    iterator = iter(loader)
    next(iterator), next(iterator)
    state = loader.state_dict()
    del iterator
    if change == "a file cut short":
        (tmp_path / "part-0.txt").write_text("")
    else:  # listed first: every shard after it would move to another consumer
        (tmp_path / "a-new.txt").write_text("new\n")
    resumed = DataLoader(shard_iterable(shards=line_shards(tmp_path), rank=0, world_size=1),
                         batch_size=None, num_workers=workers)
    with pytest.raises(ValueError, match="saved over another shard list"):
        resumed.load_state_dict(state)
        list(resumed)  # (with workers, each worker loads its own as it starts)
