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
:func:`collect_stats`. Needs only ``redis`` (``--watch`` needs ``rich``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import redis.asyncio

from fairpost.config import Settings
from fairpost.config.limits import Window, format_limits
from fairpost.config.warmup import stricter
from fairpost.dispatcher.keys import TOTAL_INFLIGHT, TOTAL_WAITING, Keys
from fairpost.dispatcher.redis_memory import RedisMemory, memory_from_info
from fairpost.dispatcher.replies import record, text, time_ms
from fairpost.mailer.quota.engine import QuotaEngine
from fairpost.mailer.quota.holds import parse_hold, read_hold
from fairpost.mailer.quota.overrides import read_auto_limits, read_overrides, resolve_global, resolve_tenant
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
from fairpost.mailer.sdk.outcomes.pending import PendingDeliveries, pending_deliveries

if TYPE_CHECKING:
    from rich.table import Table

__all__ = ["ScopeStats", "Stats", "WindowUsage", "collect_stats", "render_table", "render_text"]

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
    keys: Keys,
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
    guards, ses_disabled = guard_states(values[8]), read_verdicts(values[9])
    events = {text(k): int(v) for k, v in values[10].items()}
    provider_held = {text(t): h for t, raw in values[14].items() if (h := held_providers(raw))}
    warming = {t: WarmupView(t, place) for t, (_, place) in read_places(values[11]).items()}
    book = ReputationBook(client, keys, settings)
    at_ms = time_ms(server_time)
    overrides = read_overrides(raw_overrides, paused)
    if tenants is None:
        # Bounded: every tenant only while they are few, else the top backlogs.
        listed = (
            await client.smembers(keys.tenants()) if known <= sample else await _top(client, keys, sample)
        )
        names = {text(t) for t in listed} | set(settings.tenants) | set(overrides.tenants) | overrides.paused
        names |= set(also) | set(guards) | set(ses_disabled) | set(warming) | set(provider_held)
    else:
        names = set(tenants)
    ordered = sorted(names)

    glob = resolve_global(settings, overrides, read_auto_limits(auto_text))
    effective = {t: resolve_tenant(settings, overrides, t) for t in ordered}
    for tenant in set(warming) & set(effective):
        own = effective[tenant].windows or ()
        effective[tenant] = replace(effective[tenant], windows=stricter(own, warming[tenant].place.limits))

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

    # Bounded: thousands of tenants must not mean thousands of connections.
    slots = asyncio.Semaphore(_CONCURRENT_READS)

    async def tenant_stats(tenant: str) -> ScopeStats:
        eff = effective[tenant]
        windows = eff.windows or ()
        used: list[tuple[Window, int]] = []
        retry = 0.0
        reputation = None
        if detail is None or detail(tenant):
            async with slots:
                if windows:
                    used = await quota.usage(tenant, windows)
                    retry = await quota.retry_after(tenant, windows)
                reputation = await book.read(tenant)
        return ScopeStats(
            scope=tenant,
            backlog=backlog[tenant],
            inflight=inflight[tenant],
            windows=[WindowUsage(w.seconds, w.limit, n) for w, n in used],
            limits_source=eff.source + (" + warm-up" if tenant in warming else ""),
            paused=eff.paused,
            retry_after=retry,
            reputation=reputation,
            guard=guards.get(tenant),
            ses_disabled=ses_disabled.get(tenant),
            held_by=holds[tenant][0] if tenant in holds else None,
            held_until_ms=holds[tenant][1] if tenant in holds else None,
            warmup=warming.get(tenant),
            provider_holds=provider_held.get(tenant, {}),
        )

    async def global_stats() -> ScopeStats:
        windows = glob.windows or ()
        used = await quota.usage(None, windows) if windows else []
        retry = await quota.global_retry_after(windows) if windows else 0.0
        return ScopeStats(
            scope="global",
            backlog=max(0, int(totals[0] or 0)),
            inflight=max(0, int(totals[1] or 0)),
            windows=[WindowUsage(w.seconds, w.limit, n) for w, n in used],
            limits_source=glob.source if glob.windows is not None else "auto (no daemon has read SES yet)",
            retry_after=retry,
        )

    results = await asyncio.gather(global_stats(), *(tenant_stats(t) for t in ordered))
    return Stats(
        at_ms=at_ms,
        global_=results[0],
        tenants=list(results[1:]),
        replicas=sorted(text(r) for r in replicas),
        reconciled={k: int(v) for k, v in record(reconciled).items()},
        known_tenants=int(known),
        events=events,
        webhooks=await pending_deliveries(client, keys),
        memory=memory_from_info(values[12], values[13]),
    )


async def _top(client: redis.asyncio.Redis, keys: Keys, sample: int) -> list[str]:
    """The ``sample`` tenants with the largest backlogs, to within a factor of two.

    The scripts raise a tenant's score in :meth:`Keys.backlog_top` only when its
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
    """The score :meth:`Keys.backlog_top` should hold: the largest power of two not
    above ``count``, or 0 (not there) below 2."""
    return 1 << (count.bit_length() - 1) if count >= 2 else 0


# -- rendering -------------------------------------------------------------------


def _usage(windows: Sequence[WindowUsage]) -> str:
    return ", ".join(f"{w.used}/{w.limit} per {w.name}" for w in windows) or "-"


def _state(scope: ScopeStats) -> str:
    if scope.ses_disabled is not None:
        return "parked: SES disabled its SES tenant"
    if scope.guard is not None and scope.guard.level == "paused":
        return "paused by the reputation guard"
    if scope.paused:
        return "paused"
    if scope.held_by:
        return f"held ({scope.held_by})"
    if scope.retry_after < 0:
        return "blocked (limit too small)"
    if scope.retry_after > 0:
        return f"throttled {scope.retry_after:.1f}s"
    if scope.guard is not None:
        return "throttled by the reputation guard"
    if scope.provider_holds:
        return "held at " + ", ".join(sorted(scope.provider_holds))
    return "ok"


def _rates(scope: ScopeStats) -> str:
    if scope.reputation is None:
        return "-"
    return (
        ", ".join(
            f"{w.bounce_rate:.1%} / {w.complaint_rate:.2%} ({w.name})"
            for w in scope.reputation.windows
            if w.sends
        )
        or "-"
    )


_HEADERS = ("scope", "backlog", "in flight", "sent / limit", "state", "limits from", "bounce / complaint")


def _rows(stats: Stats) -> list[tuple[str, ...]]:
    rows: list[tuple[str, ...]] = []
    for scope in [stats.global_, *stats.tenants]:
        name = "(global)" if scope is stats.global_ else scope.scope
        rows.append(
            (
                name,
                str(scope.backlog),
                str(scope.inflight),
                _usage(scope.windows),
                _state(scope),
                scope.limits_source,
                _rates(scope),
            )
        )
    return rows


def render_text(stats: Stats) -> str:
    """A plain table, for a terminal or a log."""
    rows = [_HEADERS, *_rows(stats)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(_HEADERS))]
    lines = ["  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip() for row in rows]
    lines.append(_caption(stats))
    lines.append(_reconciled(stats))
    lines += [f"{t}: {p.describe(stats.at_ms)}" for t, p in sorted(stats.webhooks.items())]
    for scope in stats.tenants:
        if scope.guard is not None:
            stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(scope.guard.at_ms / 1000))
            guard = scope.guard
            lines.append(
                f"{scope.scope}: {guard.level} by the reputation guard at {stamp} UTC: {guard.reason}"
            )
        for provider, hold in sorted(scope.provider_holds.items()):
            stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(hold.at_ms / 1000))
            lines.append(
                f"{scope.scope}: mail to {provider} held by the reputation guard at {stamp} UTC: "
                + hold.reason
            )
        if scope.warmup is not None:
            lines.append(f"{scope.scope}: {scope.warmup.describe(stats.at_ms)}")
        if scope.ses_disabled is not None:
            v = scope.ses_disabled
            lines.append(
                f"{scope.scope}: SES tenant {v.ses_tenant} disabled (AWS-managed {v.aws_managed}, "
                f"customer-managed {v.customer_managed})"
            )
    return "\n".join(lines)


def _reconciled(stats: Stats) -> str:
    again, dead = stats.reconciled.get("handed_again", 0), stats.reconciled.get("dead", 0)
    return f"jobs SQS lost: {again} handed to SQS again, {dead} dead-lettered"


def _caption(stats: Stats) -> str:
    caption = f"replicas alive: {len(stats.replicas)} ({', '.join(stats.replicas) or 'none'})"
    if stats.memory is not None:
        caption += "; " + stats.memory.describe()
    if stats.known_tenants > len(stats.tenants):
        caption += (
            f"; {len(stats.tenants)} of {stats.known_tenants} tenants shown (those with the largest backlogs)"
        )
    return caption


def render_table(stats: Stats) -> Table:
    """The same as :func:`render_text`, as a rich table (``--watch``)."""
    from rich.table import Table

    stamp = time.strftime("%H:%M:%S", time.localtime(stats.at_ms / 1000))
    table = Table(
        title=f"fairpost at {stamp}",
        caption=_caption(stats) + "; " + _reconciled(stats),
    )
    for header in _HEADERS:
        table.add_column(header, justify="right" if header in ("backlog", "in flight") else "left")
    for row in _rows(stats):
        style = "bold" if row[0] == "(global)" else None
        table.add_row(*row, style=style)
    return table
