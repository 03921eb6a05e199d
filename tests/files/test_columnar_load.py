"""Graphs, matrices and vectors from Parquet / Arrow IPC columns: the same partitions as from text.

The same edges and vectors are written as text lines and as columnar files of several row
groups; on real gloo ranks each rank must hold exactly what it holds when loading the text.
"""

import re
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute
import pyarrow.parquet as pq
import pytest
import torch.distributed as dist

from shardwise.distributed.launch import spawn_local
from shardwise.files import ParseError, load_graph, load_matrix, load_vectors, read_records
from shardwise.files.patterns import Format

EDGE_COLUMNS = ("src", "dst", "weight")


def write_both(folder: Path, rng: np.random.Generator, kind: str = "parquet") -> dict[str, str]:
    """Edges and vectors as text and as columnar files (3 files, uneven row groups)."""
    n = 300
    src, dst = rng.integers(0, 50, n), rng.integers(0, 50, n)
    weight = rng.integers(0, 100, n) / 4
    ids = rng.permutation(10_000)[:120]
    values = rng.integers(-100, 100, (120, 3)) / 8
    text, table = folder / "text", folder / kind
    text.mkdir()
    table.mkdir()
    (text / "edges.csv").write_text("".join(f"{a},{b},{w}\n" for a, b, w in zip(src, dst, weight)))
    (text / "vectors.csv").write_text(
        "".join(f"{i},{','.join(map(str, v))}\n" for i, v in zip(ids, values)))
    cuts = [0, 70, 200, n]
    for number, (lo, hi) in enumerate(zip(cuts, cuts[1:])):
        edges = pa.table({"src": src[lo:hi], "dst": dst[lo:hi], "weight": weight[lo:hi],
                          "name": [f"v{a}" for a in src[lo:hi]]})
        _write(edges, table / f"edges-{number}.{kind}", kind, row_group_size=17 + 20 * number)
    vectors = pa.table({"id": ids, "values": pa.array(values.tolist(), pa.list_(pa.float64())),
                        **{f"f{j}": values[:, j] for j in range(3)}})
    _write(vectors, table / f"vectors.{kind}", kind, row_group_size=25)
    return {"text_edges": str(text / "edges.csv"), "text_vectors": str(text / "vectors.csv"),
            "edges": sorted(str(p) for p in table.glob("edges-*")),
            "vectors": str(table / f"vectors.{kind}")}


def _write(table: pa.Table, path: Path, kind: str, row_group_size: int) -> None:
    if kind == "parquet":
        pq.write_table(table, path, row_group_size=row_group_size)
        return
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, table.schema) as out:
        for batch in table.to_batches(max_chunksize=row_group_size):
            out.write_batch(batch)


def _edges(graph) -> Counter:
    return Counter(zip(*(a.tolist() for a in graph.edges())))


def _load_both_ways(paths: dict) -> dict:
    """On each rank: every load from text and from columns, as comparable values."""
    held = {}
    for pattern in ("fmap", "smap", "fsmap"):
        for source, extra in (("text", {}), ("table", {"columns": EDGE_COLUMNS})):
            inputs = paths["text_edges"] if source == "text" else paths["edges"]
            graph = load_graph(inputs, pattern, round_bytes=64 * dist.get_world_size(), **extra)
            held[pattern, source] = _edges(graph)
            block = load_matrix(inputs, pattern, **extra)
            coo = block.matrix.tocoo()
            held["matrix", pattern, source] = {
                (int(block.row_ids[r]), int(block.col_ids[c])): float(x)
                for r, c, x in zip(coo.row, coo.col, coo.data)}
    held["undirected", "text"] = _edges(load_graph(paths["text_edges"], "fmap", "undirected"))
    held["undirected", "table"] = _edges(
        load_graph(paths["edges"], "fmap", "undirected", columns=EDGE_COLUMNS))
    for source, inputs, extra in (
            ("text", paths["text_vectors"], {}),
            ("list", paths["vectors"], {"columns": ("id", "values")}),
            ("columns", paths["vectors"], {"columns": ("id", "f0", "f1", "f2")})):
        ids, values = load_vectors(inputs, **extra)
        held["vectors", source] = list(zip(ids.tolist(), map(tuple, values.tolist())))
    # String ids: the text of the ids hashes the same from either kind of input.
    named = load_graph(paths["edges"], "fmap", ids="str", columns=("name", "dst"))
    held["str ids"] = sorted(named.vertices().tolist())
    return held


@pytest.mark.timeout(240)
@pytest.mark.parametrize("world_size, kind", [(2, "parquet"), (3, "parquet"), (2, "arrow")])
def test_each_rank_holds_from_columns_exactly_what_it_holds_from_text(
        tmp_path: Path, world_size: int, kind: str) -> None:
    paths = write_both(tmp_path, np.random.default_rng(world_size), kind)
    per_rank = spawn_local(_load_both_ways, world_size, paths, timeout=200)
    everything: Counter = Counter()
    for held in per_rank:
        for pattern in ("fmap", "smap", "fsmap", "undirected"):
            assert held[pattern, "table"] == held[pattern, "text"], pattern
        for pattern in ("fmap", "smap", "fsmap"):
            assert held["matrix", pattern, "table"] == pytest.approx(held["matrix", pattern, "text"])
        assert held["vectors", "list"] == held["vectors", "text"]
        assert held["vectors", "columns"] == held["vectors", "text"]
        everything += held["fmap", "table"]
    text = Path(paths["text_edges"]).read_text().split()
    assert everything == Counter((int(a), int(b), float(w))
                                 for a, b, w in (line.split(",") for line in text))
    assert sum(len(held["str ids"]) for held in per_rank) == len(
        {line.split(",")[0] for line in text})


def _load_with_a_bad_row(folder: str) -> str:
    try:
        load_graph(folder, "fmap", columns=("src", "dst"))
    except ParseError as error:
        return str(error)
    return "no error"


@pytest.mark.timeout(120)
def test_a_null_on_one_rank_is_raised_on_every_rank_naming_its_file_and_row(tmp_path) -> None:
    pq.write_table(pa.table({"src": [1, 2, 3], "dst": [4, 5, 6]}), tmp_path / "a.parquet")
    pq.write_table(pa.table({"src": [7, None, 9], "dst": [1, 2, 3]}), tmp_path / "b.parquet")
    messages = spawn_local(_load_with_a_bad_row, 2, str(tmp_path), timeout=100)
    assert all("b.parquet:2: null in column 'src'" in message for message in messages)


def test_bad_rows_are_counted_and_skipped_with_on_error_skip(tmp_path) -> None:
    pq.write_table(pa.table({"id": [1, None, 3], "v": [[1.0, 2.0], [3.0, 4.0], [5.0]]}),
                   tmp_path / "v.parquet")
    with pytest.warns(UserWarning, match=r"skipped 2 malformed row\(s\).*v.parquet:2: null"):
        records, stats = read_records(tmp_path, Format("fvec", on_error="skip"), 0, 1,
                                      columns=("id", "v"))
    assert records["id"].tolist() == [1] and records["values"].tolist() == [[1.0, 2.0]]
    assert (stats.lines, stats.skipped, stats.row_groups) == (3, 2, 1)
    assert "vector of 1 values, not 2" in str(stats.examples[1])


@pytest.mark.parametrize("suffix", ["txt", "parquet"])
def test_a_source_and_a_target_sharing_a_string_id_is_an_error(tmp_path, monkeypatch,
                                                              suffix) -> None:
    # A hash that collides for strings of one length: "ab" (a source) and "cd" (a target).
    monkeypatch.setattr("shardwise.files.ids.hash_binary",
                        lambda values: pa.compute.binary_length(values).to_numpy().astype("int64"))
    if suffix == "txt":
        (tmp_path / "e.txt").write_text("ab,cd\n")
    else:
        pq.write_table(pa.table({"src": ["ab"], "dst": ["cd"]}), tmp_path / "e.parquet")
    columns = ("src", "dst") if suffix == "parquet" else None
    with pytest.raises(ValueError, match="hash to the same 63-bit id"):
        read_records(tmp_path, Format("fmap", ids="str"), 0, 1, columns=columns)


@pytest.mark.parametrize("columns, error, says", [
    (None, ValueError, "name the columns to read from"),
    (("src",), ValueError, "name 2 or 3 columns"),
    (("src", "nope"), ValueError, "has no column 'nope': its columns are src, dst, name"),
    (("name", "dst"), TypeError, "holds string, not integers (pass ids='str' for text ids)"),
    ("src,dst", TypeError, "a sequence of column names"),
])
def test_bad_columns_are_named(tmp_path, columns, error, says) -> None:
    pq.write_table(pa.table({"src": [1], "dst": [2], "name": ["a"]}), tmp_path / "e.parquet")
    with pytest.raises(error, match=re.escape(says)):
        load_graph(tmp_path, "fmap", columns=columns)


@pytest.mark.parametrize("row_groups", [0, 1])
def test_columns_are_checked_whatever_the_rows(tmp_path, row_groups) -> None:
    """No row to check them by: an input of no row group, or of one of no rows, and a rank with
    no rows of its own, check the columns by the footer."""
    path, schema = tmp_path / "e.parquet", pa.schema([("x", pa.int64()), ("y", pa.string())])
    with pq.ParquetWriter(path, schema) as out:
        for _ in range(row_groups):
            out.write_table(schema.empty_table())
    lacking = "e.parquet has no column 'nope': its columns are x, y"
    with pytest.raises(ValueError, match=lacking):
        load_graph(path, "fmap", columns=("x", "nope"))
    with pytest.raises(ValueError, match=lacking):
        load_vectors(path, columns=("x", "nope"))
    with pytest.raises(TypeError, match="id column 'y' holds string, not integers"):
        load_graph(path, "fmap", columns=("x", "y"))
    with pytest.raises(TypeError, match="column 'y' holds string, not numbers"):
        load_vectors(path, columns=("x", "y"))
    pq.write_table(pa.table({"x": [1], "y": ["a"]}), path)  # one row, read by rank 1 of 2
    with pytest.raises(TypeError, match="id column 'y' holds string, not integers"):
        read_records(path, Format("fmap"), 0, 2, columns=("x", "y"))
    pq.write_table(pa.table({"x": [], "y": []}), path)  # pandas writes an empty frame's as nulls
    assert load_graph(path, "fmap", columns=("x", "y")).num_edges == 0


def test_columnar_and_text_inputs_do_not_mix_and_text_takes_no_columns(tmp_path) -> None:
    pq.write_table(pa.table({"src": [1], "dst": [2]}), tmp_path / "e.parquet")
    (tmp_path / "f.csv").write_text("1,2\n")
    with pytest.raises(ValueError, match="mix columnar files .*e.parquet.* with text files"):
        load_graph(tmp_path, "fmap", columns=("src", "dst"))
    with pytest.raises(ValueError, match="drop columns="):
        load_graph(tmp_path / "f.csv", "fmap", columns=("src", "dst"))
    with pytest.raises(ValueError, match="for columnar edges choose the owner"):
        load_graph(tmp_path / "e.parquet", "fset", columns=("src", "dst"))


def test_an_arrow_file_without_a_named_column_is_named(tmp_path) -> None:
    table = pa.table({"src": [1], "dst": [2]})
    with pa.OSFile(str(tmp_path / "e.arrow"), "wb") as sink, pa.ipc.new_file(sink, table.schema) as out:
        out.write_table(table)
    with pytest.raises(ValueError, match="e.arrow has no column 'w': its columns are src, dst"):
        load_graph(tmp_path, "fmap", columns=("src", "dst", "w"))
    with pytest.raises(ValueError, match=re.escape("features=3, but columns names 1 value column(s)")):
        load_vectors(tmp_path, columns=("src", "dst"), features=3)
    with pytest.raises(ValueError, match="e.arrow has no columns 'a', 'b': its columns are src, dst"):
        load_vectors(tmp_path, columns=("src", "a", "b"))


def test_a_vector_holding_a_null_value_is_a_bad_row_and_empty_files_are_fine(tmp_path) -> None:
    schema = pa.schema([("id", pa.int64()), ("v", pa.list_(pa.float64()))])
    pq.write_table(schema.empty_table(), tmp_path / "a.parquet")  # no rows at all
    pq.write_table(pa.table({"id": [1, 2, 3], "v": [[1.0, None], [2.0, 3.0], [4.0, 5.0]]},
                            schema=schema), tmp_path / "b.parquet", row_group_size=2)
    with pytest.raises(ParseError, match=r"b.parquet:1: null value in the vector in column 'v'"):
        load_vectors(tmp_path, columns=("id", "v"))
    with pytest.warns(UserWarning, match="skipped 1 malformed row"):
        ids, values = load_vectors(tmp_path, columns=("id", "v"), on_error="skip")
    assert ids.tolist() == [2, 3] and values.tolist() == [[2.0, 3.0], [4.0, 5.0]]


@pytest.mark.parametrize("first", [None, []])
def test_vectors_are_as_long_as_the_first_that_holds_a_value_as_from_text(tmp_path, first) -> None:
    """A null or empty first vector is a bad row, passed over as the text loader passes over a
    first line with no value, even when it is all its row group holds."""
    pq.write_table(pa.table({"id": [1, 2, 3], "v": pa.array([first, [1.0, 2.0], [3.0, 4.0]],
                                                             pa.list_(pa.float64()))}),
                   tmp_path / "v.parquet", row_group_size=1)
    (tmp_path / "v.txt").write_text("1\n2,1.0,2.0\n3,3.0,4.0\n")
    with pytest.warns(UserWarning, match="skipped 1 malformed line"):
        text = load_vectors(tmp_path / "v.txt", on_error="skip")
    with pytest.warns(UserWarning, match="skipped 1 malformed row"):
        ids, values = load_vectors(tmp_path / "v.parquet", columns=("id", "v"), on_error="skip")
    assert ids.tolist() == text.ids.tolist() == [2, 3]
    assert values.tolist() == text.values.tolist() == [[1.0, 2.0], [3.0, 4.0]]
    pq.write_table(pa.table({"id": [1, 2], "v": pa.array([first, []], pa.list_(pa.float64()))}),
                   tmp_path / "v.parquet")
    with pytest.raises(ValueError, match="no vector in column 'v' holds a value; pass features="):
        load_vectors(tmp_path / "v.parquet", columns=("id", "v"), on_error="skip")


def test_ids_the_text_loader_refuses_are_bad_rows_and_other_encodings_are_read(tmp_path) -> None:
    """An unsigned id past 2**63 - 1 or an empty string id is a bad row, named or skipped as a
    bad line is; categorical id columns, and binary ids that are not UTF-8, load."""
    pq.write_table(pa.table({"src": pa.array([1, 2**63, 3], pa.uint64()),
                             "dst": pa.array([4, 5, 6], pa.uint64())}), tmp_path / "u.parquet")
    with pytest.raises(ParseError, match=r"u.parquet:2: id 9223372036854775808 in column 'src' "
                                         r"does not fit in int64"):
        load_graph(tmp_path / "u.parquet", "fmap", columns=("src", "dst"))
    with pytest.warns(UserWarning, match="skipped 1 malformed row"):
        graph = load_graph(tmp_path / "u.parquet", "fmap", columns=("src", "dst"), on_error="skip")
    assert (graph.row_ids.tolist(), graph.stats.skipped) == ([1, 3], 1)

    text = tmp_path / "text.csv"
    text.write_bytes(b"a,x\n\xff,y\n")  # not UTF-8: a bad line in text, a fine binary id here
    pq.write_table(pa.table({"src": pa.array([b"a", b"\xff", b""], pa.binary()),
                             "dst": pa.array(["x", "y", "z"]).dictionary_encode()}),
                   tmp_path / "s.parquet")
    with pytest.raises(ParseError, match=r"s.parquet:3: empty id in column 'src'"):
        load_graph(tmp_path / "s.parquet", "fmap", ids="str", columns=("src", "dst"))
    with pytest.warns(UserWarning, match="skipped 1 malformed row"):
        graph = load_graph(tmp_path / "s.parquet", "fmap", ids="str", columns=("src", "dst"),
                           on_error="skip")
    with pytest.warns(UserWarning, match="skipped 1 malformed line"):
        from_text = load_graph(text, "fmap", ids="str", on_error="skip")
    assert graph.stats.records_owned == 2
    assert from_text.row_ids.tolist()[0] in graph.row_ids.tolist()  # 'a' hashes alike


def test_a_nested_parquet_field_is_named_by_its_path(tmp_path) -> None:
    pq.write_table(pa.table({"st": [{"x": 1, "in": {"w": 0.5}}, {"x": 3, "in": {"w": 2.0}}],
                             "dst": [5, 6]}), tmp_path / "e.parquet")
    records, _ = read_records(tmp_path / "e.parquet", Format("fmap"), 0, 1,
                              columns=("st.x", "dst", "st.in.w"))
    assert records.tolist() == [(1, 5, 0.5), (3, 6, 2.0)]


def test_integer_weights_and_values_past_2_to_the_53_round_as_from_text(tmp_path) -> None:
    big = 2**53 + 1  # no float64 holds it: pyarrow's safe cast refused it
    (tmp_path / "e.txt").write_text(f"1,2,{big}\n")
    pq.write_table(pa.table({"s": [1], "t": [2], "w": pa.array([big], pa.int64())}),
                   tmp_path / "e.parquet")
    text, _ = read_records(tmp_path / "e.txt", Format("fmap"), 0, 1)
    table, _ = read_records(tmp_path / "e.parquet", Format("fmap"), 0, 1, columns=("s", "t", "w"))
    assert table["weight"].tolist() == text["weight"].tolist() == [float(big)]
    vectors, _ = read_records(tmp_path / "e.parquet", Format("fvec"), 0, 1, columns=("s", "w"))
    assert vectors["values"].tolist() == [[float(big)]]


@pytest.mark.skipif(not hasattr(pa, "string_view"), reason="views came in pyarrow 16")
@pytest.mark.parametrize("kind", ["string_view", "binary_view", "fixed_size_binary"])
def test_text_ids_in_view_and_fixed_size_columns_load_as_from_text(tmp_path, kind) -> None:
    """polars writes text columns as string_view; a UUID's 16 bytes are fixed-size binary."""
    src, dst = ["anna", "bert", "carl", "dave", "anna"], ["bert", "carl", "anna", "anna", "dave"]
    (tmp_path / "edges.txt").write_text("".join(f"{a},{b}\n" for a, b in zip(src, dst)))
    text = _edges(load_graph(tmp_path / "edges.txt", "fmap", ids="str"))
    type_ = pa.binary(4) if kind == "fixed_size_binary" else getattr(pa, kind)()
    ids = [[name.encode() for name in column] for column in (src, dst)]
    _write(pa.table({"src": pa.array(ids[0], type_), "dst": pa.array(ids[1], type_)}),
           tmp_path / "edges.arrow", "arrow", row_group_size=2)
    graph = load_graph(tmp_path / "edges.arrow", "fmap", ids="str", columns=("src", "dst"))
    assert _edges(graph) == text and graph.num_edges == len(src)


def test_a_file_that_is_not_parquet_is_named(tmp_path) -> None:
    (tmp_path / "t.parquet").write_text("1,2\n" * 100)
    with pytest.raises(ValueError, match=r"t.parquet is not a readable Parquet file \(Parquet "
                                         r"magic bytes not found"):
        load_graph(tmp_path / "t.parquet", "fmap", columns=("src", "dst"))


def test_row_groups_that_compress_unevenly_are_read_into_what_their_rows_need(tmp_path):
    """A first row group that compresses to almost nothing must not make the record array be
    sized from its share of the bytes (2 M rows read as 2 billion: a 47 GiB allocation)."""
    path, n = tmp_path / "edges.parquet", 1_000_000
    rng = np.random.default_rng(0)
    with pq.ParquetWriter(path, pa.schema([("src", pa.int64()), ("dst", pa.int64())])) as out:
        out.write_table(pa.table({"src": np.zeros(n, np.int64), "dst": np.zeros(n, np.int64)}))
        out.write_table(pa.table({"src": rng.integers(0, 2**62, n),
                                  "dst": rng.integers(0, 2**62, n)}))
    records, stats = read_records(path, Format("fmap"), 0, 1, columns=("src", "dst"))
    assert len(records) == stats.lines == 2 * n
    assert records["dst"][n:].tolist() == pq.read_table(path).column("dst")[n:].to_pylist()


def test_an_empty_part_of_any_column_types_adds_nothing(tmp_path):
    pq.write_table(pa.table({"src": [1, 2], "dst": [3, 4]}), tmp_path / "part-0.parquet")
    pq.write_table(pa.table({"src": [], "dst": []}), tmp_path / "part-1.parquet")  # null type
    records, _ = read_records(tmp_path, Format("fmap"), 0, 1, columns=("src", "dst"))
    assert records["src"].tolist() == [1, 2] and records["dst"].tolist() == [3, 4]
