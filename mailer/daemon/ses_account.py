"""``FAIRPOST_GLOBAL_LIMITS=auto``: the global windows, derived from SES itself.

SES v2 ``GetAccount`` reports the account's ``SendQuota``: ``MaxSendRate``
(recipients per second), ``Max24HourSend`` and ``SentLast24Hours``. fairpost
takes ``FAIRPOST_SES_SAFETY_FACTOR`` (default 0.9) of each:

- per second: ``floor(MaxSendRate * factor)``, at least 1;
- per day: ``floor(Max24HourSend * factor)`` minus what *others* sent on the
  account in the last 24 hours (``SentLast24Hours`` less what fairpost's own
  day window counts), at least 1.

fairpost's own day count is read on every read, the first one included: a
replica started after a busy day must not take fairpost's own sends for
others' (they would count twice, once in ``SentLast24Hours`` and once in the
day window, and stop sending for most of a day).

It reads the account at start-up (the sender does not start without it) and
every ``FAIRPOST_SES_ACCOUNT_REFRESH`` seconds; a failed refresh keeps the
last limits, and is tried again on the outage back-off (fairpost.dispatcher.loop).
A change is logged, handed to ``on_change`` (the daemon wakes the sender's gate
when the limits rose: :func:`limits_rose`), and the limits are published in
Redis (``MailKeys.auto_limits()``) for ``fairpost quota show`` and ``fairpost
stats``. Needs ``ses:GetAccount``.

SES's "Daily message quota exceeded" is not a rate to back off from for
seconds: :func:`daily_quota_wait` re-reads the account and says how long to
hold sending (until the day window can free, or the next look at the account).
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import redis.asyncio

from fairpost.config import Settings
from fairpost.config.limits import Limits, Window, format_limits
from fairpost.dispatcher.backoff import OutageBackoff, wait_or_stop
from fairpost.dispatcher.loop import OnError, forever
from fairpost.mailer.daemon.aws import SesClient
from fairpost.mailer.errors import SesAccountError
from fairpost.mailer.quota.engine import QuotaEngine
from fairpost.mailer.sdk.keys import MailKeys

__all__ = [
    "SesAccountLimits",
    "daily_quota_wait",
    "derive_limits",
    "is_daily_quota_exceeded",
    "limits_rose",
]

log = logging.getLogger("fairpost.ses_account")

DAY = 86_400


def derive_limits(send_quota: Mapping[str, Any], factor: float, own_last_24h: int = 0) -> Limits:
    """The global windows for an account's ``SendQuota``; see the module docstring."""
    try:
        rate = float(send_quota["MaxSendRate"])
        daily = float(send_quota["Max24HourSend"])
        sent = float(send_quota.get("SentLast24Hours", 0.0))
    except (KeyError, TypeError, ValueError) as exc:
        raise SesAccountError(f"SendQuota without a usable {exc}") from None
    windows = [Window(1, max(1, math.floor(rate * factor)))]
    if daily > 0:  # SES reports -1 for an unlimited daily quota
        others = max(0.0, sent - own_last_24h)
        windows.append(Window(DAY, max(1, math.floor(daily * factor - others))))
    return tuple(windows)


OnChange = Callable[[Limits | None, Limits], Awaitable[None]]
"""Called with the old limits (``None`` before the first read) and the new ones."""


def limits_rose(old: Limits | None, new: Limits) -> bool:
    """Whether ``new`` allows more somewhere: a window's limit went up, or a window went away.

    Then a gate closed under ``old`` may be open: look again at once."""
    if old is None:
        return True
    now = {w.seconds: w.limit for w in new}
    return any(w.seconds not in now or now[w.seconds] > w.limit for w in old)


def is_daily_quota_exceeded(error: str | None) -> bool:
    """Whether an SES throttling error says the *daily* quota is spent (not the rate)."""
    return error is not None and "daily message quota exceeded" in error.lower()


async def _own_last_24h(quota: QuotaEngine) -> int:
    """What fairpost's global day window counts now (the key does not depend on the limit)."""
    return (await quota.usage(None, [Window(DAY, 1)]))[0][1]


class SesAccountLimits:
    """The current auto limits; :meth:`run` keeps them fresh. Use :meth:`current` as
    the :class:`fairpost.mailer.quota.overrides.OverrideCache`'s ``auto`` source."""

    def __init__(
        self,
        ses: SesClient,
        settings: Settings,
        *,
        client: redis.asyncio.Redis,
        keys: MailKeys,
        quota: QuotaEngine,
        on_change: OnChange | None = None,
        on_error: OnError | None = None,
    ) -> None:
        """``on_error``: told of each failed refresh of :meth:`run` (the daemon counts them)."""
        self._ses = ses
        self.on_change = on_change
        self._on_error = on_error
        self.send_quota: Mapping[str, Any] | None = None
        """The ``SendQuota`` of the last successful read."""
        self._factor = settings.ses_safety_factor
        self.refresh_seconds = settings.ses_account_refresh
        self._redis = client
        self._keys = keys
        self._quota = quota
        self._limits: Limits | None = None

    def current(self) -> Limits:
        if self._limits is None:
            raise SesAccountError("the SES account has not been read yet")
        return self._limits

    async def refresh(self) -> Limits:
        try:
            response = await self._ses.get_account()
        except Exception as exc:
            raise SesAccountError(f"SES GetAccount failed: {type(exc).__name__}: {exc}") from None
        quota = response.get("SendQuota")
        if not isinstance(quota, Mapping):
            raise SesAccountError("SES GetAccount answered without a SendQuota")
        # Every read, the first too: after a restart fairpost's own sends of the
        # day are in SentLast24Hours and in the day window alike.
        own = await _own_last_24h(self._quota)
        limits = derive_limits(quota, self._factor, own)
        old, self.send_quota = self._limits, quota
        if limits != old:
            log.info(
                "global limits from SES: %s (MaxSendRate %s, Max24HourSend %s, SentLast24Hours %s, x%s)",
                format_limits(limits),
                quota.get("MaxSendRate"),
                quota.get("Max24HourSend"),
                quota.get("SentLast24Hours"),
                self._factor,
            )
        self._limits = limits
        await self._redis.set(
            self._keys.auto_limits(), format_limits(limits), ex=int(self.refresh_seconds * 3) + 60
        )
        if limits != old and old is not None and self.on_change is not None:
            try:
                await self.on_change(old, limits)
            except Exception as exc:
                log.warning("could not act on the new SES limits at once: %s", exc)
        return limits

    async def start(self, attempts: int = 5) -> Limits:
        """The first read, retried a few times: the sender cannot start without it."""
        for attempt in range(attempts):
            try:
                return await self.refresh()
            except SesAccountError as exc:
                if attempt == attempts - 1:
                    raise SesAccountError(
                        f"{exc}; FAIRPOST_GLOBAL_LIMITS=auto needs ses:GetAccount "
                        "(or set the limits, e.g. FAIRPOST_GLOBAL_LIMITS='14/second; 50000/day')"
                    ) from None
                log.warning("reading the SES account failed (attempt %d): %s", attempt + 1, exc)
                await asyncio.sleep(0.5 * 2**attempt)
        raise AssertionError("unreachable")

    async def run(self, stop: asyncio.Event) -> None:
        """Refresh every ``refresh_seconds`` until ``stop``; a failed refresh keeps the last
        limits, and is tried again on the outage back-off, at least once a period, for
        as long as SES's control plane fails."""

        async def refresh() -> float:
            await self.refresh()
            return self.refresh_seconds

        # start() has just read the account.
        await wait_or_stop(stop, self.refresh_seconds)
        # SES's control plane failing (or GetAccount denied) does not stop sending: the
        # last limits read stay in force for as long as it lasts, as they always did.
        # Only this task rides out any outage; SendEmail failing is the sender's to judge.
        backoff = OutageBackoff(math.inf, most=min(10.0, self.refresh_seconds))
        await forever("ses-account", refresh, stop, backoff=backoff, on_error=self._on_error)


async def daily_quota_wait(
    ses: SesClient,
    quota: QuotaEngine,
    global_limits: Limits,
    *,
    recheck_seconds: float,
    account: SesAccountLimits | None = None,
) -> float:
    """SES refused a send with "Daily message quota exceeded": seconds to hold sending.

    The account is read again (through ``account`` with ``auto`` limits, which
    then derives and publishes new ones; else ``GetAccount`` directly). If SES
    has room again (the quota was raised, old mail aged out), 0.0. Else, if
    fairpost's own global day window is spent under the limits in force, until
    it frees; if fairpost's count still shows room (mail it cannot see, sent by
    others on the account), until its own oldest unit leaves the day or
    ``recheck_seconds``, whichever is sooner, to look at the account again then.
    Raises :class:`SesAccountError` if the account cannot be read.
    """
    if account is not None:
        global_limits = await account.refresh()
        send_quota = account.send_quota or {}
    else:
        try:
            response = await ses.get_account()
        except Exception as exc:
            raise SesAccountError(f"SES GetAccount failed: {type(exc).__name__}: {exc}") from None
        send_quota = response.get("SendQuota") or {}
    try:
        daily = float(send_quota["Max24HourSend"])
        sent = float(send_quota.get("SentLast24Hours", 0.0))
    except (KeyError, TypeError, ValueError) as exc:
        raise SesAccountError(f"SendQuota without a usable {exc}") from None
    if daily < 0 or sent < daily:
        return 0.0
    day = [w for w in global_limits if w.seconds == DAY]
    if day:
        closed = await quota.global_retry_after(day)
        if closed > 0:
            return closed
    own = await _own_last_24h(quota)
    if own > 0:
        # The oldest of fairpost's own units leaves the day then: SES frees as much.
        return min(recheck_seconds, await quota.global_retry_after([Window(DAY, own)]))
    return recheck_seconds
