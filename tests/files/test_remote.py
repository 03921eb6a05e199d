"""Loading from a real S3-compatible server (moto's, on 127.0.0.1), healthy and troubled.

Reads go through a proxy that fails chosen range requests (503 SlowDown, 500, connection resets,
responses cut short, stalls): the loads must still be exact, a request that keeps failing must
end in an error naming the object, the byte range and the tries, a missing or forbidden object
must fail at once, and no credential may show anywhere.
"""

from __future__ import annotations

import http.server
import random
import threading
import time
import traceback
import warnings
from functools import partial
from urllib.parse import quote

import pytest

from shardwise.cli import main
from shardwise.distributed.launch import spawn_local
from shardwise.files import agreed_plan, iter_chunks, load_graph, plan, read_lines, remote
from shardwise.files.credentials import public_url
from shardwise.files.read import chunk_lines, split_lines
from tests.files.object_store import BUCKET, KEY, SECRET, ObjectStore, store_fixtures

TOKEN = "SessionTokenNeverShown123"
PASSWORD = "PasswordNeverShown456"
QUERY_TOKEN = "QueryTokenNeverShown789"
SECRETS = (KEY, SECRET, TOKEN, PASSWORD, QUERY_TOKEN)


def _lines_objects(seed: int = 7) -> dict[str, bytes]:
    """Text objects with every quirk: CRLF, no final newline, blank, long and non-ASCII lines, an
    empty object, a nested prefix, and hidden objects a listing must skip."""
    rng = random.Random(seed)

    def text(count: int, crlf: bool, final: bool) -> bytes:
        lines = [("é" if i % 97 == 0 else "") + "x" * rng.choice([0, 3, 40, 9000 if i % 500 == 1
                                                                     else 12]) + str(i)
                 for i in range(count)]
        lines[count // 2] += "y" * 70_000  # longer than a chunk's look past its cut for a newline
        end = "\r\n" if crlf else "\n"
        return (end.join(lines) + (end if final else "")).encode()

    return {"lines/a.csv": text(3000, False, True), "lines/b.csv": text(700, True, False),
            "lines/empty.csv": b"", "lines/sub/c.csv": text(1500, False, True),
            "lines/_SUCCESS": b"", "lines/.c.csv.crc": b"ignored"}


def _expected_lines(objects: dict[str, bytes], prefix: str) -> list[str]:
    visible = sorted(key for key in objects if key.startswith(prefix)
                     and not any(p.startswith(("_", ".")) for p in key.split("/")))
    return [line for key in visible if objects[key] for line in split_lines(objects[key].decode())]


def _edge_objects() -> dict[str, bytes]:
    return {f"edges/part-{part}.csv": "".join(f"{i},{(i * 7 + part) % 1000}\n"
                                              for i in range(2000 * part, 2000 * part + 1500))
            .encode() for part in range(3)}


store, _no_faults = store_fixtures(lambda: {**_lines_objects(), **_edge_objects()})


@pytest.fixture
def quick_retries(monkeypatch) -> None:
    """Short waits between tries, in this process (spawned ranks keep the defaults)."""
    monkeypatch.setattr(remote, "BACKOFF", remote.Backoff(tries=3, first_wait=0.01))


def _rank_loads(options: dict) -> dict:
    """On each rank: every line of the prefix, in small chunks, and the graph of the edges."""
    the_plan = agreed_plan(f"s3://{BUCKET}/lines/", storage_options=options)
    chunks = iter_chunks(the_plan, block_bytes=4096)
    lines = [line for chunk in chunks for line in chunk_lines(chunk)]
    graph = load_graph(f"s3://{BUCKET}/edges/", storage_options=options, block_bytes=2048)
    src, dst, _ = graph.edges()
    return {"lines": lines, "edges": list(zip(src.tolist(), dst.tolist()))}


@pytest.mark.timeout(240)
@pytest.mark.parametrize("world", [2, 3])
def test_ranks_load_every_line_of_a_bucket_prefix_once_through_failing_requests(
    store: ObjectStore, world: int
) -> None:
    store.faults.fail("lines/a.csv", "503", "reset")
    store.faults.fail("lines/sub/", "500", "cut")
    store.faults.fail("edges/part-1", "500", "reset")
    per_rank = spawn_local(_rank_loads, world, store.options(), timeout=200)
    # Rank order is file order: every line once, by exactly one rank.
    assert [line for rank in per_rank for line in rank["lines"]] == _expected_lines(
        _lines_objects(), "lines/")
    assert all(rank["lines"] for rank in per_rank)
    edges = sorted(edge for rank in per_rank for edge in rank["edges"])
    assert edges == sorted((i, (i * 7 + part) % 1000) for part in range(3)
                           for i in range(2000 * part, 2000 * part + 1500))
    faults = {r.fault for r in store.faults.requests if r.fault}
    assert faults == {"503", "reset", "500", "cut"}  # every kind of failure was met, and passed


@pytest.mark.timeout(120)
def test_http_urls_are_retried_through_every_kind_of_failure(
    store: ObjectStore, monkeypatch
) -> None:
    """fsspec's http filesystem retries nothing itself: each range here passes only because
    shardwise tried it again, after a 503, a 500, a reset, a cut-off response and a timeout."""
    aiohttp = pytest.importorskip("aiohttp")
    monkeypatch.setattr(remote, "BACKOFF", remote.Backoff(tries=6, first_wait=0.01))
    urls = [store.http_url("lines/a.csv"), store.http_url("lines/b.csv")]
    store.faults.fail("lines/b.csv", "503", "500", "reset", "cut", "stall")
    options = {"client_kwargs": {"timeout": aiohttp.ClientTimeout(sock_read=1)}}
    lines = [line for rank in range(2)
             for line in read_lines(urls, rank, 2, storage_options=options)]
    assert lines == [line for key in ("lines/a.csv", "lines/b.csv")
                     for line in split_lines(_lines_objects()[key].decode())]
    failed = [r for r in store.faults.requests if r.fault]
    assert {r.fault for r in failed} == {"503", "500", "reset", "cut", "stall"}
    assert all(r.method == "GET" and r.range for r in failed)


@pytest.mark.timeout(60)
def test_a_range_that_keeps_failing_names_the_object_the_range_and_the_tries(
    store: ObjectStore, quick_retries: None
) -> None:
    store.faults.fail("edges/part-2", "500", forever=True)
    the_plan = plan(f"s3://{BUCKET}/edges/part-2.csv", 1, storage_options=store.options())
    size = the_plan.total_bytes
    with pytest.raises(OSError) as caught:
        list(iter_chunks(the_plan, 0, 1))
    assert str(caught.value).startswith(
        f"s3://{BUCKET}/edges/part-2.csv: reading bytes [0, {size:,}) failed 3 times over ")
    assert "InternalError" in str(caught.value) or "internal error" in str(caught.value)
    assert len(store.faults.seen("edges/part-2")) == 3  # no more tries than it says


@pytest.mark.timeout(60)
@pytest.mark.parametrize("fault, kind, says", [
    ("404", FileNotFoundError, "there is no such object"),
    ("403", PermissionError, "access was denied"),
])
def test_a_missing_or_forbidden_object_fails_at_once_naming_it(
    store: ObjectStore, fault: str, kind: type, says: str
) -> None:
    store.faults.fail("edges/part-0", fault, forever=True)
    with pytest.raises(kind, match=says) as caught:
        list(iter_chunks(f"s3://{BUCKET}/edges/part-0.csv", 0, 1, storage_options=store.options()))
    assert str(caught.value).startswith(f"s3://{BUCKET}/edges/part-0.csv: reading bytes [0, ")
    assert "not tried again" in str(caught.value)
    assert len(store.faults.seen("edges/part-0")) == 1


@pytest.mark.timeout(60)
def test_a_glob_walks_the_prefixes_it_matches_and_skips_hidden_names(store: ObjectStore) -> None:
    store.upload({"globbed/a.csv": b"a\n", "globbed/sub/b.csv": b"b\n", "globbed/_SUCCESS": b"",
                  "globbed/sub/.b.csv.crc": b"junk\n"})
    lines = read_lines(f"s3://{BUCKET}/globbed/*", 0, 1, storage_options=store.options())
    assert lines == ["a", "b"]


@pytest.mark.timeout(60)
def test_a_recursive_glob_lists_once_and_skips_hidden_prefixes(store: ObjectStore) -> None:
    objects = {f"deep/{i}/{j}/part-{i}{j}.csv": f"{i}{j}\n".encode()
               for i in range(4) for j in range(5)}
    store.upload({**objects, "deep/_tmp/part-x.csv": b"unfinished\n", "deep/0/_SUCCESS": b""})
    store.faults.reset()
    lines = read_lines(f"s3://{BUCKET}/deep/**/part-*.csv", 0, 1, storage_options=store.options())
    assert lines == [f"{i}{j}" for i in range(4) for j in range(5)]
    listings = [r for r in store.faults.requests if r.range is None and r.method == "GET"]
    assert len(listings) == 1, listings  # not one more per matched prefix
    assert read_lines(f"s3://{BUCKET}/deep/**", 0, 1, storage_options=store.options()) == lines
    assert read_lines(f"s3://{BUCKET}/deep/_tmp/*", 0, 1, storage_options=store.options()
                      ) == ["unfinished"]


@pytest.mark.timeout(60)
def test_an_object_deleted_or_shrunk_after_planning_is_an_error_naming_it(
    store: ObjectStore
) -> None:
    store.upload({"changing/gone.csv": b"1,2\n" * 100, "changing/shrunk.csv": b"1,2\n" * 100})
    gone, shrunk = (plan(f"s3://{BUCKET}/changing/{name}", 1, storage_options=store.options())
                    for name in ("gone.csv", "shrunk.csv"))
    store.writer().rm(f"{BUCKET}/changing/gone.csv")
    store.upload({"changing/shrunk.csv": b"1,2\n" * 10})
    store.faults.reset()
    gone_name = f"s3://{BUCKET}/changing/gone.csv"
    with pytest.raises(FileNotFoundError, match=f"{gone_name}: asking its size failed"):
        list(iter_chunks(gone, 0, 1))
    assert len(store.faults.seen("changing/gone.csv", method="HEAD")) == 1  # not retried
    with pytest.raises(OSError, match=f"{BUCKET}/changing/shrunk.csv has 40 bytes but had 400"):
        list(iter_chunks(shrunk, 0, 1))


@pytest.mark.timeout(60)
def test_the_next_chunk_is_requested_while_this_one_is_used(store: ObjectStore) -> None:
    key = "edges/part-1.csv"
    the_plan = plan(f"s3://{BUCKET}/{key}", 1, storage_options=store.options())
    chunks = iter_chunks(the_plan, 0, 1, block_bytes=4096)
    first = next(chunks)
    second_start = first.start + len(first.data)

    def requested(start: int, ranges: list[str | None]) -> bool:  # a chunk's one request
        return any(r and r.startswith(f"bytes={start}-") for r in ranges)

    def seen() -> list[str | None]:
        return [r.range for r in store.faults.seen(key)]

    assert _until(lambda: requested(second_start, seen()))  # while the first chunk is held
    time.sleep(0.3)  # time enough to run further ahead, were it to
    held = seen()
    rest = [c.start for c in chunks]
    assert len(rest) >= 3
    asked_while_held = {start for start in rest if requested(start, held)}
    assert asked_while_held == {rest[0]}  # one chunk ahead, no more: memory stays bounded


def _until(condition, seconds: float = 20.0) -> bool:
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.02)
    return condition()


def _texts(error: BaseException) -> list[str]:
    return [str(error), repr(error), "".join(traceback.format_exception(error))]


def _assert_hidden(texts: list[str]) -> None:
    for text in texts:
        for secret in SECRETS:
            for spelling in (secret, quote(secret, safe="")):
                assert spelling not in text, f"{secret!r} shows in: {text[:2000]}"


@pytest.mark.timeout(180)
def test_credentials_never_show_in_errors_warnings_reprs_or_output(
    store: ObjectStore, quick_retries: None, capsys, caplog
) -> None:
    store.upload({"bad/edges.csv": b"1,2\n3,oops\n5,6\n"})
    http_base = store.url.replace("http://", f"http://reader:{PASSWORD}@")
    urls = {
        "s3": f"s3://{BUCKET}/edges/",
        "presigned": store.http_url("edges/part-0.csv"),  # its query holds the access key
        "password": f"{http_base}/{BUCKET}/edges/part-1.csv?token={QUERY_TOKEN}",
    }
    http_options = {"headers": {"X-Session-Token": TOKEN}}
    texts: list[str] = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for name, url in urls.items():
            options = store.options(token=TOKEN) if name == "s3" else http_options
            the_plan = plan(url, 2, storage_options=options)
            texts += [str(the_plan), repr(the_plan), repr(the_plan.sources)]
            texts += [str(chunk.source) for chunk in iter_chunks(the_plan, 0, 2)]
            for fault in ("500", "404", "403"):
                store.faults.fail("edges/part-", fault, forever=True)
                with pytest.raises(OSError) as failed:
                    list(iter_chunks(the_plan, 1, 2))
                texts += _texts(failed.value)
                store.faults.reset()
            missing = url.replace("edges/", "edges/none-") if "?" in url else url + "none.csv"
            with pytest.raises(FileNotFoundError) as failed:
                plan(missing, 1, storage_options=options)
            texts += _texts(failed.value)
        options = store.options(token=TOKEN)
        bad = f"s3://{BUCKET}/bad/edges.csv"
        with pytest.raises(ValueError) as failed:
            load_graph(bad, storage_options=options)
        texts += _texts(failed.value)
        load_graph(bad, storage_options=options, on_error="skip")
    texts += [str(w.message) for w in caught]
    assert any("skipped 1 malformed line" in str(w.message) for w in caught)

    flags = [f"--storage-option=key={KEY}", f"--storage-option=secret={SECRET}",
             f"--storage-option=token={TOKEN}",
             f'--storage-option=client_kwargs={{"endpoint_url": "{store.url}"}}',
             '--storage-option=config_kwargs={"retries": {"total_max_attempts": 1}}']
    assert main(["load", urls["s3"], "--nproc", "2", *flags]) == 0
    assert main(["load", bad, "--on-error", "skip", *flags]) == 0
    for command in (["load", f"s3://{BUCKET}/edges/none.csv", *flags],
                    ["load", bad, *flags], ["load", urls["password"], "--pattern", "linesplit"]):
        store.faults.fail("edges/part-1", "403", forever=True)
        with pytest.raises(SystemExit) as exit_code:
            main(command)
        assert exit_code.value.code == 2
    out = capsys.readouterr()
    assert "shardwise load: 2 rank(s)" in out.out and "rank 0 skipped" in out.out
    assert out.err.count("shardwise load: error:") == 3
    texts += [out.out, out.err, caplog.text]
    _assert_hidden(texts)


@pytest.mark.timeout(60)
def test_a_mistyped_option_for_an_http_url_is_named_not_called_a_missing_file(
    store: ObjectStore
) -> None:
    url = store.http_url("lines/a.csv")
    with pytest.raises(ValueError) as caught:
        plan(url, 1, storage_options={"bogus_opt": 1})
    message = str(caught.value)
    assert message.startswith(f"{public_url(url)}: asking what it is failed (TypeError: ")
    assert "unexpected keyword argument 'bogus_opt'" in message
    assert message.endswith("is an option wrong? Check the storage options (storage_options)")
    with pytest.raises(FileNotFoundError, match="input file not found"):  # a real missing file
        plan(store.http_url("lines/nope.csv"), 1)


@pytest.mark.timeout(60)
def test_a_server_that_ignores_byte_ranges_is_named_as_such(tmp_path) -> None:
    """Python's own http.server answers a range request with the whole file."""
    size = (tmp_path / "e.csv").write_text("".join(f"{i},{i + 1}\n" for i in range(50)))
    handler = partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/e.csv"
    try:
        with pytest.raises(OSError, match=rf"the server sent {size} bytes: it ignores byte "
                                          r"ranges \(HTTP Range requests\)") as caught:
            read_lines(url, rank=1, world_size=2)
        assert str(caught.value).startswith(f"{url}: asked for bytes [")
    finally:
        server.shutdown()
        server.server_close()
