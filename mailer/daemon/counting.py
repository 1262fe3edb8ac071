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
import math
import time
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass
from typing import Any

from redis.asyncio.client import Pipeline

from fairpost.dispatcher.backoff import OutageBackoff
from fairpost.mailer.daemon import ses
from fairpost.mailer.daemon.context import SenderContext
from fairpost.mailer.daemon.inbox import Received
from fairpost.mailer.quota.engine import Grant, StreamWindows
from fairpost.mailer.quota.stream_limits import stream_windows
from fairpost.mailer.sdk.streams import TRANSACTIONAL

log = logging.getLogger("fairpost.sender")


@dataclass
class Stamp:
    """Where a granted mail's quota units are counted: the bucket of ``at_ms``
    (Redis time), put there at ``mono`` (this process's monotonic clock)."""

    at_ms: int
    mono: float
    stream: StreamWindows | None = None
    """The windows of the mail's stream, moved with the tenant's (fairpost.mailer.quota.stream_limits)."""
    since: float | None = None
    """This process's monotonic clock no later than ``at_ms`` was taken (before the
    grant or restamp was asked for); None: unknown."""


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
            tenant, costs, *ctx.windows(tenant), weight=ctx.settings.weight_for(tenant),
            stream=self.stream(tenant, messages[0]),
        )  # fmt: skip

    def stream(self, tenant: str, msg: Received) -> StreamWindows | None:
        """The windows of the mail's stream, if it has its own (a group is one stream:
        one FIFO group); its units move with the tenant's (:class:`Stamp`)."""
        stream = msg.envelope.mail.stream if msg.envelope else TRANSACTIONAL
        return stream_windows(self.ctx.limits, self.ctx.settings, tenant, stream)

    async def refund(self, tenant: str, msg: Received, at_ms: int) -> None:
        """A granted mail SES never took (refused outright, or not sent here): its
        units, counted in the bucket of ``at_ms``, go back."""
        assert msg.envelope is not None
        ctx = self.ctx
        cost, stream = msg.envelope.mail.recipients, self.stream(tenant, msg)
        await ctx.quota.refund(tenant, cost, at_ms, *ctx.windows(tenant), stream=stream)

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
        windows = self.ctx.windows(tenant)
        asked = time.monotonic()
        moved = await self.ctx.quota.restamp(tenant, cost, stamp.at_ms, *windows, stream=stamp.stream)
        if moved is not None:
            stamp.at_ms, stamp.mono, stamp.since = moved, time.monotonic(), asked

    async def keep_during(
        self, call: Awaitable[ses.SendResult], tenant: str, cost: int, stamp: Stamp, every: float
    ) -> ses.SendResult:
        """Await ``call`` (a mail's SES call), keeping the mail counted until it ends.

        The call is awaited in the caller's task: a mail's send is one task, not
        two, and a call that ends within ``every`` (nearly every call) costs one
        timer. One that outlasts it is kept counted beside it (:class:`_Keeper`).
        A keep that fails must not end the wait: SES has the call, and an answer
        left unrecorded sends the mail again when its message comes back."""
        keeper = _Keeper(self, tenant, cost, stamp, every)
        timer = asyncio.get_running_loop().call_later(every, keeper.start)
        cancelled = False
        try:
            return await call
        except asyncio.CancelledError:
            cancelled = True
            raise
        finally:
            timer.cancel()
            await keeper.stop(cancel=cancelled)

    async def wait_for_answers(
        self,
        tenant: str,
        granted: list[Received],
        stamps: list[Stamp],
        sends: Sequence[asyncio.Future[ses.SendResult]],
        every: float,
        answers: asyncio.Future[Any],
    ) -> None:
        """Wait for a group's SES calls (``answers``: done once every one of ``sends`` is).
        A mail SES answered early waits for the slowest of its group before
        :meth:`move_to_answers`; until then it is kept counted like a mail in a call, or
        its units could leave the window (counted from the grant) before SES's count of
        it (from its arrival) does. ``every``: :meth:`every`."""
        while not answers.done():
            done, _ = await asyncio.wait({answers}, timeout=every)
            if done:
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
        answer, summed per bucket they sat in. Units whose every window's bucket
        still holds the answer stay: they count a window past it already (a restamp
        would move nothing), and Redis is spared the call."""
        counted: dict[int, int] = {}
        since: dict[int, float | None] = {}
        stream: StreamWindows | None = None
        for msg, result, stamp in answered:
            if may_have_it(result.verdict) and msg.envelope:
                at_ms = stamp.at_ms
                counted[at_ms] = counted.get(at_ms, 0) + msg.envelope.mail.recipients
                known = since.get(at_ms, stamp.since)
                since[at_ms] = None if known is None or stamp.since is None else min(known, stamp.since)
                stream = stamp.stream  # a group is one stream
        windows = self.ctx.windows(tenant)
        every_window = (*windows[0], *windows[1], *(stream.windows if stream else ()))
        now = time.monotonic()
        for at_ms, cost in counted.items():
            asked = since[at_ms]
            if asked is not None:
                # The answers came no later, in server time, than at_ms plus the time
                # since the ask (1 ms more for the two clocks' rounding).
                answered_by = at_ms + math.ceil((now - asked) * 1000) + 1
                if self.ctx.quota.in_one_bucket(at_ms, answered_by, every_window):
                    continue
            await self.ctx.quota.restamp(tenant, cost, at_ms, *windows, pipeline=pipeline, stream=stream)


class _Keeper:
    """Keeps a mail in a slow SES call counted, beside the call: a keep now and
    then every ``every`` (a failed one is tried again on the outage back-off, never
    later than ``every``), for as long as the call runs."""

    def __init__(self, counting: Counting, tenant: str, cost: int, stamp: Stamp, every: float) -> None:
        self._counting = counting
        self._tenant = tenant
        self._cost = cost
        self._stamp = stamp
        self._every = every
        self._task: asyncio.Task[None] | None = None
        self._sleeping = False
        self._done = False

    def start(self) -> None:
        """The call outlasted ``every``: its keeping starts."""
        self._task = asyncio.create_task(self._run(), name="sender-keep-counted")

    async def _run(self) -> None:
        every = self._every
        backoff = OutageBackoff(self._counting.ctx.settings.max_outage_seconds, first=0.2, most=every)
        while not self._done:
            try:
                await self._counting.keep(self._tenant, self._cost, self._stamp, every)
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
            if self._done:
                return
            self._sleeping = True
            try:
                await asyncio.sleep(wait)
            finally:
                self._sleeping = False

    async def stop(self, *, cancel: bool) -> None:
        """The call ended: a keep under way ends first (its stamp is the one the
        answer's record moves from), a wait for the next one ends now. ``cancel``:
        the caller was cancelled (shutdown), and so is a keep under way."""
        self._done = True
        task = self._task
        if task is None:
            return
        if cancel or self._sleeping:
            task.cancel()
        await asyncio.gather(task, return_exceptions=True)
