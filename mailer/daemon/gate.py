"""The sender's gate: while it is closed, nothing is received.

It closes when receiving now would only park what it got: the global quota
is spent (the quota engine says until when), or SES throttled or paused the
whole account (the sender holds itself for a while). A change of the global
limits opens it at once to look again (:meth:`Gate.regate`).

Whether the global quota is spent is asked of Redis (a quota script call, about
as dear as 20 ``SET``s) before each receive only while the quota binds: for
:data:`BINDING_TURNS` turns after each sign that it does (an ask that found it
spent, a refusal for global room or for a share of it, a change of limits).
Otherwise once every :data:`OPEN_PEEK_EVERY` turns: under a steady load the
quota does not bind, the ask was a third of the quota script's calls, and each
answered "open". The quota itself is never passed: every acquire checks every
window; what a skipped ask may cost is one receive whose mail another
replica's use refuses, parked as any refused mail is, and the gate closed by it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from fairpost.dispatcher.backoff import wait_or_stop
from fairpost.mailer.quota.engine import QuotaEngine
from fairpost.mailer.quota.overrides import LimitSource

OPEN_PEEK_EVERY = 8
"""Turns of the receive loop between asks of the global quota while it has not bound lately."""

BINDING_TURNS = 64
"""Turns the global quota is asked before each receive after a sign that it binds."""


class Gate:
    def __init__(self, quota: QuotaEngine, limits: LimitSource) -> None:
        self._quota = quota
        self._limits = limits
        self._binding_left = 0
        """Turns left that ask the global quota whatever (a sign that it binds was seen)."""
        self._unasked = OPEN_PEEK_EVERY - 1
        """Turns since the global quota was last asked (the first turn asks)."""
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
        self.quota_binds()

    def quota_binds(self) -> None:
        """A sign that the global quota binds (a refusal for global room or a share of
        it): it is asked before each receive for the next :data:`BINDING_TURNS` turns."""
        self._binding_left = BINDING_TURNS

    def holding(self) -> bool:
        """Whether the sender holds itself now (SES's hold, or the global quota's as last
        seen): the in-flight slots of mail waiting in SQS are kept meanwhile
        (fairpost.mailer.daemon.slots)."""
        return max(self._hold_until, self._quota_hold_until) > time.monotonic()

    def regate(self) -> None:
        """The global limits changed (an operator, or SES's auto limits rose): look at the
        gate again now, not when the old limits freed it. A hold SES asked for stays."""
        self._quota_hold_until = 0.0
        self.quota_binds()
        self._regate.set()

    async def wait(self, stop: asyncio.Event) -> bool:
        """Wait while the gate is closed. Returns True if it waited, so the
        caller looks at the world again before receiving."""
        wait = max(self._hold_until, self._quota_hold_until) - time.monotonic()
        if self._binding_left > 0 or self._unasked >= OPEN_PEEK_EVERY - 1:
            self._binding_left = max(0, self._binding_left - 1)
            self._unasked = 0
            global_wait = await self._quota.global_retry_after(self._limits.global_limits())
            if global_wait > 0:
                self.quota_binds()
            wait = max(wait, global_wait)
        else:
            self._unasked += 1
        wait = max(wait, 0.0)
        if self.observer is not None:
            self.observer(wait)
        if wait <= 0:
            return False
        self._regate.clear()
        await wait_or_stop(stop, wait, self._regate)
        return True
