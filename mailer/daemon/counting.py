"""A mail's quota units, from its grant until SES counts it (or they go back).

The one place the sender moves quota units: a group's grant
(:meth:`Counting.acquire`), the refund of a mail SES never took, or that is
not sent here (:meth:`Counting.refund`), and the moves forward below.

The quota engine counts a grant in the bucket of the grant's moment. SES
counts a mail when it arrives, which may be later: the mail waited for an
SES slot, or its call was slow, or a faster mail of its group waits for the
slowest. Until SES has answered, a granted mail's units are moved forward
(restamped) every half of the shortest window, so they never leave a window
before SES's count of the mail does.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass

from redis.asyncio.client import Pipeline

from fairpost.dispatcher.backoff import OutageBackoff
from fairpost.mailer.daemon import ses
from fairpost.mailer.daemon.context import SenderContext
from fairpost.mailer.daemon.inbox import Received
from fairpost.mailer.quota.engine import Grant

log = logging.getLogger("fairpost.sender")


@dataclass
class Stamp:
    """Where a granted mail's quota units are counted: the bucket of ``at_ms``
    (Redis time), put there at ``mono`` (this process's monotonic clock)."""

    at_ms: int
    mono: float


def may_have_it(verdict: ses.Verdict) -> bool:
    """SES took the mail, or may have (a 5xx or a network error): it stays counted."""
    return verdict in (ses.Verdict.SENT, ses.Verdict.TRANSIENT)


class Counting:
    def __init__(self, ctx: SenderContext) -> None:
        self.ctx = ctx

    async def acquire(self, tenant: str, messages: Sequence[Received]) -> Grant:
        """Ask the quota for a group's mails, in order, in one atomic call: the head
        it grants is counted at the grant's ``at_ms``."""
        ctx = self.ctx
        costs = [m.envelope.mail.recipients for m in messages if m.envelope]
        return await ctx.quota.acquire(
            tenant, costs, *ctx.windows(tenant), weight=ctx.settings.weight_for(tenant)
        )

    async def refund(self, tenant: str, msg: Received, at_ms: int) -> None:
        """A granted mail SES never took (refused outright, or not sent here): its
        units, counted in the bucket of ``at_ms``, go back."""
        assert msg.envelope is not None
        ctx = self.ctx
        await ctx.quota.refund(tenant, msg.envelope.mail.recipients, at_ms, *ctx.windows(tenant))

    def every(self, tenant: str) -> float:
        """Half the shortest window: how long a granted mail may go unsent before its
        units must be moved forward, or they would leave that window too soon."""
        windows = (*self.ctx.limits.global_limits(), *self.ctx.limits.limits_for(tenant))
        return min((w.seconds for w in windows), default=1) / 2

    async def keep(self, tenant: str, cost: int, stamp: Stamp, every: float) -> None:
        """A mail still waiting for an SES slot, or in a slow call, must stay
        counted until SES has it: move its units to now once ``every`` passed."""
        if time.monotonic() - stamp.mono < every:
            return
        moved = await self.ctx.quota.restamp(tenant, cost, stamp.at_ms, *self.ctx.windows(tenant))
        if moved is not None:
            stamp.at_ms, stamp.mono = moved, time.monotonic()

    async def keep_during(
        self, call: asyncio.Future[ses.SendResult], tenant: str, cost: int, stamp: Stamp, every: float
    ) -> None:
        """Keep a mail counted until its SES call ends. A keep that fails must not end
        the wait: SES has the call, and an answer left unrecorded sends the mail again
        when its message comes back. The keep is tried again on the outage back-off,
        never later than ``every``, for as long as the call runs."""
        backoff = OutageBackoff(self.ctx.settings.max_outage_seconds, first=0.2, most=every)
        wait = every
        while not (await asyncio.wait({call}, timeout=wait))[0]:
            try:
                await self.keep(tenant, cost, stamp, every)
            except Exception as exc:
                wait = min(backoff.failed() or every, every)
                log.warning(
                    "could not keep a mail in an SES call counted (%s: %s); again in %.1fs",
                    type(exc).__name__,
                    exc,
                    wait,
                )
            else:
                backoff.succeeded()
                wait = every

    async def wait_for_answers(
        self,
        tenant: str,
        granted: list[Received],
        stamps: list[Stamp],
        sends: Sequence[asyncio.Future[ses.SendResult]],
    ) -> None:
        """Wait for a group's SES calls. A mail SES answered early waits for the slowest
        of its group before :meth:`move_to_answers`; until then it is kept counted like
        a mail in a call, or its units could leave the window (counted from the grant)
        before SES's count of it (from its arrival) does."""
        every = self.every(tenant)
        pending: set[asyncio.Future[ses.SendResult]] = set(sends)
        while pending:
            _, pending = await asyncio.wait(pending, timeout=every)
            if not pending:
                return
            for msg, stamp, send in zip(granted, stamps, sends, strict=True):
                if not send.done() or send.cancelled() or send.exception() is not None:
                    continue
                if may_have_it(send.result().verdict) and msg.envelope:
                    try:
                        await self.keep(tenant, msg.envelope.mail.recipients, stamp, every)
                    except Exception as exc:
                        # Raising would abandon the group's calls still under way; this
                        # mail's units are restamped by move_to_answers (or that fails loudly).
                        log.warning(
                            "could not keep an answered mail counted (%s: %s)", type(exc).__name__, exc
                        )

    async def move_to_answers(
        self, tenant: str, answered: Sequence[tuple[Received, ses.SendResult, Stamp]], pipeline: Pipeline
    ) -> None:
        """Queue on ``pipeline``: the units of every mail SES may have move to the
        answer, summed per bucket they sat in."""
        counted: dict[int, int] = {}
        for msg, result, stamp in answered:
            if may_have_it(result.verdict) and msg.envelope:
                counted[stamp.at_ms] = counted.get(stamp.at_ms, 0) + msg.envelope.mail.recipients
        for at_ms, cost in counted.items():
            await self.ctx.quota.restamp(tenant, cost, at_ms, *self.ctx.windows(tenant), pipeline=pipeline)
