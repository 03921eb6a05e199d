"""Requests to object stores (``s3://``, ``gs://``, ``az://``, ``http(s)://``...): retried, and
made ahead of need.

Every request shardwise makes of a remote filesystem (a listing, a size, a byte range) goes
through ``retried``. A transient error (a connection reset or cut short, a timeout, HTTP 5xx, 408
or 429, throttling such as S3's ``SlowDown``) is tried again after an exponential, jittered
wait; after the last try, or at once for any other error (a missing object, access denied), it
raises a built-in exception that names the object, the request (the byte range) and the tries,
with every credential hidden. These tries come on top of any the filesystem makes itself (s3fs
and botocore retry some errors a few times on their own).

``RetriedFile`` is a remote object as a seekable binary file whose every read is such a request,
for readers that want a file (pyarrow's Parquet and Arrow IPC readers). ``read_ahead`` runs a
rank's reading in a background thread one chunk ahead of the parser, so the next range is on its
way while this one is parsed.
"""

from __future__ import annotations

import io
import queue
import random
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from shardwise.files.credentials import hide

if TYPE_CHECKING:
    from shardwise.files.sources import Source

T = TypeVar("T")

_TRANSIENT_STATUS = {408, 429, 500, 502, 503, 504}
_TRANSIENT_CODES = {
    "SlowDown", "Throttling", "ThrottlingException", "TooManyRequests", "TooManyRequestsException",
    "RequestLimitExceeded", "RequestTimeout", "RequestTimeoutException", "InternalError",
    "ServiceUnavailable", "ServerBusy", "OperationTimedOut",
}
# What the HTTP clients under fsspec's filesystems (aiohttp, botocore, urllib3, requests,
# azure-core) raise when a connection drops, a response is cut short or a request times out;
# matched by class name (the class or a base), so none of them has to be installed.
_TRANSIENT_TYPES = {
    "ConnectionError", "TimeoutError", "ClientConnectionError", "ClientPayloadError",
    "HTTPClientError", "IncompleteRead", "ProtocolError", "ResponseStreamingError",
    "ChunkedEncodingError", "ServiceRequestError", "ServiceResponseError",
}
_MISSING_CODES = {"NoSuchKey", "NoSuchBucket", "NotFound", "BlobNotFound", "ContainerNotFound"}
_DENIED_CODES = {"AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken",
                 "AuthorizationFailure", "AuthenticationFailed", "Forbidden"}
# botocore's errors when it finds no credentials to sign a request with (by class name).
_NO_CREDENTIALS_TYPES = {"NoCredentialsError", "PartialCredentialsError"}
NO_CREDENTIALS = (
    "the credentials are missing or incomplete: give them in the environment (AWS_ACCESS_KEY_ID and "
    "AWS_SECRET_ACCESS_KEY, or AWS_PROFILE), as storage_options={'key': ..., 'secret': ...}, or, "
    "for a public bucket, as storage_options={'anon': True}")


@dataclass(frozen=True)
class Backoff:
    """How often to try a request, and how long to wait between tries.

    The wait after the ``n``-th failure is ``first_wait * 2**(n - 1)`` seconds, at most
    ``longest_wait``, times a random factor in [0.5, 1] so that ranks throttled together do not
    come back together.

    >>> backoff = Backoff(first_wait=1.0, longest_wait=3.0)
    >>> [backoff.wait(n) <= limit for n, limit in [(1, 1), (3, 3)]]
    [True, True]
    """

    tries: int = 6
    first_wait: float = 0.25
    longest_wait: float = 8.0

    def wait(self, failures: int) -> float:
        longest = min(self.first_wait * 2 ** (failures - 1), self.longest_wait)
        return longest * random.uniform(0.5, 1)


BACKOFF = Backoff()  # about 4 to 8 seconds of waiting in all before the last try


def retried(call: Callable[[], T], *, name: str, request: str,
            secrets: frozenset[str] = frozenset(), backoff: Backoff | None = None) -> T:
    """``call()``, tried again on transient errors; ``name`` and ``request`` word the error.

    >>> retried(lambda: 7, name="s3://bucket/a.csv", request="reading bytes [0, 7)")
    7
    """
    backoff = backoff or BACKOFF  # looked up at call time, so tests can shorten the waits
    started, tries = time.monotonic(), 0
    while True:
        tries += 1
        try:
            return call()
        except Exception as error:  # noqa: BLE001 - sorted into transient or not right here
            if not is_transient(error):
                raise _permanent(error, name, request, secrets) from None
            if tries >= backoff.tries:
                waited = time.monotonic() - started
                raise OSError(
                    f"{name}: {request} failed {tries} times over {waited:.1f} s, each time with "
                    f"an error that usually passes (the last: {_quote(error, secrets)}); check the "
                    "endpoint and the network, or try again later") from None
        time.sleep(backoff.wait(tries))


def read_range(source: Source, start: int, stop: int) -> bytes:
    """Bytes ``[start, stop)`` of a remote ``source`` (fewer only if it ends sooner)."""
    data = retried(lambda: source.fs.cat_file(source.path, start=start, end=stop),
                   name=source.name, request=f"reading bytes [{start:,}, {stop:,})",
                   secrets=source.secrets)
    if len(data) > stop - start:  # a server that ignores Range answers with the whole file
        raise OSError(f"{source.name}: asked for bytes [{start:,}, {stop:,}), the server sent "
                      f"{len(data):,} bytes: it ignores byte ranges (HTTP Range requests), which "
                      "reading a share of a file needs; serve it from a server that honours "
                      "them, or copy it to a local disk")
    return data


def current_size(source: Source) -> int:
    """The size of a remote ``source`` now, asked of the store (not of a cached listing)."""
    source.fs.invalidate_cache(source.path)
    return retried(lambda: source.fs.size(source.path), name=source.name,
                   request="asking its size", secrets=source.secrets)


class RetriedFile(io.RawIOBase):
    """A remote ``source`` as a seekable binary file: each read is one retried range request.

    Its end is the size planned for the source (bytes appended since are not read). Reads are not
    buffered: wrap it in ``io.BufferedReader`` for many small reads (``Source.open`` does).
    """

    def __init__(self, source: Source) -> None:
        super().__init__()
        self.source = source
        self.position = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.position

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.position, io.SEEK_END: self.source.size}[whence]
        if base + offset < 0:
            raise ValueError(f"{self.source.name}: cannot seek to byte {base + offset} (< 0)")
        self.position = base + offset
        return self.position

    def readinto(self, buffer: Any) -> int:
        stop = min(self.position + len(buffer), self.source.size)
        if stop <= self.position:
            return 0
        data = read_range(self.source, self.position, stop)
        memoryview(buffer).cast("B")[: len(data)] = data
        self.position += len(data)
        return len(data)

    def readall(self) -> bytes:
        """The rest in one request (``RawIOBase`` would make one per 8 KiB)."""
        if self.position >= self.source.size:
            return b""
        data = read_range(self.source, self.position, self.source.size)
        self.position += len(data)
        return data


def is_transient(error: BaseException) -> bool:
    """Whether ``error``, or an error it was raised from, is one that may pass when tried again.

    >>> is_transient(ConnectionResetError(104, "Connection reset by peer"))
    True
    >>> is_transient(FileNotFoundError("s3://bucket/a.csv"))
    False
    """
    for exc in _chain(error):
        status, code = _status(exc), _code(exc)
        if status in _TRANSIENT_STATUS or code in _TRANSIENT_CODES:
            return True
        if any(kind.__name__ in _TRANSIENT_TYPES for kind in type(exc).__mro__):
            return True
    return False


def read_ahead(items: Iterator[T], depth: int = 1) -> Iterator[T]:
    """``items``, made in a background thread up to ``depth`` items ahead of the consumer.

    While the consumer works on one item (parses a chunk), the thread makes the next (waits for
    its range request), so network time hides behind parsing. At most ``depth + 1`` items exist
    at a time: the consumer's and those made ahead. An error in the thread is raised in the
    consumer; a consumer that stops early stops the thread once its current item is made.

    >>> list(read_ahead(iter(range(3))))
    [0, 1, 2]
    """
    made: queue.SimpleQueue[tuple[bool, Any]] = queue.SimpleQueue()  # (is an item, item or end)
    room = threading.Semaphore(depth)
    stopped = threading.Event()

    def make() -> None:
        try:
            while room.acquire() and not stopped.is_set():
                made.put((True, next(items)))
        except StopIteration:
            made.put((False, None))
        except BaseException as error:  # noqa: BLE001 - raised in the consumer instead
            made.put((False, error))
        finally:
            getattr(items, "close", lambda: None)()

    threading.Thread(target=make, name="shardwise-read-ahead", daemon=True).start()
    try:
        while True:
            is_item, value = made.get()
            if not is_item:
                if value is not None:
                    raise value
                return
            room.release()  # the thread may make the next one while this one is used
            yield value
    finally:
        stopped.set()
        room.release()  # wakes a thread waiting for room, to see that it should stop


def _permanent(error: Exception, name: str, request: str, secrets: frozenset[str]) -> Exception:
    """The error to raise at once for ``error``: a built-in type, its message hiding secrets."""
    statuses = {_status(exc) for exc in _chain(error)}
    codes = {_code(exc) for exc in _chain(error)}
    kinds = {kind for exc in _chain(error) for kind in type(exc).__mro__}
    wrong = _wrong_option(error)
    if wrong is not None:
        return ValueError(f"{name}: {request} failed ({_quote(wrong, secrets)}), not tried "
                          "again: is an option wrong? Check the storage options (storage_options)")
    failed = f"{name}: {request} failed ({_quote(error, secrets)}), not tried again"
    if {kind.__name__ for kind in kinds} & _NO_CREDENTIALS_TYPES:
        return PermissionError(f"{failed}: {NO_CREDENTIALS}")
    if statuses & {401, 403} or codes & _DENIED_CODES or PermissionError in kinds:
        return PermissionError(f"{failed}: access was denied; check the credentials "
                               "(storage_options) and the object's permissions")
    if 404 in statuses or codes & _MISSING_CODES or FileNotFoundError in kinds:
        return FileNotFoundError(f"{failed}: there is no such object; check the URL (was it "
                                 "deleted during the load?)")
    builtin = next(kind for kind in type(error).__mro__ if kind.__module__ == "builtins")
    if builtin in (Exception, BaseException):  # a client's own error (botocore's): no kind to keep
        builtin = OSError
    try:
        return builtin(f"{failed}, as errors of this kind do not pass with time")
    except Exception:  # noqa: BLE001 - a built-in needing more arguments (UnicodeDecodeError)
        return OSError(f"{failed}, as errors of this kind do not pass with time")


def _wrong_option(error: BaseException) -> BaseException | None:
    """The error behind a "not found" that is not one: fsspec's http filesystem raises
    ``FileNotFoundError`` from whatever stops it asking a URL's size, a mistyped option too."""
    cause = error.__cause__
    if (isinstance(error, FileNotFoundError) and isinstance(cause, Exception)
            and not isinstance(cause, OSError) and _status(cause) is None):
        return cause
    return None


def _quote(error: BaseException, secrets: frozenset[str]) -> str:
    return hide(f"{type(error).__name__}: {error}", secrets)


def _chain(error: BaseException) -> list[BaseException]:
    """``error`` and the errors it was raised from or while handling, as a traceback shows them."""
    chain: list[BaseException] = []
    current: BaseException | None = error
    while current is not None and current not in chain:
        chain.append(current)
        current = current.__cause__ or (None if current.__suppress_context__
                                         else current.__context__)
    return chain


def _status(error: BaseException) -> int | None:
    """The HTTP status an error carries: aiohttp's ``status``, requests' and azure-core's
    ``status_code``, gcsfs's ``code``, or botocore's response metadata."""
    for attribute in ("status", "status_code", "code"):
        value = getattr(error, attribute, None)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    response = getattr(error, "response", None)
    if isinstance(response, dict):
        return response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    return None


def _code(error: BaseException) -> str | None:
    """The error code a botocore ``ClientError`` carries (``SlowDown``, ``NoSuchKey``...)."""
    response = getattr(error, "response", None)
    if isinstance(response, dict):
        return response.get("Error", {}).get("Code")
    return None
