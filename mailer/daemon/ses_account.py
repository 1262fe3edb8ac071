"""``FAIRPOST_GLOBAL_LIMITS=auto``: the global windows, derived from SES itself.

SES v2 ``GetAccount`` reports the account's ``SendQuota``: ``MaxSendRate``
(recipients per second), ``Max24HourSend`` and ``SentLast24Hours``. fairpost
takes ``FAIRPOST_SES_SAFETY_FACTOR`` (default 0.9) of each:

- per second: ``floor(MaxSendRate * factor)``, at least 1;
- per day: ``floor(Max24HourSend * factor)`` minus what *others* sent on the
  account in the last 24 hours (``SentLast24Hours`` less what fairpost's own
  day window counts), at least 1.

It reads the account at start-up (the sender does not start without it) and
every ``FAIRPOST_SES_ACCOUNT_REFRESH`` seconds; a failed refresh keeps the
last limits. A change is logged, and the limits are published in Redis
(``Keys.auto_limits()``) for ``fairpost quota show`` and ``fairpost stats``.
Needs ``ses:GetAccount``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import Mapping
from typing import Any

import redis.asyncio

from config import Settings
from config.limits import Limits, Window, format_limits
from dispatcher.keys import Keys
from mailer.daemon.aws import SesClient
from mailer.errors import SesAccountError
from mailer.quota.engine import QuotaEngine

__all__ = ["SesAccountLimits", "derive_limits"]

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


class SesAccountLimits:
    """The current auto limits; :meth:`run` keeps them fresh. Use :meth:`current` as
    the :class:`mailer.overrides.OverrideCache`'s ``auto`` source."""

    def __init__(
        self,
        ses: SesClient,
        settings: Settings,
        *,
        client: redis.asyncio.Redis,
        keys: Keys,
        quota: QuotaEngine,
    ) -> None:
        self._ses = ses
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
        own = 0
        if self._limits is not None:
            day = [w for w in self._limits if w.seconds == DAY]
            if day:
                own = (await self._quota.usage(None, day))[0][1]
        limits = derive_limits(quota, self._factor, own)
        if limits != self._limits:
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
        """Refresh every ``refresh_seconds`` until ``stop``; failures keep the last limits."""
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=self.refresh_seconds)
            if stop.is_set():
                return
            try:
                await self.refresh()
            except (SesAccountError, redis.RedisError, OSError) as exc:
                log.warning("keeping the last SES limits (%s): %s", format_limits(self.current()), exc)
