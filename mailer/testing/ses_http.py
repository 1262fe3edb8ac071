"""The HTTP side of :class:`~fairpost.mailer.testing.ses_server.SesServer`.

:class:`HttpEndpoint` listens on a free port of 127.0.0.1 (standard library
only, one thread per connection, HTTP/1.1 keep-alive, chunked bodies) and
hands every request to a ``respond(method, path, body, user_agent)`` function.
It carries out the :class:`Answer` it gets back, including what no response
can say: a delay, a connection closed without an answer, a TCP reset.
:func:`json_answer` and :func:`error_answer` write answers as SES v2 does.
"""

from __future__ import annotations

import contextlib
import json
import socket
import struct
import threading
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Literal
from urllib.parse import urlsplit

from fairpost.mailer.testing.services import free_port
from fairpost.mailer.testing.ses_mail import Faults, SesError

__all__ = ["Answer", "HttpEndpoint", "Responder", "error_answer", "json_answer"]

_ERROR_TYPE_SUFFIX = ":http://internal.amazon.com/coral/com.amazon.aws.services.email/"


@dataclass(frozen=True)
class Answer:
    """What one request gets: a response, or (``action``) a dropped connection, after ``delay`` s."""

    status: int
    body: bytes
    content_type: str = "application/json"
    error_type: str | None = None
    action: Literal["answer", "close", "reset"] = "answer"
    delay: float = 0.0


Responder = Callable[[str, str, bytes, str], Answer]
"""``respond(method, path, body, user_agent)``: the answer to one request."""


def json_answer(status: int, payload: Mapping[str, Any]) -> Answer:
    return Answer(status, json.dumps(payload).encode())


def error_answer(error: SesError) -> Answer:
    if error.action != "answer":
        return Answer(0, b"", action=error.action, delay=error.delay)
    if error.code is None:
        html = f"<html><body><b>Http/1.1 {error.message}</b></body></html>"
        return Answer(error.status, html.encode(), content_type="text/html", delay=error.delay)
    return Answer(
        error.status,
        json.dumps({"message": error.message}).encode(),
        error_type=error.code + _ERROR_TYPE_SUFFIX,
        delay=error.delay,
    )


class HttpEndpoint:
    """A server on a free port of 127.0.0.1 answering through ``respond``.

    An exception from ``respond`` goes to ``on_error`` and is answered as a 500
    ``InternalFailure``. :meth:`stop` ends every open connection, also those
    waiting out an answer's delay.
    """

    def __init__(self, respond: Responder, on_error: Callable[[Exception], None]) -> None:
        self.respond = respond
        self.on_error = on_error
        self.stopping = threading.Event()
        self._connections: dict[socket.socket, threading.Thread] = {}
        self._conn_lock = threading.Lock()
        self._httpd: _HttpServer | None = None
        self._thread: threading.Thread | None = None
        self._port = 0

    @property
    def running(self) -> bool:
        return self._httpd is not None

    @property
    def port(self) -> int:
        if self._httpd is None:
            raise RuntimeError("SesServer is not running")
        return self._port

    def start(self) -> None:
        if self._httpd is not None:
            raise RuntimeError("SesServer already started")
        self.stopping.clear()
        last_error: OSError | None = None
        for _ in range(20):
            port = free_port()
            try:
                httpd = _HttpServer(("127.0.0.1", port), _Handler, self)
            except OSError as exc:  # the port was taken between free_port() and bind
                last_error = exc
                continue
            break
        else:
            raise RuntimeError(f"no free port for SesServer: {last_error}")
        self._httpd = httpd
        self._port = port
        self._thread = threading.Thread(
            target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, name=f"ses-server-{port}", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
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
    # an artefact no real endpoint shows. (Slow answers are wanted on purpose: latency=.)
    request_queue_size = 128

    def __init__(
        self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler], endpoint: HttpEndpoint
    ) -> None:
        self.endpoint = endpoint
        self.to_reset: set[object] = set()  # connections to close with RST
        self.to_reset_lock = threading.Lock()
        super().__init__(address, handler)

    def handle_error(self, request: object, client_address: object) -> None:
        """Quiet: a client that went away is not the test's business."""

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
        body = self._read_body()
        try:
            user_agent = self.headers.get("User-Agent", "")
            answer = endpoint.respond(self.command, urlsplit(self.path).path, body, user_agent)
        except Exception as exc:  # e.g. a fail_when predicate that raised: the test must see it
            endpoint.on_error(exc)
            answer = error_answer(Faults.INTERNAL_FAILURE.with_message(f"SesServer error: {exc!r}"))
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
        if answer.error_type is not None:
            self.send_header("x-amzn-ErrorType", answer.error_type)
        self.end_headers()
        self.wfile.write(answer.body)
