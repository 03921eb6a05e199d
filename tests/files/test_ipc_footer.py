"""Arrow IPC record batches from the footer: the rows pyarrow finds, with no batch body read."""

from __future__ import annotations

import io

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardwise.files.ipc_footer import record_batches


class CountingReader(io.BytesIO):
    """Bytes in memory that count what is read of them."""

    read_bytes = 0

    def read(self, size: int | None = -1) -> bytes:
        data = super().read(size)
        self.read_bytes += len(data)
        return data


def ipc_file(sizes: list[int], compression: str | None, dictionary: bool) -> CountingReader:
    values = pa.array([f"v{i % 7}" for i in range(sum(sizes))], pa.string())
    batch = pa.record_batch({"id": pa.array(range(sum(sizes)), pa.int64()),
                             "name": values.dictionary_encode() if dictionary else values})
    sink = io.BytesIO()
    options = pa.ipc.IpcWriteOptions(compression=compression)
    with pa.ipc.new_file(sink, batch.schema, options=options) as out:
        start = 0
        for size in sizes:
            out.write_batch(batch.slice(start, size))
            start += size
    return CountingReader(sink.getvalue())


@settings(max_examples=60, deadline=None)
@given(sizes=st.lists(st.integers(0, 3000), max_size=8),
       compression=st.sampled_from([None, "lz4", "zstd"]), dictionary=st.booleans())
def test_rows_are_pyarrows_and_bodies_fit_in_the_file(sizes, compression, dictionary):
    handle = ipc_file(sizes, compression, dictionary)
    size = len(handle.getvalue())
    batches = record_batches(handle, size, "t.arrow")
    reader = pa.ipc.open_file(pa.BufferReader(handle.getvalue()))
    assert [rows for rows, _ in batches] == [reader.get_batch(i).num_rows
                                             for i in range(reader.num_record_batches)]
    assert sum(body for _, body in batches) < size


def test_only_the_footer_and_the_batch_metadata_are_read():
    handle = ipc_file([200_000] * 4, None, False)  # 4 bodies of several MB each
    batches = record_batches(handle, len(handle.getvalue()), "t.arrow")
    assert [rows for rows, _ in batches] == [200_000] * 4
    assert handle.read_bytes < 4096 < len(handle.getvalue()) // 1000


def test_a_stream_or_a_short_file_is_named():
    sink = io.BytesIO()
    with pa.ipc.new_stream(sink, pa.schema([("x", pa.int64())])) as out:
        out.write_table(pa.table({"x": [1]}))
    with pytest.raises(ValueError, match="s.arrow does not end as an Arrow IPC file does"):
        record_batches(sink, sink.tell(), "s.arrow")
    with pytest.raises(ValueError, match="e.arrow is too short"):
        record_batches(io.BytesIO(b"ARROW1"), 6, "e.arrow")


def test_a_feather_version_1_file_is_named_as_one():
    import warnings

    from pyarrow import feather

    sink = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # (pyarrow 25 deprecates writing it)
        feather.write_feather(pa.table({"x": [1, 2]}), sink, version=1)
    with pytest.raises(ValueError, match="v1.feather is a Feather version 1 file.*version 2"):
        record_batches(sink, sink.tell(), "v1.feather")
