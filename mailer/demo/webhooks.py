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
from typing import Any

from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from fairpost.mailer.testing.http_endpoint import Answer, HttpEndpoint, Request

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
        self._http = HttpEndpoint(self._answer, self._failed, name="demo-webhooks")

    def start(self) -> Receiver:
        self._http.start()
        return self

    def stop(self) -> None:
        self._http.stop()

    def url(self, tenant: str) -> str:
        return f"{self._http.url}/hooks/{tenant}"

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

    def _answer(self, request: Request) -> Answer:
        if request.method != "POST" or not request.path.startswith("/hooks/"):
            return Answer(404, b"")
        body = request.body[:_MAX_BODY].decode("utf-8", errors="replace")
        status = self._take(request.path.removeprefix("/hooks/"), body, dict(request.headers))
        return Answer(status, b"" if status == 204 else json.dumps({"ok": status < 300}).encode())

    def _failed(self, exc: Exception) -> Answer:
        return Answer(500, json.dumps({"error": type(exc).__name__}).encode())

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
