"""A small HTTP/1.1 server for the emulators (SES, SQS): one thread a connection.

:class:`HttpEndpoint` listens on 127.0.0.1 (standard library only, keep-alive,
chunked bodies) and hands every request to a ``respond(request)`` function.
It carries out the :class:`Answer` it gets back, including what no response
can say: a delay, a connection closed without an answer, a TCP reset. Its
:meth:`~HttpEndpoint.stop` ends every open connection, also those waiting out
an answer's delay or a long poll, so a test's server never outlives the test.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Literal
from urllib.parse import urlsplit

__all__ = ["Answer", "HttpEndpoint", "Request", "Responder"]


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    headers: Mapping[str, str]
    """Names in lower case (HTTP's are case-insensitive)."""
    body: bytes


@dataclass(frozen=True)
class Answer:
    """What one request gets: a response, or (``action``) a dropped connection, after ``delay`` s."""

    status: int
    body: bytes
    content_type: str = "application/json"
    headers: Mapping[str, str] = field(default_factory=dict)
    """Headers beyond Content-Type, Content-Length and x-amzn-RequestId."""
    action: Literal["answer", "close", "reset"] = "answer"
    delay: float = 0.0


Responder = Callable[[Request], Answer]
"""``respond(request)``: the answer to one request."""


class HttpEndpoint:
    """A server on ``host`` at ``port`` (0: a free one) answering through ``respond``.

    An exception from ``respond`` goes to ``on_error`` and is answered by
    ``on_error``'s own answer (the emulator's 500 in its protocol).
    """

    def __init__(
        self,
        respond: Responder,
        on_error: Callable[[Exception], Answer],
        *,
        name: str,
        host: str = "127.0.0.1",
        port: int = 0,
        poll_interval: float = 0.05,
    ) -> None:
        self.respond = respond
        self.on_error = on_error
        self.name = name
        self.host = host
        self.stopping = threading.Event()
        self._wanted_port = port
        self._poll_interval = poll_interval
        self._connections: dict[socket.socket, threading.Thread] = {}
        self._conn_lock = threading.Lock()
        self._httpd: _HttpServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def running(self) -> bool:
        return self._httpd is not None

    @property
    def port(self) -> int:
        if self._httpd is None:
            raise RuntimeError(f"{self.name} is not running")
        port: int = self._httpd.server_address[1]
        return port

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> None:
        if self._httpd is not None:
            raise RuntimeError(f"{self.name} already started")
        self.stopping.clear()
        # Port 0 binds a free port in one step: no race with another process for it.
        httpd = _HttpServer((self.host, self._wanted_port), _Handler, self)
        self._httpd = httpd
        self._thread = threading.Thread(
            target=httpd.serve_forever,
            kwargs={"poll_interval": self._poll_interval},
            name=f"{self.name}-{self.port}",
            daemon=True,
        )
        self._thread.start()

    def stop(self) -> None:
        """Close every connection and the listener; idempotent."""
        httpd, thread = self._httpd, self._thread
        if httpd is None or thread is None:
            return
        self.stopping.set()
        httpd.shutdown()
        with self._conn_lock:
            connections = list(self._connections.items())
        for sock, _ in connections:
            with contextlib.suppress(OSError):  # already closed by its handler
                sock.shutdown(socket.SHUT_RDWR)
        for _, handler_thread in connections:
            handler_thread.join(timeout=5)
        httpd.server_close()
        thread.join(timeout=5)
        self._httpd = None
        self._thread = None

    def _track(self, sock: socket.socket) -> None:
        with self._conn_lock:
            self._connections[sock] = threading.current_thread()

    def _untrack(self, sock: socket.socket) -> None:
        with self._conn_lock:
            self._connections.pop(sock, None)


class _HttpServer(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    # socketserver's default listen backlog is 5: a burst of new connections from a few
    # daemons overflows it, the kernel drops the SYNs and each client retries after 1 s,
    # an artefact no real endpoint shows. (Slow answers are wanted on purpose: delay=.)
    request_queue_size = 128

    def __init__(
        self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler], endpoint: HttpEndpoint
    ) -> None:
        self.endpoint = endpoint
        self.to_reset: set[object] = set()  # connections to close with RST
        self.to_reset_lock = threading.Lock()
        super().__init__(address, handler)

    def handle_error(self, request: object, client_address: object) -> None:
        """Quiet: a client that went away (mid long poll, say) is not the test's business."""

    def shutdown_request(self, request: Any) -> None:
        with self.to_reset_lock:
            reset = request in self.to_reset
            self.to_reset.discard(request)
        if reset:  # SO_LINGER 0 is set: close() without a shutdown() first sends RST, not FIN
            self.close_request(request)
        else:
            super().shutdown_request(request)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _HttpServer

    def setup(self) -> None:
        super().setup()
        # Headers and body go out in two writes: with Nagle on, the body waits for the
        # client's delayed ACK (~40 ms a request).
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.server.endpoint._track(self.connection)

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            self.server.endpoint._untrack(self.connection)

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: no request log on stderr."""

    def do_GET(self) -> None:
        self._dispatch()

    def do_POST(self) -> None:
        self._dispatch()

    def do_PUT(self) -> None:
        self._dispatch()

    def do_DELETE(self) -> None:
        self._dispatch()

    def _read_body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            return b"".join(self._chunks())
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length > 0 else b""

    def _chunks(self) -> Iterator[bytes]:
        while True:
            size = int(self.rfile.readline().split(b";", 1)[0].strip() or b"0", 16)
            if size == 0:
                while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                    pass
                return
            yield self.rfile.read(size)
            self.rfile.readline()

    def _dispatch(self) -> None:
        endpoint = self.server.endpoint
        path = urlsplit(self.path).path
        request = Request(
            self.command, path, {k.lower(): v for k, v in self.headers.items()}, self._read_body()
        )
        try:
            answer = endpoint.respond(request)
        except Exception as exc:  # e.g. a fail_when predicate that raised: the test must see it
            answer = endpoint.on_error(exc)
        if answer.delay > 0 and endpoint.stopping.wait(answer.delay):
            self.close_connection = True
            return
        if answer.action != "answer":
            self.close_connection = True
            if answer.action == "reset":
                self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                with self.server.to_reset_lock:
                    self.server.to_reset.add(self.connection)
            return
        self.send_response(answer.status)
        self.send_header("Content-Type", answer.content_type)
        self.send_header("Content-Length", str(len(answer.body)))
        self.send_header("x-amzn-RequestId", str(uuid.uuid4()))
        for name, value in answer.headers.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(answer.body)
