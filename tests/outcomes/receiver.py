"""A webhook receiver for the tests: a local HTTP server in a thread that verifies
every delivery with the Standard Webhooks specification's own library
(``standardwebhooks`` from PyPI), never with fairpost's code.

Each path is one endpoint: :meth:`Receiver.plan` says how it answers (a list of
answers, in order, then 200; or hang until released), :meth:`Receiver.secret`
which secret it verifies with. Every request is kept, verified or not.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from standardwebhooks.webhooks import Webhook, WebhookVerificationError


@dataclass(frozen=True)
class Answer:
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    hang: bool = False
    """Answer nothing until the receiver is released (or stops)."""
    delay: float = 0.0
    """Seconds to take before answering (a slow endpoint)."""


@dataclass(frozen=True)
class Delivery:
    path: str
    event_id: str
    headers: dict[str, str]
    body: str
    event: dict[str, Any] | None
    """The body as ``standardwebhooks`` verified it; None if it did not verify."""
    error: str | None
    at: float
    """time.monotonic() when the request arrived."""
    answered: int | None = None


class Receiver:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._plans: dict[str, list[Answer]] = {}
        self._secrets: dict[str, list[str]] = {}
        self.deliveries: list[Delivery] = []
        self.in_flight: dict[str, int] = {}
        """Event id → requests for it being answered now."""
        self.most_at_once: dict[str, int] = {}
        """Event id → most requests for it at one time."""
        self.hanging = 0
        self.released = threading.Event()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}{path}"

    def plan(self, path: str, *answers: Answer) -> None:
        with self._lock:
            self._plans[path] = list(answers)

    def secret(self, path: str, *secrets: str) -> None:
        """Verify this path's deliveries with any of ``secrets``."""
        with self._lock:
            self._secrets[path] = list(secrets)

    def at(self, path: str) -> list[Delivery]:
        with self._lock:
            return [d for d in self.deliveries if d.path == path]

    def verified(self, path: str) -> list[Delivery]:
        return [d for d in self.at(path) if d.event is not None]

    def _next(self, path: str) -> Answer:
        with self._lock:
            plan = self._plans.get(path, [])
            return plan.pop(0) if plan else Answer()

    def _verify(
        self, path: str, body: str, headers: dict[str, str]
    ) -> tuple[dict[str, Any] | None, str | None]:
        with self._lock:
            secrets = list(self._secrets.get(path, []))
        error = "no secret for this path"
        for secret in secrets:
            try:
                return Webhook(secret).verify(body, headers), None
            except WebhookVerificationError as exc:
                error = str(exc)
        return None, error

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                arrived = time.monotonic()
                body = self.rfile.read(int(self.headers.get("Content-Length", "0"))).decode()
                headers = {k.lower(): v for k, v in self.headers.items()}
                event_id = headers.get("webhook-id", "")
                event, error = receiver._verify(self.path, body, headers)
                with receiver._lock:
                    receiver.deliveries.append(
                        Delivery(self.path, event_id, headers, body, event, error, arrived)
                    )
                    now = receiver.in_flight.get(event_id, 0) + 1
                    receiver.in_flight[event_id] = now
                    receiver.most_at_once[event_id] = max(now, receiver.most_at_once.get(event_id, 0))
                answer = receiver._next(self.path)
                try:
                    if answer.hang:
                        with receiver._lock:
                            receiver.hanging += 1
                        receiver.released.wait()
                        return
                    if answer.delay:
                        time.sleep(answer.delay)
                    payload = json.dumps({"ok": answer.status < 300}).encode()
                    self.send_response(answer.status)
                    for name, value in answer.headers.items():
                        self.send_header(name, value)
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                finally:
                    with receiver._lock:
                        receiver.in_flight[event_id] -= 1

        return Handler

    @contextmanager
    def running(self) -> Iterator[Receiver]:
        self._thread.start()
        try:
            yield self
        finally:
            self.released.set()
            self._server.shutdown()
            self._server.server_close()
            self._thread.join(timeout=10)
