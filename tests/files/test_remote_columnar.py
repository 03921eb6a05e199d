"""Parquet and Arrow IPC objects in a bucket (moto's S3 server on 127.0.0.1): every row read by
exactly one rank, through failing requests, and no credential in any message."""

from __future__ import annotations

import io

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from shardwise.distributed.launch import spawn_local
from shardwise.files import read_table, remote, table_plan
from tests.files.object_store import BUCKET, KEY, SECRET, ObjectStore, store_fixtures

GROUPS = [[400, 150, 150], [90], [300, 10, 10, 10, 200], [60, 60]]  # rows per row group, per file


def _parquet(first: int, sizes: list[int]) -> bytes:
    """One Parquet object with a row group per size; ``id`` counts on from ``first``."""
    buffer = io.BytesIO()
    schema = pa.schema([("id", pa.int64()), ("name", pa.string())])
    with pq.ParquetWriter(buffer, schema) as writer:
        for size in sizes:
            ids = list(range(first, first + size))
            writer.write_table(pa.table({"id": ids, "name": [f"row {i}" for i in ids]}, schema))
            first += size
    return buffer.getvalue()


def _objects() -> dict[str, bytes]:
    objects, first = {}, 0
    for number, sizes in enumerate(GROUPS):
        objects[f"table/part-{number:03d}.parquet"] = _parquet(first, sizes)
        first += sum(sizes)
    objects["table/_SUCCESS"] = b""  # a marker a listing must skip
    return objects


ALL_IDS = list(range(sum(map(sum, GROUPS))))


store, _no_faults = store_fixtures(_objects)


def _rank_ids(options: dict) -> list[int]:
    """On each rank: its rows of the bucket prefix (world and rank from the process group)."""
    return read_table(f"s3://{BUCKET}/table/", columns=["id"], storage_options=options
                      )["id"].to_pylist()


@pytest.mark.timeout(240)
@pytest.mark.parametrize("world", [2, 3])
def test_ranks_read_every_row_of_a_bucket_prefix_once_through_failing_requests(
    store: ObjectStore, world: int
) -> None:
    store.faults.fail("part-000", "503", "reset")
    store.faults.fail("part-002", "500", "cut")
    shares = spawn_local(_rank_ids, world, store.options(), timeout=200)
    assert [i for share in shares for i in share] == ALL_IDS  # each row once, ranks in order
    assert all(shares)
    assert {r.fault for r in store.faults.requests if r.fault} == {"503", "reset", "500", "cut"}


@pytest.mark.timeout(60)
def test_a_rank_requests_only_its_own_row_groups(store: ObjectStore) -> None:
    plan = table_plan(f"s3://{BUCKET}/table/", 3, storage_options=store.options())
    store.faults.reset()
    mine = {unit.source.name for unit, _, _ in plan.share(2)}
    read_table(plan, 2, 3)
    asked = {r.path.split("?")[0] for r in store.faults.requests if r.method == "GET"}
    assert asked == {f"/{BUCKET}/{name.split('/', 3)[3]}" for name in mine}


@pytest.mark.timeout(60)
def test_arrow_ipc_objects_are_read_by_record_batch(store: ObjectStore) -> None:
    buffer = io.BytesIO()
    table = pa.table({"id": list(range(50))})
    with pa.ipc.new_file(buffer, table.schema) as writer:
        for start in range(0, 50, 20):
            writer.write_table(table.slice(start, 20))
    store.upload({"ipc/t.arrow": buffer.getvalue()})
    url = f"s3://{BUCKET}/ipc/t.arrow"
    shares = [read_table(url, rank, 2, storage_options=store.options())["id"].to_pylist()
              for rank in range(2)]
    assert shares[0] + shares[1] == list(range(50)) and all(shares)


def _bytes_asked(requests: list) -> int:
    spans = [r.range.removeprefix("bytes=").split("-") for r in requests if r.range]
    return sum(int(stop) - int(start) + 1 for start, stop in spans)


@pytest.mark.timeout(60)
def test_planning_an_arrow_ipc_object_asks_for_little_of_it(store: ObjectStore) -> None:
    table = pa.table({"id": list(range(400_000))})
    buffer = io.BytesIO()
    with pa.ipc.new_file(buffer, table.schema) as writer:
        writer.write_table(table, max_chunksize=100_000)  # 4 bodies of 800 KB
    store.upload({"ipc/big.arrow": buffer.getvalue()})
    store.faults.reset()
    plan = table_plan(f"s3://{BUCKET}/ipc/big.arrow", 2, storage_options=store.options())
    assert [unit.rows for unit in plan.units] == [100_000] * 4
    assert _bytes_asked(store.faults.seen("big.arrow")) < len(buffer.getvalue()) // 20


@pytest.mark.timeout(60)
def test_a_rank_reads_the_footer_of_a_file_once_for_all_its_row_groups(store: ObjectStore) -> None:
    plan = table_plan(f"s3://{BUCKET}/table/part-002.parquet", 1, storage_options=store.options())
    store.faults.reset()
    assert read_table(plan, 0, 1)["id"].to_pylist() == ALL_IDS[790:1320]
    assert len(plan.units) == 5 and len(store.faults.seen("part-002")) <= 3  # was 2 per group


@pytest.mark.timeout(60)
@pytest.mark.parametrize("fault, kind, says", [
    ("403", PermissionError, "access was denied"),
    ("500", OSError, "failed 3 times"),
])
def test_a_failing_row_group_names_its_object_and_never_a_credential(
    store: ObjectStore, monkeypatch, fault: str, kind: type, says: str
) -> None:
    monkeypatch.setattr(remote, "BACKOFF", remote.Backoff(tries=3, first_wait=0.01))
    plan = table_plan(f"s3://{BUCKET}/table/", 1, storage_options=store.options())
    store.faults.fail("part-002", fault, forever=True)
    with pytest.raises(kind, match=says) as caught:
        read_table(plan, 0, 1)
    message = str(caught.value)
    assert message.startswith(f"s3://{BUCKET}/table/part-002.parquet: reading bytes [")
    assert KEY not in message and SECRET not in message
