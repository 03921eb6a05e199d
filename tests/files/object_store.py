"""A real S3-compatible server on 127.0.0.1 for the object-store tests, and a troubled one.

moto's S3 server runs in a thread of the test process. Writes go to it directly; reads go through
a small TCP proxy in front of it that logs every request and fails the ones a test chooses the
way a troubled store does: HTTP 503 SlowDown or 500 InternalError, a connection reset (a real
TCP RST), a response cut off halfway, or a stall until the client times out. Both speak plain
HTTP, so ranks in other processes reach them as they would a real store.
"""

from __future__ import annotations

import socket
import socketserver
import struct
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import pytest

pytest.importorskip("s3fs")
pytest.importorskip("moto.server")

import fsspec
from moto.server import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
from werkzeug.serving import make_server

BUCKET = "shardwise-test"
# Recognisable credentials, which must never show in any message or output.
KEY = "AKIASHARDWISEKEYNEVERSHOWN"
SECRET = "secret/NeverShown+ShardwiseTest=="
MODES = ("503", "500", "404", "403", "reset", "cut", "stall")
_ERRORS = {
    "503": ("503 Slow Down", "SlowDown", "Please reduce your request rate."),
    "500": ("500 Internal Server Error", "InternalError", "We encountered an internal error."),
    "404": ("404 Not Found", "NoSuchKey", "The specified key does not exist."),
    "403": ("403 Forbidden", "AccessDenied", "Access Denied"),
}
STALL_SECONDS = 3.0


@dataclass(frozen=True)
class Request:
    method: str
    path: str  # with the query
    range: str | None  # the Range header: "bytes=0-99"
    fault: str | None  # what the proxy did instead of forwarding it


@dataclass
class Faults:
    """Which read requests fail, how, and every request seen."""

    rules: dict[str, tuple[tuple[str, ...], bool]] = field(default_factory=dict)
    requests: list[Request] = field(default_factory=list)
    _tries: Counter = field(default_factory=Counter)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def fail(self, key: str, *modes: str, forever: bool = False) -> None:
        """Range requests to objects whose path holds ``key``: each range's first tries fail with
        ``modes`` in turn (all tries, cycling through them, if ``forever``)."""
        assert set(modes) <= set(MODES), modes
        self.rules[key] = (modes, forever)

    def reset(self) -> None:
        with self._lock:
            self.rules.clear()
            self.requests.clear()
            self._tries.clear()

    def decide(self, method: str, path: str, byte_range: str | None) -> str | None:
        with self._lock:
            fault = None
            rule = next((r for key, r in self.rules.items() if key in path), None)
            if rule is not None and method == "GET" and byte_range is not None:
                modes, forever = rule
                tries = self._tries[path, byte_range]
                self._tries[path, byte_range] += 1
                if forever or tries < len(modes):
                    fault = modes[tries % len(modes)]
            self.requests.append(Request(method, path, byte_range, fault))
            return fault

    def seen(self, fragment: str, method: str = "GET") -> list[Request]:
        with self._lock:
            return [r for r in self.requests if fragment in r.path and r.method == method]


@dataclass
class ObjectStore:
    endpoint: str  # moto itself, for writing
    url: str  # the proxy, for reading
    faults: Faults

    def options(self, **extra: Any) -> dict[str, Any]:
        """s3fs storage options that read through the proxy. botocore's own retries are off, so
        an error s3fs does not retry itself (HTTP 500) reaches shardwise's."""
        return {"key": KEY, "secret": SECRET, "client_kwargs": {"endpoint_url": self.url},
                "config_kwargs": {"retries": {"total_max_attempts": 1}, "read_timeout": 2},
                "use_listings_cache": False, **extra}

    def writer(self) -> Any:
        return fsspec.filesystem("s3", key=KEY, secret=SECRET, skip_instance_cache=True,
                                 client_kwargs={"endpoint_url": self.endpoint})

    def upload(self, objects: dict[str, bytes]) -> None:
        """Write each ``{key: data}`` under the test bucket."""
        writer = self.writer()
        for key, data in objects.items():
            writer.pipe_file(f"{BUCKET}/{key}", data)

    def http_url(self, key: str) -> str:
        """A presigned http:// URL of ``key`` through the proxy: its query holds ``KEY``."""
        writer = fsspec.filesystem("s3", key=KEY, secret=SECRET, skip_instance_cache=True,
                                   client_kwargs={"endpoint_url": self.url})
        return writer.url(f"{BUCKET}/{key}", expires=3600)


@contextmanager
def object_store() -> Iterator[ObjectStore]:
    """moto's S3 server with the test bucket, and the failing proxy in front of it."""
    server = make_server("127.0.0.1", 0, DomainDispatcherApplication(create_backend_app),
                         threaded=True, request_handler=_QuietMoto)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    proxy = _Proxy(("127.0.0.1", server.server_port))
    threading.Thread(target=proxy.serve_forever, daemon=True).start()
    store = ObjectStore(f"http://127.0.0.1:{server.server_port}",
                        f"http://127.0.0.1:{proxy.server_address[1]}", proxy.faults)
    # moto keeps its buckets in the process, across servers: each store starts empty.
    urllib.request.urlopen(urllib.request.Request(f"{store.endpoint}/moto-api/reset",
                                                  method="POST")).close()
    store.writer().mkdir(BUCKET)
    try:
        yield store
    finally:
        proxy.shutdown()
        server.shutdown()


class _QuietMoto(MotoRequestHandler):
    def log_request(self, *args: Any) -> None:  # one line per request would drown pytest's output
        pass


class _Proxy(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, upstream: tuple[str, int]) -> None:
        super().__init__(("127.0.0.1", 0), _ProxyHandler)
        self.upstream = upstream
        self.faults = Faults()


class _ProxyHandler(socketserver.BaseRequestHandler):
    """One request per connection: moto answers each with ``Connection: close``."""

    server: _Proxy

    def handle(self) -> None:
        head = _read_until(self.request, b"\r\n\r\n")
        if not head:
            return
        lines = head.split(b"\r\n")
        method, path, _ = lines[0].decode().split(" ", 2)
        headers = {k.strip().lower(): v.strip() for k, _, v in
                   (line.decode().partition(":") for line in lines[1:] if line)}
        fault = self.server.faults.decide(method, path, headers.get("range"))
        if fault in _ERRORS:
            status, code, message = _ERRORS[fault]
            body = (f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code>'
                    f"<Message>{message}</Message><RequestId>0</RequestId></Error>").encode()
            self.request.sendall(f"HTTP/1.1 {status}\r\nContent-Type: application/xml\r\n"
                                 f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
                                 .encode() + body)
            return
        if fault in ("reset", "stall"):
            if fault == "stall":
                time.sleep(STALL_SECONDS)
            _reset(self.request)
            return
        with socket.create_connection(self.server.upstream) as upstream:
            upstream.sendall(head)
            response = _read_until(upstream, b"\r\n\r\n")
            if fault == "cut":  # the headers and half the body, then the connection drops
                header, _, body = response.partition(b"\r\n\r\n")
                length = next(int(line.split(b":")[1]) for line in header.split(b"\r\n")
                              if line.lower().startswith(b"content-length:"))
                while len(body) < length:
                    body += upstream.recv(1 << 16)
                self.request.sendall(header + b"\r\n\r\n" + body[: length // 2])
                _reset(self.request)
                return
            while response:
                self.request.sendall(response)
                response = upstream.recv(1 << 20)


def _read_until(sock: socket.socket, end: bytes) -> bytes:
    data = b""
    while end not in data:
        part = sock.recv(1 << 16)
        if not part:
            return data
        data += part
    return data


def _reset(sock: socket.socket) -> None:
    """Close ``sock`` with a TCP RST (linger 0), as a dropped connection looks to the client."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


def store_fixtures(objects: Callable[[], dict[str, bytes]]) -> tuple[Any, Any]:
    """A test module's ``store`` fixture (one server holding ``objects()``, started once for the
    module) and an autouse fixture that clears its faults around every test.

    Use as ``store, _no_faults = store_fixtures(make_objects)`` at a test module's top level.
    """

    @pytest.fixture(scope="module")
    def store() -> Iterator[ObjectStore]:
        with object_store() as running:
            running.upload(objects())
            yield running

    @pytest.fixture(autouse=True)
    def _no_faults(store: ObjectStore) -> Iterator[None]:
        store.faults.reset()
        yield
        store.faults.reset()

    return store, _no_faults
