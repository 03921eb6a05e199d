"""A bucket prefix (moto's S3 server on 127.0.0.1) streamed as shards: ranks x DataLoader workers
read every line once, through failing requests, and a resume mid-object loses and repeats none."""

from __future__ import annotations

import io
from collections import Counter
from itertools import islice

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from torch.utils.data import DataLoader as TorchLoader

from shardwise import shard_iterable
from shardwise.distributed.launch import spawn_local
from shardwise.streams.files import line_shards, row_group_shards
from tests.files.object_store import BUCKET, ObjectStore, store_fixtures

HEAD = 9  # items each rank takes before it stops mid-epoch: inside its first objects


def _objects() -> dict[str, bytes]:
    """Six text objects of uneven lengths, some with CRLF, one without a final newline."""
    objects = {}
    for number in range(6):
        end = "\r\n" if number % 2 else "\n"
        lines = [f"object{number}-line{i}" for i in range(20 + 15 * number)]
        objects[f"stream/part-{number}.txt"] = (end.join(lines) + (end if number != 3 else "")
                                                ).encode()
    return objects


LINES = Counter(f"object{n}-line{i}" for n in range(6) for i in range(20 + 15 * n))


store, _no_faults = store_fixtures(_objects)


def _stream(options: dict):
    return shard_iterable(shards=line_shards(f"s3://{BUCKET}/stream/", storage_options=options))


def _read_all(options: dict) -> list[str]:
    """On each rank: its lines, read by two worker processes of torch's DataLoader."""
    return list(TorchLoader(_stream(options), batch_size=None, num_workers=2))


@pytest.mark.timeout(240)
def test_two_ranks_of_two_workers_read_every_line_of_a_bucket_once(store: ObjectStore) -> None:
    store.faults.fail("part-1", "503", "reset")
    store.faults.fail("part-4", "500", "cut")
    per_rank = spawn_local(_read_all, 2, store.options(), timeout=200)
    assert Counter(line for lines in per_rank for line in lines) == LINES
    assert all(per_rank)
    assert {r.fault for r in store.faults.requests if r.fault} == {"503", "reset", "500", "cut"}


def _stop_and_resume(options: dict, loader: str) -> dict:
    """On each rank: ``HEAD`` lines, the state saved, then the rest from a new stream."""
    if loader == "workers":  # torchdata's DataLoader keeps each worker's ShardedIterable state
        from torchdata.stateful_dataloader import StatefulDataLoader

        def make():
            return StatefulDataLoader(_stream(options), batch_size=None, num_workers=2)

        first = make()
        head = list(islice(iter(first), HEAD))
        state = first.state_dict()
        resumed = make()
        resumed.load_state_dict(state)
        return {"head": head, "rest": list(resumed), "offsets": []}
    stream = _stream(options)  # no workers: the stream's own state
    head = list(islice(iter(TorchLoader(stream, batch_size=None)), HEAD))
    state = stream.state_dict()
    resumed = _stream(options)
    resumed.load_state_dict(state)
    rest = list(TorchLoader(resumed, batch_size=None))
    return {"head": head, "rest": rest, "offsets": [p[1] for p in state["progress"].values()]}


@pytest.mark.timeout(240)
@pytest.mark.parametrize("loader", ["workers", "in-process"])
def test_a_stream_stopped_mid_object_resumes_with_every_line_once(
    store: ObjectStore, loader: str
) -> None:
    if loader == "workers":
        pytest.importorskip("torchdata.stateful_dataloader")
    store.faults.fail("part-2", "503")
    per_rank = spawn_local(_stop_and_resume, 2, store.options(), loader, timeout=200)
    assert all(len(rank["head"]) == HEAD and rank["rest"] for rank in per_rank)
    assert Counter(line for rank in per_rank for line in rank["head"] + rank["rest"]) == LINES
    assert all(0 < offset for rank in per_rank for offset in rank["offsets"])  # mid-object


@pytest.mark.timeout(60)
def test_parquet_row_groups_in_a_bucket_resume_mid_group(store: ObjectStore) -> None:
    buffer = io.BytesIO()
    pq.write_table(pa.table({"id": range(40), "name": [f"n{i}" for i in range(40)]}), buffer,
                   row_group_size=6)
    store.upload({"rows/t.parquet": buffer.getvalue()})

    def stream():
        shards = row_group_shards(f"s3://{BUCKET}/rows/", columns=["id"],
                                  storage_options=store.options())
        return shard_iterable(shards=shards, rank=0, world_size=1)

    first = stream()
    head = [row["id"] for row in islice(iter(first), 15)]
    resumed = stream()
    resumed.load_state_dict(first.state_dict())
    assert head + [row["id"] for row in resumed] == list(range(40))
