"""The record batches of an Arrow IPC file, from its footer: where each is, its rows and bytes.

pyarrow gives a batch's row count only by reading the batch, body and all, so planning a remote
file that way would download it whole on every rank. The file's footer lists each batch's
offset, metadata size and body size; the metadata (a few hundred bytes in front of the body)
holds its row count. Both are FlatBuffers, read here by the format's rules: a table starts with
the offset back to its vtable, whose entries give each field's place in the table (0: absent).
See https://arrow.apache.org/docs/format/Columnar.html#ipc-file-format.
"""

from __future__ import annotations

import struct
from typing import BinaryIO

_MAGIC = b"ARROW1"
_CONTINUATION = b"\xff\xff\xff\xff"  # in front of each message's length since Arrow 0.15
_RECORD_BATCH = 3  # MessageHeader union: the type of a record batch's header
_FOOTER_SCHEMA, _FOOTER_BATCHES = 1, 3  # Footer: version, schema, dictionaries, recordBatches
_SCHEMA_FIELDS = 1  # Schema: endianness, fields, ...
_MESSAGE_HEADER_TYPE, _MESSAGE_HEADER = 1, 2  # Message: version, header_type, header, ...
_BATCH_LENGTH = 0  # RecordBatch: length (rows), nodes, buffers, ...
_BLOCK = struct.Struct("<qi4xq")  # Block: offset, metaDataLength, (padding), bodyLength


def record_batches(handle: BinaryIO, size: int, name: str) -> list[tuple[int, int]]:
    """``(rows, body bytes as stored)`` of each record batch of the IPC file ``handle`` of ``size``
    bytes, reading only its footer and each batch's metadata.

    >>> import io, pyarrow as pa
    >>> sink = io.BytesIO()
    >>> with pa.ipc.new_file(sink, pa.schema([("x", pa.int64())])) as out:
    ...     out.write_table(pa.table({"x": range(5)}), max_chunksize=3)
    >>> [rows for rows, _ in record_batches(sink, sink.tell(), "t.arrow")]
    [3, 2]
    """
    if size < 2 * len(_MAGIC) + 4:
        raise ValueError(f"{name} is too short ({size} bytes) to be an Arrow IPC file")
    handle.seek(size - len(_MAGIC) - 4)
    tail = handle.read(len(_MAGIC) + 4)
    footer_size = struct.unpack_from("<i", tail)[0]
    if tail.endswith(b"FEA1"):
        raise ValueError(f"{name} is a Feather version 1 file, which has no row groups to split: "
                         "write it again as Feather version 2 (pyarrow.feather.write_feather's "
                         "default, an Arrow IPC file)")
    if tail[4:] != _MAGIC or not 0 < footer_size <= size - len(_MAGIC) - 4:
        raise ValueError(f"{name} does not end as an Arrow IPC file does (written with "
                         "pyarrow.ipc.new_file or feather?): an IPC stream has no footer")
    footer_start = size - len(_MAGIC) - 4 - footer_size
    handle.seek(footer_start)
    footer = handle.read(footer_size)
    try:
        return _batches(handle, footer, footer_start, name)
    except (struct.error, IndexError, OverflowError, _Damaged) as error:
        # Offsets read from damaged bytes point anywhere: say so, rather than read 0 batches
        raise ValueError(f"{name} is a damaged Arrow IPC file: its footer cannot be read "
                         f"({error}); write it again whole") from None


class _Damaged(Exception):
    """A footer whose fields contradict each other or the file."""


def _batches(handle: BinaryIO, footer: bytes, footer_start: int, name: str
             ) -> list[tuple[int, int]]:
    root = _root(footer)
    schema = _field(footer, root, _FOOTER_SCHEMA)
    # Every file has a schema listing its fields (pyarrow refuses one without), batches or none
    if schema is None or _field(footer, schema + _u32(footer, schema), _SCHEMA_FIELDS) is None:
        raise _Damaged("no schema with its fields")
    vector = _field(footer, root, _FOOTER_BATCHES)
    if vector is None:
        return []
    vector += _u32(footer, vector)
    count = _u32(footer, vector)
    if vector + 4 + _BLOCK.size * count > len(footer):
        raise _Damaged(f"{count} record batches do not fit in it")
    batches = []
    for i in range(count):
        offset, metadata_size, body_size = _BLOCK.unpack_from(footer, vector + 4 + _BLOCK.size * i)
        if offset < len(_MAGIC) or metadata_size <= 0 or body_size < 0 or \
                offset + metadata_size + body_size > footer_start:
            raise _Damaged(f"record batch {i} does not lie within the file")
        handle.seek(offset)
        rows = _message_rows(handle.read(metadata_size), name)
        if rows < 0:
            raise _Damaged(f"record batch {i} has {rows} rows")
        batches.append((rows, body_size))
    return batches


def _message_rows(metadata: bytes, name: str) -> int:
    """The row count in a record batch's metadata (its length prefix, then a ``Message``)."""
    start = 8 if metadata.startswith(_CONTINUATION) else 4
    message = metadata[start:]
    root = _root(message)
    kind = _field(message, root, _MESSAGE_HEADER_TYPE)
    header = _field(message, root, _MESSAGE_HEADER)
    if kind is None or message[kind] != _RECORD_BATCH or header is None:
        raise ValueError(f"{name}: a block its footer lists as a record batch is not one")
    batch = header + _u32(message, header)
    length = _field(message, batch, _BATCH_LENGTH)
    return 0 if length is None else struct.unpack_from("<q", message, length)[0]


def _root(buffer: bytes) -> int:
    return _u32(buffer, 0)


def _field(buffer: bytes, table: int, index: int) -> int | None:
    """Where field ``index`` of the table at ``table`` lies, or None when it is absent."""
    vtable = table - struct.unpack_from("<i", buffer, table)[0]
    vtable_size = struct.unpack_from("<H", buffer, vtable)[0]
    entry = 4 + 2 * index
    if entry + 2 > vtable_size:
        return None
    offset = struct.unpack_from("<H", buffer, vtable + entry)[0]
    return table + offset if offset else None


def _u32(buffer: bytes, at: int) -> int:
    return struct.unpack_from("<I", buffer, at)[0]
