"""Whether a tenant may send now: every hold on it, asked and told in one place.

A hold keeps one tenant's mail waiting in SQS whatever its quota; the sender
asks :meth:`Holds.of` once per group and parks the mail for the hold's
``recheck``. Its reasons, and who writes them:

- ``paused``: an operator's pause (``fairpost tenant pause``: the dispatcher's
  ``paused`` set, read through the live overrides);
- ``reputation_paused``: the reputation guard's pause (the same set; the guard's
  hash says it was the guard, fairpost.mailer.quota.reputation);
- ``ses_tenant_disabled``: SES disabled the tenant's SES tenant
  (fairpost.mailer.daemon.ses_tenant_status reads SES and shares the verdict);
- ``ses_<code>``: SES refused the tenant's own set-up (:meth:`Holds.hold_for_ses`,
  stored by fairpost.mailer.quota.holds); when it ends one mail rechecks it
  (:meth:`Holds.probing`), and a send clears it (:meth:`Holds.sent`).

Not a tenant's hold: the account's (SES throttling or pausing the whole
account, the global quota: fairpost.mailer.daemon.gate holds every tenant) and
the quota's park (fairpost.mailer.daemon.parking). Every park and hold keeps the
tenant's in-flight slots and jobs alive as long, the one way
(:meth:`Holds.keep_alive`).

A change of any hold, or of the limits a park waited for, is one event,
:meth:`Holds.changed`: the sender brings the tenant's parked mail back at once.
``fairpost tenant resume`` lifts the holds an operator may lift
(fairpost.mailer.quota.holds.LIFTED_BY_RESUME); every replica sees it within
a refresh of the live overrides (:meth:`Holds.refresh`, on their schedule).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

from fairpost.config import Settings
from fairpost.dispatcher.store import JobStore
from fairpost.mailer.quota.holds import SES_TENANT_DISABLED, TenantHolds
from fairpost.mailer.quota.reputation import guard_states
from fairpost.mailer.sdk.keys import mail_keys

__all__ = ["PAUSED_RECHECK_SECONDS", "Hold", "Holds", "SesTenants"]

log = logging.getLogger("fairpost.sender")

PAUSED_RECHECK_SECONDS = 10.0
"""How long the sender parks the mail of a tenant held until lifted (a pause, a disabled
SES tenant) before looking again: a lift is seen sooner (:meth:`Holds.changed`)."""

_SWEEP_MIN = 64
"""Tenants the SES-fault map may hold before it is first swept."""
FORGET_AFTER_SECONDS = 3600.0
"""A tenant whose hold ended this long ago and that has not sent since is forgotten: its
next mail is sent as any other, not as a lone probe (a refusal holds it again)."""

KEEP_ALIVE_SLACK_MS = 10_000
"""A park's keep-alive is skipped while this process kept the tenant's slots alive
to within this of what the park asks: they live an in-flight TTL (30 min by
default) past it. A tenant over its quota is parked every few hundred ms, and
each keep-alive touches every job of it (dispatcher/touch.lua)."""

_KEPT_MOST = 10_000
"""Tenants whose last keep-alive is remembered; past this, forgotten all at once
(a forgotten tenant's next park touches its jobs again: the safe side)."""

Woken = Callable[[str | None], Awaitable[object]]
"""Told of a change of a tenant's hold (``None``: every tenant's, the global limits)."""


class SesTenants(Protocol):
    """SES's verdict on the tenants' SES tenants (fairpost.mailer.daemon.ses_tenant_status)."""

    def waiting(self, tenant: str) -> None: ...

    def is_disabled(self, tenant: str) -> bool: ...


@dataclass(frozen=True)
class Hold:
    """Why a tenant may not send now."""

    reason: str
    """``paused``, ``reputation_paused``, ``ses_tenant_disabled`` or ``ses_<code>``."""
    recheck: float
    """Seconds until the sender looks at the tenant's mail again."""
    until: float | None = None
    """Monotonic time the hold ends by itself; None: it lasts until lifted."""


def forget_ended(held: dict[str, tuple[str, float]], now: float) -> int:
    """Drop from ``held`` (tenant -> (reason, monotonic end of its hold)) the tenants
    whose hold ended over :data:`FORGET_AFTER_SECONDS` ago, or the map would keep
    every tenant ever held that never sent again; returns the size past which to
    sweep next (twice what is left: amortised O(1) a hold)."""
    for tenant in [t for t, (_, until) in held.items() if until + FORGET_AFTER_SECONDS < now]:
        del held[tenant]
    return max(_SWEEP_MIN, 2 * len(held))


class Holds:
    def __init__(
        self,
        store: JobStore,
        settings: Settings,
        is_paused: Callable[[str], bool],
        *,
        ses_tenants: SesTenants | None = None,
    ) -> None:
        """``is_paused``: the pauses (the live overrides', LimitSource.is_paused);
        ``ses_tenants``: SES's verdict on SES tenants, when any tenant's mail names one."""
        self._jobs = store
        self._store = TenantHolds(store.redis, mail_keys(store.keys), store.limits)
        self._redis = store.redis
        self._keys = mail_keys(store.keys)
        self._settings = settings
        self._is_paused = is_paused
        self._ses_tenants = ses_tenants
        self._ses: dict[str, tuple[str, float]] = {}
        """Tenants SES refused for their own set-up: tenant → (``ses_<code>``, monotonic
        end of the hold). Kept while the tenant has not sent since (the hold in Redis is
        cleared by the replica that sees it send again, or by a resume)."""
        self._sweep_above = _SWEEP_MIN
        self._guard_paused: frozenset[str] = frozenset()
        self._listeners: list[Woken] = []
        self._kept: dict[str, int] = {}
        """Tenant → the ``until_ms`` its last keep-alive from here asked for."""

    # -- the sender's one question (no I/O) -------------------------------------------
    def of(self, tenant: str) -> Hold | None:
        """Whether the tenant is held now, why and for how long; None: it may send.
        Asking tells that the tenant has mail waiting (its SES tenant's status is read
        on schedule meanwhile)."""
        if self._is_paused(tenant):
            # An operator's or the guard's pause: its mail already in SQS waits too.
            return self.until_lifted("reputation_paused" if tenant in self._guard_paused else "paused")
        status = self._ses_tenants
        if status is not None:
            status.waiting(tenant)
            if status.is_disabled(tenant):
                return self.until_lifted(SES_TENANT_DISABLED)
        held = self._ses.get(tenant)
        if held is not None:
            reason, until = held
            left = until - time.monotonic()
            if left > 0:
                return Hold(reason, left, until)
        return None

    def probing(self, tenant: str) -> bool:
        """The tenant's SES-fault hold ended and it has not sent since: its next mail
        asks SES alone whether the fault is gone."""
        return tenant in self._ses

    @staticmethod
    def until_lifted(reason: str) -> Hold:
        """A hold that lasts until something lifts it: looked at again every
        :data:`PAUSED_RECHECK_SECONDS`."""
        return Hold(reason, PAUSED_RECHECK_SECONDS)

    # -- what the sender tells ---------------------------------------------------------
    async def hold_for_ses(self, tenant: str, reason: str) -> tuple[str, int, float]:
        """SES refused the tenant's mail for a fault of its own set-up (``ses_<code>``):
        hold it (or keep the hold in force, shared by every replica); returns the hold's
        reason, its end (Redis time, ms) and the seconds until then."""
        s = self._settings.sender
        hold, wait = await self._store.hold(
            tenant, reason, first_seconds=s.backoff_base_seconds, most_seconds=s.backoff_max_seconds
        )
        now = time.monotonic()
        self._ses[tenant] = (hold.reason, now + wait)
        if len(self._ses) > self._sweep_above:
            self._sweep_above = forget_ended(self._ses, now)
        return hold.reason, hold.until_ms, wait

    async def sent(self, tenant: str) -> None:
        """SES accepted the tenant's mail: a hold for its own SES fault is over."""
        if self._ses.pop(tenant, None) is not None:
            await self._store.clear(tenant)

    async def keep_alive(self, tenant: str, until_ms: int) -> None:
        """The tenant's mail waits in SQS until ``until_ms`` (Redis time), whatever the
        reason: its in-flight slots and dispatched jobs are kept that long and an
        in-flight TTL after (``dispatcher/touch.lua``, as an SES-fault hold keeps them:
        fairpost.mailer.quota.holds.TenantHolds.keep_alive). Skipped while an
        earlier keep-alive from here covers it within KEEP_ALIVE_SLACK_MS (or half the
        TTL, if that is shorter)."""
        ttl_ms = self._jobs.limits.inflight_ttl_ms
        kept = self._kept.get(tenant)
        # Half the TTL at most: what is skipped still lives half a TTL past the park.
        if kept is not None and kept >= until_ms - min(KEEP_ALIVE_SLACK_MS, ttl_ms // 2):
            return
        await self._jobs.touch_inflight(tenant, until_ms + ttl_ms)
        if len(self._kept) >= _KEPT_MOST:
            self._kept.clear()
        self._kept[tenant] = until_ms

    # -- the one event -----------------------------------------------------------------
    def listen(self, woken: Woken) -> None:
        """Call ``woken`` on every :meth:`changed` (the sender brings parked mail back)."""
        self._listeners.append(woken)

    async def changed(self, tenant: str | None = None) -> None:
        """A hold of the tenant (``None``: of every tenant, as a change of the global
        limits is) was lifted or changed: its parked mail is weighed again now, not when
        its park ends. Raises what a listener raised (the caller tries again)."""
        for woken in self._listeners:
            await woken(tenant)

    # -- other replicas' and operators' changes ----------------------------------------
    async def refresh(self) -> None:
        """Read which pauses are the guard's, and whether the SES-fault holds this
        replica knows are still in Redis: one gone (a resume, or another replica's send)
        is lifted here too."""
        guards = guard_states(await self._redis.hgetall(self._keys.guard()))
        self._guard_paused = frozenset(t for t, state in guards.items() if state.level == "paused")
        known = list(self._ses)
        stored = await self._store.held(known)
        for tenant in known:
            if tenant in stored or tenant not in self._ses:
                continue
            reason, until = self._ses[tenant]
            if until > time.monotonic():
                # Lifted before its end: its next mail rechecks the fault now (told
                # first: a wake that failed is tried again on the next refresh).
                await self.changed(tenant)
                self._ses[tenant] = (reason, time.monotonic())
                log.info("tenant's hold (%s) lifted", reason, extra={"tenant": tenant})
