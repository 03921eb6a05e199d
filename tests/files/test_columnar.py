"""Columnar inputs: every row in exactly one rank's table; whole row groups, balanced by bytes."""

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pyarrow import feather

from shardwise import spawn_local
from shardwise.files.columnar import read_table, table_plan
from shardwise.files.ipc_footer import record_batches


def write_inputs(folder: Path, groups: list[list[int]], kind: str = "parquet") -> list[int]:
    """Files of row groups of the given sizes; every row's ``id`` unique. Returns all ids."""
    folder.mkdir(parents=True, exist_ok=True)
    ids, start = [], 0
    for number, sizes in enumerate(groups):
        tables = []
        for size in sizes:
            tables.append(pa.table({"id": np.arange(start, start + size, dtype=np.int64),
                                    "score": np.arange(size, dtype=np.float64) / 7}))
            ids.extend(range(start, start + size))
            start += size
        table = pa.concat_tables(tables) if tables else pa.table(
            {"id": pa.array([], pa.int64()), "score": pa.array([], pa.float64())})
        path = folder / f"part-{number:03d}.{kind}"
        if kind == "parquet":
            writer = pq.ParquetWriter(path, table.schema)
            for piece in tables:  # one row group per piece
                writer.write_table(piece)
            writer.close()
        else:
            with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, table.schema) as out:
                for piece in tables:
                    out.write_table(piece)
    return ids


@settings(max_examples=60, deadline=None)
@given(groups=st.lists(st.lists(st.integers(0, 40), max_size=4), min_size=1, max_size=4),
       world=st.integers(1, 6), kind=st.sampled_from(["parquet", "arrow"]))
def test_every_row_is_read_by_exactly_one_rank_in_order(tmp_path_factory, groups, world, kind):
    folder = tmp_path_factory.mktemp("inputs")
    ids = write_inputs(folder, groups, kind)
    shares = [read_table(folder, rank, world, columns=["id"])["id"].to_pylist()
              for rank in range(world)]
    assert [i for share in shares for i in share] == ids  # each once, ranks in order
    assert all(shares) or len(ids) < world  # no rank idle, a row group of no rows no work
    plan = table_plan(folder, world)
    if not plan.by_rows:  # whole row groups: each rank reads only units of its own
        assert sum(len(plan.share(r)) for r in range(world)) == len(plan.units)


@pytest.mark.parametrize("world", [2, 3, 5])
def test_row_groups_are_balanced_by_bytes(tmp_path, world):
    write_inputs(tmp_path, [[1000, 10, 10, 10, 1000, 10, 10, 10], [500] * 4, [30] * 9])
    plan = table_plan(tmp_path, world)
    total, largest = sum(u.bytes for u in plan.units), max(u.bytes for u in plan.units)
    for rank in range(world):  # within one row group of an equal share of the bytes
        assert abs(sum(u.bytes for u, _, _ in plan.share(rank)) - total / world) <= largest
    assert "rank" in str(plan) and "whole row groups" in str(plan)


def test_fewer_row_groups_than_ranks_split_rows(tmp_path):
    ids = write_inputs(tmp_path, [[10], [5]])
    plan = table_plan(tmp_path, 4)
    assert plan.by_rows and "fewer row groups than ranks" in str(plan)
    with pytest.warns(UserWarning, match=r"2 row group\(s\) for 4 ranks: rows are split"):
        shares = [read_table(tmp_path, r, 4)["id"].to_pylist() for r in range(4)]
    assert [len(s) for s in shares] == [3, 4, 4, 4] and sum(shares, []) == ids


def test_an_input_without_rows_gives_empty_tables_and_no_warning(tmp_path, recwarn):
    pq.write_table(pa.table({"id": pa.array([], pa.int64())}), tmp_path / "e.parquet")
    assert [read_table(tmp_path, r, 3).num_rows for r in range(3)] == [0, 0, 0]
    assert not recwarn.list


@pytest.mark.parametrize("kind", ["parquet", "arrow"])
def test_no_columns_count_the_rows_of_every_rank(tmp_path, kind):
    """columns=[] reads no column, but a table of no columns still has its rows, as in pyarrow."""
    write_inputs(tmp_path, [[2, 2, 2, 1]], kind)
    for world in (1, 2, 4):
        tables = [read_table(tmp_path, rank, world, columns=[]) for rank in range(world)]
        assert sum(t.num_rows for t in tables) == 7 and all(t.num_columns == 0 for t in tables)


def test_feather_files_are_arrow_ipc(tmp_path):
    feather.write_feather(pa.table({"id": [1, 2, 3]}), tmp_path / "t.feather",
                          compression="uncompressed")
    assert read_table(tmp_path / "t.feather", 0, 1)["id"].to_pylist() == [1, 2, 3]


def test_a_rank_with_nothing_gets_an_empty_table_of_the_columns(tmp_path):
    write_inputs(tmp_path, [[2]])  # fewer rows than ranks
    plan = table_plan(tmp_path, 3)
    assert plan.by_rows and plan.share(0) == []
    with pytest.warns(UserWarning, match="rows are split"):
        empty = read_table(plan, 0, 3, columns=["score"])
    assert empty.num_rows == 0 and empty.schema.names == ["score"]


def test_small_row_groups_in_front_of_a_large_one_leave_no_rank_idle(tmp_path):
    write_inputs(tmp_path, [[10, 10, 3000]])  # the old rule gave rank 0 all three
    plan = table_plan(tmp_path, 3)
    assert [[u.index for u, _, _ in plan.share(r)] for r in range(3)] == [[0], [1], [2]]


@pytest.mark.parametrize("empty_first", [True, False])
def test_row_groups_of_no_rows_leave_no_rank_idle(tmp_path, empty_first):
    """An empty file's row group is no work: 2 row groups with rows for 3 ranks split rows."""
    write_inputs(tmp_path, [[0], [450, 450]] if empty_first else [[450, 450], [0]])
    with pytest.warns(UserWarning, match=r"2 row group\(s\) for 3 ranks: rows are split"):
        assert [read_table(tmp_path, r, 3).num_rows for r in range(3)] == [300, 300, 300]
    plan = table_plan(tmp_path, 2)  # whole row groups, one with rows each
    assert not plan.by_rows and [sum(e - s for _, s, e in plan.share(r)) for r in range(2)] == [
        450, 450]


def test_bad_inputs_are_named(tmp_path):
    (tmp_path / "a.csv").write_text("1,2\n")
    with pytest.raises(ValueError, match="a.csv is not a Parquet or Arrow IPC file"):
        table_plan(tmp_path / "a.csv", 2)
    pq.write_table(pa.table({"id": [1]}), tmp_path / "x.parquet")
    pq.write_table(pa.table({"id": ["one"]}), tmp_path / "y.parquet")
    with pytest.raises(ValueError, match="y.parquet has columns"):
        read_table([tmp_path / "x.parquet", tmp_path / "y.parquet"], 0, 1)
    with pytest.raises(ValueError, match="world_size must be at least 1, got 0"):
        read_table(tmp_path / "x.parquet", 0, 0)  # named as the caller names it


@pytest.mark.parametrize("kind", ["parquet", "arrow"])
def test_a_column_a_file_lacks_is_named_with_those_it_has(tmp_path, kind):
    path = tmp_path / f"e.{kind}"
    table = pa.table({"src": [1, 2], "dst": [3, 4]})
    pq.write_table(table, path) if kind == "parquet" else feather.write_feather(table, path)
    for columns in (["sorce"], ["src", "dest"]):
        with pytest.raises(ValueError, match=rf"e.{kind} has no column '{columns[-1][:4]}.*: "
                                             "its columns are src, dst; name them in columns="):
            read_table(path, 0, 1, columns=columns)
    with pytest.raises(ValueError, match="has no column 'sorce'"):
        read_table(path, 1, 2, columns=["sorce"])  # a rank with no rows of its own too


def test_damaged_arrow_ipc_footers_are_errors_naming_the_file_not_empty_tables(tmp_path):
    path = tmp_path / "e.arrow"
    feather.write_feather(pa.table({"src": range(20)}), path, chunksize=6,
                          compression="uncompressed")
    whole = path.read_bytes()
    length = int.from_bytes(whole[-10:-6], "little")
    for damaged in (whole[:-10] + bytes([0]) + whole[-9:],  # the footer's length, low byte 0
                    whole[:-60] + whole[-10:],  # the middle of the footer cut out
                    whole[: -10 - length] + bytes(length) + whole[-10:]):  # a zeroed footer
        path.write_bytes(damaged)
        with pytest.raises(ValueError, match=r"e.arrow (is a damaged Arrow IPC file|is not a "
                                             "readable Arrow IPC file|does not end as)"):
            read_table(path, 0, 1)


def test_a_damaged_parquet_footer_is_an_error_naming_the_file(tmp_path):
    path = tmp_path / "e.parquet"
    pq.write_table(pa.table({"src": range(20), "dst": range(20)}), path, row_group_size=6)
    damaged = bytearray(path.read_bytes())
    damaged[-291] = 0  # a byte of the footer's metadata: pyarrow raises an OSError about thrift
    path.write_bytes(bytes(damaged))
    with pytest.raises(ValueError, match=r"e.parquet is not a readable Parquet file \("):
        table_plan(path, 1)



def test_a_parquet_row_group_of_a_negative_row_count_is_damaged_not_read_short(tmp_path):
    """pyarrow raises 'Negative size'; the plan took it as -201 rows, so ranks read 300 rows or
    99, depending on their number, of the 600."""
    path = tmp_path / "e.parquet"
    pq.write_table(pa.table({"l": [[i, i] for i in range(600)]}), path, row_group_size=300)
    whole = path.read_bytes()
    # The last row group's num_rows (Thrift: field delta 1, i64; zigzag varint of 300); the
    # column chunks' value counts (600) and the file's row count (600) read otherwise.
    assert whole.count(b"\x16\xd8\x04") == 2
    at = whole.rindex(b"\x16\xd8\x04")
    path.write_bytes(whole[:at] + b"\x16\x91\x03" + whole[at + 3:])  # -201
    assert pq.ParquetFile(path).metadata.row_group(1).num_rows == -201
    for world in (1, 3):
        with pytest.raises(ValueError, match=r"e.parquet is a damaged Parquet file: its row "
                                             r"group 1 has -201 rows"):
            read_table(path, 0, world)


def test_a_record_batch_whose_damaged_metadata_reads_as_no_rows_is_an_error(tmp_path):
    """A batch of no rows is no work for a rank, so it was never read and its rows were lost;
    pyarrow refuses its metadata ('Invalid flatbuffers message')."""
    import struct

    path = tmp_path / "e.arrow"
    feather.write_feather(pa.table({"x": range(100)}), path, chunksize=50,
                          compression="uncompressed")
    data = bytearray(path.read_bytes())
    eos = data.rindex(b"\xff\xff\xff\xff\x00\x00\x00\x00")  # after the last batch
    message = data.rindex(b"\xff\xff\xff\xff", 0, eos) + 8  # the last batch's metadata
    root = message + struct.unpack_from("<I", data, message)[0]
    vtable = root - struct.unpack_from("<i", data, root)[0]
    header = root + struct.unpack_from("<H", data, vtable + 8)[0]  # Message.header's offset
    data[header] += 77  # now pointing at no record batch
    path.write_bytes(bytes(data))
    with path.open("rb") as handle:  # (the footer's metadata, read by the format's rules)
        assert [rows for rows, _ in record_batches(handle, len(data), "e.arrow")] == [50, 0]
    with pytest.raises(OSError, match="Invalid flatbuffers message"):
        pa.ipc.open_file(path).read_all()
    with pytest.raises(ValueError, match=r"e.arrow is not a readable Arrow IPC file \("):
        read_table(path, 0, 1)


@pytest.mark.parametrize("kind", ["parquet", "arrow"])
def test_a_column_name_that_is_not_utf8_names_the_file(tmp_path, kind):
    """A damaged name (both formats store names as UTF-8) raised a bare UnicodeDecodeError."""
    path = tmp_path / f"e.{kind}"
    table = pa.table({"qqqq": [1, 2], "dst": [3, 4]})
    pq.write_table(table, path) if kind == "parquet" else feather.write_feather(table, path)
    path.write_bytes(path.read_bytes().replace(b"qqqq", b"\xff\xfeqq"))
    for columns in (None, ["dst"]):
        with pytest.raises(ValueError, match=rf"e.{kind} is not a readable .* file \(.*utf-8"):
            read_table(path, 0, 1, columns=columns)

def _read_on_every_rank(folder: str) -> list[int]:
    return read_table(folder)["id"].to_pylist()  # world and rank from the process group


@pytest.mark.timeout(120)
def test_three_gloo_ranks_read_every_row_once(tmp_path):
    ids = write_inputs(tmp_path, [[30, 20], [25], [5, 5, 5]])
    shares = spawn_local(_read_on_every_rank, 3, str(tmp_path), timeout=100)
    assert sum(shares, []) == ids and all(shares)


def test_files_differing_only_in_which_columns_may_hold_nulls_read_as_one_table(tmp_path):
    strict = pa.schema([pa.field("src", pa.int64(), nullable=False), ("dst", pa.int64())])
    pq.write_table(pa.table({"src": [1, 2], "dst": [3, 4]}, schema=strict), tmp_path / "a.parquet")
    pq.write_table(pa.table({"src": [5], "dst": [6]}), tmp_path / "b.parquet")
    assert read_table(tmp_path, 0, 1)["src"].to_pylist() == [1, 2, 5]


def test_files_differing_only_in_the_layout_of_text_or_lists_read_as_one_table(tmp_path):
    """pyarrow writes string and list, polars large_string and large_list; other types differ."""
    pq.write_table(pa.table({"src": ["a", "b"], "v": [[1.0], [2.0]]}), tmp_path / "part-0.parquet")
    pq.write_table(pa.table({"src": pa.array(["c"], pa.large_string()),
                             "v": pa.array([[3.0]], pa.large_list(pa.float64()))}),
                   tmp_path / "part-1.parquet")
    table = read_table(tmp_path, 0, 1)
    assert table.to_pydict() == {"src": ["a", "b", "c"], "v": [[1.0], [2.0], [3.0]]}
    assert table.schema.types == [pa.large_string(), pa.large_list(pa.float64())]
    pq.write_table(pa.table({"src": [4], "v": [[4.0]]}), tmp_path / "part-2.parquet")
    with pytest.raises(ValueError, match=r"part-2.parquet has columns \['src', 'v'\] of types "
                                         r"\[DataType\(int64\).*give files of one schema"):
        read_table(tmp_path, 0, 1)


@pytest.mark.filterwarnings("ignore:.*rows are split")
@pytest.mark.parametrize("world", [1, 2, 5])
def test_every_rank_gives_the_widest_layout_of_all_the_files(tmp_path, world):
    """A rank that reads only the pyarrow part, or nothing, gives large_string too: the ranks'
    tables join as one."""
    pq.write_table(pa.table({"s": ["a", "b"], "n": [1, 2]}), tmp_path / "part-0.parquet")
    pq.write_table(pa.table({"s": pa.array(["c", "d"], pa.large_string()), "n": [3, 4]}),
                   tmp_path / "part-1.parquet")
    tables = [read_table(tmp_path, rank, world) for rank in range(world)]
    assert all(t.schema.types == [pa.large_string(), pa.int64()] for t in tables)
    assert pa.concat_tables(tables).to_pydict() == {"s": ["a", "b", "c", "d"], "n": [1, 2, 3, 4]}
    assert read_table(tmp_path, 0, world, columns=["n"]).schema.types == [pa.int64()]


def test_a_parquet_files_nested_field_may_be_named_by_its_path(tmp_path):
    table = pa.table({"id": [1, 2], "st": [{"x": 0, "y": 1}, {"x": 2, "y": 3}]})
    pq.write_table(table, tmp_path / "n.parquet")
    assert read_table(tmp_path, 0, 1, columns=["st.x"]).to_pydict() == {
        "st": [{"x": 0}, {"x": 2}]}
    with pytest.warns(UserWarning, match="rows are split"):
        empty = read_table(tmp_path, 0, 3, columns=["st.x"])  # a rank with no rows
    assert empty.num_rows == 0 and empty.schema.names == ["st"]
    with pytest.raises(ValueError, match=r"n.parquet has no column 'st.z': its columns are id, st"):
        read_table(tmp_path, 0, 1, columns=["st.z"])


def test_one_column_name_alone_is_refused_not_read_as_its_letters(tmp_path):
    from shardwise.streams.files import row_group_shards

    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"a": [1], "b": [2], "ab": [3]}), path)
    for read in (lambda: read_table(path, 0, 1, columns="ab"),
                 lambda: row_group_shards(path, columns="ab")):
        with pytest.raises(TypeError, match="columns must be a sequence of column names, got 'ab'"):
            read()
    assert read_table(path, 0, 1, columns=["ab"]).column_names == ["ab"]


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_files_of_other_schemas_are_refused_on_every_rank(tmp_path, world_size):
    """A rank reads only some files; the plan holds every footer, so every rank refuses."""
    pq.write_table(pa.table({"id": [1, 2]}), tmp_path / "a.parquet")
    feather.write_feather(pa.table({"name": ["x"]}), tmp_path / "b.arrow")
    for rank in range(world_size):
        with pytest.raises(ValueError, match=r"b.arrow has columns \['name'\].*unlike .*a.parquet"):
            read_table(tmp_path, rank, world_size)
        with pytest.raises(ValueError, match=r"a.parquet has no column 'name'"):
            read_table(tmp_path, rank, world_size, columns=["name"])


@pytest.mark.filterwarnings("ignore:.*rows are split")
def test_an_empty_part_of_other_types_adds_nothing(tmp_path):
    """pandas writes an empty frame's text column as nulls."""
    pq.write_table(pa.table({"id": [1, 2], "s": ["a", "b"]}), tmp_path / "part-0.parquet")
    pq.write_table(pa.table({"id": pa.array([], pa.int32()), "s": pa.array([], pa.null())}),
                   tmp_path / "part-1.parquet")
    tables = [read_table(tmp_path, rank, 3) for rank in range(3)]
    assert [t.num_rows for t in tables] == [0, 1, 1]
    assert tables[0].schema.types == [pa.int64(), pa.string()]  # the first file's columns


@pytest.mark.filterwarnings("ignore:.*rows are split")
def test_an_empty_first_part_does_not_set_the_types_of_a_rank_with_nothing(tmp_path):
    pq.write_table(pa.table({"id": pa.array([], pa.int32()), "s": pa.array([], pa.null())}),
                   tmp_path / "part-0.parquet")
    pq.write_table(pa.table({"id": [1, 2], "s": ["a", "b"]}), tmp_path / "part-1.parquet")
    tables = [read_table(tmp_path, rank, 3) for rank in range(3)]
    assert [t.num_rows for t in tables] == [0, 1, 1]
    assert tables[0].schema == tables[1].schema  # the columns of the file with rows


def test_columns_given_as_a_generator_are_read_not_used_up_by_the_check(tmp_path):
    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"a": [1, 2], "b": [3, 4], "c": [5, 6]}), path)
    table = read_table(path, 0, 1, columns=(name for name in ["a", "b"]))
    assert table.column_names == ["a", "b"] and table.num_rows == 2


def test_columns_given_as_a_set_are_refused_as_their_order_differs_between_processes(tmp_path):
    """A set's order follows string hashes, salted per process: each rank would get its columns
    in another order, and a loader would give the roles (src, dst, weight) to others."""
    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"src": [1], "dst": [2], "weight": [3]}), path)
    for columns in ({"src", "dst"}, frozenset(["src", "dst"])):
        with pytest.raises(TypeError, match="columns must be in order.*a list"):
            read_table(path, 0, 1, columns=columns)


@pytest.mark.parametrize("kind", ["parquet", "arrow"])
def test_a_column_named_twice_is_refused_alike_for_every_format(tmp_path, kind):
    """Parquet read it once and Arrow IPC raised pyarrow's 'Can't unify schema'."""
    path = tmp_path / f"t.{kind}"
    table = pa.table({"a": [1, 2], "b": [3, 4]})
    pq.write_table(table, path) if kind == "parquet" else feather.write_feather(table, path)
    for rank in range(3):
        with pytest.raises(ValueError, match=r"columns names a column twice: \['a', 'b', 'a'\]"):
            read_table(path, rank, 3, columns=["a", "b", "a"])


@pytest.mark.parametrize("world_size", [1, 3])
def test_a_named_column_that_a_later_file_lacks_is_named(tmp_path, world_size):
    pq.write_table(pa.table({"src": [1, 2], "dst": [3, 4]}), tmp_path / "a.parquet")
    pq.write_table(pa.table({"src": [5], "dest": [6]}), tmp_path / "b.parquet")
    for rank in range(world_size):
        with pytest.raises(ValueError, match=r"b.parquet has no column 'dst': its columns are "
                                             "src, dest; name them in columns="):
            read_table(tmp_path, rank, world_size, columns=["src", "dst"])
