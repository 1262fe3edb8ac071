"""The holds on tenants that live in Redis, and what an operator's resume lifts.

A hold keeps a tenant's mail waiting whatever its quota (the sender asks
:mod:`fairpost.mailer.daemon.holds` whether a tenant is held). Two of them
are stored here:

- ``ses_<code>``: SES refused the tenant's mail for a fault of its own set-up
  (its sender identity unverified or denied, its configuration set or SES
  tenant missing: fairpost.mailer.daemon.ses); the sender holds that tenant
  alone, rechecking after a backoff that doubles on each fault (``hold.lua``).
  The hold lives in Redis, so ``stats`` and every replica see why the tenant
  waits and until when; a send that succeeds clears it.
- ``ses_tenant_disabled``: SES disabled the tenant's SES tenant; the verdict is
  written by the replica that read it (fairpost.mailer.daemon.ses_tenant_status),
  and dropped here by a resume.

An operator's pause is the dispatcher's ``paused`` set
(fairpost.mailer.quota.overrides) and the reputation guard's pause or
throttle is its own hash (fairpost.mailer.quota.reputation); ``fairpost tenant
resume`` lifts all of them (:data:`LIFTED_BY_RESUME`, :func:`lift`).

Every hold keeps the tenant's in-flight slots and its dispatched jobs alive
while it lasts and an in-flight TTL after (the one way: ``dispatcher/touch.lua``,
as a park keeps them), however long it goes on.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import redis
import redis.asyncio

from fairpost.dispatcher.calls import ScriptCalls, script
from fairpost.dispatcher.replies import text
from fairpost.dispatcher.scripts import lua_source
from fairpost.dispatcher.store import StoreLimits
from fairpost.mailer.sdk.keys import MailKeys

__all__ = [
    "LIFTED_BY_RESUME",
    "SES_TENANT_DISABLED",
    "SesFaultHold",
    "TenantHolds",
    "lift",
    "parse_hold",
    "read_hold",
]

SES_TENANT_DISABLED = "ses_tenant_disabled"
"""The hold of a tenant whose SES tenant SES disabled (stats, metrics, the jobs' ``waiting_for``)."""

LIFTED_BY_RESUME = {
    "paused": "an operator's pause",
    "reputation_paused": "the reputation guard's pause",
    "reputation_throttled": "the reputation guard's throttle",
    SES_TENANT_DISABLED: "a disabled SES tenant's park (SES is asked again when it sends)",
    "ses_<code>": "a hold for an SES fault of its own set-up (its next mail rechecks it)",
    "provider_paused:<provider>": "the per-provider guard's hold at one mailbox provider",
}
"""The holds ``fairpost tenant resume`` lifts, by reason. Not lifted (no operator
can): the sender's own holds for SES throttling or an account pause, and quota parks."""


@dataclass(frozen=True)
class SesFaultHold:
    reason: str
    """``ses_<code>``: the SES error that holds the tenant."""
    until_ms: int
    """Redis time the tenant's next mail is tried again."""


def read_hold(pipe: redis.asyncio.client.Pipeline, keys: MailKeys, tenant: str) -> None:
    """Queue the read of the tenant's SES-fault hold on ``pipe``; its reply is
    :func:`parse_hold`'s to read."""
    pipe.hmget(keys.tenant_hold(tenant), ["reason", "until_ms"])


def parse_hold(reply: Any) -> SesFaultHold | None:
    """The hold :func:`read_hold` read; None: the tenant is not held (nor recently was)."""
    reason, until = reply
    return None if reason is None or until is None else SesFaultHold(text(reason), int(until))


class TenantHolds:
    def __init__(self, client: redis.asyncio.Redis, keys: MailKeys, limits: StoreLimits) -> None:
        """``limits``: the dispatcher's, whose in-flight TTL and stranded deadline a
        hold keeps the tenant's slots and jobs by."""
        self._redis = client
        self._keys = keys
        self._limits = limits
        self._calls = ScriptCalls(keys, limits)
        self._hold = client.register_script(lua_source("fairpost.mailer.quota", "hold"))
        self._touch = client.register_script(script("touch"))

    async def hold(
        self, tenant: str, reason: str, *, first_seconds: float, most_seconds: float
    ) -> tuple[SesFaultHold, float]:
        """Hold the tenant (or keep the hold in force); returns the hold and the
        seconds until it ends. Until then, and an in-flight TTL after, the tenant
        keeps its in-flight slots and its dispatched jobs count as waiting, not
        stranded: its mail waits in SQS for as long as it is held."""
        until_ms, held_for, wait_ms = await self._hold(
            keys=[self._keys.tenant_hold(tenant)],
            args=[reason, int(first_seconds * 1000), int(most_seconds * 1000)],
        )
        # Slots handed off since a hold in force began are kept as long too.
        await self.keep_alive(tenant, int(until_ms))
        return SesFaultHold(text(held_for), int(until_ms)), int(wait_ms) / 1000

    async def keep_alive(self, tenant: str, until_ms: int) -> None:
        """The tenant's mail waits in SQS until ``until_ms`` (Redis time): its in-flight
        slots last an in-flight TTL past that, its dispatched jobs' stranded deadlines as
        long after (``dispatcher/touch.lua``: the one way every hold and park keeps them)."""
        keys, args = self._calls.touch(tenant, until_ms + self._limits.inflight_ttl_ms)
        await self._touch(keys=keys, args=args)

    async def clear(self, tenant: str) -> None:
        await self._redis.delete(self._keys.tenant_hold(tenant))

    async def held(self, tenants: Iterable[str]) -> dict[str, SesFaultHold]:
        """The holds of these tenants (those held, or recently held, only)."""
        names = list(tenants)
        if not names:
            return {}
        async with self._redis.pipeline(transaction=False) as pipe:
            for tenant in names:
                read_hold(pipe, self._keys, tenant)
            values = await pipe.execute()
        read = {tenant: parse_hold(reply) for tenant, reply in zip(names, values, strict=True)}
        return {tenant: hold for tenant, hold in read.items() if hold is not None}


def lift(client: redis.Redis, keys: MailKeys, tenant: str) -> list[str]:
    """An operator resumed the tenant: lift its holds stored here (blocking; called by
    ``fairpost tenant resume``); returns the reasons lifted. Every replica sees it
    within a refresh and brings the tenant's parked mail back
    (fairpost.mailer.daemon.holds, fairpost.mailer.daemon.ses_tenant_status)."""
    with client.pipeline(transaction=True) as pipe:
        pipe.hget(keys.tenant_hold(tenant), "reason")
        pipe.delete(keys.tenant_hold(tenant))
        pipe.hdel(keys.ses_tenant_status(), tenant)
        reason, _, verdict = pipe.execute()
    lifted = [text(reason)] if reason is not None else []
    return lifted + ([SES_TENANT_DISABLED] if verdict else [])
