"""What the pages show, read through the modules that own it: stats
(:func:`collect_stats`), job status (the SDK), dead letters, suppression lists
and the quota admin. Nothing here writes; :mod:`.actions` does.

The admin clients are blocking (they are what the CLI uses): their calls run
in a thread, on one shared blocking connection pool.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import secrets
from dataclasses import dataclass

import redis
import redis.asyncio

from fairpost.config import Settings
from fairpost.config.pools import DEFAULT_POOL
from fairpost.config.tenant_id import is_valid_tenant_id
from fairpost.dispatcher.keys import LANES
from fairpost.dispatcher.record import ENTRY_SEP
from fairpost.dispatcher.replies import text
from fairpost.mailer.console.live import Account, Samples, SesAccount
from fairpost.mailer.console.pools import ConsolePools, PoolParts
from fairpost.mailer.console.tenants import TenantIndex
from fairpost.mailer.ops.stats import ScopeStats, Stats, WindowUsage, collect_stats
from fairpost.mailer.quota.provider_guard import held_providers
from fairpost.mailer.quota.reputation import guard_states, read_verdicts
from fairpost.mailer.sdk.client import AsyncMailClient
from fairpost.mailer.sdk.dead import DeadLetter
from fairpost.mailer.sdk.rollups import Report, SendHistory
from fairpost.mailer.sdk.status import JobStatus
from fairpost.mailer.sdk.suppression import Suppression, Suppressions
from fairpost.mailer.sdk.unsubscribes import Unsubscribe, Unsubscribes

__all__ = ["Console", "DeadPage", "Held", "Overview", "TenantCharts", "TenantDetail"]

DEAD_PAGE = 50
SHOWN_HELD = 20
CHART_DAYS = 14
SHOWN_SUPPRESSIONS = 200
SHOWN_JOBS = 10


@dataclass(frozen=True)
class Overview:
    stats: Stats
    """The global numbers (no tenant's)."""
    dead: int
    account: Account
    sent: WindowUsage | None
    """The longest global window: recipients sent in it."""
    history: SendHistory
    """Recipients sent per minute over the last hour, every tenant's."""
    held: Held
    pools: list[tuple[str, ScopeStats]]
    """Each pool's totals (none without pools; ``stats`` is then the one pool's)."""


@dataclass(frozen=True)
class Held:
    """Tenants held beyond their quota: paused by an operator or the reputation guard,
    or their SES tenant disabled (a hold for an SES fault of their own ends by itself
    within minutes and is on the tenant's page)."""

    tenants: list[tuple[str, str]]
    """The first :data:`SHOWN_HELD`, by id: (tenant, why)."""
    total: int


@dataclass(frozen=True)
class TenantCharts:
    stats: ScopeStats
    history: SendHistory
    """Its recipients sent per minute over the last hour."""
    report: Report
    """Its deliverability by provider over :data:`CHART_DAYS` days."""


@dataclass(frozen=True)
class TenantDetail:
    pool: str
    """The pool the tenant is on: where these numbers are read."""
    stats: ScopeStats
    at_ms: int
    known: bool
    """Whether it ever enqueued, or the settings or an operator name it."""
    suppressions: list[Suppression]
    suppressions_total: int
    unsubscribes: list[Unsubscribe]
    """Who stopped its notification mail, and which topics (apart from the suppression list)."""
    unsubscribes_total: int
    waiting: dict[str, list[str]]
    """Lane (a priority, or its bulk lane: notification mail) → ids of its first waiting jobs."""
    inflight: list[str]
    dead: list[DeadLetter]


@dataclass(frozen=True)
class DeadPage:
    letters: list[DeadLetter]
    matching: int
    page: int
    pages: int
    tenant: str
    reason: str


class Console:
    """Everything the console reads, over one asyncio and one blocking Redis connection pool
    (and, on a Redis Cluster, one of each per other sending pool's slot)."""

    def __init__(self, settings: Settings, client: redis.asyncio.Redis, sync_client: redis.Redis) -> None:
        self.settings = settings
        self.pools = ConsolePools(settings, client, sync_client)
        default = self.pools.default
        self.keys = default.keys
        self.redis = client
        self.tenants = TenantIndex(self.pools)
        self.account = SesAccount()
        self.backlog = Samples()
        self.mail = AsyncMailClient(settings, redis_client=client)
        # The default pool's: the dead letters page and the overview's charts.
        self.dead = default.dead
        self.deliverability = default.deliverability
        self.lifecycle = default.lifecycle
        # These two find the tenant's pool themselves.
        self.suppressions = Suppressions(settings, redis_client=sync_client)
        self.unsubscribes = Unsubscribes(settings, redis_client=sync_client)
        self._ref_key = secrets.token_bytes(32)

    async def aclose(self) -> None:
        await self.pools.aclose()

    # -- overview -------------------------------------------------------------------
    async def global_stats(self, pool: PoolParts | None = None) -> Stats:
        p = pool or self.pools.default
        return await collect_stats(p.redis, p.keys, p.settings, tenants=())

    async def sample_backlog(self) -> float:
        """Jobs waiting over every tenant of every pool, for the chart."""
        return float(sum([(await self.global_stats(p)).global_.backlog for p in self.pools]))

    async def overview(self) -> Overview:
        stats, dead, account, history, held = await asyncio.gather(
            self.global_stats(),
            self.redis.zcard(self.keys.dead()),
            self.account.read(),
            asyncio.to_thread(self.deliverability.send_history),
            self.held(),
        )
        windows = stats.global_.windows
        longest = max(windows, key=lambda w: w.seconds) if windows else None
        others = [p for p in self.pools if p is not self.pools.default] if self.pools.pooled else []
        pools = [(p.name, (await self.global_stats(p)).global_) for p in others]
        if self.pools.pooled:
            pools.insert(0, (self.pools.default.name, stats.global_))
        return Overview(stats, int(dead), account, longest, history, held, pools)

    async def held(self) -> Held:
        """The held tenants of every pool, each as its own pool holds it."""
        placed = await self.pools.placements()
        why: dict[str, str] = {}
        for p in self.pools:
            for tenant, reason in (await _held_in(p)).items():
                if placed.get(tenant, DEFAULT_POOL) == p.name:
                    why.setdefault(tenant, reason)
        shown = sorted(why)[:SHOWN_HELD]
        return Held([(t, why[t]) for t in shown], len(why))

    async def tenant_charts(self, tenant: str) -> TenantCharts:
        p = await self.pools.of(tenant)
        stats, history, report = await asyncio.gather(
            collect_stats(p.redis, p.keys, p.settings, tenants=[tenant]),
            asyncio.to_thread(p.deliverability.send_history, tenant),
            asyncio.to_thread(p.deliverability.report, tenant, days=CHART_DAYS),
        )
        return TenantCharts(stats.tenants[0], history, report)

    # -- one tenant -----------------------------------------------------------------
    async def tenant(self, tenant: str) -> TenantDetail:
        p = await self.pools.of(tenant)
        stats = await collect_stats(p.redis, p.keys, p.settings, tenants=[tenant])
        async with p.redis.pipeline(transaction=False) as pipe:
            pipe.sismember(p.keys.tenants(), tenant)
            for priority in LANES:
                pipe.lrange(p.keys.queue(tenant, priority), 0, SHOWN_JOBS - 1)
            pipe.zrange(p.keys.inflight(tenant), 0, SHOWN_JOBS - 1)
            enqueued, *queues, inflight = await pipe.execute()
        suppressed, unsubscribed, dead = await asyncio.gather(
            asyncio.to_thread(self.suppressions.list, tenant),
            asyncio.to_thread(self.unsubscribes.list, tenant),
            asyncio.to_thread(p.dead.list, tenant, limit=SHOWN_JOBS),
        )
        scope = stats.tenants[0]
        known = (
            bool(enqueued)
            or tenant in self.settings.tenants
            or scope.paused
            or scope.limits_source == "override"
        )
        return TenantDetail(
            pool=p.name,
            stats=scope,
            at_ms=stats.at_ms,
            known=known
            or scope.guard is not None
            or scope.ses_disabled is not None
            or scope.warmup is not None
            or bool(scope.provider_holds),
            suppressions=suppressed[:SHOWN_SUPPRESSIONS],
            suppressions_total=len(suppressed),
            unsubscribes=unsubscribed[:SHOWN_SUPPRESSIONS],
            unsubscribes_total=len(unsubscribed),
            waiting={
                lane: [text(e).split(ENTRY_SEP, 1)[0] for e in q]
                for lane, q in zip(LANES, queues, strict=True)
            },
            inflight=[text(j) for j in inflight],
            dead=dead,
        )

    def address_ref(self, address: str) -> str:
        """An address as a form names it: not the address, which the page may mask."""
        return hmac.new(self._ref_key, address.encode(), hashlib.sha256).hexdigest()[:24]

    # -- jobs -----------------------------------------------------------------------
    async def job(self, job_id: str) -> JobStatus:
        """Raises :class:`UnknownJob`."""
        return await self.mail.status(job_id)

    # -- dead letters ---------------------------------------------------------------
    def dead_pool(self, tenant: str) -> PoolParts:
        """Where the dead letters of ``tenant`` are: its pool; every tenant's: the default pool."""
        return self.pools.of_sync(tenant) if tenant else self.pools.default

    def matching_dead(self, tenant: str, reason: str) -> list[DeadLetter]:
        """Every dead letter of ``tenant`` (any if empty) whose reason contains ``reason``."""
        letters = self.dead_pool(tenant).dead.list(tenant or None)
        needle = reason.strip().lower()
        return [d for d in letters if needle in d.reason.lower()] if needle else letters

    def dead_page(self, tenant: str, reason: str, page: int) -> DeadPage:
        if tenant and not is_valid_tenant_id(tenant):
            return DeadPage([], 0, 1, 1, tenant, reason)
        if tenant or reason.strip():
            letters = self.matching_dead(tenant, reason)
            pages = max(1, -(-len(letters) // DEAD_PAGE))
            page = min(max(1, page), pages)
            shown = letters[(page - 1) * DEAD_PAGE : page * DEAD_PAGE]
            return DeadPage(shown, len(letters), page, pages, tenant, reason)
        # No filter: a page reads its own records only.
        ids = self.lifecycle.dead_ids()
        pages = max(1, -(-len(ids) // DEAD_PAGE))
        page = min(max(1, page), pages)
        records = self.lifecycle.records(ids[(page - 1) * DEAD_PAGE : page * DEAD_PAGE])
        shown = [DeadLetter.from_record(*r) for r in records if r[1].get("state") == "dead"]
        return DeadPage(shown, len(ids), page, pages, tenant, reason)


async def _held_in(p: PoolParts) -> dict[str, str]:
    """Tenant → why one pool holds it."""
    async with p.redis.pipeline(transaction=False) as pipe:
        pipe.smembers(p.keys.paused())
        pipe.hgetall(p.keys.guard())
        pipe.hgetall(p.keys.ses_tenant_status())
        pipe.hgetall(p.keys.provider_guard())
        paused, guards, verdicts, providers = await pipe.execute()
    why: dict[str, str] = {text(t): "paused by an operator" for t in paused}
    for tenant, state in guard_states(guards).items():
        why.setdefault(tenant, f"{state.level} by the reputation guard")
    for tenant, raw in providers.items():
        if held := held_providers(raw):
            why.setdefault(text(tenant), f"held at {', '.join(sorted(held))} by the reputation guard")
    for tenant, verdict in read_verdicts(verdicts).items():
        if verdict.disabled:
            why.setdefault(tenant, "SES disabled its SES tenant")
    return why
