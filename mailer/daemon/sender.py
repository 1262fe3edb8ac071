"""The sender: SQS → quota → SES, pausing an over-quota tenant by visibility timeout.

Reading order, one idea a module:

- :mod:`fairpost.mailer.daemon.receive`: the receive loop (gate wait, long poll, hand back);
- :mod:`fairpost.mailer.daemon.gate`: when nothing is received at all;
- this module: one received batch, grouped by tenant, each group decided, and a
  failed group's round (backed off, or asked for again here on an outage);
- :mod:`fairpost.mailer.daemon.group`: one tenant group's quota decision;
- :mod:`fairpost.mailer.daemon.parking`: refused mail waiting in SQS for its tenant;
- :mod:`fairpost.mailer.daemon.send`: the granted mails' sends, kept hidden until recorded;
- :mod:`fairpost.mailer.daemon.answers`: what each SES answer means (and tenant holds);
- :mod:`fairpost.mailer.daemon.counting`: a mail's quota units, from its grant until SES counts it;
- :mod:`fairpost.mailer.daemon.endings`: dead letters and poison messages;
- :mod:`fairpost.mailer.daemon.settlement`: how a message ends a round (one value each);
- :mod:`fairpost.mailer.daemon.inbox`: the SQS messages held, their settlements applied
  (and the timed retries timed).

Nothing is put back on a queue and no worker slot waits: SQS counts
visibility in whole seconds, so a wait of under two seconds is timed by the
sender as well (a :class:`~fairpost.mailer.daemon.settlement.TimedRetry`: the
message stays parked in SQS meanwhile, as the safety net), and
every other wait is SQS's alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Sequence

from botocore.exceptions import BotoCoreError, ClientError
from redis.exceptions import RedisError

from fairpost.config import Settings
from fairpost.dispatcher.backoff import OutageBackoff
from fairpost.dispatcher.store import JobStore
from fairpost.mailer.daemon.aws import SesClient, SqsClient
from fairpost.mailer.daemon.context import SenderContext, SenderStats
from fairpost.mailer.daemon.counting import Counting
from fairpost.mailer.daemon.endings import Endings
from fairpost.mailer.daemon.feedback import Feedback
from fairpost.mailer.daemon.gate import Gate
from fairpost.mailer.daemon.group import GroupDecision
from fairpost.mailer.daemon.holds import Holds
from fairpost.mailer.daemon.inbox import Inbox, Received
from fairpost.mailer.daemon.mail_jobs import MailJobs
from fairpost.mailer.daemon.metrics import Metrics
from fairpost.mailer.daemon.parking import PRECISE_SAFETY_NET, Parking
from fairpost.mailer.daemon.provider_holds import ProviderHolds
from fairpost.mailer.daemon.receive import Receiver
from fairpost.mailer.daemon.send import Sending
from fairpost.mailer.daemon.ses import redact
from fairpost.mailer.daemon.settlement import Backoff, Leave, TimedRetry, attempt_backoff
from fairpost.mailer.daemon.tracing import JobTrace, Tracing, handling
from fairpost.mailer.errors import NewerFormat, PoisonMessage
from fairpost.mailer.quota.engine import QuotaEngine
from fairpost.mailer.quota.overrides import LimitSource, StaticLimits
from fairpost.mailer.sdk.envelope import decode
from fairpost.mailer.sdk.keys import mail_keys
from fairpost.mailer.sdk.streams import group_id

__all__ = ["Received", "Sender", "SenderStats"]

log = logging.getLogger("fairpost.sender")

RETRY_MOST = 2.0
"""Seconds at most between tries of messages whose handling failed on an outage:
a tenant sends again within that of Redis answering."""

_OUTAGE = (RedisError, BotoCoreError, ClientError, OSError)
"""What an outage of Redis or AWS raises: ridden out on the outage back-off."""


class Sender:
    def __init__(
        self,
        *,
        sqs: SqsClient,
        ses_client: SesClient,
        queue_url: str,
        store: JobStore,
        quota: QuotaEngine,
        settings: Settings,
        limits: LimitSource | None = None,
        metrics: Metrics | None = None,
        feedback: Feedback | None = None,
        holds: Holds | None = None,
        tracing: Tracing | None = None,
        provider_holds: ProviderHolds | None = None,
    ) -> None:
        """``holds``: every hold on a tenant (fairpost.mailer.daemon.holds); by default
        the pauses of ``limits`` and SES's verdict on SES tenants of ``feedback``;
        ``provider_holds``: the per-provider guard's (a held mail is taken back out of SQS)."""
        self.tracing = tracing
        """The processing spans of received jobs (mailer/daemon/tracing.py); None: untraced."""
        self._queue = queue_url.rsplit("/", 1)[-1]
        limits = limits or StaticLimits(settings)
        if holds is None:
            status = feedback.status if feedback is not None else None
            holds = Holds(store, settings, limits.is_paused, ses_tenants=status)
        self.ctx = SenderContext(
            settings=settings,
            store=store,
            quota=quota,
            limits=limits,
            metrics=metrics or Metrics(),
            holds=holds,
            mail=MailJobs(store),
            feedback=feedback,
            provider_holds=provider_holds,
        )
        self.holds = holds
        self.store = store
        self.keys = mail_keys(store.keys)
        self.quota = quota
        self.settings = settings
        self.metrics = self.ctx.metrics
        self.gate = Gate(quota, self.ctx.limits)
        self.inbox = Inbox(sqs, queue_url, self.ctx.metrics, on_due=self._ask_again)
        self.endings = Endings(self.ctx)
        counting = Counting(self.ctx)
        # Both the group's decision and SES's answers park a tenant's mail: one Parking,
        # built first and handed to each.
        parking = Parking(self.ctx, self.gate, self.endings)
        sending = Sending(self.ctx, ses_client, self.gate, self.inbox, self.endings, counting, parking)
        self.groups = GroupDecision(self.ctx, self.gate, counting, self.endings, sending, parking)
        self.receiver = Receiver(self.ctx, self.gate, self.inbox, self.process)
        # Failures in a row of handling messages on an outage: their retries back off on it.
        self._outage = OutageBackoff(settings.max_outage_seconds, first=0.2, most=RETRY_MOST)
        # A hold lifted, or limits changed: parked mail is weighed again now.
        holds.listen(self._woken)

    @property
    def stats(self) -> SenderStats:
        return self.ctx.stats

    async def run(self, stop: asyncio.Event) -> None:
        """Receive and send until ``stop`` is set."""
        loops = [
            asyncio.create_task(self.receiver.run(stop), name=f"sender-receive-{i}")
            for i in range(self.settings.sender.receivers)
        ]
        try:
            await asyncio.gather(*loops)
        finally:
            for task in loops:
                task.cancel()
            await asyncio.gather(*loops, return_exceptions=True)

    def regate(self) -> None:
        """The global limits changed: look at the gate again now, not when the old limits freed it."""
        self.gate.regate()

    async def _woken(self, tenant: str | None) -> None:
        """A hold of the tenant changed (``None``: the global limits, every tenant)."""
        if tenant is None:
            self.regate()
        await self.unpark(tenant)

    async def unpark(self, tenant: str | None = None) -> int:
        """Limits changed or a tenant was resumed (fairpost.mailer.quota.overrides): bring the tenant's
        parked messages (every tenant's for ``None``) back now, to be weighed against
        the new limits, instead of at the time the old ones gave. Returns how many."""
        return await self.inbox.unpark(tenant)

    async def release_held(self) -> int:
        """Shutdown: give every message received but not finished back to SQS at once,
        then, as the long polls in flight at the stop land (within the poll wait),
        what they bring. Returns how many."""
        await self.inbox.cancel_timers()
        self._end_traces(self.inbox.held())
        released = await self.inbox.release_held()
        return released + await self.receiver.landed()

    # -- one batch -------------------------------------------------------------

    async def process(self, messages: list[Received]) -> None:
        """Handle one received batch: every message is deleted or given a new
        visibility before this returns, or is asked for again here in a moment:
        those whose quota frees within a moment (fairpost.mailer.daemon.parking.PRECISE_WAIT_MAX),
        and those whose handling failed on a Redis or AWS outage (on its back-off)."""
        self.ctx.stats.received += len(messages)
        self.inbox.hold(messages)
        for msg in messages:
            try:
                msg.envelope = decode(msg.body)
            except (PoisonMessage, NewerFormat):
                continue  # settled in _handle, where a failure to end it is tried again
            if self.tracing is not None:
                msg.trace = self.tracing.received(self._queue, msg.message_id, msg.envelope)
        await self._handle(messages)

    async def _handle(self, messages: list[Received], *, retried: bool = False) -> None:
        timed: list[Received] = []
        groups = _grouped(messages)
        try:
            with self._traced(messages):
                outcomes = await asyncio.gather(*(self._decide(group) for group in groups))
            failed = {i: error for i, error in enumerate(outcomes) if error is not None}
            for i, exc in list(failed.items()):
                if isinstance(exc, Exception) and not isinstance(exc, _OUTAGE):
                    # Ended here, or (Redis failing meanwhile) an outage like any other.
                    ended = await self._unexpected(groups[i], exc)
                    if ended is None:
                        del failed[i]
                    else:
                        failed[i] = ended
            error = self._after_failures(groups, failed)
            again = [m for m in messages if m.retry_at is not None]
            if again:
                # Timed first, after only their own visibility change (rarely needed): the
                # batch's deletes linger for company (fairpost.mailer.daemon.inbox._Deletes) and
                # then take an SQS call, and every moment the retry waits behind them
                # is the tenant's quota left unused (BENCHMARKS.md, "Utilisation").
                await self.inbox.settle(again)
                timed = again
            # A timed retry that sent its group's last mail frees the tenant's FIFO
            # group once the deletes land: the tenant was throttled, its backlog waits
            # behind them, and its quota frees again before long.
            freed = retried and any(all(m.deleted for m in group) for group in groups)
            await self.inbox.settle([m for m in messages if m not in timed], promptly=freed)
            if freed:
                self.receiver.group_freed()
            if error is not None:
                raise error
        except asyncio.CancelledError:
            # Shutdown cancelled the batch: it stays held, for release_held to hand back.
            raise
        except BaseException as exc:
            untimed = [m for m in messages if m not in timed]
            self._end_traces(untimed, type(exc).__name__)
            self.inbox.release(untimed)
            raise
        # The timed ones stay held: their timer settles them, or release_held at shutdown.
        settled = [m for m in messages if m not in timed]
        self._end_traces(settled)
        self.inbox.release(settled)

    async def _decide(self, group: list[Received]) -> BaseException | None:
        """Handle one tenant's group (or settle one unreadable message); the error it ended
        with, once every SES call it made has answered and been recorded."""
        try:
            envelope = group[0].envelope
            if envelope is None:
                group[0].decide(await self.endings.unreadable(group[0]))
            else:
                await self.groups.handle(envelope.tenant, group)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:
            return exc
        return None

    async def _unexpected(self, group: list[Received], exc: BaseException) -> BaseException | None:
        """A group's handling raised what nobody listed (a defect, or a mail shaped as
        nobody foresaw): logged and counted, and its unsettled mails count an attempt,
        to come back after their back-off or, once out of attempts, to end dead with
        the error named. No task dies of it, and the tenant's group is not blocked for
        ever behind a mail that always fails. A mail SES has or may have (its call
        unanswered or unrecorded) is left to its visibility timeout, its marker held.
        Returns an outage met on the way (to be ridden out like any), else None."""
        self.ctx.metrics.task_failed("sender")
        env = group[0].envelope
        extra = {"tenant": env.tenant} if env is not None else {}
        log.error("handling a batch's mail failed unexpectedly", exc_info=exc, extra=extra)
        reason = f"handling failed: {type(exc).__name__}: {redact(str(exc))[:200]}"
        s = self.ctx.settings.sender
        try:
            for msg in group:
                if msg.deleted or msg.in_call:
                    continue
                # Whatever was decided for it before the failure is void.
                msg.reopen()
                if msg.envelope is None:
                    msg.decide(Backoff(s.backoff_max_seconds, "poison whose ending failed"))
                    continue
                attempts = await self.ctx.store.count_attempt(msg.envelope.job_id, reason)
                if attempts >= s.max_attempts:
                    msg.decide(
                        await self.endings.dead(
                            msg, f"gave up after {attempts} attempts: {reason}", "attempts"
                        )
                    )
                else:
                    msg.decide(attempt_backoff(attempts, s, "handling failed"))
        except _OUTAGE as outage:
            return outage
        return None

    def _after_failures(
        self, groups: list[list[Received]], failed: dict[int, BaseException]
    ) -> BaseException | None:
        """Groups whose handling failed on a Redis or AWS outage are asked for again
        here on the outage back-off, not left to their visibility timeout (a minute,
        say, for an outage of seconds): decided again from the start, as Redis
        has them then. A mail SES has or may have without its answer recorded is
        never tried again: it waits in SQS, its sending marker held (what else
        failed was ended by :meth:`_unexpected`). Returns the error to raise: an
        outage too long to ride out, or what is not an ``Exception`` at all."""
        if not failed:
            self._outage.succeeded()
            return None
        outage = {i: e for i, e in failed.items() if isinstance(e, _OUTAGE)}
        delay = self._outage.failed(next(iter(outage.values()))) if outage else None
        due = time.monotonic() + (delay or 0.0)
        for i in failed:
            for msg in groups[i]:
                # The round's decisions are void: it is decided again from the start.
                msg.reopen()
                if i in outage and delay is not None and not msg.in_call:
                    msg.decide(TimedRetry(due, PRECISE_SAFETY_NET))
                else:
                    msg.decide(Leave("SES may have it unrecorded" if msg.in_call else "outage"))
        unexpected = [e for i, e in failed.items() if i not in outage]
        if unexpected:
            return unexpected[0]  # not an Exception: an interpreter's exit, say
        error = next(iter(outage.values()))
        if delay is None:
            # Too long an outage: left to their visibility timeouts, and raised.
            return error
        log.warning(
            "handling %d messages failed (%s: %s); asked for again in %.1fs",
            sum(len(groups[i]) for i in outage),
            type(error).__name__,
            error,
            delay,
        )
        return None

    def _traced(self, messages: list[Received]) -> contextlib.AbstractContextManager[None]:
        """While the groups are handled, each job's SES call finds its processing span."""
        if self.tracing is None:
            return contextlib.nullcontext()
        traces: dict[str, JobTrace] = {}
        for msg in messages:
            if msg.trace is not None:
                # A job twice in one batch: the first is the one that goes on.
                traces.setdefault(msg.trace.job_id, msg.trace)
        return handling(traces)

    def _end_traces(self, messages: Sequence[Received], error: str | None = None) -> None:
        """Their messages are settled (or handed back) for this receive: its spans end."""
        if self.tracing is None:
            return
        for msg in messages:
            if msg.trace is not None:
                # Deleted without a known end: finished elsewhere (another sender, a cancel).
                msg.trace.end("finished" if msg.deleted else "dispatched", error)
                msg.trace = None

    async def _ask_again(self, messages: list[Received]) -> None:
        """A timed retry is due (fairpost.mailer.daemon.inbox.Inbox.settle): a new round."""
        for msg in messages:
            msg.reopen()
        await self._handle(messages, retried=True)


def _grouped(messages: list[Received]) -> list[list[Received]]:
    """A batch by FIFO group (a tenant's stream), in order; a poison message is a group
    of its own: it ends alone. A tenant's notification mail is decided apart from its
    transactional mail, so it is never parked in front of it."""
    groups: dict[str, list[Received]] = {}
    poison: list[list[Received]] = []
    for msg in messages:
        if msg.envelope is None:
            poison.append([msg])
        else:
            env = msg.envelope
            groups.setdefault(group_id(env.tenant, env.mail.stream), []).append(msg)
    return [*groups.values(), *poison]
