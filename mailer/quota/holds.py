"""Tenants held for a fault of their own SES set-up, shared by every replica.

When SES refuses a tenant's mail for the tenant's own set-up (its sender
identity unverified or denied, its configuration set or SES tenant missing,
paused or disabled: fairpost.mailer.daemon.ses), the sender holds that tenant alone,
rechecking after a backoff that doubles on each fault (``hold.lua``). The
hold lives in Redis, so ``stats`` and every replica see why the tenant waits
(``ses_<code>``) and until when; a send that succeeds clears it. A hold keeps
the tenant's in-flight slots and its dispatched jobs alive until it ends (and
an in-flight TTL after), however long the holds go on.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import redis.asyncio

from fairpost.dispatcher.keys import Keys
from fairpost.dispatcher.replies import text
from fairpost.dispatcher.scripts import lua_source
from fairpost.dispatcher.store import StoreLimits


@dataclass(frozen=True)
class Hold:
    reason: str
    """``ses_<code>``: the SES error that holds the tenant."""
    until_ms: int
    """Redis time the tenant's next mail is tried again."""


class TenantHolds:
    def __init__(self, client: redis.asyncio.Redis, keys: Keys, limits: StoreLimits) -> None:
        """``limits``: the dispatcher's, whose in-flight TTL and stranded deadline a
        hold keeps the tenant's slots and jobs by."""
        self._redis = client
        self._keys = keys
        self._limits = limits
        self._hold = client.register_script(lua_source("fairpost.mailer.quota", "hold"))

    async def hold(
        self, tenant: str, reason: str, *, first_seconds: float, most_seconds: float
    ) -> tuple[Hold, float]:
        """Hold the tenant (or keep the hold in force); returns the hold and the
        seconds until it ends. Until then, and an in-flight TTL after, the tenant
        keeps its in-flight slots and its dispatched jobs count as waiting, not
        stranded: its mail waits in SQS for as long as it is held, whatever the
        reason (``hold.lua``)."""
        limits = self._limits
        until_ms, held_for, wait_ms = await self._hold(
            keys=[self._keys.tenant_hold(tenant), self._keys.inflight(tenant), self._keys.dispatched()],
            args=[
                reason,
                int(first_seconds * 1000),
                int(most_seconds * 1000),
                limits.inflight_ttl_ms,
                limits.stranded_after_ms - limits.inflight_ttl_ms,
            ],
        )
        return Hold(text(held_for), int(until_ms)), int(wait_ms) / 1000

    async def clear(self, tenant: str) -> None:
        await self._redis.delete(self._keys.tenant_hold(tenant))

    async def held(self, tenants: Iterable[str]) -> dict[str, Hold]:
        """The holds of these tenants (those held, or recently held, only)."""
        names = list(tenants)
        async with self._redis.pipeline(transaction=False) as pipe:
            for tenant in names:
                pipe.hmget(self._keys.tenant_hold(tenant), ["reason", "until_ms"])
            values = await pipe.execute()
        return {
            tenant: Hold(text(reason), int(until))
            for tenant, (reason, until) in zip(names, values, strict=True)
            if reason is not None and until is not None
        }
