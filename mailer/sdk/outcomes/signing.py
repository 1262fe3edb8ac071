"""Standard Webhooks signatures (https://www.standardwebhooks.com, "Signature scheme").

A delivery carries ``webhook-id`` (the event's id, the same on every retry),
``webhook-timestamp`` (the attempt's time, whole seconds since the epoch) and
``webhook-signature``: ``v1,`` and the base64 HMAC-SHA256 of
``<id>.<timestamp>.<body>`` under the endpoint's secret (``whsec_`` and its
base64 key). While a rotated-out secret still overlaps, the delivery carries
both signatures, separated by a space, the current one first. The receiver
verifies with the specification's own libraries (``standardwebhooks`` on PyPI).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets as random_source
from collections.abc import Sequence

__all__ = ["PREFIX", "headers", "new_secret", "sign"]

PREFIX = "whsec_"
_KEY_BYTES = 32
"""Within the specification's 24 to 64 bytes."""


def new_secret() -> str:
    """A fresh endpoint secret: ``whsec_`` and 32 random bytes in base64."""
    return PREFIX + base64.b64encode(random_source.token_bytes(_KEY_BYTES)).decode()


def sign(secret: str, msg_id: str, timestamp: int, body: str) -> str:
    """``v1,<base64 signature>`` of one delivery under ``secret``."""
    key = base64.b64decode(secret.removeprefix(PREFIX))
    mac = hmac.new(key, f"{msg_id}.{timestamp}.{body}".encode(), hashlib.sha256).digest()
    return "v1," + base64.b64encode(mac).decode()


def headers(msg_id: str, timestamp: int, body: str, secrets: Sequence[str]) -> dict[str, str]:
    """The headers of one delivery attempt, signed with every secret given."""
    return {
        "content-type": "application/json",
        "user-agent": "fairpost-webhooks/1",
        "webhook-id": msg_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": " ".join(sign(s, msg_id, timestamp, body) for s in secrets),
    }
