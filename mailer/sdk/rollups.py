"""Deliverability rollups and the send history: the one owner of their keys.

- **Deliverability by mailbox provider**: for each tenant, day (Redis time, UTC)
  and provider (config/providers.py; ``other`` for the rest), the recipients
  sent, delivered, bounced hard and soft, complained of, suppressed and
  unsubscribed. One hash per tenant and day (:meth:`MailKeys.rollup_prefix`), field
  ``<provider>:<counter>``, kept ``FAIRPOST_DELIVERABILITY__RETENTION_DAYS``: at
  most (named providers + 1) x 7 fields, 63 with every provider named.
- **The send history**: recipients sent per minute over the last hour, over
  every tenant and per tenant (:meth:`MailKeys.send_history`): 60 fields at most,
  gone an hour after the last send.

The daemon writes both with one script call per group of sends or per SES
event (:class:`RollupWriter`, rollups.lua); :class:`Deliverability` reads them
(``fairpost analytics``, the console, an admin tool).

``with Deliverability() as book: book.report("acme", days=14).providers[0].bounce_rate.text()``
reads as ``'3.00% (6 hard bounces / 200 sent)'``.
"""

from __future__ import annotations

from collections import Counter as Tally
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import date, timedelta
from typing import Any

import redis
import redis.asyncio

from fairpost.config import Settings
from fairpost.config.providers import OTHER, by_domain, known
from fairpost.dispatcher.replies import text, time_ms
from fairpost.dispatcher.scripts import lua_source
from fairpost.mailer.errors import InvalidInput
from fairpost.mailer.sdk.connection import RedisOwner
from fairpost.mailer.sdk.failures import redis_operation
from fairpost.mailer.sdk.keys import MailKeys
from fairpost.mailer.sdk.mail import check_tenant_id
from fairpost.mailer.sdk.outcomes import feed
from fairpost.mailer.sdk.suppression import normalize

__all__ = [
    "COUNTERS",
    "UNSUBSCRIBED",
    "Deliverability",
    "ProviderCounts",
    "Rate",
    "Report",
    "RollupWriter",
    "SendHistory",
    "count_outcome",
    "counter_of",
    "outcome_call",
    "rollup_call",
]

COUNTERS = ("sent", "delivered", "hard_bounced", "soft_bounced", "complained", "suppressed", "unsubscribed")
"""What is counted per tenant, day and provider (recipients, not mails)."""

UNSUBSCRIBED = feed.UNSUBSCRIBED
"""The outcome event of a recipient who unsubscribed; counted as ``unsubscribed``."""

_BY_EVENT = {
    feed.SENT: "sent",
    feed.DELIVERED: "delivered",
    feed.COMPLAINED: "complained",
    feed.SUPPRESSED: "suppressed",
    UNSUBSCRIBED: "unsubscribed",
}
MAX_DAYS = 400
MAX_TENANTS = 1000
"""At most this many tenants are read for a report of every tenant."""
_EPOCH = date(1970, 1, 1)
HISTORY_MINUTES = 60


def counter_of(event_type: str, bounce_type: str | None = None) -> str | None:
    """The counter an outcome event feeds (None: none): a ``Permanent`` bounce is
    hard, any other soft, as SES's bounce types say."""
    if event_type == feed.BOUNCED:
        return "hard_bounced" if bounce_type == "Permanent" else "soft_bounced"
    return _BY_EVENT.get(event_type)


def rollup_call(
    keys: MailKeys, settings: Settings, tenant: str, counts: Mapping[tuple[str, str], int], sent_now: int = 0
) -> tuple[list[str], list[str | int]] | None:
    """rollups.lua's KEYS and ARGV (None: nothing to count). ``counts``: (provider,
    counter) → recipients; ``sent_now``: recipients sent, for the send histories."""
    args: list[str | int] = [settings.deliverability.retention_days * 86400, sent_now]
    for (provider, counter), n in counts.items():
        if n > 0:
            args += [f"{provider}:{counter}", n]
    if len(args) == 2 and sent_now <= 0:
        return None
    scopes = (keys.send_history(f"t:{tenant}"), keys.send_history("global"))
    return [keys.rollup_prefix(tenant), *scopes], args


def rollup_source() -> str:
    return lua_source("fairpost.mailer.sdk", "rollups")


def outcome_call(
    keys: MailKeys, settings: Settings, tenant: str, event_type: str, addresses: Sequence[str]
) -> tuple[list[str], list[str | int]] | None:
    """rollups.lua's call counting an outcome recorded outside the daemon's pipelines
    (None: the event type feeds no counter, or no address). The provider is told by
    the domain's name alone (no MX lookup: ``other`` for a hosted domain)."""
    counter = counter_of(event_type)
    if counter is None or not addresses:
        return None
    named = frozenset(settings.deliverability.providers)
    providers = (by_domain(normalize(a).rpartition("@")[2], named) or OTHER for a in addresses)
    return rollup_call(keys, settings, tenant, dict(Tally((p, counter) for p in providers)))


async def count_outcome(
    client: redis.asyncio.Redis, settings: Settings, tenant: str, event_type: str, addresses: Sequence[str]
) -> int:
    """:meth:`Deliverability.count` for asyncio code (the unsubscribe server, the SES
    event consumer): how many recipients were counted."""
    call = outcome_call(MailKeys(settings.key_prefix), settings, tenant, event_type, addresses)
    if call is None:
        return 0
    await client.register_script(rollup_source())(keys=call[0], args=call[1])
    return len(addresses)


class RollupWriter:
    """Queues counts on a caller's pipeline: one script call, no round trip of its own."""

    def __init__(self, client: redis.asyncio.Redis, keys: MailKeys, settings: Settings) -> None:
        self.keys = keys
        self.settings = settings
        self._script = client.register_script(rollup_source())

    async def queue(
        self,
        pipe: redis.asyncio.client.Pipeline,
        tenant: str,
        counts: Mapping[tuple[str, str], int],
        *,
        sent_now: int = 0,
    ) -> None:
        """``counts``: (provider, counter) → recipients; ``sent_now``: recipients sent,
        for the send histories (0: leave them)."""
        call = rollup_call(self.keys, self.settings, tenant, counts, sent_now)
        if call is not None:
            await self._script(keys=call[0], args=call[1], client=pipe)


@dataclass(frozen=True)
class Rate:
    """A share that names what it is a share of: ``numerator / denominator``."""

    numerator: int
    denominator: int
    of: str
    """What is counted, e.g. ``hard bounces``."""
    per: str
    """What it is counted among, e.g. ``sent``."""
    no_data: bool = False
    """The provider sends no such reports (Gmail's complaints): unknown, not 0 %."""

    @property
    def value(self) -> float | None:
        if self.no_data or not self.denominator:
            return None
        return self.numerator / self.denominator

    def text(self) -> str:
        if self.no_data:
            return "no data (the provider sends no complaint reports)"
        value = self.value
        if value is None:
            return f"- (0 {self.per})"
        return f"{value * 100:.2f}% ({self.numerator} {self.of} / {self.denominator} {self.per})"

    def to_json(self) -> dict[str, Any]:
        return {
            "value": None if self.value is None else round(self.value, 6),
            "numerator": self.numerator,
            "denominator": self.denominator,
            "of": self.of,
            "per": self.per,
            "no_data": self.no_data,
        }


@dataclass(frozen=True)
class ProviderCounts:
    provider: str
    counts: dict[str, int]
    """Counter → recipients (every one of :data:`COUNTERS`)."""

    @property
    def complaint_reports(self) -> bool:
        named = known(self.provider)
        return named is None or named.complaint_reports

    @property
    def delivery_rate(self) -> Rate:
        return Rate(self.counts["delivered"], self.counts["sent"], "delivered", "sent")

    @property
    def bounce_rate(self) -> Rate:
        return Rate(self.counts["hard_bounced"], self.counts["sent"], "hard bounces", "sent")

    @property
    def soft_bounce_rate(self) -> Rate:
        return Rate(self.counts["soft_bounced"], self.counts["sent"], "soft bounces", "sent")

    @property
    def complaint_rate(self) -> Rate:
        c = self.counts
        return Rate(c["complained"], c["delivered"], "complaints", "delivered", not self.complaint_reports)

    def to_json(self) -> dict[str, Any]:
        return {
            "provider": self.provider,
            **self.counts,
            "delivery_rate": self.delivery_rate.to_json(),
            "bounce_rate": self.bounce_rate.to_json(),
            "soft_bounce_rate": self.soft_bounce_rate.to_json(),
            "complaint_rate": self.complaint_rate.to_json(),
        }


@dataclass(frozen=True)
class Report:
    """A tenant's deliverability over its last ``len(days)`` days (the oldest first)."""

    tenant: str
    days: list[str]
    """Each day as ``YYYY-MM-DD`` (UTC)."""
    providers: list[ProviderCounts]
    """Totals over the days, the most sent first."""
    daily: dict[str, list[ProviderCounts]] = field(default_factory=dict)
    """Provider → its counts on each of ``days``."""

    def to_json(self) -> dict[str, Any]:
        return {
            "tenant": self.tenant,
            "days": self.days,
            "providers": [p.to_json() for p in self.providers],
            "daily": {
                name: [{"day": d, **p.counts} for d, p in zip(self.days, series, strict=True)]
                for name, series in self.daily.items()
            },
        }


@dataclass(frozen=True)
class SendHistory:
    """Recipients sent in each of the last 60 minutes, the oldest first."""

    minutes: list[tuple[int, int]]
    """(the minute's start, ms; recipients)."""
    at_ms: int


def _zero() -> dict[str, int]:
    return dict.fromkeys(COUNTERS, 0)


def parse_day(raw: Mapping[Any, Any]) -> dict[str, dict[str, int]]:
    """One day's hash as provider → counter → count (fields of no counter are skipped)."""
    found: dict[str, dict[str, int]] = {}
    for name, value in raw.items():
        provider, _, counter = text(name).rpartition(":")
        if counter in COUNTERS and provider:
            found.setdefault(provider, _zero())[counter] = int(value)
    return found


def build_report(tenant: str, first_day: int, raws: list[Mapping[Any, Any]]) -> Report:
    """The report of consecutive days from ``first_day`` (days since 1970), one hash each."""
    days = [(_EPOCH + timedelta(days=first_day + i)).isoformat() for i in range(len(raws))]
    parsed = [parse_day(r) for r in raws]
    names = sorted({p for d in parsed for p in d})
    daily = {n: [ProviderCounts(n, d.get(n, _zero())) for d in parsed] for n in names}
    totals = [
        ProviderCounts(n, {c: sum(p.counts[c] for p in series) for c in COUNTERS})
        for n, series in daily.items()
    ]
    totals.sort(key=lambda p: (p.provider == OTHER, -p.counts["sent"], p.provider))
    return Report(tenant, days, totals, daily)


def parse_history(raw: Mapping[Any, Any], now_ms: int) -> SendHistory:
    """The 60 minutes up to now's, each with what its slot holds if the slot is its."""
    now_minute = now_ms // 60_000
    counts: dict[int, int] = {}
    for value in raw.values():
        minute, _, count = text(value).partition(":")
        if minute.isdigit() and count.isdigit():
            counts[int(minute)] = int(count)
    first = now_minute - HISTORY_MINUTES + 1
    return SendHistory([(m * 60_000, counts.get(m, 0)) for m in range(first, now_minute + 1)], now_ms)


def check_days(days: int) -> int:
    if not isinstance(days, int) or isinstance(days, bool) or not 1 <= days <= MAX_DAYS:
        raise InvalidInput("days", f"must be a whole number from 1 to {MAX_DAYS}")
    return days


class Deliverability(RedisOwner):
    """Read the rollups and send histories (blocking, like an admin tool)."""

    def __init__(self, settings: Settings | None = None, *, redis_client: redis.Redis | None = None) -> None:
        super().__init__(settings, redis_client=redis_client)
        self.keys = MailKeys(self.settings.key_prefix)
        self._script = self._redis.register_script(rollup_source())

    @redis_operation("deliverability: count", writes=True, repeatable=False)
    def count(self, tenant: str, event_type: str, addresses: Sequence[str]) -> int:
        """Count an outcome that happened outside the daemon (``recipient.unsubscribed``,
        recorded by the code that unsubscribes) for these recipients; returns how many
        were counted (0: the event type feeds no counter). The provider is told by the
        domain's name alone here (no MX lookup: ``other`` for a hosted domain)."""
        check_tenant_id(tenant, "tenant")
        call = outcome_call(self.keys, self.settings, tenant, event_type, addresses)
        if call is None:
            return 0
        self._script(keys=call[0], args=call[1])
        return len(addresses)

    @redis_operation("deliverability: report")
    def report(self, tenant: str, *, days: int = 14) -> Report:
        """The tenant's last ``days`` days, today's (UTC, Redis time) included."""
        check_tenant_id(tenant, "tenant")
        check_days(days)
        today = time_ms(self._redis.time()) // 86_400_000
        first = today - days + 1
        with self._redis.pipeline(transaction=False) as pipe:
            for day in range(first, today + 1):
                pipe.hgetall(self.keys.rollup_prefix(tenant) + str(day))
            raws = pipe.execute()
        return build_report(tenant, first, raws)

    @redis_operation("deliverability: send history")
    def send_history(self, tenant: str | None = None) -> SendHistory:
        """Recipients sent per minute over the last hour: the tenant's, or every tenant's."""
        if tenant is not None:
            check_tenant_id(tenant, "tenant")
        scope = "global" if tenant is None else f"t:{tenant}"
        with self._redis.pipeline(transaction=False) as pipe:
            pipe.time()
            pipe.hgetall(self.keys.send_history(scope))
            now, raw = pipe.execute()
        return parse_history(raw, time_ms(now))

    @redis_operation("deliverability: reports")
    def reports(self, *, days: int = 14, limit: int = MAX_TENANTS) -> list[Report]:
        """Every tenant's report that counted anything in the last ``days`` days (of the
        first ``limit`` tenants that ever enqueued, by id), the most sent first."""
        check_days(days)
        tenants = sorted(text(t) for t in self._redis.smembers(self.keys.tenants()))[:limit]
        reports = [self.report(t, days=days) for t in tenants]
        found = [r for r in reports if r.providers]
        found.sort(key=lambda r: -sum(p.counts["sent"] for p in r.providers))
        return found
