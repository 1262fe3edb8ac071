"""``fairpost stats``: per tenant and global backlog, in flight, quota use and pauses.

Everything is read from Redis, so any replica (or an operator's laptop) sees
the same numbers, and nothing reads every tenant: one tenant costs a few
O(log n) reads, the global numbers are counters the dispatcher's scripts keep
as work happens, and the tenants listed without ``--tenant`` are every tenant
when there are at most :data:`SAMPLE` of them, else the top :data:`SAMPLE` by
backlog (plus those configured, overridden or paused). ``backlog`` is the
jobs waiting in the tenant's queues in Redis (not yet handed to SQS); ``in flight`` the live members of its
in-flight set (claimed, or handed to SQS and not finished); ``used`` the
recipients counted in each quota window (granted sends); ``retry after``
how long until one more recipient fits (0: it fits now); ``paused`` an
operator's pause (``fairpost tenant pause``); a warming tenant's limits are its
step's where they are stricter, and ``warmup`` says where it stands in its plan.

The metrics' gauges (:mod:`fairpost.mailer.daemon.metrics`) are filled from the same
:func:`collect_stats`; :mod:`fairpost.mailer.ops.stats_render` shows them. Needs only
``redis``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any

import redis.asyncio

from fairpost.config import Settings
from fairpost.config.limits import Window, format_limits
from fairpost.config.warmup import stricter
from fairpost.dispatcher.keys import TOTAL_INFLIGHT, TOTAL_WAITING
from fairpost.dispatcher.redis_memory import RedisMemory, memory_from_info
from fairpost.dispatcher.replies import record, text, time_ms
from fairpost.mailer.quota.engine import QuotaEngine
from fairpost.mailer.quota.holds import parse_hold, read_hold
from fairpost.mailer.quota.overrides import (
    EffectiveLimits,
    read_auto_limits,
    read_overrides,
    resolve_global,
    resolve_tenant,
)
from fairpost.mailer.quota.provider_guard import ProviderHold, held_providers
from fairpost.mailer.quota.reputation import (
    GuardState,
    Reputation,
    ReputationBook,
    TenantVerdict,
    guard_states,
    read_verdicts,
)
from fairpost.mailer.quota.warmup import WarmupView, read_places
from fairpost.mailer.sdk.keys import MailKeys
from fairpost.mailer.sdk.outcomes.pending import PendingDeliveries, pending_deliveries

__all__ = ["ScopeStats", "Stats", "WindowUsage", "collect_stats"]

_CONCURRENT_READS = 16

SAMPLE = 1000
"""Most tenants a whole-system view reads, besides those named (configured,
overridden, paused): beyond it, the top tenants by backlog."""


@dataclass(frozen=True)
class WindowUsage:
    seconds: int
    limit: int
    used: int

    @property
    def name(self) -> str:
        """``"second"``, ``"day"``, ``"10 seconds"``: the window without its count."""
        return str(Window(self.seconds, self.limit)).split("/", 1)[1]

    def to_json(self) -> dict[str, Any]:
        return {"window": self.name, "seconds": self.seconds, "limit": self.limit, "used": self.used}


@dataclass(frozen=True)
class ScopeStats:
    """One tenant's numbers, or the global ones (``scope == "global"``)."""

    scope: str
    backlog: int
    inflight: int
    windows: list[WindowUsage]
    limits_source: str
    paused: bool = False
    retry_after: float = 0.0
    """Seconds until one more recipient fits in every window; -1: never (a limit of 0)."""
    held_by: str | None = None
    """``ses_<code>`` while the tenant is held for a fault of its own SES set-up."""
    held_until_ms: int | None = None
    """Redis time its next mail is tried again."""
    reputation: Reputation | None = None
    """Sends, bounces and complaints over 24 h and 7 d (mailer/quota/reputation.py)."""
    guard: GuardState | None = None
    """What the reputation guard did to the tenant, if anything."""
    ses_disabled: TenantVerdict | None = None
    """SES's verdict, while SES has the tenant's SES tenant disabled."""
    warmup: WarmupView | None = None
    """Where the tenant stands in its warm-up plan, while it warms up (mailer/quota/warmup.py)."""
    provider_holds: dict[str, ProviderHold] = field(default_factory=dict)
    """The providers the per-provider guard holds the tenant for (mailer/quota/provider_guard.py):
    its mail to them waits, its mail to the others goes on."""

    @property
    def held(self) -> str | None:
        """Why the tenant is held, beyond its quota: ``ses_tenant_disabled``,
        ``ses_<code>`` (SES refused its own set-up), ``reputation_paused`` or
        ``reputation_throttled``."""
        if self.ses_disabled is not None:
            return "ses_tenant_disabled"
        if self.held_by is not None:
            return self.held_by
        if self.guard is not None:
            return "reputation_" + self.guard.level
        return None

    def to_json(self, at_ms: int) -> dict[str, Any]:
        throttled_until = None
        if self.retry_after > 0:
            throttled_until = at_ms + int(self.retry_after * 1000)
        return {
            "backlog": self.backlog,
            "in_flight": self.inflight,
            "limits": format_limits(tuple(Window(w.seconds, w.limit) for w in self.windows)) or None,
            "limits_source": self.limits_source,
            "windows": [w.to_json() for w in self.windows],
            "paused": self.paused,
            "retry_after_seconds": self.retry_after,
            "throttled_until_ms": throttled_until,
            "held": self.held,
            "reputation": None if self.reputation is None else self.reputation.to_json()["windows"],
            "guard": None if self.guard is None else self.guard.to_json(),
            "ses_tenant": None if self.ses_disabled is None else self.ses_disabled.to_json(),
            "held_by": self.held_by,
            "held_until_ms": self.held_until_ms,
            "warmup": None if self.warmup is None else self.warmup.to_json(),
            "provider_holds": {p: h.to_json() for p, h in sorted(self.provider_holds.items())},
        }


@dataclass(frozen=True)
class Stats:
    at_ms: int
    """Redis server time the numbers were read at."""
    global_: ScopeStats
    tenants: list[ScopeStats] = field(default_factory=list)
    replicas: list[str] = field(default_factory=list)
    """Replicas with a live heartbeat."""
    reconciled: dict[str, int] = field(default_factory=dict)
    """Dispatched jobs SQS lost, by what the reconcilers did (``handed_again``, ``dead``)."""
    known_tenants: int = 0
    """Tenants that ever enqueued: more than :attr:`tenants` lists when it is a sample."""
    events: dict[str, int] = field(default_factory=dict)
    webhooks: dict[str, PendingDeliveries] = field(default_factory=dict)
    """Per tenant with webhook endpoints: deliveries still pending (docs/outcomes.md)."""
    """SES events handled, by outcome (mailer/daemon/events.py), all replicas together."""
    memory: RedisMemory | None = None
    """How full Redis is, and its eviction policy (dispatcher/redis_memory.py)."""

    def tenant(self, tenant: str) -> ScopeStats | None:
        return next((t for t in self.tenants if t.scope == tenant), None)

    def to_json(self) -> dict[str, Any]:
        return {
            "at_ms": self.at_ms,
            "global": self.global_.to_json(self.at_ms),
            "tenants": {t.scope: t.to_json(self.at_ms) for t in self.tenants},
            "replicas": self.replicas,
            "reconciled": {"handed_again": 0, "dead": 0, **self.reconciled},
            "known_tenants": self.known_tenants,
            "ses_events": self.events,
            "webhooks": {t: p.to_json(self.at_ms) for t, p in self.webhooks.items()},
            "redis_memory": self.memory.to_json() if self.memory else None,
        }


async def collect_stats(
    client: redis.asyncio.Redis,
    keys: MailKeys,
    settings: Settings,
    *,
    quota: QuotaEngine | None = None,
    tenants: Iterable[str] | None = None,
    detail: Callable[[str], bool] | None = None,
    sample: int = SAMPLE,
    also: Iterable[str] = (),
) -> Stats:
    """Read every number in a few pipelined round trips.

    ``tenants``: which tenants to report (default: every tenant that is
    configured, has an override or is paused, and every tenant that ever
    enqueued when they are at most ``sample``, else the ``sample`` with the
    largest backlogs); ``also``: more tenants to report with the default.
    ``detail``: which tenants get their quota windows read (two script calls
    each; default all): the metrics ask only for the tenants they label.
    Global limits set to ``auto`` show what a running daemon last derived
    from SES and published.
    """
    quota = quota or QuotaEngine(client, keys)
    shared = await _read_shared(client, keys)
    overrides = read_overrides(shared.raw_overrides, shared.paused)
    guards, ses_disabled, warming = shared.guards, shared.ses_disabled, shared.warming
    if tenants is None:
        # Bounded: every tenant only while they are few, else the top backlogs.
        listed = (
            await client.smembers(keys.tenants())
            if shared.known <= sample
            else await _top(client, keys, sample)
        )
        names = {text(t) for t in listed} | set(settings.tenants) | set(overrides.tenants) | overrides.paused
        names |= set(also) | set(guards) | set(ses_disabled) | set(warming) | set(shared.provider_held)
    else:
        names = set(tenants)
    ordered = sorted(names)

    glob = resolve_global(settings, overrides, read_auto_limits(shared.auto_text))
    effective = {t: resolve_tenant(settings, overrides, t) for t in ordered}
    for tenant in set(warming) & set(effective):
        own = effective[tenant].windows or ()
        effective[tenant] = replace(effective[tenant], windows=stricter(own, warming[tenant].place.limits))
    backlog, inflight, holds = await _tenant_counts(client, keys, ordered, shared.at_ms)
    reader = _TenantReader(
        quota, ReputationBook(client, keys, settings), shared, effective, backlog, inflight, holds, detail
    )
    results = await asyncio.gather(_global_stats(quota, glob, shared), *(reader.read(t) for t in ordered))
    return Stats(
        at_ms=shared.at_ms,
        global_=results[0],
        tenants=list(results[1:]),
        replicas=sorted(text(r) for r in shared.replicas),
        reconciled={k: int(v) for k, v in record(shared.reconciled).items()},
        known_tenants=int(shared.known),
        events=shared.events,
        webhooks=await pending_deliveries(client, keys),
        memory=shared.memory,
    )


@dataclass(frozen=True)
class _Shared:
    """What one pipelined round trip reads for every tenant at once."""

    at_ms: int
    raw_overrides: Any
    paused: Any
    known: int
    auto_text: Any
    replicas: Any
    reconciled: Any
    totals: Any
    guards: dict[str, GuardState]
    ses_disabled: dict[str, TenantVerdict]
    events: dict[str, int]
    warming: dict[str, WarmupView]
    memory: RedisMemory
    provider_held: dict[str, dict[str, ProviderHold]]


async def _read_shared(client: redis.asyncio.Redis, keys: MailKeys) -> _Shared:
    async with client.pipeline(transaction=False) as pipe:
        pipe.time()
        pipe.hgetall(keys.limit_overrides())
        pipe.smembers(keys.paused())
        pipe.scard(keys.tenants())
        pipe.get(keys.auto_limits())
        pipe.zrangebyscore(keys.replicas(), "(" + str(int(time.time() * 1000)), "+inf")
        pipe.hgetall(keys.reconciled())
        pipe.hmget(keys.counts(), TOTAL_WAITING, TOTAL_INFLIGHT)
        pipe.hgetall(keys.guard())
        pipe.hgetall(keys.ses_tenant_status())
        pipe.hgetall(keys.events_seen())
        pipe.hgetall(keys.warmup())
        pipe.info("memory")
        pipe.info("stats")
        pipe.hgetall(keys.provider_guard())
        values = await pipe.execute()
    server_time, raw_overrides, paused, known, auto_text, replicas, reconciled, totals = values[:8]
    return _Shared(
        at_ms=time_ms(server_time),
        raw_overrides=raw_overrides,
        paused=paused,
        known=int(known),
        auto_text=auto_text,
        replicas=replicas,
        reconciled=reconciled,
        totals=totals,
        guards=guard_states(values[8]),
        ses_disabled=read_verdicts(values[9]),
        events={text(k): int(v) for k, v in values[10].items()},
        warming={t: WarmupView(t, place) for t, (_, place) in read_places(values[11]).items()},
        memory=memory_from_info(values[12], values[13]),
        provider_held={text(t): h for t, raw in values[14].items() if (h := held_providers(raw))},
    )


async def _tenant_counts(
    client: redis.asyncio.Redis, keys: MailKeys, ordered: list[str], at_ms: int
) -> tuple[dict[str, int], dict[str, int], dict[str, tuple[str, int]]]:
    """Each tenant's backlog, in flight and SES-fault hold, in one round trip."""
    async with client.pipeline(transaction=False) as pipe:
        for tenant in ordered:
            # The scripts' count: a queue may still hold ids of cancelled jobs.
            pipe.hget(keys.counts(), tenant)
            pipe.zcount(keys.inflight(tenant), "(" + str(at_ms), "+inf")
            read_hold(pipe, keys, tenant)
        counts = await pipe.execute()
    backlog = {t: int(counts[3 * i] or 0) for i, t in enumerate(ordered)}
    inflight = {t: int(counts[3 * i + 1]) for i, t in enumerate(ordered)}
    holds = {
        t: (hold.reason, hold.until_ms)
        for i, t in enumerate(ordered)
        if (hold := parse_hold(counts[3 * i + 2])) is not None and hold.until_ms > at_ms
    }
    return backlog, inflight, holds


class _TenantReader:
    """One tenant's figures, from what was read for every tenant and its own quota
    windows and reputation (two script calls and a read, for tenants in ``detail``)."""

    def __init__(
        self,
        quota: QuotaEngine,
        book: ReputationBook,
        shared: _Shared,
        effective: dict[str, EffectiveLimits],
        backlog: dict[str, int],
        inflight: dict[str, int],
        holds: dict[str, tuple[str, int]],
        detail: Callable[[str], bool] | None,
    ) -> None:
        self.quota, self.book, self.shared = quota, book, shared
        self.effective, self.backlog, self.inflight, self.holds = effective, backlog, inflight, holds
        self.detail = detail
        # Bounded: thousands of tenants must not mean thousands of connections.
        self.slots = asyncio.Semaphore(_CONCURRENT_READS)

    async def read(self, tenant: str) -> ScopeStats:
        eff, shared = self.effective[tenant], self.shared
        windows = eff.windows or ()
        used: list[tuple[Window, int]] = []
        retry = 0.0
        reputation = None
        if self.detail is None or self.detail(tenant):
            async with self.slots:
                if windows:
                    used = await self.quota.usage(tenant, windows)
                    retry = await self.quota.retry_after(tenant, windows)
                reputation = await self.book.read(tenant)
        hold = self.holds.get(tenant)
        return ScopeStats(
            scope=tenant,
            backlog=self.backlog[tenant],
            inflight=self.inflight[tenant],
            windows=[WindowUsage(w.seconds, w.limit, n) for w, n in used],
            limits_source=eff.source + (" + warm-up" if tenant in shared.warming else ""),
            paused=eff.paused,
            retry_after=retry,
            reputation=reputation,
            guard=shared.guards.get(tenant),
            ses_disabled=shared.ses_disabled.get(tenant),
            held_by=hold[0] if hold else None,
            held_until_ms=hold[1] if hold else None,
            warmup=shared.warming.get(tenant),
            provider_holds=shared.provider_held.get(tenant, {}),
        )


async def _global_stats(quota: QuotaEngine, glob: EffectiveLimits, shared: _Shared) -> ScopeStats:
    windows = glob.windows or ()
    used = await quota.usage(None, windows) if windows else []
    retry = await quota.global_retry_after(windows) if windows else 0.0
    return ScopeStats(
        scope="global",
        backlog=max(0, int(shared.totals[0] or 0)),
        inflight=max(0, int(shared.totals[1] or 0)),
        windows=[WindowUsage(w.seconds, w.limit, n) for w, n in used],
        limits_source=glob.source if glob.windows is not None else "auto (no daemon has read SES yet)",
        retry_after=retry,
    )


async def _top(client: redis.asyncio.Redis, keys: MailKeys, sample: int) -> list[str]:
    """The ``sample`` tenants with the largest backlogs, to within a factor of two.

    The scripts raise a tenant's score in :meth:`MailKeys.backlog_top` only when its
    backlog reaches a power of two (no sorted-set write per job), so a drained
    tenant's score is too high until a reader looks: the candidates read here
    get their scores put right, and the largest of them by their true count
    are kept.
    """
    scored: list[Any] = await client.zrevrange(keys.backlog_top(), 0, 2 * sample - 1, withscores=True)
    if not scored:
        return []
    candidates = [text(tenant) for tenant, _ in scored]
    counts = [int(n or 0) for n in await client.hmget(keys.counts(), candidates)]
    stale = [
        (tenant, count)
        for tenant, count, (_, score) in zip(candidates, counts, scored, strict=True)
        if _bucket(count) != int(score)
    ]
    if stale:
        async with client.pipeline(transaction=False) as pipe:
            for tenant, count in stale:
                if _bucket(count):
                    pipe.zadd(keys.backlog_top(), {tenant: _bucket(count)}, xx=True)
                else:
                    pipe.zrem(keys.backlog_top(), tenant)
            await pipe.execute()
    ranked = sorted(zip(counts, candidates, strict=True), key=lambda pair: (-pair[0], pair[1]))
    return [tenant for count, tenant in ranked[:sample] if count > 0]


def _bucket(count: int) -> int:
    """The score :meth:`MailKeys.backlog_top` should hold: the largest power of two not
    above ``count``, or 0 (not there) below 2."""
    return 1 << (count.bit_length() - 1) if count >= 2 else 0
