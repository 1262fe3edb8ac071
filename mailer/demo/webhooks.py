"""The demo's webhook receiver: a tenant's outcomes, pushed to a small local HTTP server.

For each scenario tenant with ``webhook = true`` the demo registers an endpoint
(:class:`~fairpost.mailer.sdk.outcomes.endpoints.Webhooks`, as ``fairpost
webhook add`` does) pointing at one path of :class:`Receiver`, which the
replicas deliver to as they would to an application. The receiver verifies
every delivery with the Standard Webhooks specification's own library
(``standardwebhooks``, in the ``demo`` extra), as an application would, and
keeps what it verified; the report says what arrived and checks that it did.

Verification never uses fairpost's own signing code: a receiver that shared
it would agree with any mistake in it.
"""

from __future__ import annotations

import json
import threading
from collections import Counter
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from standardwebhooks.webhooks import Webhook, WebhookVerificationError

__all__ = ["Received", "Receiver"]

_MAX_BODY = 1 << 20


@dataclass
class Received:
    """What one tenant's endpoint got."""

    endpoint: str
    deliveries: int = 0
    """Requests, retries and duplicates included."""
    unverified: int = 0
    """Requests whose signature did not verify (answered 400)."""
    events: dict[str, str] = field(default_factory=dict)
    """Event id → type, of the verified deliveries (a retry adds nothing)."""
    sent_jobs: set[str] = field(default_factory=set)
    """Job ids of the verified ``mail.sent`` events."""
    errors: list[str] = field(default_factory=list)
    """The first few verification errors, for the report."""

    def by_type(self) -> dict[str, int]:
        return dict(sorted(Counter(self.events.values()).items()))

    def to_json(self) -> dict[str, Any]:
        return {
            "endpoint": self.endpoint,
            "deliveries": self.deliveries,
            "unverified": self.unverified,
            "events": self.by_type(),
            "errors": self.errors,
        }


class Receiver:
    """An HTTP server on 127.0.0.1 in a thread; each tenant's endpoint is its own path."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._secrets: dict[str, str] = {}
        self._received: dict[str, Received] = {}
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="demo-webhooks", daemon=True)

    def start(self) -> Receiver:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)

    def url(self, tenant: str) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/hooks/{tenant}"

    def expect(self, tenant: str, endpoint: str, secret: str) -> None:
        """Verify the tenant's deliveries with its endpoint's ``whsec_`` secret."""
        with self._lock:
            self._secrets[tenant] = secret
            self._received[tenant] = Received(endpoint)

    def received(self) -> dict[str, Received]:
        """A copy of what each tenant's endpoint got so far."""
        with self._lock:
            return {
                tenant: Received(
                    r.endpoint, r.deliveries, r.unverified, dict(r.events), set(r.sent_jobs), list(r.errors)
                )
                for tenant, r in self._received.items()
            }

    def _take(self, tenant: str, body: str, headers: dict[str, str]) -> int:
        with self._lock:
            secret, received = self._secrets.get(tenant), self._received.get(tenant)
        if secret is None or received is None:
            return 404
        try:
            event = Webhook(secret).verify(body, headers)
            error = None
        except WebhookVerificationError as exc:
            event, error = None, str(exc)
        with self._lock:
            received.deliveries += 1
            if not isinstance(event, dict):
                received.unverified += 1
                if len(received.errors) < 5:
                    received.errors.append(error or "the body is not a JSON object")
                return 400
            kind = str(event.get("type"))
            received.events[headers.get("webhook-id", "")] = kind
            if kind == "mail.sent":
                received.sent_jobs.add(str(event.get("data", {}).get("job_id")))
        return 204

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass  # the demo's screen is the live table

            def do_POST(self) -> None:
                length = min(int(self.headers.get("Content-Length") or 0), _MAX_BODY)
                body = self.rfile.read(length).decode("utf-8", errors="replace")
                headers = {k.lower(): v for k, v in self.headers.items()}
                tenant = self.path.removeprefix("/hooks/")
                status = receiver._take(tenant, body, headers)
                payload = json.dumps({"ok": status < 300}).encode() if status != 204 else b""
                self.send_response(status)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

        return Handler
