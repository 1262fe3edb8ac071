"""The reputation guard per mailbox provider: a tenant held for one provider only.

The tenant-wide guard (:mod:`.reputation`) cannot tell one tenant's bad Gmail
list from a problem everywhere, so it can only pause the whole tenant. With
``FAIRPOST_REPUTATION__PER_PROVIDER``, this guard judges each tenant's rates
at each named provider (config/providers.py; never ``other``, which is no one
provider), from the deliverability rollups (:mod:`fairpost.mailer.sdk.rollups`:
sent, hard bounces, complaints per tenant, day and provider) over
:data:`WINDOW_DAYS` days (today and yesterday, UTC, Redis time: the last 24 to
48 hours). A provider whose bounce or complaint rate reaches the guard's
threshold (the tenant-wide guard's: ``BOUNCE_THRESHOLD``,
``COMPLAINT_THRESHOLD``), counted over at least ``PROVIDER_MIN_SENDS`` sends to
it, holds the tenant for that provider: its mail with a recipient there waits
(``waiting_for`` = ``provider_paused:<provider>``, :func:`hold_reason`), its
mail to the others goes on (fairpost.mailer.daemon.provider_holds enforces it).

The guard judges a tenant when a bounce or complaint of it is counted, and every
``PROVIDER_RECHECK_SECONDS`` each tenant it holds: a hold lifts by itself once
the rate is back under (the days that held the bounces leave the window; held
mail sends none, so only time lowers it), or when an operator resumes the
tenant (:func:`lift_provider_holds`: the guard then judges only what came after).

This module owns the guard's keys (:meth:`MailKeys.provider_guard`,
:meth:`MailKeys.provider_guard_base`); the decision, :func:`judge_providers`, is pure.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import redis
import redis.asyncio

from fairpost.config import Settings
from fairpost.config.providers import OTHER, known
from fairpost.dispatcher.backoff import OutageBackoff
from fairpost.dispatcher.loop import OnError, forever
from fairpost.dispatcher.replies import text, time_ms
from fairpost.mailer.sdk.keys import MailKeys
from fairpost.mailer.sdk.rollups import parse_day

__all__ = [
    "HOLD_PREFIX",
    "WINDOW_DAYS",
    "ProviderGuard",
    "ProviderHold",
    "ProviderWindow",
    "held_providers",
    "hold_reason",
    "judge_providers",
    "lift_provider_holds",
    "read_provider_holds",
]

log = logging.getLogger("fairpost.reputation")

WINDOW_DAYS = 2
"""The rollup days a provider's rates are counted over: today's and yesterday's."""

HOLD_PREFIX = "provider_paused:"


def hold_reason(provider: str) -> str:
    """The reason a mail held for ``provider`` waits (its ``waiting_for``, stats, metrics)."""
    return HOLD_PREFIX + provider


@dataclass(frozen=True)
class ProviderWindow:
    """A tenant's counts at one provider over the window (what the guard judges)."""

    sends: int
    bounces: int
    """Hard (``Permanent``) bounces: what SES counts."""
    complaints: int


@dataclass(frozen=True)
class ProviderHold:
    """The guard holds a tenant for one provider, and why."""

    provider: str
    reason: str
    """E.g. ``bounce rate 20.00% at gmail (4 of 20 sends) >= 4.00%``."""
    bounce_rate: float
    complaint_rate: float
    sends: int
    at_ms: int
    """Redis time the hold began."""

    @property
    def waiting_for(self) -> str:
        return hold_reason(self.provider)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def judge_providers(
    windows: Mapping[str, ProviderWindow], settings: Settings
) -> dict[str, tuple[str, float, float]]:
    """The providers the tenant is to be held for: provider → (why, bounce rate,
    complaint rate). A rate's denominator is the provider's sends, at least
    ``provider_min_sends``; ``other`` is never held, nor a provider's complaints
    judged where it sends no complaint reports (Gmail: always 0, not a good rate)."""
    r = settings.reputation
    held: dict[str, tuple[str, float, float]] = {}
    for provider, w in sorted(windows.items()):
        if provider == OTHER:
            continue
        denominator = max(w.sends, r.provider_min_sends)
        bounce_rate, complaint_rate = w.bounces / denominator, w.complaints / denominator
        named = known(provider)
        reports = named is None or named.complaint_reports
        counted = f"{max(w.sends, w.bounces)} sends" + (
            f", counted as {r.provider_min_sends}" if w.sends < r.provider_min_sends else ""
        )
        if bounce_rate >= r.bounce_threshold:
            why = f"bounce rate {bounce_rate:.2%} at {provider} ({w.bounces} of {counted})"
            held[provider] = (f"{why} >= {r.bounce_threshold:.2%}", bounce_rate, complaint_rate)
        elif reports and complaint_rate >= r.complaint_threshold:
            why = f"complaint rate {complaint_rate:.2%} at {provider} ({w.complaints} of {counted})"
            held[provider] = (f"{why} >= {r.complaint_threshold:.2%}", bounce_rate, complaint_rate)
    return held


DayCounts = dict[str, dict[str, list[int]]]
"""Day (days since 1970, as text) → provider → [sent, hard bounced, complained]."""


def day_counts(first_day: int, raws: Sequence[Mapping[Any, Any]]) -> DayCounts:
    """The rollup hashes of consecutive days from ``first_day``, as the guard counts them."""
    out: DayCounts = {}
    for i, raw in enumerate(raws):
        out[str(first_day + i)] = {
            p: [c["sent"], c["hard_bounced"], c["complained"]] for p, c in parse_day(raw).items()
        }
    return out


def windows_since(now: DayCounts, base: DayCounts) -> dict[str, ProviderWindow]:
    """Each provider's window: the days' counts, less what a day held when an operator
    lifted the tenant's holds (``base``), day by day."""
    totals: dict[str, list[int]] = {}
    for day, providers in now.items():
        for provider, counts in providers.items():
            before = base.get(day, {}).get(provider, [0, 0, 0])
            sums = totals.setdefault(provider, [0, 0, 0])
            for i in range(3):
                sums[i] += max(0, counts[i] - before[i])
    return {p: ProviderWindow(*t) for p, t in totals.items()}


def held_providers(raw: bytes | str | None) -> dict[str, ProviderHold]:
    """A tenant's field of the guard's hash, parsed (an unreadable one holds nothing)."""
    if raw is None:
        return {}
    try:
        data = json.loads(raw)
        return {p: ProviderHold(**v) for p, v in data.items()}
    except (ValueError, TypeError, AttributeError):
        log.warning("ignoring an unreadable provider guard state")
        return {}


def _encode(holds: Mapping[str, ProviderHold]) -> str:
    return json.dumps({p: h.to_json() for p, h in sorted(holds.items())})


def _parse_base(raw: bytes | str | None) -> DayCounts:
    if raw is None:
        return {}
    try:
        data: DayCounts = json.loads(raw)
        return data
    except ValueError:
        return {}


OnAction = Callable[[str, str, ProviderHold], Awaitable[Any]]
"""Told of each hold (``provider_pause``) and lift (``provider_resume``): tenant, action, hold."""


class ProviderGuard:
    """Judges tenants' rates per provider and keeps the holds (the daemon's side)."""

    def __init__(
        self,
        client: redis.asyncio.Redis,
        keys: MailKeys,
        settings: Settings,
        *,
        on_action: OnAction | None = None,
    ) -> None:
        self._redis = client
        self._keys = keys
        self._settings = settings
        self._on_action = on_action
        self.enabled = settings.reputation.per_provider

    async def judge(self, tenant: str) -> dict[str, ProviderHold]:
        """Judge the tenant now; hold it for each provider over a threshold, lift the
        holds of those back under. Returns its holds as they stand."""
        if not self.enabled:
            return {}
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.time()
            pipe.get(self._keys.provider_guard_base(tenant))
            pipe.hget(self._keys.provider_guard(), tenant)
            now_raw, base, current_raw = await pipe.execute()
        now_ms = time_ms(now_raw)
        first = now_ms // 86_400_000 - WINDOW_DAYS + 1
        async with self._redis.pipeline(transaction=False) as pipe:
            for day in range(first, first + WINDOW_DAYS):
                pipe.hgetall(self._keys.rollup_prefix(tenant) + str(day))
            raws = await pipe.execute()
        windows = windows_since(day_counts(first, raws), _parse_base(base))
        verdict = judge_providers(windows, self._settings)
        current = held_providers(current_raw)
        holds: dict[str, ProviderHold] = {}
        for provider, (why, bounce_rate, complaint_rate) in verdict.items():
            holds[provider] = current.get(provider) or ProviderHold(
                provider, why, round(bounce_rate, 6), round(complaint_rate, 6),
                windows[provider].sends, now_ms,
            )  # fmt: skip
        if holds == current:
            return holds
        if holds:
            await self._redis.hset(self._keys.provider_guard(), tenant, _encode(holds))
        else:
            await self._redis.hdel(self._keys.provider_guard(), tenant)
        for provider in sorted(holds.keys() - current.keys()):
            hold = holds[provider]
            log.error(
                "reputation guard holds the tenant's mail to %s: %s (fairpost tenant resume lifts it)",
                provider, hold.reason, extra={"tenant": tenant},
            )  # fmt: skip
            await self._told(tenant, "provider_pause", hold)
        for provider in sorted(current.keys() - holds.keys()):
            log.info(
                "reputation guard lifted the tenant's hold at %s: its rate is back under",
                provider, extra={"tenant": tenant},
            )  # fmt: skip
            await self._told(tenant, "provider_resume", current[provider])
        return holds

    async def recheck(self) -> None:
        """Judge again every tenant held now (a hold lifts once its rate is back under)."""
        if not self.enabled:
            return
        for tenant in sorted(text(t) for t in await self._redis.hkeys(self._keys.provider_guard())):
            await self.judge(tenant)

    async def run(self, stop: asyncio.Event, on_error: OnError | None = None) -> None:
        """:meth:`recheck` every ``PROVIDER_RECHECK_SECONDS`` until ``stop``."""

        async def step() -> float:
            await self.recheck()
            return self._settings.reputation.provider_recheck_seconds

        backoff = OutageBackoff(self._settings.max_outage_seconds)
        await forever("provider-guard", step, stop, backoff=backoff, on_error=on_error)

    async def _told(self, tenant: str, action: str, hold: ProviderHold) -> None:
        if self._on_action is not None:
            await self._on_action(tenant, action, hold)


async def read_provider_holds(
    client: redis.asyncio.Redis, keys: MailKeys
) -> dict[str, dict[str, ProviderHold]]:
    """Every tenant held for a provider: tenant → provider → hold."""
    raw = await client.hgetall(keys.provider_guard())
    found = {text(t): held_providers(v) for t, v in raw.items()}
    return {t: h for t, h in found.items() if h}


def lift_provider_holds(client: redis.Redis, keys: MailKeys, tenant: str) -> list[str]:
    """An operator resumed the tenant: lift its provider holds, and let the guard judge
    only what comes after (the window's counts as they are now become the base it
    subtracts). Blocking; returns the providers lifted."""
    lifted = sorted(held_providers(client.hget(keys.provider_guard(), tenant)))
    if not lifted:
        return []
    now_ms = time_ms(client.time())
    first = now_ms // 86_400_000 - WINDOW_DAYS + 1
    with client.pipeline(transaction=False) as pipe:
        for day in range(first, first + WINDOW_DAYS):
            pipe.hgetall(keys.rollup_prefix(tenant) + str(day))
        raws = pipe.execute()
    base = day_counts(first, raws)
    with client.pipeline(transaction=True) as pipe:
        pipe.hdel(keys.provider_guard(), tenant)
        if any(base.values()):  # (none: the window's days have no counts left)
            # Kept as long as its days are in the window.
            pipe.set(keys.provider_guard_base(tenant), json.dumps(base), ex=WINDOW_DAYS * 86_400)
        pipe.execute()
    log.info("provider holds lifted by an operator: %s", ", ".join(lifted), extra={"tenant": tenant})
    return lifted
