"""The sender's gate: while it is closed, nothing is received.

It closes when receiving now would only park what it got: the global quota
is spent (the quota engine says until when), or SES throttled or paused the
whole account (the sender holds itself for a while). A change of the global
limits opens it at once to look again (:meth:`Gate.regate`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from fairpost.dispatcher.backoff import wait_or_stop
from fairpost.mailer.quota.engine import QuotaEngine
from fairpost.mailer.quota.overrides import LimitSource


class Gate:
    def __init__(self, quota: QuotaEngine, limits: LimitSource) -> None:
        self._quota = quota
        self._limits = limits
        self._hold_until = 0.0
        """Monotonic time before which no receive is made: SES throttled or paused the account."""
        self._quota_hold_until = 0.0
        """The same, as the global limits in force said (a change of limits ends it)."""
        self._regate = asyncio.Event()
        self.observer: Callable[[float], None] | None = None
        """Called with each decision's wait (0.0: open), for tests and diagnostics."""

    def hold(self, seconds: float) -> None:
        """SES throttled or paused the account: receive nothing for ``seconds``, whatever
        the limits do meanwhile."""
        self._hold_until = max(self._hold_until, time.monotonic() + seconds)

    def hold_for_quota(self, seconds: float) -> None:
        """The global quota is spent: receive nothing for ``seconds`` (or until :meth:`regate`)."""
        self._quota_hold_until = max(self._quota_hold_until, time.monotonic() + seconds)

    def holding(self) -> bool:
        """Whether the sender holds itself now (SES's hold, or the global quota's as last
        seen): the in-flight slots of mail waiting in SQS are kept meanwhile
        (fairpost.mailer.daemon.slots)."""
        return max(self._hold_until, self._quota_hold_until) > time.monotonic()

    def regate(self) -> None:
        """The global limits changed (an operator, or SES's auto limits rose): look at the
        gate again now, not when the old limits freed it. A hold SES asked for stays."""
        self._quota_hold_until = 0.0
        self._regate.set()

    async def wait(self, stop: asyncio.Event) -> bool:
        """Wait while the gate is closed. Returns True if it waited, so the
        caller looks at the world again before receiving."""
        wait = max(self._hold_until, self._quota_hold_until) - time.monotonic()
        global_wait = await self._quota.global_retry_after(self._limits.global_limits())
        wait = max(wait, global_wait, 0.0)
        if self.observer is not None:
            self.observer(wait)
        if wait <= 0:
            return False
        self._regate.clear()
        await wait_or_stop(stop, wait, self._regate)
        return True
