"""The tenants page over any number of tenants: searched, sorted and cut into
pages on the server.

A page reads its own tenants' numbers only (:func:`collect_stats` for the 50
shown). What a search or a sort needs of every tenant is read at most once
every :data:`ORDER_SECONDS` and kept: the ids (the set of tenants that ever
enqueued, re-read when its size changes), the backlogs (one ``HGETALL`` of
the counts the scripts keep), the in-flight slots (of the tenants holding
any). Rate and hold are read for the tenants that can have them (mail
waiting or in flight, or held): the :data:`ACTIVE_SAMPLE` largest backlogs
among them when there are more, and the page says so. So 100,000 tenants cost
a page what 10 do, but for an ``HGETALL`` and a sort every few seconds.
"""

from __future__ import annotations

import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import redis.asyncio

from fairpost.config import Settings
from fairpost.dispatcher.replies import text, time_ms
from fairpost.mailer.console.views import rate
from fairpost.mailer.ops.stats import ScopeStats, collect_stats
from fairpost.mailer.quota.engine import QuotaEngine
from fairpost.mailer.quota.overrides import read_overrides
from fairpost.mailer.quota.reputation import guard_states, read_verdicts
from fairpost.mailer.sdk.keys import MailKeys

__all__ = ["ACTIVE_SAMPLE", "PAGE_SIZE", "SORTS", "TenantIndex", "TenantPage"]

PAGE_SIZE = 50
SORTS = ("id", "backlog", "inflight", "rate", "hold")
ORDER_SECONDS = 3.0
"""How long an order over every tenant is kept before it is read again."""
IDS_SECONDS = 60.0
"""The ids are re-read at least this often, and whenever their count changes."""
ACTIVE_SAMPLE = 1000
"""Most tenants whose rate and hold are read for a sort by them."""


@dataclass(frozen=True)
class TenantPage:
    rows: list[ScopeStats]
    at_ms: int
    matching: int
    """Tenants the search matches (all of them without one)."""
    known: int
    page: int
    pages: int
    sort: str
    query: str
    sampled: bool = False
    """Sorted by rate or hold over the :data:`ACTIVE_SAMPLE` busiest tenants only."""


class TenantIndex:
    def __init__(
        self,
        client: redis.asyncio.Redis,
        keys: MailKeys,
        settings: Settings,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._redis = client
        self._keys = keys
        self._settings = settings
        self._quota = QuotaEngine(client, keys)
        self._clock = clock
        self._ids: list[str] = []
        self._id_set: set[str] = set()
        self._ids_read = -math.inf
        self._ids_count = -1
        self._orders: dict[str, tuple[float, list[str], bool]] = {}

    async def page(self, *, query: str = "", sort: str = "id", page: int = 1) -> TenantPage:
        if sort not in SORTS:
            sort = "id"
        order, sampled = await self._order(sort)
        needle = query.strip().lower()
        matching = [t for t in order if needle in t.lower()] if needle else order
        pages = max(1, -(-len(matching) // PAGE_SIZE))
        page = min(max(1, page), pages)
        shown = matching[(page - 1) * PAGE_SIZE : page * PAGE_SIZE]
        stats = await collect_stats(self._redis, self._keys, self._settings, quota=self._quota, tenants=shown)
        by_id = {s.scope: s for s in stats.tenants}
        return TenantPage(
            rows=[by_id[t] for t in shown],
            at_ms=stats.at_ms,
            matching=len(matching),
            known=len(order),
            page=page,
            pages=pages,
            sort=sort,
            query=query,
            sampled=sampled,
        )

    async def _order(self, sort: str) -> tuple[list[str], bool]:
        kept = self._orders.get(sort)
        if kept is not None and self._clock() - kept[0] < ORDER_SECONDS:
            return kept[1], kept[2]
        ids = await self._all_ids()
        build: dict[str, Callable[[list[str]], Awaitable[tuple[list[str], bool]]]] = {
            "id": self._by_id,
            "backlog": self._by_backlog,
            "inflight": self._by_inflight,
            "rate": self._by_rate,
            "hold": self._by_hold,
        }
        order, sampled = await build[sort](ids)
        self._orders[sort] = (self._clock(), order, sampled)
        return order, sampled

    async def _all_ids(self) -> list[str]:
        """Every tenant: those that ever enqueued, and those configured, overridden,
        paused, judged by the guard, disabled by SES or given a warm-up plan."""
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.scard(self._keys.tenants())
            pipe.hgetall(self._keys.limit_overrides())
            pipe.smembers(self._keys.paused())
            pipe.hgetall(self._keys.guard())
            pipe.hgetall(self._keys.ses_tenant_status())
            pipe.hkeys(self._keys.warmup())
            count, raw_overrides, paused, guards, verdicts, warming = await pipe.execute()
        if int(count) != self._ids_count or self._clock() - self._ids_read > IDS_SECONDS:
            self._ids = sorted(text(t) for t in await self._redis.smembers(self._keys.tenants()))
            self._id_set = set(self._ids)
            self._ids_count, self._ids_read = int(count), self._clock()
        overrides = read_overrides(raw_overrides, paused)
        named = set(self._settings.tenants) | set(overrides.tenants) | overrides.paused
        named |= set(guard_states(guards)) | set(read_verdicts(verdicts)) | {text(t) for t in warming}
        # Those named elsewhere are nearly always known already: then the kept list is the answer.
        extra = named - self._id_set
        return sorted([*self._ids, *extra]) if extra else self._ids

    async def _by_id(self, ids: list[str]) -> tuple[list[str], bool]:
        return ids, False

    async def _backlogs(self) -> dict[str, int]:
        raw = await self._redis.hgetall(self._keys.counts())
        # "~waiting" and "~inflight" are the totals: "~" is in no tenant id.
        return {text(k): int(v) for k, v in raw.items() if not text(k).startswith("~")}

    async def _by_backlog(self, ids: list[str]) -> tuple[list[str], bool]:
        backlog = await self._backlogs()
        return sorted(ids, key=lambda t: -backlog.get(t, 0)), False

    async def _inflight(self) -> dict[str, int]:
        holding = [text(t) for t in await self._redis.zrange(self._keys.expiring(), 0, -1)]
        now_ms = time_ms(await self._redis.time())
        async with self._redis.pipeline(transaction=False) as pipe:
            for tenant in holding:
                pipe.zcount(self._keys.inflight(tenant), f"({now_ms}", "+inf")
            counts = await pipe.execute()
        return {t: int(n) for t, n in zip(holding, counts, strict=True) if int(n)}

    async def _by_inflight(self, ids: list[str]) -> tuple[list[str], bool]:
        inflight = await self._inflight()
        return sorted(ids, key=lambda t: -inflight.get(t, 0)), False

    async def _active(self, ids: list[str]) -> tuple[dict[str, ScopeStats], bool]:
        """The numbers of the tenants that can be sending or held now."""
        backlog = await self._backlogs()
        busiest = sorted((t for t, n in backlog.items() if n > 0), key=lambda t: -backlog[t])
        sampled = len(busiest) > ACTIVE_SAMPLE
        candidates = set(busiest[:ACTIVE_SAMPLE]) | set(await self._inflight())
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.smembers(self._keys.paused())
            pipe.hkeys(self._keys.guard())
            pipe.hkeys(self._keys.ses_tenant_status())
            for group in await pipe.execute():
                candidates |= {text(t) for t in group}
        stats = await collect_stats(
            self._redis, self._keys, self._settings, quota=self._quota, tenants=candidates & set(ids)
        )
        return {s.scope: s for s in stats.tenants}, sampled

    async def _by_rate(self, ids: list[str]) -> tuple[list[str], bool]:
        active, sampled = await self._active(ids)
        return sorted(ids, key=lambda t: -rate(active[t]) if t in active else 0.0), sampled

    async def _by_hold(self, ids: list[str]) -> tuple[list[str], bool]:
        active, sampled = await self._active(ids)
        return sorted(ids, key=lambda t: _hold_rank(active.get(t))), sampled


def _hold_rank(scope: ScopeStats | None) -> tuple[int, float]:
    """Held the longest first: a pause or SES's verdict (lifted by a person), then
    an SES hold, then a quota wait, each by how long is left; then the rest."""
    if scope is None:
        return (4, 0.0)
    if (
        scope.paused
        or scope.ses_disabled is not None
        or (scope.guard is not None and scope.guard.level == "paused")
    ):
        return (0, 0.0)
    if scope.held_by is not None:
        return (1, -float(scope.held_until_ms or 0))
    if scope.retry_after != 0 or scope.guard is not None:
        return (2, -scope.retry_after if scope.retry_after > 0 else -math.inf)
    return (3, 0.0)
