"""Which errors are retried, how a request that keeps failing is reported, and reading ahead.

The exceptions are the real ones the HTTP clients under fsspec raise; the server tests in
``test_remote.py`` show the same end to end.
"""

from __future__ import annotations

import errno
import threading
import time
from collections.abc import Iterator

import aiohttp
import pytest

from shardwise.files.remote import Backoff, is_transient, read_ahead, retried

QUICK = Backoff(tries=3, first_wait=0.001)


def _botocore_error(status: int, code: str) -> Exception:
    botocore = pytest.importorskip("botocore.exceptions")
    response = {"Error": {"Code": code, "Message": "..."},
                "ResponseMetadata": {"HTTPStatusCode": status}}
    return botocore.ClientError(response, "GetObject")


def _raised_from(outer: Exception, cause: Exception) -> Exception:
    """``outer`` as a filesystem raises it, translating ``cause`` (s3fs, fsspec's http)."""
    try:
        try:
            raise cause
        except Exception as error:
            raise outer from error
    except Exception as raised:  # noqa: BLE001 - handed back with its cause set
        return raised


@pytest.mark.parametrize("make", [
    lambda: ConnectionResetError(errno.ECONNRESET, "Connection reset by peer"),
    lambda: TimeoutError("read timed out"),
    lambda: aiohttp.ServerDisconnectedError(),
    lambda: aiohttp.ClientPayloadError("Response payload is not completed"),
    lambda: aiohttp.ClientOSError(errno.ECONNRESET, "Connection reset by peer"),
    lambda: _raised_from(FileNotFoundError("https://host/a"), aiohttp.ClientResponseError(
        None, (), status=503, message="Service Unavailable")),  # fsspec's http: any failed HEAD
    lambda: _raised_from(OSError(errno.EIO, "Please reduce your request rate."),
                         _botocore_error(503, "SlowDown")),  # s3fs translates ClientErrors
    lambda: _raised_from(OSError(errno.EREMOTEIO, "internal"),
                         _botocore_error(500, "InternalError")),
    lambda: _botocore_error(429, "TooManyRequests"),
], ids=["reset", "timeout", "disconnected", "payload cut", "client reset", "http 503",
        "s3 SlowDown", "s3 500", "429"])
def test_transient_errors_are_retried(make) -> None:
    assert is_transient(make())


@pytest.mark.parametrize("make", [
    lambda: FileNotFoundError("s3://bucket/a.csv"),
    lambda: PermissionError("Access Denied"),
    lambda: _raised_from(FileNotFoundError("https://host/a"), aiohttp.ClientResponseError(
        None, (), status=404, message="Not Found")),
    lambda: _raised_from(OSError(errno.EINVAL, "range"), _botocore_error(416, "InvalidRange")),
    lambda: ValueError("bad option"),
], ids=["missing", "denied", "http 404", "s3 416", "value"])
def test_permanent_errors_are_not(make) -> None:
    assert not is_transient(make())


def test_a_transient_error_is_tried_again_until_it_passes() -> None:
    calls = []

    def flaky() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise ConnectionResetError(errno.ECONNRESET, "Connection reset by peer")
        return "data"

    read = retried(flaky, name="s3://b/a.csv", request="reading bytes [0, 4)", backoff=QUICK)
    assert read == "data"
    assert len(calls) == 3


def test_after_the_last_try_the_error_names_the_object_the_range_and_the_tries() -> None:
    calls = []

    def down() -> bytes:
        calls.append(1)
        raise aiohttp.ServerDisconnectedError()

    with pytest.raises(OSError) as caught:
        retried(down, name="s3://b/a.csv", request="reading bytes [16, 32)", backoff=QUICK)
    assert len(calls) == 3
    assert str(caught.value).startswith("s3://b/a.csv: reading bytes [16, 32) failed 3 times over")
    assert "ServerDisconnectedError" in str(caught.value)
    assert caught.value.__cause__ is None and caught.value.__suppress_context__


@pytest.mark.parametrize("error, kind, says", [
    (FileNotFoundError("The specified key does not exist."), FileNotFoundError, "no such object"),
    (PermissionError("Access Denied"), PermissionError, "access was denied"),
    (ValueError("unknown option"), ValueError, "do not pass with time"),
])
def test_a_permanent_error_fails_at_once_naming_the_object(error, kind, says) -> None:
    calls = []

    def fails() -> None:
        calls.append(1)
        raise error

    with pytest.raises(kind, match=says) as caught:
        retried(fails, name="s3://b/a.csv", request="reading bytes [0, 4)", backoff=QUICK,
                secrets=frozenset({"Access Denied"}))
    assert calls == [1]
    assert str(caught.value).startswith("s3://b/a.csv: reading bytes [0, 4) failed (")
    assert "Access Denied" not in str(caught.value)


def test_the_waits_double_up_to_the_longest_with_jitter() -> None:
    backoff = Backoff(first_wait=1.0, longest_wait=5.0)
    for failures, most in [(1, 1.0), (2, 2.0), (3, 4.0), (4, 5.0), (9, 5.0)]:
        waits = [backoff.wait(failures) for _ in range(50)]
        assert most / 2 <= min(waits) and max(waits) <= most


def _numbers(made: list[int], fail_at: int | None = None) -> Iterator[int]:
    for number in range(10):
        if number == fail_at:
            raise OSError("s3://b/a.csv: reading bytes [0, 4) failed")
        made.append(number)
        yield number


def _eventually(condition, seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.01)
    return condition()


@pytest.mark.timeout(30)
def test_read_ahead_makes_one_item_ahead_of_the_consumer() -> None:
    made: list[int] = []
    items = read_ahead(_numbers(made))
    assert next(items) == 0
    assert _eventually(lambda: made == [0, 1])  # made while the consumer holds 0
    time.sleep(0.2)
    assert made == [0, 1]  # and no further: memory stays bounded
    assert list(items) == list(range(1, 10))


@pytest.mark.timeout(30)
def test_read_ahead_raises_the_threads_error_in_the_consumer() -> None:
    items = read_ahead(_numbers([], fail_at=3))
    assert [next(items) for _ in range(3)] == [0, 1, 2]
    with pytest.raises(OSError, match="reading bytes"):
        next(items)


@pytest.mark.timeout(30)
def test_a_consumer_that_stops_early_stops_the_thread() -> None:
    made: list[int] = []
    items = read_ahead(_numbers(made))
    assert next(items) == 0
    items.close()

    def running() -> bool:
        return any(t.name == "shardwise-read-ahead" for t in threading.enumerate())

    assert _eventually(lambda: not running())
    assert len(made) <= 2
