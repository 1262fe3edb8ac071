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

With sending pools (#43) each tenant is listed once, in the pool the directory
puts it on (one ``HGETALL`` of the directory, kept with the order), and its
numbers are read there: each pool's reads above, once per pool.
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field

from fairpost.config.pools import DEFAULT_POOL
from fairpost.dispatcher.replies import text, time_ms
from fairpost.mailer.console.pools import ConsolePools, PoolParts
from fairpost.mailer.console.views import rate
from fairpost.mailer.ops.stats import ScopeStats, collect_stats
from fairpost.mailer.quota.overrides import read_overrides
from fairpost.mailer.quota.reputation import guard_states, read_verdicts

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
    pool: str = ""
    """The pool filter (every pool if empty)."""
    pools: tuple[str, ...] = ()
    """The pools, for the filter and the column; none without pools."""
    pool_of: dict[str, str] = field(default_factory=dict)
    """Each row's tenant → its pool."""


class _Ids:
    """One pool's tenant ids, re-read when their count changes or every :data:`IDS_SECONDS`."""

    def __init__(self) -> None:
        self.ids: list[str] = []
        self.id_set: set[str] = set()
        self.read = -math.inf
        self.count = -1


class TenantIndex:
    def __init__(self, pools: ConsolePools, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._pools = pools
        self._clock = clock
        self._ids = {p.name: _Ids() for p in pools}
        self._placed: dict[str, str] = {}
        self._orders: dict[str, tuple[float, list[str], bool]] = {}

    def _owner(self, tenant: str) -> str:
        return self._placed.get(tenant, DEFAULT_POOL)

    async def page(self, *, query: str = "", sort: str = "id", page: int = 1, pool: str = "") -> TenantPage:
        if sort not in SORTS:
            sort = "id"
        if pool not in self._pools.names():
            pool = ""
        order, sampled = await self._order(sort)
        needle = query.strip().lower()
        matching = [t for t in order if needle in t.lower()] if needle else order
        if pool:
            matching = [t for t in matching if self._owner(t) == pool]
        pages = max(1, -(-len(matching) // PAGE_SIZE))
        page = min(max(1, page), pages)
        shown = matching[(page - 1) * PAGE_SIZE : page * PAGE_SIZE]
        by_id, at_ms = await self._stats(shown)
        return TenantPage(
            rows=[by_id[t] for t in shown],
            at_ms=at_ms,
            matching=len(matching),
            known=len(order),
            page=page,
            pages=pages,
            sort=sort,
            query=query,
            sampled=sampled,
            pool=pool,
            pools=self._pools.names(),
            pool_of={t: self._owner(t) for t in shown},
        )

    async def _stats(self, tenants: Iterable[str]) -> tuple[dict[str, ScopeStats], int]:
        """The tenants' numbers, each read in its own pool."""
        by_pool: dict[str, list[str]] = defaultdict(list)
        for tenant in tenants:
            by_pool[self._owner(tenant)].append(tenant)
        found: dict[str, ScopeStats] = {}
        at_ms = 0
        for name, group in by_pool.items():
            p = self._pools.parts[name]
            stats = await collect_stats(p.redis, p.keys, p.settings, quota=p.quota, tenants=group)
            found.update((s.scope, s) for s in stats.tenants)
            at_ms = max(at_ms, stats.at_ms)
        if not by_pool:
            p = self._pools.default
            at_ms = (await collect_stats(p.redis, p.keys, p.settings, quota=p.quota, tenants=())).at_ms
        return found, at_ms

    async def _order(self, sort: str) -> tuple[list[str], bool]:
        kept = self._orders.get(sort)
        if kept is not None and self._clock() - kept[0] < ORDER_SECONDS:
            return kept[1], kept[2]
        self._placed = await self._pools.placements()
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
        """Every tenant of every pool, and those the directory places."""
        lists = [await self._pool_ids(p) for p in self._pools]
        if len(lists) == 1:
            return lists[0]
        return sorted(set().union(*lists, self._placed))

    async def _pool_ids(self, p: PoolParts) -> list[str]:
        """A pool's tenants: those that ever enqueued there, and those configured, overridden,
        paused, judged by the guard, disabled by SES or given a warm-up plan there."""
        kept, keys = self._ids[p.name], p.keys
        async with p.redis.pipeline(transaction=False) as pipe:
            pipe.scard(keys.tenants())
            pipe.hgetall(keys.limit_overrides())
            pipe.smembers(keys.paused())
            pipe.hgetall(keys.guard())
            pipe.hgetall(keys.ses_tenant_status())
            pipe.hkeys(keys.warmup())
            count, raw_overrides, paused, guards, verdicts, warming = await pipe.execute()
        if int(count) != kept.count or self._clock() - kept.read > IDS_SECONDS:
            kept.ids = sorted(text(t) for t in await p.redis.smembers(keys.tenants()))
            kept.id_set = set(kept.ids)
            kept.count, kept.read = int(count), self._clock()
        overrides = read_overrides(raw_overrides, paused)
        named = set(p.settings.tenants) | set(overrides.tenants) | overrides.paused
        named |= set(guard_states(guards)) | set(read_verdicts(verdicts)) | {text(t) for t in warming}
        # Those named elsewhere are nearly always known already: then the kept list is the answer.
        extra = named - kept.id_set
        return sorted([*kept.ids, *extra]) if extra else kept.ids

    async def _by_id(self, ids: list[str]) -> tuple[list[str], bool]:
        return ids, False

    async def _backlogs(self) -> dict[str, int]:
        """Each tenant's backlog in its own pool."""
        backlog: dict[str, int] = {}
        for p in self._pools:
            raw = await p.redis.hgetall(p.keys.counts())
            # "~waiting" and "~inflight" are the totals: "~" is in no tenant id.
            backlog.update(
                (t, int(v))
                for k, v in raw.items()
                if not (t := text(k)).startswith("~") and self._owner(t) == p.name
            )
        return backlog

    async def _by_backlog(self, ids: list[str]) -> tuple[list[str], bool]:
        backlog = await self._backlogs()
        return sorted(ids, key=lambda t: -backlog.get(t, 0)), False

    async def _inflight(self) -> dict[str, int]:
        """Each tenant's jobs in flight in its own pool."""
        found: dict[str, int] = {}
        for p in self._pools:
            holding = [
                t
                for t in map(text, await p.redis.zrange(p.keys.expiring(), 0, -1))
                if self._owner(t) == p.name
            ]
            now_ms = time_ms(await p.redis.time())
            async with p.redis.pipeline(transaction=False) as pipe:
                for tenant in holding:
                    pipe.zcount(p.keys.inflight(tenant), f"({now_ms}", "+inf")
                counts = await pipe.execute()
            found.update((t, int(n)) for t, n in zip(holding, counts, strict=True) if int(n))
        return found

    async def _by_inflight(self, ids: list[str]) -> tuple[list[str], bool]:
        inflight = await self._inflight()
        return sorted(ids, key=lambda t: -inflight.get(t, 0)), False

    async def _active(self, ids: list[str]) -> tuple[dict[str, ScopeStats], bool]:
        """The numbers of the tenants that can be sending or held now."""
        backlog = await self._backlogs()
        busiest = sorted((t for t, n in backlog.items() if n > 0), key=lambda t: -backlog[t])
        sampled = len(busiest) > ACTIVE_SAMPLE
        candidates = set(busiest[:ACTIVE_SAMPLE]) | set(await self._inflight())
        for p in self._pools:
            async with p.redis.pipeline(transaction=False) as pipe:
                pipe.smembers(p.keys.paused())
                pipe.hkeys(p.keys.guard())
                pipe.hkeys(p.keys.ses_tenant_status())
                for group in await pipe.execute():
                    candidates |= {t for t in map(text, group) if self._owner(t) == p.name}
        found, _ = await self._stats(candidates & set(ids))
        return found, sampled

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
