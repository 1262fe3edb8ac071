"""Each tenant's reputation (bounce and complaint rates), and the guard that acts on it.

SES reviews or pauses a whole *account* whose bounce rate passes about 5 %
or complaint rate about 0.1 %; one tenant's bad list would do that to every
tenant. So fairpost counts, per tenant, the recipients it sent, the
recipients that bounced for good (``Permanent`` bounces: what SES counts)
and those who complained, over sliding windows of 24 hours and 7 days
(``reputation.lua``: bucketed like the quota windows, Redis time), and the
guard acts before SES would:

- at ``throttle_at`` of a threshold (default half), the tenant is throttled
  to ``throttle_limits`` (a live quota override, unless an operator set one);
  back under it, the throttle is lifted again by itself;
- at a threshold (default bounce 4 %, complaint 0.08 %), the tenant is
  paused, as an operator pause would (its queue waits in Redis, its mail in
  SQS is parked), with the reason, the rates and the time kept for ``stats``.

A rate is counted over at least ``min_sends`` sends (default 200): with
fewer, the denominator is ``min_sends``, so a tenant's first bounces weigh
as they would among that many sends, and one bounce among three sends
pauses nobody. Only an operator lifts a pause (``fairpost tenant resume``,
:func:`lift_guard`); the guard then judges only what comes after the lift.

This module owns the windows' and the guard's keys; it needs only ``redis``.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal

import redis
import redis.asyncio

from fairpost.config import Settings
from fairpost.config.limits import Limits, Window, format_limits
from fairpost.dispatcher.replies import text
from fairpost.dispatcher.scripts import lua_source
from fairpost.mailer.sdk.keys import MailKeys

__all__ = [
    "WINDOWS",
    "GuardState",
    "Reputation",
    "ReputationBook",
    "TenantVerdict",
    "WindowCounts",
    "judge",
    "lift_guard",
    "read_verdicts",
    "window_name",
]

log = logging.getLogger("fairpost.reputation")

WINDOWS = (86_400, 7 * 86_400)
"""The sliding windows rates are counted over: 24 hours and 7 days."""

_NAMES = {86_400: "24h", 7 * 86_400: "7d"}

Level = Literal["throttled", "paused"]
Verdict = Literal["ok", "throttle", "pause"]


def window_name(seconds: int) -> str:
    return _NAMES.get(seconds, f"{seconds}s")


@dataclass(frozen=True)
class WindowCounts:
    seconds: int
    sends: int
    bounces: int
    complaints: int
    judged_sends: int
    """Sends the guard judges: those since an operator last lifted it."""
    judged_bounces: int
    judged_complaints: int

    @property
    def name(self) -> str:
        return window_name(self.seconds)

    @property
    def bounce_rate(self) -> float:
        return self.bounces / self.sends if self.sends else 0.0

    @property
    def complaint_rate(self) -> float:
        return self.complaints / self.sends if self.sends else 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "window": self.name,
            "sends": self.sends,
            "bounces": self.bounces,
            "complaints": self.complaints,
            "bounce_rate": round(self.bounce_rate, 6),
            "complaint_rate": round(self.complaint_rate, 6),
        }


@dataclass(frozen=True)
class GuardState:
    """What the guard did to a tenant, and why."""

    level: Level
    reason: str
    """E.g. ``bounce rate 4.5% over 24h (9 of 200 sends) >= 4%``."""
    bounce_rate: float
    complaint_rate: float
    window: str
    at_ms: int
    """Redis time of the action."""
    override: str | None = None
    """The throttle limits the guard set as the tenant's override, if it set one."""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, raw: bytes | str | None) -> GuardState | None:
        if raw is None:
            return None
        try:
            data = json.loads(raw)
            return cls(**data)
        except (ValueError, TypeError):
            log.warning("ignoring an unreadable reputation guard state")
            return None


@dataclass(frozen=True)
class Reputation:
    tenant: str
    at_ms: int
    windows: tuple[WindowCounts, ...]
    guard: GuardState | None
    recent_bounces: int | None = None
    """Permanent bounces among the tenant's last ``min_sends`` sends (known when a bounce
    was just counted): the guard's quickest measure, whatever the day before held."""

    def window(self, seconds: int) -> WindowCounts | None:
        return next((w for w in self.windows if w.seconds == seconds), None)

    def to_json(self) -> dict[str, Any]:
        return {
            "windows": [w.to_json() for w in self.windows],
            "guard": None if self.guard is None else self.guard.to_json(),
        }


def judge(rep: Reputation, settings: Settings) -> tuple[Verdict, str, WindowCounts | None]:
    """What the guard should do now, why, and in which window."""
    r = settings.reputation
    worst: tuple[Verdict, str, WindowCounts | None] = ("ok", "", None)
    if rep.recent_bounces is not None:
        # A list gone bad today is caught as fast after a good week as on a first day.
        rate = rep.recent_bounces / r.min_sends
        why = f"bounce rate {rate:.2%} over the last {r.min_sends} sends ({rep.recent_bounces} bounced)"
        if rate >= r.bounce_threshold:
            return "pause", f"{why} >= {r.bounce_threshold:.2%}", None
        if rate >= r.bounce_threshold * r.throttle_at:
            worst = ("throttle", f"{why} >= {r.bounce_threshold * r.throttle_at:.2%}", None)
    for w in rep.windows:
        denominator = max(w.judged_sends, r.min_sends)
        for what, count, threshold in (
            ("bounce", w.judged_bounces, r.bounce_threshold),
            ("complaint", w.judged_complaints, r.complaint_threshold),
        ):
            rate = count / denominator
            why = (
                f"{what} rate {rate:.2%} over {w.name} ({count} of {max(w.judged_sends, count)} sends"
                + (f", counted as {r.min_sends}" if w.judged_sends < r.min_sends else "")
                + ")"
            )
            if rate >= threshold:
                return "pause", f"{why} >= {threshold:.2%}", w
            if rate >= threshold * r.throttle_at and worst[0] == "ok":
                worst = ("throttle", f"{why} >= {threshold * r.throttle_at:.2%}", w)
    return worst


class ReputationBook:
    """Counts a tenant's sends, bounces and complaints, and applies the guard.

    ``on_action(tenant, action)`` is told of every guard action this replica
    takes (``throttle``, ``pause``, ``unthrottle``), for the metrics.
    """

    def __init__(
        self,
        client: redis.asyncio.Redis,
        keys: MailKeys,
        settings: Settings,
        *,
        on_action: Callable[[str, str], Awaitable[Any]] | None = None,
    ) -> None:
        self._redis = client
        self._keys = keys
        self._settings = settings
        self._on_action = on_action
        self._script = client.register_script(lua_source("fairpost.mailer.quota", "reputation"))
        self._recent = client.register_script(lua_source("fairpost.mailer.quota", "recent_bounces"))

    async def record(
        self,
        tenant: str,
        *,
        sends: int = 0,
        bounces: int = 0,
        complaints: int = 0,
        bounced: tuple[str, int] | None = None,
    ) -> Reputation:
        """Count what happened and let the guard judge the tenant. ``bounced``: the job
        id and send number (its record's ``send_seq``; 0 unknown) of the mail whose
        ``bounces`` recipients bounced for good, for the last-sends measure."""
        rep = await self.read(tenant, sends=sends, bounces=bounces, complaints=complaints)
        return await self.judged(rep, sends=sends, bounces=bounces, bounced=bounced)

    async def queue_sends(self, pipe: redis.asyncio.client.Pipeline, tenant: str, sends: int) -> None:
        """Queue on ``pipe`` what :meth:`record` counts of ``sends``, beside the caller's
        other writes (one round trip for them all): its one reply, read by
        :meth:`reputation`, is for :meth:`judged`."""
        await self._script(keys=self._read_keys(tenant), args=[sends, 0, 0, tenant, *WINDOWS], client=pipe)

    @staticmethod
    def reputation(tenant: str, reply: Sequence[Any]) -> Reputation:
        """The reply of a call :meth:`queue_sends` queued."""
        return _reputation(tenant, reply)

    async def judged(
        self,
        rep: Reputation,
        *,
        sends: int = 0,
        bounces: int = 0,
        bounced: tuple[str, int] | None = None,
    ) -> Reputation:
        """What the guard does of ``rep``, the tenant's reputation just counted
        (:meth:`record`'s second half)."""
        tenant = rep.tenant
        throttled_now = rep.guard is not None and rep.guard.level == "throttled"
        if (bounced is not None and bounces > 0) or throttled_now:
            # On a bounce, place it among the last sends; while throttled, read where the
            # last sends stand, so that sends lift the throttle only when that measure
            # has fallen back too (not on the windows alone).
            job_id, seq = bounced if bounced is not None and bounces > 0 else ("", 0)
            recent, _ = await self._recent(
                keys=[self._keys.send_seq(tenant), self._keys.recent_bounces(tenant)],
                args=[
                    job_id,
                    seq,
                    bounces if job_id else 0,
                    self._settings.reputation.min_sends,
                    self._settings.job_ttl * 1000,
                ],
            )
            rep = dataclasses.replace(rep, recent_bounces=int(recent))
        verdict, reason, window = judge(rep, self._settings)
        current = rep.guard.level if rep.guard else None
        if verdict == "pause" and current != "paused":
            await self._pause(rep, reason, window)
        elif verdict == "throttle" and current is None:
            await self._throttle(rep, reason, window)
        elif verdict == "ok" and current == "throttled" and sends > 0:
            await self._unthrottle(rep)
        return rep

    async def read(self, tenant: str, *, sends: int = 0, bounces: int = 0, complaints: int = 0) -> Reputation:
        keys = self._read_keys(tenant)
        flat: list[Any] = await self._script(keys=keys, args=[sends, bounces, complaints, tenant, *WINDOWS])
        return _reputation(tenant, flat)

    async def read_many(self, tenants: Sequence[str]) -> list[Reputation]:
        """:meth:`read` for several tenants, in one round trip."""
        if not tenants:
            return []
        async with self._redis.pipeline(transaction=False) as pipe:
            for tenant in tenants:
                await self._script(
                    keys=self._read_keys(tenant), args=[0, 0, 0, tenant, *WINDOWS], client=pipe
                )
            replies = await pipe.execute()
        return [_reputation(tenant, flat) for tenant, flat in zip(tenants, replies, strict=True)]

    def _read_keys(self, tenant: str) -> list[str]:
        keys: list[str] = []
        for seconds in WINDOWS:
            keys += [self._keys.reputation(tenant, seconds), self._keys.reputation_base(tenant, seconds)]
        keys.append(self._keys.guard())
        return keys

    def _state(self, rep: Reputation, level: Level, reason: str, window: WindowCounts | None) -> GuardState:
        w = window or rep.windows[0]
        bounce_rate, name = w.bounce_rate, w.name
        if window is None and rep.recent_bounces is not None:
            # Judged by the last sends: report that measure, not the day's.
            n = self._settings.reputation.min_sends
            bounce_rate, name = rep.recent_bounces / n, f"last {n} sends"
        return GuardState(
            level=level,
            reason=reason,
            bounce_rate=round(bounce_rate, 6),
            complaint_rate=round(w.complaint_rate, 6),
            window=name,
            at_ms=rep.at_ms,
            override=rep.guard.override if rep.guard else None,
        )

    async def _throttle(self, rep: Reputation, reason: str, window: WindowCounts | None) -> None:
        limits = format_limits(
            throttled(self._settings.limits_for(rep.tenant), self._settings.reputation.throttle_limits)
        )
        # An operator's own override of the tenant wins: the guard only adds one.
        mine = await self._redis.hsetnx(self._keys.limit_overrides(), "t:" + rep.tenant, limits)
        state = self._state(rep, "throttled", reason, window)
        if mine:
            state = GuardState(**{**state.to_json(), "override": limits})
        await self._redis.hset(self._keys.guard(), rep.tenant, json.dumps(state.to_json()))
        log.warning(
            "reputation guard throttles the tenant to %s: %s", limits, reason, extra={"tenant": rep.tenant}
        )
        await self._told(rep.tenant, "throttle")

    async def _pause(self, rep: Reputation, reason: str, window: WindowCounts | None) -> None:
        state = self._state(rep, "paused", reason, window)
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.sadd(self._keys.paused(), rep.tenant)
            pipe.hset(self._keys.guard(), rep.tenant, json.dumps(state.to_json()))
            await pipe.execute()
        log.error(
            "reputation guard paused the tenant: %s (fairpost tenant resume lifts it)",
            reason,
            extra={"tenant": rep.tenant},
        )
        await self._told(rep.tenant, "pause")

    async def _unthrottle(self, rep: Reputation) -> None:
        assert rep.guard is not None
        await _drop_override(self._redis, self._keys, rep.tenant, rep.guard)
        await self._redis.hdel(self._keys.guard(), rep.tenant)
        log.info(
            "reputation guard lifted the tenant's throttle: rates back under", extra={"tenant": rep.tenant}
        )
        await self._told(rep.tenant, "unthrottle")

    async def _told(self, tenant: str, action: str) -> None:
        if self._on_action is not None:
            await self._on_action(tenant, action)


async def _drop_override(client: redis.asyncio.Redis, keys: MailKeys, tenant: str, state: GuardState) -> None:
    if state.override is None:
        return
    current = await client.hget(keys.limit_overrides(), "t:" + tenant)
    if current is not None and text(current) == state.override:
        await client.hdel(keys.limit_overrides(), "t:" + tenant)


def throttled(own: Limits, throttle: Limits) -> Limits:
    """The tenant's own windows with the throttle's added, the lower limit where both
    have a window of one length: a throttle only ever lowers what the tenant may send."""
    merged: dict[int, int] = {w.seconds: w.limit for w in own}
    for w in throttle:
        merged[w.seconds] = min(w.limit, merged.get(w.seconds, w.limit))
    return tuple(sorted(Window(seconds, limit) for seconds, limit in merged.items()))


def lift_guard(client: redis.Redis, keys: MailKeys, tenant: str) -> GuardState | None:
    """An operator resumed the tenant: lift the guard's pause and throttle, and let it
    judge only what comes after (blocking; called by ``fairpost tenant resume``)."""
    state = GuardState.from_json(client.hget(keys.guard(), tenant))
    if state is None:
        return None
    with client.pipeline(transaction=True) as pipe:
        pipe.hdel(keys.guard(), tenant)
        # The last-sends measure starts afresh too.
        pipe.delete(keys.recent_bounces(tenant))
        for seconds in WINDOWS:
            # The window as it is now becomes the base the guard subtracts.
            pipe.copy(keys.reputation(tenant, seconds), keys.reputation_base(tenant, seconds), replace=True)
            pipe.expire(keys.reputation_base(tenant, seconds), seconds)
        pipe.execute()
    if state.override is not None:
        current = client.hget(keys.limit_overrides(), "t:" + tenant)
        if current is not None and text(current) == state.override:
            client.hdel(keys.limit_overrides(), "t:" + tenant)
    log.info(
        "reputation guard lifted by an operator (was %s: %s)",
        state.level,
        state.reason,
        extra={"tenant": tenant},
    )
    return state


def guard_states(raw: dict[Any, Any]) -> dict[str, GuardState]:
    """The guard hash as read (``HGETALL``), parsed."""
    states = {}
    for tenant, value in raw.items():
        state = GuardState.from_json(value)
        if state is not None:
            states[text(tenant)] = state
    return states


@dataclass(frozen=True)
class TenantVerdict:
    """An SES tenant's sending status as ``GetReputationEntity`` gave it."""

    ses_tenant: str
    aggregate: str
    aws_managed: str | None
    customer_managed: str | None
    cause: str | None
    checked_ms: int

    @property
    def disabled(self) -> bool:
        return self.aggregate == "DISABLED"

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def read_verdicts(raw: dict[Any, Any]) -> dict[str, TenantVerdict]:
    """The Redis hash of disabled tenants, parsed (unreadable entries skipped)."""
    verdicts = {}
    for tenant, value in raw.items():
        try:
            verdicts[text(tenant)] = TenantVerdict(**json.loads(value))
        except (TypeError, ValueError):
            continue
    return verdicts


def _reputation(tenant: str, flat: Sequence[Any]) -> Reputation:
    at_ms = int(flat[0])
    guard = GuardState.from_json(flat[1]) if flat[1] else None
    windows = []
    stride = 6 if int(flat[2]) else 3  # with no base, the judged counts are the window's own
    for i, seconds in enumerate(WINDOWS):
        counts = [int(v) for v in flat[3 + stride * i : 3 + stride * (i + 1)]]
        windows.append(WindowCounts(seconds, *counts[:3], *counts[-3:]))
    return Reputation(tenant, at_ms, tuple(windows), guard)
