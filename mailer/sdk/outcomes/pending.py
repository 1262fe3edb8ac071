"""What the webhook endpoints still have to deliver, per tenant: for ``fairpost stats``
and the daemon's gauges (``fairpost_webhook_pending``, ``..._oldest_pending_seconds``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import redis.asyncio

from fairpost.dispatcher.replies import text
from fairpost.mailer.sdk.keys import MailKeys

__all__ = ["PendingDeliveries", "pending_deliveries"]


@dataclass(frozen=True)
class PendingDeliveries:
    tenant: str
    pending: int
    """Deliveries waiting at the tenant's endpoints (due, in flight, or behind their job's)."""
    oldest_ms: int | None
    """The time of the oldest event among them (ms), None with none."""
    endpoints: int
    disabled: int

    def describe(self, at_ms: int) -> str:
        """One line for ``fairpost stats``."""
        line = f"webhooks: {self.pending} deliveries pending at {self.endpoints} endpoints"
        if self.disabled:
            line += f" ({self.disabled} disabled)"
        if self.oldest_ms is not None:
            line += f", the oldest {max(0, at_ms - self.oldest_ms) / 1000:.0f}s old"
        return line

    def to_json(self, at_ms: int) -> dict[str, Any]:
        age = None if self.oldest_ms is None else max(0, at_ms - self.oldest_ms) / 1000
        return {
            "pending": self.pending,
            "oldest_age_seconds": age,
            "endpoints": self.endpoints,
            "disabled": self.disabled,
        }


async def pending_deliveries(client: redis.asyncio.Redis, keys: MailKeys) -> dict[str, PendingDeliveries]:
    """Per tenant with an endpoint: what its endpoints have yet to deliver. Reads every
    endpoint once (they are as many as operators registered), in one round trip."""
    endpoints = sorted(text(e) for e in await client.smembers(keys.webhook_endpoints()))
    if not endpoints:
        return {}
    async with client.pipeline(transaction=False) as pipe:
        for endpoint in endpoints:
            pipe.hmget(keys.webhook_endpoint(endpoint), ["tenant", "enabled"])
            pipe.zcard(keys.webhook_part(endpoint, "pending"))
            pipe.zrange(keys.webhook_part(endpoint, "pending"), 0, 0, withscores=True)
        values: list[Any] = await pipe.execute()
    out: dict[str, PendingDeliveries] = {}
    for i in range(len(endpoints)):
        (tenant, enabled), count, oldest = values[3 * i : 3 * i + 3]
        if tenant is None:
            continue
        name = text(tenant)
        was = out.get(name, PendingDeliveries(name, 0, None, 0, 0))
        first = int(oldest[0][1]) if oldest else None
        out[name] = PendingDeliveries(
            name,
            was.pending + int(count),
            first
            if was.oldest_ms is None
            else (was.oldest_ms if first is None else min(first, was.oldest_ms)),
            was.endpoints + 1,
            was.disabled + (0 if enabled is not None and text(enabled) == "1" else 1),
        )
    return out
