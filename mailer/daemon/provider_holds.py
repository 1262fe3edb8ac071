"""Which mails wait for a per-provider hold, and how they wait without blocking others.

The per-provider guard (fairpost.mailer.quota.provider_guard) holds a tenant for one
mailbox provider. SQS FIFO groups are per tenant, so the held mail cannot wait
in SQS the way a paused tenant's does: a message parked at the head of the
group would stop its mail to every provider. It waits in Redis instead, as a
scheduled job (``dispatcher/defer.lua``), at two places:

- the dispatcher's mail worker does not hand it to SQS: it is scheduled again
  ``PROVIDER_RECHECK_SECONDS`` from now (:class:`~fairpost.dispatcher.worker.Later`);
- a sender that receives it (in SQS when the hold began) takes it back out:
  scheduled again in Redis, then its message deleted, so its group goes on. Its
  next hand-off comes at least :data:`TAKEN_BACK_MIN_SECONDS` later, past SQS's
  five-minute deduplication window, which would otherwise drop the new message
  as a duplicate of the deleted one (same ``MessageDeduplicationId``).

A mail is held when any of its recipients is at a provider its tenant is held
for (sending it would reach that provider too). The holds are read from Redis at
most once every :data:`FRESH_SECONDS` per process.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

import redis.asyncio

from fairpost.config import Settings
from fairpost.mailer.daemon.deliverability import domain_of
from fairpost.mailer.daemon.mx import ProviderMap
from fairpost.mailer.quota.provider_guard import ProviderHold, read_provider_holds
from fairpost.mailer.sdk.keys import MailKeys
from fairpost.mailer.sdk.outcomes import feed

__all__ = ["FRESH_SECONDS", "TAKEN_BACK_MIN_SECONDS", "ProviderHolds"]

FRESH_SECONDS = 1.0
"""How old the holds a process acts on may be: a hold begun is obeyed within this."""

TAKEN_BACK_MIN_SECONDS = 330.0
"""A mail taken back out of SQS waits at least this long: SQS FIFO drops a message
whose deduplication id it saw in the last 5 minutes, and the mail's next hand-off
carries the same id (the 30 s beyond are the margin for clocks)."""


class ProviderHolds:
    def __init__(
        self,
        client: redis.asyncio.Redis,
        keys: MailKeys,
        settings: Settings,
        providers: ProviderMap,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.enabled = settings.reputation.per_provider
        self.recheck_seconds = settings.reputation.provider_recheck_seconds
        self._redis = client
        self._keys = keys
        self._providers = providers
        self._clock = clock
        self._holds: dict[str, dict[str, ProviderHold]] = {}
        self._read_at: float | None = None

    async def _current(self) -> dict[str, dict[str, ProviderHold]]:
        now = self._clock()
        if self._read_at is None or now - self._read_at >= FRESH_SECONDS:
            self._holds = await read_provider_holds(self._redis, self._keys)
            self._read_at = now
        return self._holds

    async def tenant_holds(self, tenant: str) -> dict[str, ProviderHold]:
        """The providers the tenant is held for (none: the guard is off, or holds none)."""
        if not self.enabled:
            return {}
        return (await self._current()).get(tenant, {})

    async def blocking(self, held: dict[str, ProviderHold], addresses: Iterable[str]) -> ProviderHold | None:
        """The hold, among the tenant's ``held``, that one of these recipients is under."""
        if not held:
            return None
        domains = [domain_of(a) for a in addresses]
        providers = await self._providers.providers(domains)
        for domain in domains:
            hold = held.get(providers[domain])
            if hold is not None:
                return hold
        return None

    @staticmethod
    def event(hold: ProviderHold) -> dict[str, str]:
        """The ``mail.held`` outcome event of a mail that starts to wait for ``hold``."""
        return feed.entry(
            feed.HELD, {"reason": hold.waiting_for, "provider": hold.provider, "detail": hold.reason}
        )
