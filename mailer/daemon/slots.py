"""In-flight slots kept while mail waits in SQS and no sender receives it.

A tenant's in-flight slot (``dispatcher/``) lasts ``inflight_ttl`` from its
hand-off, renewed when the sender parks the tenant's mail (``touch``). But
while the sender's gate is closed (the global quota spent, or the sender
holding itself: SES throttling, its daily quota, a pause) nothing is
received, nothing is parked, and slots would lapse with their messages still
in SQS: every TTL, another cap's worth of each tenant's backlog would move to
SQS, where priorities and cancels no longer apply and FIFO's look-ahead
starves other tenants.

So while the gate is closed, every live sender replica renews the slots due
to expire within three quarters of a TTL to a whole TTL from now, every
quarter TTL: a pass may come half a TTL late (a busy machine, a slow Redis)
before a slot whose message legitimately waits gets near its end. Only
tenants whose earliest slot is due are visited (``dispatcher/keep.lua``).
With the gate open, mail is received within moments and parked (``touch``)
or sent; a slot whose message is gone then expires as before. If every
replica dies, nothing renews: slots come back by themselves within a TTL.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from fairpost.dispatcher.backoff import OutageBackoff
from fairpost.dispatcher.loop import OnError, forever
from fairpost.dispatcher.store import JobStore
from fairpost.mailer.quota.engine import QuotaEngine
from fairpost.mailer.quota.overrides import LimitSource

__all__ = ["SlotKeeper"]

log = logging.getLogger("fairpost.slots")


class SlotKeeper:
    """Renews in-flight slots while the sender's gate is closed; see the module docstring.

    ``held`` says whether the sender holds itself (besides the global quota,
    which the keeper reads itself); ``None``: only the global quota counts.
    """

    def __init__(
        self,
        store: JobStore,
        quota: QuotaEngine,
        limits: LimitSource,
        *,
        ttl_ms: int,
        held: Callable[[], bool] | None = None,
        page: int = 200,
        max_outage_seconds: float = 60.0,
        on_error: OnError | None = None,
    ) -> None:
        if ttl_ms < 4:
            raise ValueError(f"the in-flight TTL must be at least 4 ms, not {ttl_ms}")
        self._store = store
        self._quota = quota
        self._limits = limits
        self._held = held
        self._ttl_ms = ttl_ms
        self._page = page
        self._max_outage_seconds = max_outage_seconds
        self._on_error = on_error
        self.passes = 0
        """Passes that renewed slots (tests wait on it)."""

    @property
    def period(self) -> float:
        """Seconds between two looks at the gate: a quarter TTL."""
        return self._ttl_ms / 4000

    async def gate_closed(self) -> bool:
        if self._held is not None and self._held():
            return True
        return await self._quota.global_retry_after(self._limits.global_limits()) > 0

    async def keep_once(self) -> int:
        """One pass: renew what is due; returns how many tenants were visited."""
        offset, visited = 0, 0
        while True:
            seen, stayed, _ = await self._store.keep_inflight(
                self._ttl_ms, self._ttl_ms * 3 // 4, offset, self._page
            )
            visited += seen
            # Tenants renewed left the due range; those still due (an expired
            # slot heads them, for the reaper) are skipped on the next page.
            offset += stayed
            if seen < self._page:
                return visited

    async def run(self, stop: asyncio.Event) -> None:
        """Every :attr:`period` until ``stop``: renew while the gate is closed. A failed
        pass is tried again on the outage back-off, at least once a period (slots last
        a whole TTL)."""

        async def look() -> float:
            if await self.gate_closed():
                await self.keep_once()
                self.passes += 1
            return self.period

        backoff = OutageBackoff(self._max_outage_seconds, most=min(10.0, self.period))
        await forever("slots", look, stop, backoff=backoff, on_error=self._on_error)
